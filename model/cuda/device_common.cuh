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

// Shared floats a warp gives warp_sum_of_squares: one chunk.
inline constexpr int kSsqChunk = 1024;  // a multiple of 16 (the lanes' order) and of 128 (32 lanes x float4)
inline constexpr int kSsqStageFloats = kSsqChunk;

// The CPU's sum_of_squares over x[0..n) in double (16 interleaved lanes, each in order, then the
// 8/4/2/1 tree), bit for bit, by one warp (lanes 0..15 hold the lanes); every lane gets the sum.
// The whole warp loads the row a chunk at a time (float4 loads where aligned: a chunk's loads all
// in flight at once, the next chunk's while lanes 0..15 add this one from `stage`, kSsqStageFloats
// of the warp's shared memory). Read by the 16 adding lanes themselves, eight loads in flight, a
// 4k-value row (hc_mixes) took ~16 us: 32 memory latencies in a row. Plain loads, not the
// read-only path: callers write the row later in the same kernel (the engram gate, RMSNorm in place).
__device__ __forceinline__ double warp_sum_of_squares(const float* x, int64_t n, int lane, float* stage) {
    constexpr int kPer = kSsqChunk / 128;  // float4 a lane loads per chunk
    const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    const int64_t chunks = (n + kSsqChunk - 1) / kSsqChunk;
    float4 next[kPer];
    const auto load = [&](int64_t c) {
        const int64_t base = c * kSsqChunk;
        const int64_t m = n - base < kSsqChunk ? n - base : kSsqChunk;
        if (vec && m == kSsqChunk) {
#pragma unroll
            for (int j = 0; j < kPer; ++j) next[j] = reinterpret_cast<const float4*>(x + base)[lane + kWarp * j];
        } else {
            const auto at = [&](int64_t i) { return i < m ? x[base + i] : 0.0f; };
#pragma unroll
            for (int j = 0; j < kPer; ++j) {
                const int64_t i = 4 * (lane + int64_t(kWarp) * j);
                next[j] = make_float4(at(i), at(i + 1), at(i + 2), at(i + 3));
            }
        }
    };
    if (chunks > 0) load(0);
    double acc = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
        __syncwarp();  // the stage's previous contents have been added
#pragma unroll
        for (int j = 0; j < kPer; ++j) reinterpret_cast<float4*>(stage)[lane + kWarp * j] = next[j];
        __syncwarp();
        if (c + 1 < chunks) load(c + 1);  // in flight while this chunk is added
        const int64_t m = n - c * kSsqChunk < kSsqChunk ? n - c * kSsqChunk : kSsqChunk;
        if (lane < 16)
            for (int64_t i = lane; i < m; i += 16) {  // chunks start at multiples of 16: lane i % 16 of the CPU
                const double v = double(stage[i]);
                acc = __dadd_rn(acc, __dmul_rn(v, v));
            }
    }
    __syncwarp();  // the stage is free again for the caller's next use
#pragma unroll
    for (int o = 8; o >= 1; o >>= 1) {
        const double other = __shfl_down_sync(kFullMask, acc, o);
        if (lane < o) acc = __dadd_rn(acc, other);
    }
    return __shfl_sync(kFullMask, acc, 0);
}

// The CPU's inv_rms: 1 / sqrt(float(Σx² / n) + eps), by one warp.
__device__ __forceinline__ float warp_inv_rms(const float* x, int64_t n, float eps, int lane, float* stage) {
    const double ss = warp_sum_of_squares(x, n, lane, stage);
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

// Every kernel's first statement. Kernel nodes of a step graph follow each other through
// programmatic edges (step_graph.cpp), so a kernel's blocks may be scheduled while the kernel
// before it still runs, which hides the launch latency between the two (~1,200 dependent kernels
// a decode step): wait holds until that kernel has completed and its writes are visible, before
// this one touches any memory (the previous kernels' too: each of them waited for its own
// predecessor); launch_dependents then lets the next kernel be scheduled. Both are no-ops for a
// kernel launched without a programmatic dependency (streams, the other graph edges).
__device__ __forceinline__ void grid_dependency_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

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
