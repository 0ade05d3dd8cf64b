// Launchers of the slot-table MoE kernels (model/cuda/moe.cu): the routed experts' order and
// the expansion of a layer's assignments into matmul jobs on the device, so the host never reads
// the picks. Plain C++ (kernels.h's conventions: device pointers, enqueued on `s`).
#pragma once

#include "model/cuda/kernels.h"

namespace moestream::cuda::kernels {

// backend::order_picks (k <= 16).
cudaError_t order_picks(cudaStream_t s, const int32_t* picks, const float* weights, int64_t n, int k,
                        int32_t* sorted_picks, float* sorted_weights);

// out[i] = templates[i] with its weights found through the slot table: assignment a = i /
// jobs_per_assignment, slot = slot_of[sorted_picks[a]], and w (and up, for SwiGLU pairs) = base +
// slot * slot_bytes + the offset the template holds in w (and up). Every other field (x, y, u,
// swiglu_w, the plan) is the template's.
cudaError_t expand_routed_jobs(cudaStream_t s, const mm_job* templates, int n_jobs, int jobs_per_assignment,
                               const int32_t* sorted_picks, const int32_t* slot_of, const uint8_t* base,
                               size_t slot_bytes, mm_job* out);

}  // namespace moestream::cuda::kernels
