// Loads a deepseek41 GGUF (and optionally its DSpark dflash file) into the model's weight views:
// dense tensors are memory-mapped and viewed in place; small float parameters stored in another
// float type are converted once; routed experts are reached through an expert_source. The
// resident source here views them in the mapping (everything in RAM); the streaming scheduler
// provides tiered sources with the same interface.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "storage/gguf.h"

namespace moestream {

struct loaded_model {
    dsv41::hparams hp;
    gguf::model_file target;
    std::optional<gguf::model_file> draft_file;
    dsv41::model_weights weights;
    std::optional<dsv41::draft_weights> draft;
    std::deque<std::vector<float>> converted;  // parameters converted to F32 at load
    std::vector<int32_t> token_map;

    // Size and modification time of every file at load time.
    struct file_stamp {
        std::string path;
        uint64_t size = 0;
        int64_t mtime_ns = 0;
    };
    std::vector<file_stamp> stamps;
    // An error naming the file when one of them changed on disk since it was loaded (the mapping
    // and every cached expert would then be stale).
    status verify_unchanged() const;

    // Expert `e` of a layer (n_layers + s: DSpark stage s) as views into the mapping.
    dsv41::expert_weights expert(int layer, int32_t e) const;
    // Routed experts of every layer and DSpark stage together.
    int64_t total_experts() const;

    // Per layer, then per DSpark stage: its three expert tensors, looked up once at load
    // (expert() runs for every expert of every step).
    struct expert_tensors {
        const gguf::model_file* file = nullptr;
        const gguf::tensor_info *gate = nullptr, *up = nullptr, *down = nullptr;
    };
    std::vector<expert_tensors> expert_index;
};

// Errors name the file and the tensor. `draft_path` may be empty.
result<std::unique_ptr<loaded_model>> load_model(const std::string& path, const std::string& draft_path);

// Every expert resident in the memory mapping (the CPU path and the reference for streaming).
class resident_experts final : public dsv41::expert_source {
  public:
    explicit resident_experts(const loaded_model& m) : m_(m) {}
    void need(int, std::span<const int32_t>) override {}
    result<dsv41::expert_weights> get(int layer, int32_t expert) override { return m_.expert(layer, expert); }

  private:
    const loaded_model& m_;
};

}  // namespace moestream
