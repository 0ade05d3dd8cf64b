// Sparse attention with sinks (§3.4.9) and the indexer's scores (§3.4.6), following the CPU
// backend's operations: each dot product takes value d of a 32-value chunk in lane d % 32, the
// chunks in order, then the lanes in the CPU kernels' tree (warp_sum); the softmax's max, its
// exponentials and its denominator summed in key order; each output value the keys' weighted
// sum in key order. The only difference is exp (numeric::exp_float against glibc's expf, which
// disagree in rare last bits).
#include "model/attention_keys.h"
#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;

// Key i of a row (ring keys, then fresh ones, then selected entries; n_sel valid ids).
__device__ __forceinline__ const uint16_t* key_at(const attention_row& a, int64_t head_dim, int64_t i) {
    if (i < a.ring_count) return a.ring + ((a.ring_first + i) % a.ring_capacity) * head_dim;
    i -= a.ring_count;
    if (i < a.fresh_count) return a.fresh + i * head_dim;
    i -= a.fresh_count;
    return a.latents + int64_t(a.selection[i]) * head_dim;
}

// dot(q, key) over head_dim values by one warp, in the CPU's lane order.
__device__ __forceinline__ float key_dot(const float* q, const uint16_t* key, int64_t head_dim, int lane) {
    float acc = 0.0f;
    for (int64_t d = lane; d < head_dim; d += kWarp)
        acc = __fadd_rn(acc, __fmul_rn(bf16_bits_value(key[key_word(d, head_dim)]), q[d]));
    return warp_sum(acc);
}

// One block per (row, head).
__global__ void __launch_bounds__(kThreads) k_attention(const attention_row* __restrict__ rows, int n_heads,
                                                        int64_t head_dim, float scale, const float* __restrict__ sinks,
                                                        bool bf16_probs) {
    extern __shared__ float smem[];
    __shared__ int64_t n_keys_s;
    __shared__ float inv_s;
    const attention_row& a = rows[blockIdx.x / n_heads];
    const int h = int(blockIdx.x % n_heads);
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    if (threadIdx.x == 0) {
        int64_t n_sel = 0;
        while (n_sel < a.selection_len && a.selection[n_sel] >= 0) ++n_sel;
        n_keys_s = a.ring_count + a.fresh_count + n_sel;
    }
    __syncthreads();
    const int64_t n_keys = n_keys_s;
    float* out = a.out + h * head_dim;
    if (n_keys == 0) {  // no key visible: the output is zero (the sink alone carries no value)
        for (int64_t d = threadIdx.x; d < head_dim; d += kThreads) out[d] = 0.0f;
        return;
    }
    float* p = smem;  // [n_keys]
    const float* q = a.q + h * head_dim;
    for (int64_t i = warp; i < n_keys; i += kWarps) {
        const float dot = key_dot(q, key_at(a, head_dim, i), head_dim, lane);
        if (lane == 0) p[i] = __fmul_rn(dot, scale);
    }
    __syncthreads();
    // The softmax with its sink (cpu_backend.cpp softmax_with_sink): the scores' own max, the
    // sink's term first in the denominator, then the keys in order.
    if (threadIdx.x == 0) {
        float m = -1e30f;
        for (int64_t i = 0; i < n_keys; ++i) m = fmaxf(m, p[i]);
        float denom = numeric::exp_float(__fsub_rn(sinks[h], m));
        for (int64_t i = 0; i < n_keys; ++i) {
            p[i] = numeric::exp_float(__fsub_rn(p[i], m));
            denom = __fadd_rn(denom, p[i]);
        }
        if (bf16_probs)
            for (int64_t i = 0; i < n_keys; ++i) p[i] = numeric::round_bf16(p[i]);
        inv_s = __fdiv_rn(1.0f, denom);
    }
    __syncthreads();
    const float inv = inv_s;
    for (int64_t d = threadIdx.x; d < head_dim; d += kThreads) {
        const int64_t word = key_word(d, head_dim);
        float acc = 0.0f;
        for (int64_t i = 0; i < n_keys; ++i)
            acc = __fadd_rn(acc, __fmul_rn(p[i], bf16_bits_value(key_at(a, head_dim, i)[word])));
        out[d] = numeric::round_bf16(__fmul_rn(acc, inv));
    }
}

// One warp per (row, entry): every head's dot in the CPU's lane order, then the bf16 sum over heads.
__global__ void k_indexer_scores(const float* __restrict__ q, const float* __restrict__ w, int64_t n, int n_heads,
                                 int64_t head_dim, const float* __restrict__ keys, int64_t n_keys,
                                 const int64_t* __restrict__ n_visible, float* scores) {
    const int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
    const int lane = int(threadIdx.x) % kWarp;
    if (item >= n * n_keys) return;
    const int64_t r = item / n_keys, j = item % n_keys;
    if (j >= n_visible[r]) {
        if (lane == 0) scores[item] = -__int_as_float(0x7f800000);
        return;
    }
    const float* k = keys + j * head_dim;
    float s = 0.0f;
    for (int h = 0; h < n_heads; ++h) {
        const float* qh = q + (r * n_heads + h) * head_dim;
        float acc = 0.0f;
        for (int64_t d = lane; d < head_dim; d += kWarp) acc = __fadd_rn(acc, __fmul_rn(qh[d], k[d]));
        const float qk = numeric::round_bf16(warp_sum(acc));
        s = __fadd_rn(s, numeric::round_bf16(__fmul_rn(fmaxf(qk, 0.0f), w[r * n_heads + h])));
    }
    if (lane == 0) scores[item] = numeric::round_bf16(s);
}

size_t g_shared_limit = 48 << 10;

}  // namespace

void set_shared_memory_limit(size_t bytes) { g_shared_limit = bytes; }

cudaError_t attention(cudaStream_t s, const attention_row* rows, int64_t n_rows, int n_heads, int64_t head_dim,
                      float scale, const float* sinks, bool bf16_probs, int64_t max_keys) {
    if (n_rows == 0) return cudaSuccess;
    const size_t shared = size_t(std::max<int64_t>(max_keys, 1)) * sizeof(float);
    if (shared > g_shared_limit) return cudaErrorInvalidValue;
    if (shared > (48 << 10)) {
        const cudaError_t e = cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
        if (e != cudaSuccess) return e;
    }
    const int64_t blocks = n_rows * n_heads;
    if (blocks > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
    return launch_kernel(s, k_attention, dim3(unsigned(blocks)), dim3(kThreads), shared, rows, n_heads, head_dim,
                         scale, sinks, bf16_probs);
}

cudaError_t indexer_scores(cudaStream_t s, const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                           const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) {
    if (n * n_keys == 0) return cudaSuccess;
    const unsigned blocks = grid_for(n * n_keys, kWarps);
    return launch_kernel(s, k_indexer_scores, dim3(blocks), dim3(kThreads), 0, q, w, n, n_heads, head_dim, keys,
                         n_keys, n_visible, scores);
}

}  // namespace moestream::cuda::kernels
