// Hyper-connection kernels (§3.3): the mixes with their Sinkhorn normalisation, collapse,
// expand, the output sum that feeds them (output_sum's adding pass) and the engram gate (§3.2).
// Each follows the CPU backend's operations one by one (cpu_backend.cpp, cpu_elementwise.cpp);
// only exp differs where the CPU calls glibc (sigmoid, the comb softmax).
#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHc = 8;
constexpr int kRowsPerBlock = 4;  // warps of k_hc_mixes and k_engram_gate blocks

// The comb matrix of a row lives in one warp's registers: element e = i * hc + j in lane e % 32,
// register e / 32 (hc <= 8: 64 elements, two registers). A line's sum reads its elements from
// their lanes in the CPU's order (j ascending along a row, i ascending down a column), so every
// Sinkhorn step is cpu_backend::hc_mixes's arithmetic, without a pass through memory (one lane
// walking the matrix in global memory cost ~70 us a call; one lane with the matrix in
// registers, ~35 us: the divisions of a line then run one after another).
// kCombRegs is 1 when the matrix fits one register a lane (hc <= 5): half the shuffles of a line
// sum, on the chain of 40 line sums.
template <int kCombRegs>
__device__ __forceinline__ float comb_element(const float (&c)[kCombRegs], int e) {
    e = e < kCombRegs * kWarp ? e : 0;  // lanes past the matrix read something harmless
    float v = 0.0f;
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) {
        const float x = __shfl_sync(kFullMask, c[t], e % kWarp);
        if (e / kWarp == t) v = x;
    }
    return v;
}

// Each register's line sum (a row when stride is 1, a column when stride is hc), in order.
template <int kCombRegs>
__device__ __forceinline__ void line_sums(const float (&c)[kCombRegs], const int (&first)[kCombRegs], int stride, int hc,
                                          float (&sum)[kCombRegs]) {
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) sum[t] = 0.0f;
#pragma unroll 8
    for (int k = 0; k < hc; ++k)
#pragma unroll
        for (int t = 0; t < kCombRegs; ++t) sum[t] = __fadd_rn(sum[t], comb_element(c, first[t] + k * stride));
}

// One warp per row: the RMS scale of the row's streams (all of them, one statistic), then pre,
// post and comb exactly as cpu_backend::hc_mixes forms them.
// kHc: the stream count when the launcher knows it at compile time (4, every preset's), so each
// line sum's hc shuffles are issued together ahead of its adds (a runtime count kept them in a
// loop, a shuffle's latency per element on the Sinkhorn's chain of 40 line sums); 0 reads hc_arg.
template <int kCombRegs, int kHc>
__global__ void k_hc_mixes(const float* __restrict__ H, const float* __restrict__ mix_in, int64_t n, int hc_arg,
                           int64_t dim, const float* __restrict__ base, const float* __restrict__ scale, int iters,
                           float hc_eps, float norm_eps, float* pre, float* post, float* comb) {
    grid_dependency_prologue();
    const int hc = kHc > 0 ? kHc : hc_arg;
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (r >= n) return;  // whole warps leave together
    const float s = warp_inv_rms(H + r * hc * dim, hc * dim, norm_eps, lane);
    const int n_mix = (2 + hc) * hc, n_comb = hc * hc;
    const float* m = mix_in + r * n_mix;
    if (lane < hc) {
        pre[r * hc + lane] = __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(m[lane], s), scale[0]), base[lane])), hc_eps);
        post[r * hc + lane] = __fmul_rn(
            2.0f, sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(m[hc + lane], s), scale[1]), base[hc + lane])));
    }
    float c[kCombRegs], sum[kCombRegs];
    int row_first[kCombRegs], col_first[kCombRegs];
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) {
        const int e = lane + t * kWarp;
        row_first[t] = (e / hc) * hc;
        col_first[t] = e % hc;
        c[t] = e < n_comb ? __fadd_rn(__fmul_rn(__fmul_rn(m[2 * hc + e], s), scale[2]), base[2 * hc + e]) : 0.0f;
    }
    // The rows' softmax: the max, exp(x - max), x / sum + eps.
    float mx[kCombRegs];
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) mx[t] = -__int_as_float(0x7f800000);
    for (int k = 0; k < hc; ++k)
#pragma unroll
        for (int t = 0; t < kCombRegs; ++t) mx[t] = fmaxf(mx[t], comb_element(c, row_first[t] + k));
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) c[t] = numeric::exp_float(__fsub_rn(c[t], mx[t]));
    line_sums(c, row_first, 1, hc, sum);
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) c[t] = __fadd_rn(__fdiv_rn(c[t], sum[t]), hc_eps);
    // Sinkhorn: columns, then (rows, columns) iters - 1 times, each x / (sum + eps).
    for (int it = 0; it < (iters > 1 ? iters : 1); ++it) {
        if (it > 0) {
            line_sums(c, row_first, 1, hc, sum);
#pragma unroll
            for (int t = 0; t < kCombRegs; ++t) c[t] = __fdiv_rn(c[t], __fadd_rn(sum[t], hc_eps));
        }
        line_sums(c, col_first, hc, hc, sum);
#pragma unroll
        for (int t = 0; t < kCombRegs; ++t) c[t] = __fdiv_rn(c[t], __fadd_rn(sum[t], hc_eps));
    }
#pragma unroll
    for (int t = 0; t < kCombRegs; ++t) {
        const int e = lane + t * kWarp;
        if (e < n_comb) comb[r * n_comb + e] = c[t];
    }
}

// out = bf16(Σ_k p[k] H_k) at column d (the CPU's collapse_cols).
__device__ __forceinline__ float collapse_at(const float* H, int hc, int64_t dim, const float* p, int64_t d) {
    float acc = 0.0f;
    for (int k = 0; k < hc; ++k) acc = __fadd_rn(acc, __fmul_rn(p[k], H[k * dim + d]));
    return numeric::round_bf16(acc);
}

// The streams' new values at column d (the CPU's expand_cols): every stream read before any is
// written, so out may be H.
__device__ __forceinline__ void expand_at(float f, const float* H, int hc, int64_t dim, const float* post,
                                          const float* C, int64_t d, float* out) {
    float h[kMaxHc], o[kMaxHc];
    for (int i = 0; i < hc; ++i) h[i] = H[i * dim + d];
    for (int j = 0; j < hc; ++j) {
        float t = 0.0f;
        for (int i = 0; i < hc; ++i) t = __fadd_rn(t, __fmul_rn(C[i * hc + j], h[i]));
        o[j] = numeric::round_bf16(__fadd_rn(__fmul_rn(post[j], f), t));
    }
    for (int j = 0; j < hc; ++j) out[j * dim + d] = o[j];
}

__global__ void k_hc_collapse(const float* __restrict__ H, int64_t n, int hc, int64_t dim, const float* __restrict__ p,
                              float* out) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n * dim) {
        const int64_t r = t / dim, d = t % dim;
        out[t] = collapse_at(H + r * hc * dim, hc, dim, p + r * hc, d);
    }
}

__global__ void k_hc_expand(const float* __restrict__ f, const float* H, int64_t n, int hc, int64_t dim,
                            const float* __restrict__ post, const float* __restrict__ comb, float* out) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n * dim) {
        const int64_t r = t / dim, d = t % dim;
        expand_at(f[t], H + r * hc * dim, hc, dim, post + r * hc, comb + r * hc * hc, d, out + r * hc * dim);
    }
}

// f[r][d] = bf16(Σ of row r's contributions in order), then the streams' update and the next
// sub-layer's input (cpu_backend::output_sum's adding pass).
__global__ void k_sum_rows(const float* const* __restrict__ src, const int64_t* __restrict__ starts, int64_t n,
                           int64_t dim, float* f, hc_update upd) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n * dim) {
        const int64_t r = t / dim, d = t % dim;
        // The terms in order; a batch's pointers first, then their values, so the loads of a
        // batch are in flight together (one term after another was two memory latencies each).
        constexpr int kBatch = 8;
        const int64_t end = starts[r + 1];
        int64_t e = starts[r];
        float acc = 0.0f;
        for (; e < end; e += kBatch) {
            const float* p[kBatch];
#pragma unroll
            for (int a = 0; a < kBatch; ++a) p[a] = e + a < end ? src[e + a] : nullptr;
            float v[kBatch];
#pragma unroll
            for (int a = 0; a < kBatch; ++a) v[a] = p[a] ? p[a][d] : 0.0f;
#pragma unroll
            for (int a = 0; a < kBatch; ++a)
                if (p[a]) acc = __fadd_rn(acc, v[a]);  // (adding a 0 would turn -0 into +0)
        }
        const float fr = numeric::round_bf16(acc);
        f[t] = fr;
        if (!upd.H) continue;
        float* Hr = upd.H + r * upd.hc * dim;
        expand_at(fr, Hr, upd.hc, dim, upd.post + r * upd.hc, upd.comb + r * upd.hc * upd.hc, d, Hr);
        if (upd.next) upd.next[t] = collapse_at(Hr, upd.hc, dim, upd.pre + r * upd.hc, d);
    }
}

// One warp per (row, stream): both RMS scales, the normalised triple product's sum (the CPU's
// 16 double lanes and tree), the gate, then the stream's update.
__global__ void k_engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* __restrict__ kv,
                              const float* __restrict__ qk, float norm_eps) {
    grid_dependency_prologue();
    const int64_t item = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (item >= n * hc) return;
    const int64_t r = item / hc;
    const int k = int(item % hc);
    float* Hk = H + (r * hc + k) * dim;
    const float* key = kv + (r * (hc + 1) + k) * dim;
    const float* value = kv + (r * (hc + 1) + hc) * dim;
    const float sh = warp_inv_rms(Hk, dim, norm_eps, lane);
    const float sk = warp_inv_rms(key, dim, norm_eps, lane);
    const float* w = qk + k * dim;
    double acc = 0.0;
    if (lane < 16)
        for (int64_t i = lane; i < dim; i += 16) {
            const float hn = numeric::round_bf16(__fmul_rn(Hk[i], sh));
            const float kn = numeric::round_bf16(__fmul_rn(key[i], sk));
            acc = __dadd_rn(acc, double(__fmul_rn(__fmul_rn(hn, w[i]), kn)));
        }
#pragma unroll
    for (int o = 8; o >= 1; o >>= 1) {
        const double other = __shfl_down_sync(kFullMask, acc, o);
        if (lane < o) acc = __dadd_rn(acc, other);
    }
    const double dsum = __shfl_sync(kFullMask, acc, 0);
    const float inv_sqrt_dim = __fdiv_rn(1.0f, __fsqrt_rn(float(dim)));
    const float dotv = __fmul_rn(float(dsum), inv_sqrt_dim);
    const float sgn = dotv > 0 ? 1.0f : (dotv < 0 ? -1.0f : 0.0f);
    const float gate = sigmoid(__fmul_rn(sgn, __fsqrt_rn(fmaxf(fabsf(dotv), 1e-6f))));
    for (int64_t i = lane; i < dim; i += kWarp) Hk[i] = numeric::round_bf16(__fadd_rn(Hk[i], __fmul_rn(gate, value[i])));
}

}  // namespace

cudaError_t hc_mixes(cudaStream_t s, const float* H, const float* mix, int64_t n, int hc, int64_t dim,
                     const float* base, const float* scale, int iters, float hc_eps, float norm_eps, float* pre,
                     float* post, float* comb) {
    if (n == 0) return cudaSuccess;
    if (hc > kMaxHc) return cudaErrorInvalidValue;
    constexpr int rows_per_block = kRowsPerBlock;
    const dim3 grid(grid_for(n, rows_per_block)), block(rows_per_block * kWarp);
    if (hc == 4)
        return launch_kernel(s, k_hc_mixes<1, 4>, grid, block, 0, H, mix, n, hc, dim, base, scale, iters, hc_eps, norm_eps,
                             pre, post, comb);
    if (hc * hc <= kWarp)
        return launch_kernel(s, k_hc_mixes<1, 0>, grid, block, 0, H, mix, n, hc, dim, base, scale, iters, hc_eps,
                             norm_eps, pre, post, comb);
    return launch_kernel(s, k_hc_mixes<(kMaxHc * kMaxHc + kWarp - 1) / kWarp, 0>, grid, block, 0, H, mix, n, hc, dim,
                         base, scale, iters, hc_eps, norm_eps, pre, post, comb);
}

cudaError_t hc_collapse(cudaStream_t s, const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) {
    if (n * dim == 0) return cudaSuccess;
    return launch_kernel(s, k_hc_collapse, dim3(capped_grid(n * dim, kThreads)), dim3(kThreads), 0, H, n, hc, dim, p,
                         out);
}

cudaError_t hc_expand(cudaStream_t s, const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                      const float* comb, float* out) {
    if (n * dim == 0) return cudaSuccess;
    if (hc > kMaxHc) return cudaErrorInvalidValue;
    return launch_kernel(s, k_hc_expand, dim3(capped_grid(n * dim, kThreads)), dim3(kThreads), 0, f, H, n, hc, dim,
                         post, comb, out);
}

cudaError_t sum_rows(cudaStream_t s, const float* const* src, const int64_t* starts, int64_t n, int64_t dim, float* f,
                     hc_update upd) {
    if (n * dim == 0) return cudaSuccess;
    if (upd.H && upd.hc > kMaxHc) return cudaErrorInvalidValue;
    return launch_kernel(s, k_sum_rows, dim3(capped_grid(n * dim, kThreads)), dim3(kThreads), 0, src, starts, n, dim,
                         f, upd);
}

cudaError_t engram_gate(cudaStream_t s, float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                        float norm_eps) {
    if (n * hc == 0) return cudaSuccess;
    constexpr int warps = kRowsPerBlock;
    return launch_kernel(s, k_engram_gate, dim3(grid_for(n * hc, warps)), dim3(warps * kWarp), 0, H, n, hc, dim, kv,
                         qk, norm_eps);
}

}  // namespace moestream::cuda::kernels
