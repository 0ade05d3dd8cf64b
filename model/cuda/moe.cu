// The slot-table MoE's small kernels: each row's picks in ascending id order (with their
// weights), and the expansion of matmul job templates into jobs whose weights are the picked
// experts' slots. The matmuls themselves are matmul.cu's, so every value is the one the
// host-scheduled MoE computes.
#include "model/cuda/device_common.cuh"
#include "model/cuda/moe_kernels.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxK = 16;

__global__ void k_order_picks(const int32_t* __restrict__ picks, const float* __restrict__ weights, int64_t n, int k,
                              int32_t* sorted_picks, float* sorted_weights) {
    grid_dependency_prologue();
    const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (r >= n) return;
    int32_t p[kMaxK];
    float w[kMaxK];
    for (int j = 0; j < k; ++j) p[j] = picks[r * k + j], w[j] = weights[r * k + j];
    store_in_id_order(p, w, k, n, r, sorted_picks, sorted_weights);
}

__global__ void k_expand_routed_jobs(const mm_job* __restrict__ templates, int n_jobs, int per,
                                     const int32_t* __restrict__ sorted_picks, const int32_t* __restrict__ slot_of,
                                     const uint8_t* base, size_t slot_bytes, mm_job* out) {
    grid_dependency_prologue();
    const int i = int(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_jobs) return;
    mm_job j = templates[i];
    const int32_t slot = slot_of[sorted_picks[i / per]];
    const uint8_t* at = base + size_t(slot) * slot_bytes;
    j.w = at + reinterpret_cast<uintptr_t>(j.w);
    j.up = (j.flags & kSwiglu) ? at + reinterpret_cast<uintptr_t>(j.up) : nullptr;
    out[i] = j;
}

}  // namespace

cudaError_t order_picks(cudaStream_t s, const int32_t* picks, const float* weights, int64_t n, int k,
                        int32_t* sorted_picks, float* sorted_weights) {
    if (n == 0) return cudaSuccess;
    if (k < 1 || k > kMaxK) return cudaErrorInvalidValue;
    return launch_kernel(s, k_order_picks, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, picks, weights, n, k,
                         sorted_picks, sorted_weights);
}

cudaError_t expand_routed_jobs(cudaStream_t s, const mm_job* templates, int n_jobs, int jobs_per_assignment,
                               const int32_t* sorted_picks, const int32_t* slot_of, const uint8_t* base,
                               size_t slot_bytes, mm_job* out) {
    if (n_jobs == 0) return cudaSuccess;
    return launch_kernel(s, k_expand_routed_jobs, dim3(grid_for(n_jobs, kThreads)), dim3(kThreads), 0, templates,
                         n_jobs, jobs_per_assignment, sorted_picks, slot_of, base, slot_bytes, out);
}

}  // namespace moestream::cuda::kernels
