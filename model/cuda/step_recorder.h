// The ops of one step written down instead of issued: kernels (function, grid, block, shared
// memory and the values of their parameters), copies and fills, in issue order. The CUDA
// backend records a step (backend::step_begin .. step_end) and turns the list into a CUDA graph,
// or into updates of the few nodes of an earlier graph that changed (model/cuda/step_graph.h):
// recording costs a copy of the parameters, where a launch costs microseconds of driver time.
// Plain C++ (the launchers of the .cu files record through launch_kernel, device_common.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace moestream::cuda {

struct step_op {
    enum class kind : uint8_t { kernel, copy, fill } what = kind::kernel;
    const void* func = nullptr;  // kernel
    dim3 grid, block;
    size_t shared = 0;
    uint32_t first_arg = 0, n_args = 0;  // kernel: its parameters' offsets in step_recorder::arg_at
    void* dst = nullptr;                  // copy, fill
    const void* src = nullptr;            // copy
    size_t bytes = 0;                     // copy, fill
    cudaMemcpyKind direction = cudaMemcpyDefault;
    uint8_t value = 0;  // fill
};

class step_recorder {
  public:
    // The recorder of the calling thread's step, or null (launch_kernel then launches).
    static step_recorder*& active() {
        static thread_local step_recorder* r = nullptr;
        return r;
    }

    void clear() {
        ops_.clear();
        arg_at_.clear();
        args_.clear();
    }
    void kernel(const void* func, dim3 grid, dim3 block, size_t shared) {
        step_op op;
        op.func = func, op.grid = grid, op.block = block, op.shared = shared;
        op.first_arg = uint32_t(arg_at_.size());
        ops_.push_back(op);
    }
    // The next parameter of the kernel recorded last (its value as the kernel's type).
    template <class T>
    void arg(const T& v) {
        static_assert(alignof(T) <= 16, "a kernel parameter aligned beyond 16 bytes");
        size_t at = (args_.size() + alignof(T) - 1) / alignof(T) * alignof(T);
        args_.resize(at + sizeof(T));
        std::memcpy(args_.data() + at, &v, sizeof(T));
        arg_at_.push_back(uint32_t(at));
        ++ops_.back().n_args;
    }
    void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind direction) {
        step_op op;
        op.what = step_op::kind::copy, op.dst = dst, op.src = src, op.bytes = bytes, op.direction = direction;
        ops_.push_back(op);
    }
    void fill(void* dst, uint8_t value, size_t bytes) {
        step_op op;
        op.what = step_op::kind::fill, op.dst = dst, op.value = value, op.bytes = bytes;
        ops_.push_back(op);
    }

    const std::vector<step_op>& ops() const { return ops_; }
    // Parameter i of op: its bytes start at args() + arg_at(op.first_arg + i).
    uint32_t arg_at(uint32_t i) const { return arg_at_[i]; }
    const std::byte* args() const { return args_.data(); }
    size_t args_size() const { return args_.size(); }
    const std::vector<uint32_t>& arg_offsets() const { return arg_at_; }
    // The end of op's parameters: the next kernel's first one, or the end of all.
    size_t end_of(const step_op& op) const {
        const uint32_t next = op.first_arg + op.n_args;
        return next < arg_at_.size() ? arg_at_[next] : args_.size();
    }

  private:
    std::vector<step_op> ops_;
    std::vector<uint32_t> arg_at_;
    std::vector<std::byte> args_;
};

}  // namespace moestream::cuda
