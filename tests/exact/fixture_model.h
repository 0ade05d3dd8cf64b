// Shared by the exactness suites (the CPU's and the CUDA backend's): converts a reference fixture
// checkpoint into GGUF files once per test process, loads it on a backend, and reads the
// fixture's recorded tensors.
#pragma once

#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include "model/arch/deepseek41.h"
#include "model/cpu_backend.h"
#include "scheduler/device_experts.h"
#include "scheduler/device_weights.h"
#include "scheduler/model_loader.h"
#include "storage/safetensors.h"

namespace moestream::test {

struct fixture_model {
    std::string dir;
    std::unique_ptr<loaded_model> files;
    std::unique_ptr<moestream::backend> backend;
    std::unique_ptr<device_weights> device;  // a device backend's copy of the dense weights
    std::unique_ptr<dsv41::expert_source> experts;  // the mapping (CPU) or device slots
    std::unique_ptr<dsv41::model> model;

    const dsv41::hparams& hp() const { return files->hp; }
    std::unique_ptr<dsv41::sequence_state> sequence(int64_t tokens = 128) const {
        return model->new_sequence(tokens, 16);
    }
};

// "dsv41-tiny-bf16" -> converted (cached per process) and loaded with `threads` threads.
// With `lossless`, fp8 weights are stored as BF16 (exact) instead of Q8_0.
fixture_model& fixture(const std::string& name, int threads = 2, bool lossless = false);
// The fixture on a device backend (its own conversion): dense weights uploaded, `expert_slots`
// experts in device slots (every expert when it is 0).
std::unique_ptr<fixture_model> fixture_on(std::unique_ptr<backend> be, const std::string& name, bool lossless,
                                          int64_t expert_slots = 0);
std::string fixture_path(const std::string& name);

// F32 / integer tensors of a fixture safetensors file.
std::vector<float> read_f32(const std::string& path, const std::string& tensor, std::vector<int64_t>* shape = nullptr);
std::vector<int64_t> read_i64(const std::string& path, const std::string& tensor, std::vector<int64_t>* shape = nullptr);

double correlation(const float* a, const float* b, int64_t n);

// The input_ids of a fixture's prompt_len{len}.safetensors.
std::vector<int32_t> prompt_ids(const std::string& fixture_name, int len);
// Exact equality of two logit vectors, bit for bit.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace moestream::test
