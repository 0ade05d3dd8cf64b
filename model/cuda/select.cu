// The selections: the router's top-k with its weights (§3.5) and the indexer's candidate blocks
// and top-k (§3.4.7-8), by the one rule of model/top_k.h (value descending, ties to the lower
// index), so given the same scores they pick exactly what the CPU backend picks.
#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 256;

// A float's bits as an unsigned key with the same order (larger value, larger key).
__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of one int per thread over the block (kThreads threads); returns the
// thread's offset and leaves the total in *total.
__device__ int block_exclusive_sum(int v, int* scratch, int* total) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (int o = 1; o < kThreads; o <<= 1) {
        const int add = int(threadIdx.x) >= o ? scratch[threadIdx.x - o] : 0;
        __syncthreads();
        scratch[threadIdx.x] += add;
        __syncthreads();
    }
    const int inclusive = scratch[threadIdx.x];
    *total = scratch[kThreads - 1];
    __syncthreads();
    return inclusive - v;
}

// The k best of v[0..n) by the rule (value descending, ties to the lower index), as a threshold:
// every entry with a larger key is in, and of the entries whose key equals `key` the first
// `ties` (in index order). Found by a radix select on the keys, 8 bits at a time.
struct threshold {
    uint32_t key;
    int64_t ties;
};

__device__ threshold select_threshold(const float* v, int64_t n, int64_t k, unsigned int* hist) {
    __shared__ uint32_t prefix_s;
    __shared__ int64_t remaining_s;
    uint32_t prefix = 0, mask = 0;
    int64_t remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t key = order_key(v[j]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t above = 0;
            int bin = 255;
            for (; bin > 0; --bin) {
                if (above + hist[bin] >= remaining) break;
                above += hist[bin];
            }
            prefix_s = prefix | (uint32_t(bin) << shift);
            remaining_s = remaining - above;
        }
        __syncthreads();
        prefix = prefix_s;
        remaining = remaining_s;
        mask |= 0xffu << shift;
        __syncthreads();
    }
    return {prefix, remaining};
}

// Calls take(j) for every j of the k best, in ascending j, with its rank among them (0, 1, ...).
template <class Take>
__device__ void for_each_selected(const float* v, int64_t n, threshold t, int* scan, Take take) {
    int64_t base = 0, ties_before = 0;
    for (int64_t c = 0; c < n; c += kThreads) {
        const int64_t j = c + threadIdx.x;
        const uint32_t key = j < n ? order_key(v[j]) : 0u;
        const bool tie = j < n && key == t.key;
        int ties_total;
        const int tie_rank = block_exclusive_sum(tie ? 1 : 0, scan, &ties_total);
        const bool in = j < n && (key > t.key || (tie && ties_before + tie_rank < t.ties));
        int in_total;
        const int at = block_exclusive_sum(in ? 1 : 0, scan, &in_total);
        if (in) take(j, base + at);
        base += in_total;
        ties_before += ties_total;
    }
}

// One block per row of an item (cpu_backend::indexer_select, step for step).
__global__ void __launch_bounds__(kThreads) k_indexer_select(indexer_pick p, float* block_scores) {
    grid_dependency_prologue();
    __shared__ unsigned int hist[256];
    __shared__ int scan[kThreads];
    const int64_t t = blockIdx.x;
    const int64_t n_total = p.n_total;
    float* s = p.scores + t * n_total;
    const int64_t n_vis = p.n_visible[t];
    const float inf = __int_as_float(0x7f800000);
    if (p.cand == indexer_pick::candidates::source) {
        const int64_t bs = p.block_size;
        const int64_t n_blocks = (n_total + bs - 1) / bs;
        float* bscore = block_scores + t * n_blocks;
        const int64_t pin = n_vis >= 1 ? (n_vis - 1) / bs : -1;  // floor division: n_vis = 0 pins nothing
        for (int64_t b = threadIdx.x; b < n_blocks; b += blockDim.x) {
            float m = -inf;
            for (int64_t j = b * bs; j < min(n_total, (b + 1) * bs); ++j) m = fmaxf(m, s[j]);
            bscore[b] = b == pin ? inf : m;
        }
        uint8_t* mask = p.mask + t * p.mask_stride;
        for (int64_t j = threadIdx.x; j < n_total; j += blockDim.x) mask[j] = 0;
        __syncthreads();
        const int64_t keep = min(p.topk_blocks, n_blocks);
        const threshold th = select_threshold(bscore, n_blocks, keep, hist);
        for_each_selected(bscore, n_blocks, th, scan, [&](int64_t b, int64_t) {
            if (bscore[b] == -inf) return;
            for (int64_t j = b * bs; j < min(n_total, (b + 1) * bs); ++j) mask[j] = 1;
        });
        __syncthreads();
    } else if (p.cand == indexer_pick::candidates::consumer) {
        const uint8_t* mask = p.mask + t * p.mask_stride;
        for (int64_t j = threadIdx.x; j < n_total; j += blockDim.x)
            if (j >= p.mask_len || !mask[j]) s[j] = -inf;
        __syncthreads();
    }
    // Level 2: the best min(topk, n_total) entries in index order; those this row cannot see -1.
    const int64_t k = min(p.topk, n_total);
    int32_t* ids = p.selection + t * p.topk;
    for (int64_t j = threadIdx.x; j < p.topk; j += blockDim.x) ids[j] = -1;
    __syncthreads();
    const threshold th = select_threshold(s, n_total, k, hist);
    // The picks ascend, so the visible ones come first and the -1s end the list.
    for_each_selected(s, n_total, th, scan, [&](int64_t j, int64_t rank) {
        if (j < n_vis) ids[rank] = int32_t(j);
    });
}

// One warp per row: k rounds of the warp's best (value descending, lower index at ties) among
// the experts not yet picked, over s + bias; then the weights from the unbiased scores. A lane
// holds its experts' biased scores (i = lane + 32 m) in registers for all k rounds when the
// layer has at most 32 kRouteRegs experts, and reads them again each round otherwise: the
// candidates and the order they are compared in are the same either way.
constexpr int kRouteRegs = 16;

__device__ __forceinline__ void warp_best(float& best, int32_t& best_i) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        const float ov = __shfl_xor_sync(kFullMask, best, o);
        const int32_t oi = __shfl_xor_sync(kFullMask, best_i, o);
        if (oi >= 0 && (best_i < 0 || ov > best || (ov == best && oi < best_i))) best = ov, best_i = oi;
    }
}

__global__ void k_route(const float* __restrict__ scores, const float* __restrict__ bias, int64_t n, int n_experts, int k,
                        double route_scale, bool select, int32_t* picks, float* weights, int32_t* sorted_picks,
                        float* sorted_weights) {
    const int lane = int(threadIdx.x) % kWarp;
    // The bias (a weight: no kernel writes it) asked of L2 while the predecessor runs.
    if (select && blockIdx.x == 0 && threadIdx.x < kWarp)
        for (int i = lane * 32; i < n_experts; i += 32 * kWarp) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(bias + i));
    grid_dependency_prologue();
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (r >= n) return;
    const float* s = scores + r * n_experts;
    int32_t* p = picks + r * k;
    int32_t chosen[16];
    // The chosen experts' scores, when the rounds below hold them in registers (every lane has
    // them: the weights then need no load).
    float chosen_s[16];
    bool have_s = false;
    if (select && n_experts <= kWarp * kRouteRegs) {
        float v[kRouteRegs], sv[kRouteRegs];
#pragma unroll
        for (int m = 0; m < kRouteRegs; ++m) {
            const int i = lane + kWarp * m;
            sv[m] = i < n_experts ? s[i] : 0.0f;
            v[m] = i < n_experts ? __fadd_rn(sv[m], bias[i]) : 0.0f;
        }
        uint32_t taken = 0;  // bit m: expert lane + 32 m was picked in an earlier round
        for (int j = 0; j < k; ++j) {
            float best = 0.0f;
            int32_t best_i = -1;
#pragma unroll
            for (int m = 0; m < kRouteRegs; ++m) {
                const int i = lane + kWarp * m;
                if (i >= n_experts || (taken >> m & 1u)) continue;
                if (best_i < 0 || v[m] > best) best = v[m], best_i = i;
            }
            warp_best(best, best_i);
            if (best_i >= 0 && best_i % kWarp == lane) taken |= 1u << (best_i / kWarp);
            chosen[j] = best_i;
            float mine = 0.0f;
#pragma unroll
            for (int m = 0; m < kRouteRegs; ++m)
                if (best_i >= 0 && m == best_i / kWarp) mine = sv[m];
            chosen_s[j] = __shfl_sync(kFullMask, mine, best_i >= 0 ? best_i % kWarp : 0);
        }
        have_s = true;
    } else if (select) {
        for (int j = 0; j < k; ++j) {
            float best = 0.0f;
            int32_t best_i = -1;
            for (int i = lane; i < n_experts; i += kWarp) {
                bool taken = false;
                for (int c = 0; c < j; ++c) taken |= chosen[c] == i;
                if (taken) continue;
                const float v = __fadd_rn(s[i], bias[i]);
                if (best_i < 0 || v > best) best = v, best_i = i;
            }
            warp_best(best, best_i);
            chosen[j] = best_i;
        }
    }
    if (select && lane == 0)
        for (int j = 0; j < k; ++j) p[j] = chosen[j];
    __syncwarp();
    if (!weights || lane != 0) return;
    if (!select)
        for (int j = 0; j < k; ++j) chosen[j] = p[j];
    if (!have_s)
        for (int j = 0; j < k; ++j) chosen_s[j] = s[chosen[j]];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum = __fadd_rn(sum, chosen_s[j]);
    float w[16];
    for (int j = 0; j < k; ++j) {
        w[j] = __double2float_rn(__dmul_rn(double(__fdiv_rn(chosen_s[j], __fadd_rn(sum, 1e-20f))), route_scale));
        weights[r * k + j] = w[j];
    }
    if (sorted_picks) store_in_id_order(chosen, w, k, n, r, sorted_picks, sorted_weights);
}

}  // namespace

cudaError_t indexer_select(cudaStream_t s, const indexer_pick& p, float* block_scores) {
    if (p.rows == 0) return cudaSuccess;
    if (p.n_total < 1 || p.topk < 1) return cudaErrorInvalidValue;
    return launch_kernel(s, k_indexer_select, dim3(unsigned(p.rows)), dim3(kThreads), 0, p, block_scores);
}

cudaError_t route(cudaStream_t s, const float* scores, const float* bias, int64_t n, int n_experts, int k,
                  double route_scale, bool select, int32_t* picks, float* weights, int32_t* sorted_picks,
                  float* sorted_weights) {
    if (n == 0) return cudaSuccess;
    if (k < 1 || k > 16 || k > n_experts) return cudaErrorInvalidValue;
    if ((sorted_picks == nullptr) != (sorted_weights == nullptr) || (sorted_picks && (!select || !weights)))
        return cudaErrorInvalidValue;
    constexpr int warps = 4;
    return launch_kernel(s, k_route, dim3(grid_for(n, warps)), dim3(warps * kWarp), 0, scores, bias, n, n_experts, k,
                         route_scale, select, picks, weights, sorted_picks, sorted_weights);
}

}  // namespace moestream::cuda::kernels
