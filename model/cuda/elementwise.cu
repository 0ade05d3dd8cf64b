// Element-wise kernels and data movement. Each formula is the CPU backend's, operation by
// operation (explicit _rn intrinsics: no contraction into fused multiply-adds, the shared exp
// and format conversions of model/numeric.h), so these kernels give the CPU's bits; the
// exceptions are RoPE's cos/sin and the exp of pool_pairs (CUDA's libm and numeric::exp_float
// where the CPU calls glibc), which may differ in the last bit.
#include "model/attention_keys.h"
#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kNormWarps = 4;  // rows (a warp each) per block of k_rms_norm

// ---- RMSNorm: the CPU's inverse RMS and scaling, bit for bit; one warp per row. ----
// y = x s (times w), rounded: a lane's elements kScaleAhead at a time, every load of a batch in
// flight before its first product. Element after element (in place, y may be x, so no load could
// pass the store before it) the weights' loads, misses of L2 each token, ran one after another:
// ~16 us a launch for 1024 columns.
__device__ __forceinline__ void scale_row(const float* xr, const float* __restrict__ w, float s, int64_t dim,
                                          bool round, float* yr, int lane) {
    constexpr int kScaleAhead = 8;
    for (int64_t base = lane; base < dim; base += kScaleAhead * kWarp) {
        float xv[kScaleAhead], wv[kScaleAhead];
#pragma unroll
        for (int k = 0; k < kScaleAhead; ++k) {
            const int64_t i = base + k * kWarp;
            xv[k] = i < dim ? xr[i] : 0.0f;
            wv[k] = w && i < dim ? __ldg(w + i) : 1.0f;
        }
#pragma unroll
        for (int k = 0; k < kScaleAhead; ++k) {
            const int64_t i = base + k * kWarp;
            if (i >= dim) break;
            float v = __fmul_rn(xv[k], s);
            if (w) v = __fmul_rn(v, wv[k]);
            yr[i] = round ? numeric::round_bf16(v) : v;
        }
    }
}

// Asks L2 for a norm's weights (read-only, never written by a kernel): before the kernel waits
// for its predecessor, so the misses pass while it runs.
__device__ __forceinline__ void prefetch_weights_l2(const float* w, int64_t dim, int lane) {
    if (!w) return;
    for (int64_t i = int64_t(lane) * 32; i < dim; i += 32 * kWarp)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w + i));
}

__global__ void k_rms_norm(const float* __restrict__ x, int64_t n, int64_t dim, const float* __restrict__ w, float eps,
                           float* y, bool round) {
    const int lane = threadIdx.x % kWarp;
    if (threadIdx.x / kWarp == 0 && blockIdx.x == 0) prefetch_weights_l2(w, dim, lane);
    grid_dependency_prologue();
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (row >= n) return;
    const float* xr = x + row * dim;
    const float s = warp_inv_rms(xr, dim, eps, lane);
    scale_row(xr, w, s, dim, round, y + row * dim, lane);
}

__global__ void k_round_bf16(float* x, int64_t count) {
    grid_dependency_prologue();
    MS_GRID_LOOP(i, count) x[i] = numeric::round_bf16(x[i]);
}

__global__ void k_scale_round(float* x, int64_t count, float s) {
    grid_dependency_prologue();
    MS_GRID_LOOP(i, count) x[i] = numeric::round_bf16(__fmul_rn(x[i], s));
}

__global__ void k_add(float* y, const float* x, int64_t count) {
    grid_dependency_prologue();
    MS_GRID_LOOP(i, count) y[i] = __fadd_rn(y[i], x[i]);
}

// ---- RoPE: pair i of every head of row r turns by fp32(pos[r]) * freqs[i]. ----
__device__ __forceinline__ void rope_pair(float* p, int64_t pos, float freq, bool inverse) {
    // The reference forms the angle in fp32: fp32(pos) * f_i, then fp32 cos/sin.
    const float theta = __fmul_rn(float(pos), freq);
    float sn, c;
    sincosf(theta, &sn, &c);
    if (inverse) sn = -sn;
    const float a = p[0], b = p[1];
    p[0] = numeric::round_bf16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
    p[1] = numeric::round_bf16(__fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c)));
}

__global__ void k_rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
                       const int64_t* __restrict__ pos, const float* __restrict__ freqs, bool inverse) {
    grid_dependency_prologue();
    const int64_t pairs = rope_dim / 2;
    MS_GRID_LOOP(t, n * n_heads * pairs) {
        const int64_t i = t % pairs, h = (t / pairs) % n_heads, r = t / (pairs * n_heads);
        rope_pair(x + r * row_stride + h * head_dim + (head_dim - rope_dim) + 2 * i, pos[r], freqs[i], inverse);
    }
}

// ---- norm_rows: each job's rows a warp each, k_rms_norm's arithmetic, then k_rope's on the row ----
__global__ void k_norm_rows(const norm_job* __restrict__ jobs, int n_jobs) {
    grid_dependency_prologue();
    int64_t row = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    int j = 0;
    for (; j < n_jobs && row >= jobs[j].n; ++j) row -= jobs[j].n;
    if (j == n_jobs) return;  // whole warps leave together
    const norm_job& jb = jobs[j];
    const float* xr = jb.x + row * jb.dim;
    float* yr = jb.y + row * jb.dim;
    const float s = warp_inv_rms(xr, jb.dim, jb.eps, lane);
    scale_row(xr, jb.w, s, jb.dim, jb.round_bf16, yr, lane);
    if (jb.rope_dim <= 0) return;
    __syncwarp();  // the row's values, written by every lane, before any pair turns
    const int64_t pairs = jb.rope_dim / 2, head_dim = jb.dim / jb.rope_heads;
    for (int64_t t = lane; t < jb.rope_heads * pairs; t += kWarp) {
        const int64_t i = t % pairs, h = t / pairs;
        rope_pair(yr + h * head_dim + (head_dim - jb.rope_dim) + 2 * i, jb.pos[row], jb.freqs[i], false);
    }
}

// ---- embedding rows ----
// Element d of a row of `type`, as the CPU's dequantize_row gives it.
__device__ __forceinline__ float element(ggml_type type, const uint8_t* row, int64_t d) {
    switch (type) {
        case ggml_type::f32: return reinterpret_cast<const float*>(row)[d];
        case ggml_type::f16: return __half2float(reinterpret_cast<const __half*>(row)[d]);
        case ggml_type::bf16: return bf16_bits_value(reinterpret_cast<const uint16_t*>(row)[d]);
        case ggml_type::q8_0: {
            const uint8_t* blk = row + (d / 32) * 34;
            const uint16_t h = uint16_t(blk[0] | (uint16_t(blk[1]) << 8));
            return __fmul_rn(float(int8_t(blk[2 + d % 32])), __half2float(__ushort_as_half(h)));
        }
        case ggml_type::mxfp4: {
            const uint8_t* blk = row + (d / 32) * 17;
            const int j = int(d % 32);
            const uint8_t q = blk[1 + (j % 16)];
            const uint8_t nib = j < 16 ? (q & 0xf) : (q >> 4);
            return __fmul_rn(float(numeric::e2m1_doubled(nib)), numeric::e8m0_half_value(blk[0]));
        }
        default: return __uint_as_float(0x7fc00000u);
    }
}

__global__ void k_embed(ggml_type type, const uint8_t* __restrict__ table, int64_t row_bytes, int64_t dim,
                        const int32_t* __restrict__ tokens, int64_t n, int copies, float* out) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n * dim) {
        const int64_t r = t / dim, d = t % dim;
        const float v = numeric::round_bf16(element(type, table + int64_t(tokens[r]) * row_bytes, d));
        for (int k = 0; k < copies; ++k) out[(r * copies + k) * dim + d] = v;
    }
}

__global__ void k_stream_mean(const float* __restrict__ H, int64_t n, int hc, int64_t dim, float* out,
                              int64_t out_stride) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n * dim) {
        const int64_t r = t / dim, d = t % dim;
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s = __fadd_rn(s, H[(r * hc + j) * dim + d]);
        out[r * out_stride + d] = numeric::round_bf16(__fdiv_rn(s, float(hc)));
    }
}

__global__ void k_copy_rows(const row_copy* __restrict__ jobs, int64_t n_jobs, int64_t count) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n_jobs * count) {
        const row_copy& j = jobs[t / count];
        j.dst[t % count] = j.src[t % count];
    }
}

__global__ void k_gather_rows(const float* __restrict__ src, int64_t src_stride, const int64_t* __restrict__ rows,
                              int64_t m, int64_t dim, float* dst) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, m * dim) dst[t] = src[rows[t / dim] * src_stride + t % dim];
}

__global__ void k_pool_pairs(const pair_pool* __restrict__ jobs, int64_t n_jobs, int64_t dim) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n_jobs * dim) {
        const pair_pool& j = jobs[t / dim];
        const int64_t ch = t % dim;
        const float z0 = j.z0[ch], z1 = j.z1[ch];
        const float m = fmaxf(z0, z1);
        const float e0 = numeric::exp_float(__fsub_rn(z0, m)), e1 = numeric::exp_float(__fsub_rn(z1, m));
        j.out[ch] = __fdiv_rn(__fadd_rn(__fmul_rn(e0, j.a0[ch]), __fmul_rn(e1, j.a1[ch])), __fadd_rn(e0, e1));
    }
}

// Key k of the launch: its job by binary search on the jobs' first keys.
__global__ void k_store_keys(const key_store* __restrict__ jobs, const int64_t* __restrict__ first_key, int64_t n_jobs,
                             int64_t total, int64_t head_dim, unsigned int* bad) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, total * head_dim) {
        const int64_t key = t / head_dim, d = t % head_dim;
        int64_t lo = 0, hi = n_jobs - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (first_key[mid] <= key) lo = mid;
            else hi = mid - 1;
        }
        const key_store& j = jobs[lo];
        const int64_t k = key - first_key[lo];
        const uint32_t u = __float_as_uint(j.src[k * head_dim + d]);
        if (u & 0xffffu) atomicAdd(bad, 1u);
        j.dst[k * head_dim + key_word(d, head_dim)] = uint16_t(u >> 16);
    }
}

__global__ void k_dequant_fp8_rows(const uint8_t* __restrict__ values, const uint8_t* __restrict__ scales, int64_t rows,
                                   int64_t n, float* out) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, rows * n) {
        const int64_t r = t / n, i = t % n;
        const float v = __fmul_rn(numeric::e4m3_value(values[t]), numeric::e8m0_value(scales[r * (n / 32) + i / 32]));
        out[t] = numeric::round_bf16(v);
    }
}

// One block per row: each thread the best of its strided share (the first of equal values), then
// a tree that keeps the lower index at ties: the first maximum, as std::max_element.
__global__ void k_argmax_rows(const float* __restrict__ x, int64_t cols, int32_t* out) {
    grid_dependency_prologue();
    __shared__ float best_v[kThreads];
    __shared__ int64_t best_i[kThreads];
    const float* xr = x + int64_t(blockIdx.x) * cols;
    float bv = -__int_as_float(0x7f800000);
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i];
        if (bi < 0 || v > bv) bv = v, bi = i;
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int w = kThreads / 2; w >= 1; w >>= 1) {
        if (int(threadIdx.x) < w) {
            const float v = best_v[threadIdx.x + w];
            const int64_t i = best_i[threadIdx.x + w];
            const int64_t mine = best_i[threadIdx.x];
            if (i >= 0 && (mine < 0 || v > best_v[threadIdx.x] || (v == best_v[threadIdx.x] && i < mine))) {
                best_v[threadIdx.x] = v;
                best_i[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = int32_t(best_i[0]);
}

__global__ void k_swiglu(float* g, const float* __restrict__ u, int64_t n, int64_t inter, float limit,
                         const float* __restrict__ w) {
    grid_dependency_prologue();
    MS_GRID_LOOP(t, n * inter) {
        const float gv = fminf(g[t], limit);
        const float uv = fminf(fmaxf(u[t], -limit), limit);
        const float e = numeric::exp_float(-gv);
        const float wr = w ? w[t / inter] : 1.0f;
        g[t] = numeric::round_bf16(__fmul_rn(wr, __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, e)), uv)));
    }
}

// ---- the reference's activation round trips (model/act_quant.cpp), one thread per block ----
__device__ __forceinline__ float pow2_ceil(float v) {
    const uint32_t u = __float_as_uint(v);
    int e = int((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) ++e;
    return numeric::pow2(e);
}

__device__ __forceinline__ float clampf(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

__global__ void k_simulate_quant(act_quant_kind kind, float* x, int64_t blocks) {
    grid_dependency_prologue();
    MS_GRID_LOOP(b, blocks) {
        if (kind == act_quant_kind::fp8_e8m0_32) {
            float* p = x + b * 32;
            float amax = 1e-4f;
            for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(p[i]));
            const float scale = pow2_ceil(__fmul_rn(amax, 1.0f / 448.0f));
            for (int i = 0; i < 32; ++i) {
                const float q = numeric::e4m3_value(numeric::e4m3_code(clampf(__fdiv_rn(p[i], scale), -448.0f, 448.0f)));
                p[i] = numeric::round_bf16(__fmul_rn(q, scale));
            }
        } else {
            const bool e4m3_scale = kind == act_quant_kind::fp4_e4m3_16;
            const int n = e4m3_scale ? 16 : 32;
            float* p = x + b * n;
            float amax = e4m3_scale ? 6.0f * numeric::pow2(-9) : 6.0f * numeric::pow2(-126);
            for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(p[i]));
            const float scale = e4m3_scale ? numeric::e4m3_value(numeric::e4m3_code(__fdiv_rn(amax, 6.0f)))
                                           : pow2_ceil(__fmul_rn(amax, 1.0f / 6.0f));
            for (int i = 0; i < n; ++i) {
                const float q = numeric::e2m1_value(numeric::e2m1_code(clampf(__fdiv_rn(p[i], scale), -6.0f, 6.0f)));
                p[i] = numeric::round_bf16(__fmul_rn(q, scale));
            }
        }
    }
}

}  // namespace

cudaError_t rms_norm(cudaStream_t s, const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                     bool round) {
    if (n == 0) return cudaSuccess;
    constexpr int rows_per_block = kNormWarps;
    return launch_kernel(s, k_rms_norm, dim3(grid_for(n, rows_per_block)), dim3(rows_per_block * kWarp), 0, x, n, dim,
                         w, eps, y, round);
}

cudaError_t norm_rows(cudaStream_t s, const norm_job* jobs, int n_jobs, int64_t rows) {
    if (rows == 0) return cudaSuccess;
    constexpr int rows_per_block = kNormWarps;
    return launch_kernel(s, k_norm_rows, dim3(grid_for(rows, rows_per_block)), dim3(rows_per_block * kWarp), 0, jobs,
                         n_jobs);
}

cudaError_t round_bf16(cudaStream_t s, float* x, int64_t count) {
    if (count == 0) return cudaSuccess;
    return launch_kernel(s, k_round_bf16, dim3(capped_grid(count, kThreads)), dim3(kThreads), 0, x, count);
}

cudaError_t scale_round(cudaStream_t s, float* x, int64_t count, float scale) {
    if (count == 0) return cudaSuccess;
    return launch_kernel(s, k_scale_round, dim3(capped_grid(count, kThreads)), dim3(kThreads), 0, x, count, scale);
}

cudaError_t add(cudaStream_t s, float* y, const float* x, int64_t count) {
    if (count == 0) return cudaSuccess;
    return launch_kernel(s, k_add, dim3(capped_grid(count, kThreads)), dim3(kThreads), 0, y, x, count);
}

cudaError_t rope(cudaStream_t s, float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim,
                 int64_t rope_dim, const int64_t* pos, const float* freqs, bool inverse) {
    const int64_t count = n * n_heads * (rope_dim / 2);
    if (count == 0) return cudaSuccess;
    return launch_kernel(s, k_rope, dim3(capped_grid(count, kThreads)), dim3(kThreads), 0, x, n, row_stride, n_heads,
                         head_dim, rope_dim, pos, freqs, inverse);
}

cudaError_t embed(cudaStream_t s, ggml_type type, const uint8_t* table, int64_t row_bytes, int64_t dim,
                  const int32_t* tokens, int64_t n, int copies, float* out) {
    if (n * dim == 0) return cudaSuccess;
    return launch_kernel(s, k_embed, dim3(capped_grid(n * dim, kThreads)), dim3(kThreads), 0, type, table, row_bytes,
                         dim, tokens, n, copies, out);
}

cudaError_t stream_mean(cudaStream_t s, const float* H, int64_t n, int hc, int64_t dim, float* out,
                        int64_t out_stride) {
    if (n * dim == 0) return cudaSuccess;
    return launch_kernel(s, k_stream_mean, dim3(capped_grid(n * dim, kThreads)), dim3(kThreads), 0, H, n, hc, dim,
                         out, out_stride);
}

cudaError_t copy_rows(cudaStream_t s, const row_copy* jobs, int64_t n_jobs, int64_t count) {
    if (n_jobs * count == 0) return cudaSuccess;
    return launch_kernel(s, k_copy_rows, dim3(capped_grid(n_jobs * count, kThreads)), dim3(kThreads), 0, jobs, n_jobs,
                         count);
}

cudaError_t gather_rows(cudaStream_t s, const float* src, int64_t src_stride, const int64_t* rows, int64_t m,
                        int64_t dim, float* dst) {
    if (m * dim == 0) return cudaSuccess;
    return launch_kernel(s, k_gather_rows, dim3(capped_grid(m * dim, kThreads)), dim3(kThreads), 0, src, src_stride,
                         rows, m, dim, dst);
}

cudaError_t pool_pairs(cudaStream_t s, const pair_pool* jobs, int64_t n_jobs, int64_t dim) {
    if (n_jobs * dim == 0) return cudaSuccess;
    return launch_kernel(s, k_pool_pairs, dim3(capped_grid(n_jobs * dim, kThreads)), dim3(kThreads), 0, jobs, n_jobs,
                         dim);
}

cudaError_t store_keys(cudaStream_t s, const key_store* jobs, const int64_t* first_key, int64_t n_jobs, int64_t total,
                       int64_t head_dim, unsigned int* bad) {
    if (total * head_dim == 0) return cudaSuccess;
    return launch_kernel(s, k_store_keys, dim3(capped_grid(total * head_dim, kThreads)), dim3(kThreads), 0, jobs,
                         first_key, n_jobs, total, head_dim, bad);
}

cudaError_t dequant_fp8_rows(cudaStream_t s, const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t n,
                             float* out) {
    if (rows * n == 0) return cudaSuccess;
    return launch_kernel(s, k_dequant_fp8_rows, dim3(capped_grid(rows * n, kThreads)), dim3(kThreads), 0, values,
                         scales, rows, n, out);
}

cudaError_t argmax_rows(cudaStream_t s, const float* x, int64_t n, int64_t cols, int32_t* out) {
    if (n == 0) return cudaSuccess;
    return launch_kernel(s, k_argmax_rows, dim3(unsigned(n)), dim3(kThreads), 0, x, cols, out);
}

cudaError_t swiglu(cudaStream_t s, float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) {
    if (n * inter == 0) return cudaSuccess;
    return launch_kernel(s, k_swiglu, dim3(capped_grid(n * inter, kThreads)), dim3(kThreads), 0, g, u, n, inter,
                         limit, w);
}

cudaError_t simulate_quant(cudaStream_t s, act_quant_kind kind, float* x, int64_t count) {
    const int64_t block = kind == act_quant_kind::fp4_e4m3_16 ? 16 : 32;
    if (count == 0) return cudaSuccess;
    if (count % block != 0) return cudaErrorInvalidValue;
    return launch_kernel(s, k_simulate_quant, dim3(capped_grid(count / block, kThreads)), dim3(kThreads), 0, kind, x,
                         count / block);
}

}  // namespace moestream::cuda::kernels
