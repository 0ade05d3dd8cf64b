// Device helpers shared by the kernels of model/cuda: warp sums in a fixed order, unaligned byte
// loads, grid sizes. Device code only (included by .cu files).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/step_recorder.h"
#include "model/numeric.h"

namespace moestream::cuda {
bool programmatic_edges();  // step_graph.h
}

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

// Row r's k picks (distinct expert ids) and their weights in ascending id order, written
// transposed (sorted_picks[j * n + r]): backend::order_picks, shared by its kernel and the
// router's (route_ordered). Insertion sort: the picks are distinct, so the order is unique.
__device__ __forceinline__ void store_in_id_order(int32_t* p, float* w, int k, int64_t n, int64_t r,
                                                  int32_t* sorted_picks, float* sorted_weights) {
    for (int j = 1; j < k; ++j)
        for (int i = j; i > 0 && p[i] < p[i - 1]; --i) {
            const int32_t tp = p[i];
            p[i] = p[i - 1], p[i - 1] = tp;
            const float tw = w[i];
            w[i] = w[i - 1], w[i - 1] = tw;
        }
    for (int j = 0; j < k; ++j) sorted_picks[j * n + r] = p[j], sorted_weights[j * n + r] = w[j];
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// Σx² over x[0..n) in double by one warp; every lane gets the same sum. Element i goes to lane
// (i / 4) % 32, accumulator i % 4 (a lane's float4 loads, eight in flight), each accumulator in
// index order; then a lane's four in a fixed pair order and the lanes by a fixed tree. The CPU
// sums 16 interleaved lanes in order (a chain of n / 16 dependent double adds: ~6 us for the 4k
// values of hc_mixes on the H200); in double, the float the caller rounds the sum to is the
// CPU's unless the sum falls within ~1e-15 of a float rounding boundary, and on the GPU the
// order is always the same. Plain loads, not the read-only path: callers write the row later in
// the same kernel (the engram gate, RMSNorm in place).
__device__ __forceinline__ double warp_sum_of_squares(const float* x, int64_t n, int lane) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    const auto add = [&](float4 v) {
        acc[0] = __dadd_rn(acc[0], __dmul_rn(double(v.x), double(v.x)));
        acc[1] = __dadd_rn(acc[1], __dmul_rn(double(v.y), double(v.y)));
        acc[2] = __dadd_rn(acc[2], __dmul_rn(double(v.z), double(v.z)));
        acc[3] = __dadd_rn(acc[3], __dmul_rn(double(v.w), double(v.w)));
    };
    constexpr int kAhead = 8;
    const int64_t quads = n / 4;  // whole float4s; the tail (n % 4) below
    if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
        const float4* q = reinterpret_cast<const float4*>(x);
        int64_t i = lane;
        for (; i + (kAhead - 1) * kWarp < quads; i += kAhead * kWarp) {
            float4 v[kAhead];
#pragma unroll
            for (int a = 0; a < kAhead; ++a) v[a] = q[i + a * kWarp];
#pragma unroll
            for (int a = 0; a < kAhead; ++a) add(v[a]);
        }
        for (; i < quads; i += kWarp) add(q[i]);
    } else {
        for (int64_t i = lane; i < quads; i += kWarp) add(make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]));
    }
    if (n % 4 && lane == int(quads % kWarp)) {  // the tail continues the lane order: lane (i / 4) % 32
        const int64_t t = 4 * quads;
        add(make_float4(t < n ? x[t] : 0.0f, t + 1 < n ? x[t + 1] : 0.0f, t + 2 < n ? x[t + 2] : 0.0f, 0.0f));
    }
    double s = __dadd_rn(__dadd_rn(acc[0], acc[1]), __dadd_rn(acc[2], acc[3]));
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) s = __dadd_rn(s, __shfl_down_sync(kFullMask, s, o));
    return __shfl_sync(kFullMask, s, 0);
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

// The device's SM count (read once; launch planners size grids from it).
inline int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            v = 132;
        return v > 0 ? v : 132;
    }();
    return n;
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
    // A stream launch may begin while the kernel before it ends, as a graph's programmatic edge
    // lets it (every kernel waits for its predecessor first: grid_dependency_prologue): its launch
    // and its blocks' set-up overlap the predecessor's tail.
    if (programmatic_edges()) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = shared;
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, k, P(args)...);
    }
    k<<<grid, block, shared, s>>>(args...);
    return cudaGetLastError();
}

}  // namespace moestream::cuda::kernels
