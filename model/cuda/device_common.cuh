// Device helpers shared by the kernels of model/cuda: warp sums in a fixed order, unaligned byte
// loads, grid sizes. Device code only (included by .cu files).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/step_recorder.h"
#include "model/numeric.h"

namespace moestream::cuda::kernels {

inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// The sum over the warp of every lane's v, by the butterfly 16, 8, 4, 2, 1 apart: the same
// operands meet in the same order whatever the data (and every lane ends with the same bits).
// The pairing is the CPU kernels' lane tree (lane k + lane k+16, then +8, +4, +2, +1).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// The CPU's sum_of_squares over x[0..n) in double (16 interleaved lanes, each in order, then the
// 8/4/2/1 tree), bit for bit, by one warp (lanes 0..15 hold the lanes); every lane gets the sum.
__device__ __forceinline__ double warp_sum_of_squares(const float* x, int64_t n, int lane) {
    double acc = 0.0;
    if (lane < 16) {
        // Eight loads in flight before their (ordered) adds: one at a time, a 4k-value row took
        // 256 memory latencies.
        int64_t i = lane;
        for (; i + 7 * 16 < n; i += 8 * 16) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = x[i + u * 16];
#pragma unroll
            for (int u = 0; u < 8; ++u) acc = __dadd_rn(acc, __dmul_rn(double(v[u]), double(v[u])));
        }
        for (; i < n; i += 16) {
            const double v = double(x[i]);
            acc = __dadd_rn(acc, __dmul_rn(v, v));
        }
    }
#pragma unroll
    for (int o = 8; o >= 1; o >>= 1) {
        const double other = __shfl_down_sync(kFullMask, acc, o);
        if (lane < o) acc = __dadd_rn(acc, other);
    }
    return __shfl_sync(kFullMask, acc, 0);
}

// The CPU's inv_rms: 1 / sqrt(float(Σx² / n) + eps), by one warp.
__device__ __forceinline__ float warp_inv_rms(const float* x, int64_t n, float eps, int lane) {
    const double ss = warp_sum_of_squares(x, n, lane);
    const float mean = __double2float_rn(__ddiv_rn(ss, double(n)));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// sigmoid as the CPU forms it, 1 / (1 + exp(-x)), with the shared exp (the CPU calls glibc's
// expf, which agrees with it but for rare last-bit cases).
__device__ __forceinline__ float sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, numeric::exp_float(-x)));
}

// Four bytes from p, at any alignment (reads the aligned words around them; allocations are
// padded so the word after the last byte can be read).
__device__ __forceinline__ uint32_t load_u32_unaligned(const uint8_t* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    const uint32_t shift = uint32_t(a & 3) * 8;
    const uint32_t lo = __ldg(w);
    if (shift == 0) return lo;
    return __funnelshift_r(lo, __ldg(w + 1), shift);
}

// N words (4N bytes) from p, at any alignment.
template <int N>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&out)[N]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    const uint32_t shift = uint32_t(a & 3) * 8;
    uint32_t raw[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) raw[i] = (i < N || shift) ? __ldg(w + i) : 0u;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = shift ? __funnelshift_r(raw[i], raw[i + 1], shift) : raw[i];
}

__device__ __forceinline__ float bf16_bits_value(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// Blocks of `threads` covering `count` items.
inline unsigned grid_for(int64_t count, int threads) {
    const int64_t g = (count + threads - 1) / threads;
    return unsigned(g < 1 ? 1 : g);
}

// Grid-stride loop over [0, count).
#define MS_GRID_LOOP(i, count)                                                                         \
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
         i += int64_t(gridDim.x) * blockDim.x)

inline constexpr unsigned kMaxGrid = 65535u * 32u;  // grid-stride kernels cap their grid here

inline unsigned capped_grid(int64_t count, int threads) {
    const unsigned g = grid_for(count, threads);
    return g < kMaxGrid ? g : kMaxGrid;
}

// Launches kernel k on s, or, while the calling thread records a step (step_recorder.h), writes
// the launch down with its parameters' values: every launcher goes through here, so a recorded
// step holds every kernel in issue order.
template <class... P, class... A>
cudaError_t launch_kernel(cudaStream_t s, void (*k)(P...), dim3 grid, dim3 block, size_t shared, A... args) {
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launched with the wrong number of arguments");
    if (step_recorder* r = step_recorder::active()) {
        r->kernel(reinterpret_cast<const void*>(k), grid, block, shared);
        (r->arg(P(args)), ...);
        return cudaSuccess;
    }
    k<<<grid, block, shared, s>>>(args...);
    return cudaGetLastError();
}

}  // namespace moestream::cuda::kernels
