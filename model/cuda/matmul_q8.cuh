// The tensor-core (mma.sync m16n8k16, fp16 in, fp32 out) matmul of dense Q8_0 weights in the
// tile layout (model/q8_0_tiles.h): the building blocks of its two kernels (matmul.cu), which
// give the same bits. Device code only.
//
// The arithmetic, a function of the job's shape, its weights and one x row alone (so a row's
// bits never depend on the batch, the kernel or the grid):
//   - the row's columns are cut in slices of 512 (q8_0_tiles::kSliceCols; the last may be
//     shorter). Per slice, x gets a power-of-two scale 2^s from the slice's own max |x| (max
//     |x| 2^s in [2^14, 2^15)) and x' = x 2^s is split into hi = fp16(x') and lo = fp16(x' - hi)
//     (22 bits; every int8 weight is an fp16, so the products are exact);
//   - per 32-block, in order: two mmas (the block's even elements, then its odd ones: the
//     fragments' k order is matmul_mma.cuh's) into a zeroed accumulator, added to the slice's
//     hi and lo sums times the block's fp16 scale (fmaf);
//   - the slice's value is (hi + lo) 2^-s; the row's value the slices' values added in order.
// The kernels differ only in who computes what: the decode kernel spreads a tile's slices over a
// block's warps and adds their values from shared memory; the prefill kernel's warps take 16 x
// rows of their own tile slice after slice. (The mma's sum of 16 products is exact-order
// hardware arithmetic of that output element's own operands only.)
//
// x in shared memory, per slice: per 32-block, per x row (nxs rows of the layout), per part (hi,
// lo), per lane quad position t, one uint4 (the four .f16x2 B registers of the block's two mmas,
// matmul_mma.cuh's order), so a lane's B registers for one n8 tile are one LDS.128.
#pragma once

#include <cuda_fp16.h>

#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"
#include "model/cuda/matmul_mma.cuh"
#include "model/q8_0_tiles.h"

namespace moestream::cuda::kernels::q8 {

inline constexpr int kWarps = 8;  // both kernels' blocks
inline constexpr int kThreads = kWarps * kWarp;
inline constexpr int kSliceBlocks = int(q8_0_tiles::kSliceCols / 32);  // 16
inline constexpr int kAhead = 2;  // units in registers ahead of the one computed, per lane
inline constexpr int kDecodeRows = 4;   // x rows of a decode group (one n8 tile: hi 0..3, lo 4..7)
inline constexpr int kPrefillRows = 16;  // x rows of a prefill group (four n8 tiles)
// uint4 of one slice's x for `rows` x rows.
constexpr int slice_x_uint4(int rows) { return kSliceBlocks * rows * 8; }

// One unit (4 blocks) of a warp's 16-row tile: lane (g, t)'s 32 bytes of strips A and B and row
// g's four scales in each.
struct unit_regs {
    uint4 a0, a1, b0, b1;
    uint2 sa, sb;
};

__device__ __forceinline__ uint2 load_stream8(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ void load_unit(unit_regs& r, const uint8_t* A, const uint8_t* B, int64_t u, int lane) {
    const int64_t at = u * q8_0_tiles::kUnitBytes;
    r.a0 = mma::load_stream16(A + at + lane * 16);
    r.a1 = mma::load_stream16(A + at + 512 + lane * 16);
    r.b0 = mma::load_stream16(B + at + lane * 16);
    r.b1 = mma::load_stream16(B + at + 512 + lane * 16);
    r.sa = load_stream8(A + at + q8_0_tiles::kUnitWeightBytes + (lane >> 2) * 8);
    r.sb = load_stream8(B + at + q8_0_tiles::kUnitWeightBytes + (lane >> 2) * 8);
}

// Int8 pairs as exact fp16: each byte (offset to unsigned) under the fp16 exponent of 1024, then
// 1024 + 128 taken away (an exact difference of exact values).
__device__ __forceinline__ uint32_t int8_pair(uint32_t biased, uint32_t selector) {
    uint32_t v = __byte_perm(biased, 0x64646464u, selector);
    __half2 h = *reinterpret_cast<__half2*>(&v);
    h = __hsub2(h, __half2half2(__ushort_as_half(0x6480u)));  // 1152
    return *reinterpret_cast<uint32_t*>(&h);
}

// Words t and t + 4 of a block as the A fragments d0..d3 of matmul_mma.cuh's order: d0 = elements
// (4t, 4t+2), d1 = (4t+16, 4t+18), d2 = (4t+1, 4t+3), d3 = (4t+17, 4t+19).
__device__ __forceinline__ void fragments(uint32_t wt, uint32_t wt4, uint32_t (&d)[4]) {
    const uint32_t a = wt ^ 0x80808080u, b = wt4 ^ 0x80808080u;
    d[0] = int8_pair(a, 0x4240u);
    d[1] = int8_pair(b, 0x4240u);
    d[2] = int8_pair(a, 0x4341u);
    d[3] = int8_pair(b, 0x4341u);
}

__device__ __forceinline__ float scale_of(uint32_t two, int second) {
    return __half2float(__ushort_as_half(uint16_t(second ? two >> 16 : two & 0xffffu)));
}

// One block (jj of the unit) of the tile against NT n8 tiles of x (the first `live` of them hold
// x rows): x of tile j at xb[xo[j]].
template <int NT>
__device__ __forceinline__ void block_products(uint32_t a_t, uint32_t a_t4, uint32_t b_t, uint32_t b_t4, float sA,
                                               float sB, const uint4* xb, const int (&xo)[NT], int live,
                                               float (&acc)[NT][4]) {
    uint32_t dA[4], dB[4];
    fragments(a_t, a_t4, dA);
    fragments(b_t, b_t4, dB);
#pragma unroll
    for (int j = 0; j < NT; ++j)
        if (j < live) mma::block_products(dA, dB, sA, sB, xb[xo[j]], acc[j]);
}

template <int NT>
__device__ __forceinline__ void unit_products(const unit_regs& c, const uint4* xb, int xblock, const int (&xo)[NT],
                                              int live, float (&acc)[NT][4]) {
    block_products<NT>(c.a0.x, c.a0.y, c.b0.x, c.b0.y, scale_of(c.sa.x, 0), scale_of(c.sb.x, 0), xb, xo, live, acc);
    block_products<NT>(c.a0.z, c.a0.w, c.b0.z, c.b0.w, scale_of(c.sa.x, 1), scale_of(c.sb.x, 1), xb + xblock, xo, live,
                       acc);
    block_products<NT>(c.a1.x, c.a1.y, c.b1.x, c.b1.y, scale_of(c.sa.y, 0), scale_of(c.sb.y, 0), xb + 2 * xblock, xo,
                       live, acc);
    block_products<NT>(c.a1.z, c.a1.w, c.b1.z, c.b1.w, scale_of(c.sa.y, 1), scale_of(c.sb.y, 1), xb + 3 * xblock, xo,
                       live, acc);
}

// The units of a warp's sequence: slice p's units [u0, u0 + n), then (next >= 0) the next
// slice's from `next`. buf holds units u0 and u0 + 1 (u0 even; loaded by the caller or the
// slice before); loads of units past the warp's sequence are skipped.
struct unit_run {
    int64_t u0, next;
    int n;
    __device__ __forceinline__ int64_t after(int64_t k) const {  // the unit k units after u0, or -1
        if (k < n) return u0 + k;
        return next >= 0 ? next + (k - n) : -1;
    }
};

// Units kAhead .. kAhead + kL2Units - 1 of a warp's sequence asked of L2 (no registers held), as
// the tiled MXFP4 kernel does with its units 2-7: issued before the kernel waits for its
// predecessor, the rest of a decode slice's weights are on their way while x is staged.
inline constexpr int kL2Units = 6;
__device__ __forceinline__ void prefetch_units_l2(const uint8_t* A, const uint8_t* B, const unit_run& run, int lane) {
#pragma unroll
    for (int k = kAhead; k < kAhead + kL2Units; ++k) {
        const int64_t u = run.after(k);
        if (u < 0) break;
        const int64_t at = u * q8_0_tiles::kUnitBytes;
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(A + at + lane * 16));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(A + at + 512 + lane * 16));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(B + at + lane * 16));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(B + at + 512 + lane * 16));
        if (lane == 0) {
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(A + at + q8_0_tiles::kUnitWeightBytes));
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(B + at + q8_0_tiles::kUnitWeightBytes));
        }
    }
}

// A slice's products into acc (zeroed here), refilling buf with the sequence's units ahead. xs:
// the slice's x (layout above, xblock uint4 a block), xo: the lane's offsets of its n8 tiles.
template <int NT>
__device__ __forceinline__ void slice_products(unit_regs (&buf)[kAhead], const uint8_t* A, const uint8_t* B,
                                               const unit_run& run, int64_t last_unit, const uint4* xs, int xblock,
                                               const int (&xo)[NT], int live, int lane, float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int k = 0; k < run.n; k += kAhead) {
#pragma unroll
        for (int i = 0; i < kAhead; ++i) {
            if (k + i >= run.n) break;
            const unit_regs c = buf[i];
            const int64_t ahead = run.after(k + i + kAhead);
            if (ahead >= 0 && ahead <= last_unit) load_unit(buf[i], A, B, ahead, lane);
            unit_products<NT>(c, xs + (k + i) * 4 * xblock, xblock, xo, live, acc);
        }
    }
}

// One slice of R x rows loaded by a warp into registers (lane l: items l and l + 32 of each row,
// an item being a block's elements 4t..4t+3 and 16+4t..16+4t+3), then stored converted. Loading
// and storing apart let a kernel's x loads fly while it computes the slice before.
template <int R>
struct slice_x {
    float v[R][2][8];
};

// Row pointers: rows[i] (null: no row). Columns [c0, c0 + 32 nb) of each.
template <int R>
__device__ __forceinline__ void load_slice_x(slice_x<R>& sx, const float* const (&rows)[R], int64_t c0, int nb,
                                             int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int item = lane + 32 * h, b = item >> 2, t = item & 3;
            const bool in = rows[r] != nullptr && b < nb;
            const float* p = in ? rows[r] + c0 + b * 32 + 4 * t : nullptr;
#pragma unroll
            for (int k = 0; k < 8; ++k) sx.v[r][h][k] = in ? __ldg(p + (k & 3) + 16 * (k >> 2)) : 0.0f;
        }
}

// The exponent s of values whose max |x| is m: max |x| 2^s in [2^14, 2^15); zeros (and inf/NaN)
// keep s = 0 (matmul_mma.cuh's stage_x: the same formula).
__device__ __forceinline__ int x_exponent(float m) { return (m > 0.0f && m <= 3.402823466e38f) ? 14 - ilogbf(m) : 0; }

// Stores the loaded rows as layout rows at[r] (of nxs; none where at[r] < 0), each scaled by
// 2^sexp[r] and split into hi and lo. The x staging of the tiled MXFP4 prefill kernel too.
template <int R>
__device__ __forceinline__ void store_slice_x_scaled(const slice_x<R>& sx, const int (&at)[R], int nxs, int nb,
                                                     uint4* xs, const int (&sexp)[R], int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int s = sexp[r];
        if (at[r] < 0) continue;
        const int s1 = s / 2, s2 = s - s1;  // |s1|, |s2| <= 82: two exact steps
        const float f1 = mma::pow2f(s1), f2 = mma::pow2f(s2);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int item = lane + 32 * h, b = item >> 2, t = item & 3;
            if (b >= nb) continue;
            __half hi[8], lo[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const float x = __fmul_rn(__fmul_rn(sx.v[r][h][k], f1), f2);
                hi[k] = __float2half_rn(x);
                lo[k] = __float2half_rn(__fsub_rn(x, __half2float(hi[k])));
            }
            const uint4 hv{mma::pack_half2(hi[0], hi[2]), mma::pack_half2(hi[4], hi[6]), mma::pack_half2(hi[1], hi[3]),
                           mma::pack_half2(hi[5], hi[7])};
            const uint4 lv{mma::pack_half2(lo[0], lo[2]), mma::pack_half2(lo[4], lo[6]), mma::pack_half2(lo[1], lo[3]),
                           mma::pack_half2(lo[5], lo[7])};
            uint4* dst = xs + ((b * nxs + at[r]) * 2) * 4 + t;
            dst[0] = hv;
            dst[4] = lv;
        }
    }
}

// The same with each row's exponent from the slice's own max |x|, returned in sexp (every lane
// the same): the Q8_0 kernels' slices.
template <int R>
__device__ __forceinline__ void store_slice_x(const slice_x<R>& sx, const int (&at)[R], int nxs, int nb, uint4* xs,
                                              int (&sexp)[R], int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float m = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(sx.v[r][h][k]));
        sexp[r] = x_exponent(warp_max(m));
    }
    store_slice_x_scaled<R>(sx, at, nxs, nb, xs, sexp, lane);
}

// Lane (g, t)'s x offsets (uint4, within a block) of its NT n8 tiles: tile j's column g is x row
// 4j + (g & 3) (past the group's nr rows: its last, computed and never stored), part g >> 2.
template <int NT>
__device__ __forceinline__ void lane_x_offsets(int nr, int lane, int (&xo)[NT]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        int r = 4 * j + (g & 3);
        r = r < nr ? r : nr - 1;
        xo[j] = (r * 2 + (g >> 2)) * 4 + t;
    }
}

// The slice's value of a tile's accumulators: hi and lo columns added (lanes t < 2 then hold x
// rows 4j + 2t, 4j + 2t + 1 of fragment rows g (v[0], v[1]) and g + 8 (v[2], v[3])), scaled back
// by 2^-s of their x rows (s_of(row)).
template <class S>
__device__ __forceinline__ void slice_value(const float (&acc)[4], int j, int lane, S s_of, float (&v)[4]) {
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = __shfl_xor_sync(kFullMask, acc[i], 2);
        const int xr = 4 * j + 2 * (t & 1) + (i & 1);
        v[i] = scalbnf(__fadd_rn(acc[i], lo), -s_of(xr));
    }
}

}  // namespace moestream::cuda::kernels::q8
