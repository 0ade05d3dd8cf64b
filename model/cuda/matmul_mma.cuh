// The tensor-core (mma.sync m16n8k16, fp16 in, fp32 out) matmul of MXFP4 weights, included by
// matmul.cu (its launcher and planner live there). Device code only.
//
// A thread block of kMmaWarps warps takes one job, one group of up to 4 x rows and up to
// kMmaWarps tiles of 16 weight rows (a SwiGLU pair's tile: 8 gate rows in the fragment's rows
// 0-7, the same 8 up rows in 8-15); each warp computes one tile over the whole row, so a value
// never depends on which block or warp computed it.
//
// x. Each x row r gets a power-of-two scale 2^s_r from its own max |x| (max |x| 2^s_r in
// [2^14, 2^15)), and x' = x 2^s_r is split into hi = fp16(x') and lo = fp16(x' - hi) (x' - hi
// is exact in fp32; hi + lo carries 22 bits, bf16 x is exact in hi). hi goes in the mma's
// column r, lo in column 4 + r; y = (acc_hi + acc_lo) 2^(14 - s_r). Columns of x rows past the
// group's end hold copies of its last row and are never written: a column's sums depend only
// on its own B values. The group's x rows sit in shared memory already in the B fragments'
// order: per 32-block, per x row, per part (hi, lo), per lane quad position t one uint4 (the
// four .f16x2 B registers of the block's two mmas), so a lane's B registers are one LDS.128.
//
// Weights. A 32-block of 17 bytes (e8m0 exponent e, 16 bytes qs). Fragment lane (g, t) takes
// qs word t (bytes 4t..4t+3: elements 4t..4t+3 in the low nibbles, 4t+16..4t+19 in the high
// ones) of its two rows g and g + 8 and decodes it into four .f16x2 registers without
// conversions (decode_word: 11 operations): the nibbles i and i + 4 of the word land in the low
// and high halves, the 3 magnitude bits at fp16 bits 11:9 and the sign at bit 15, which is the
// e2m1 value times 2^-14 exactly (0.5 becomes an fp16 subnormal):
//   D0 = elements (4t, 4t+2), D1 = (4t+16, 4t+18), D2 = (4t+1, 4t+3), D3 = (4t+17, 4t+19).
// The first mma takes A = {D0(g), D0(g+8), D1(g), D1(g+8)}, so its k slots 2t, 2t+1, 2t+8,
// 2t+9 hold the elements 4t, 4t+2, 4t+16, 4t+18 (every even element of the block over the
// four t); the second takes D2, D3 (the odd elements). The x side is packed with the same
// permutation. Per block the two mmas run into a zeroed accumulator, which is then added to
// the row's fp32 accumulator times the block scale 2^(e-127) (exact: e << 23; the 2^14 of the
// decoding is folded into the final 2^(14 - s_r)), in block order: the summation order is
// fixed by cols alone.
//
// Loads. A warp streams its 16 rows through a ring of stages in shared memory by cp.async
// (16-byte pieces from the 16-byte boundary at or below the stage's first byte): 3 stages of 8
// blocks (136 bytes, a 160-byte window), or for long rows whose x leaves room 2 stages of 16
// blocks (272 bytes, 288): a row's longer runs read at once took flash's gate+up pairs up by
// 5-15% at batch 1 and 6-7% at batch 2 in a lab kernel of the same arithmetic (three runs; in
// this kernel 0.45 -> 0.47); deeper rings, per-row bulk copies (TMA) and L2 bulk prefetches
// measured slower (docs/benchmarks.md, seventh H200 session). The block offsets
// within a stage are known mod 4 at compile time, so a lane's qs word is one or two LDS.32 and a
// constant funnel shift, its scale one LDS.U8.
#pragma once

#include <cuda_fp16.h>

#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"
#include "model/cuda/mma_common.cuh"
#include "model/mxfp4_tiles.h"

namespace moestream::cuda::kernels::mma {

inline constexpr int kMmaWarps = 16;
inline constexpr int kMmaThreads = kMmaWarps * kWarp;
inline constexpr int kMmaGroupRows = 4;      // x rows per group (mma columns: hi 0..3, lo 4..7)
inline constexpr size_t kXBudget = 96000;    // shared bytes for a group's x (16 per column at 4 rows)
inline constexpr size_t kMmaSharedMax = 231168;  // dynamic shared bytes of a block, at most

// A ring's shape: SB 32-blocks a stage (8 or 16), its depth, the 16-byte pieces a stage copies
// per row (the 16-byte boundary at or below its first byte to past its last), the shared pitch
// of a row (pieces + 1, which keeps the fragment's LDS.32 conflict-free: 44 or 76 words), the
// pieces a lane copies.
template <int SB>
struct ring_shape {
    static_assert(SB == 8 || SB == 16);
    static constexpr int blocks = SB;
    static constexpr int stages = SB == 8 ? 3 : 2;
    static constexpr int pieces = (SB * 17 + 30) / 16;
    static constexpr int pitch = pieces * 16 + 16;
    static constexpr int stage_bytes = 16 * pitch;
    static constexpr int per_lane = 16 * pieces / 32;
    static constexpr size_t staging = size_t(kMmaWarps) * stages * stage_bytes;
};
static_assert(ring_shape<8>::per_lane == 5 && ring_shape<16>::per_lane == 9);

static_assert(mxfp4_tiles::kMaxCols * 4 <= int64_t(kXBudget), "a tileable row's x must fit the mma kernel's budget");

// x rows per group for rows of `cols` columns (0: the shape is not for the mma kernel).
constexpr int mma_group_rows(int64_t cols) {
    if (cols <= 0 || cols % 128 != 0) return 0;
    const int64_t fit = int64_t(kXBudget) / (cols * 4);
    return int(fit < kMmaGroupRows ? fit : kMmaGroupRows);
}
// Shared bytes of a group's x (blocks x rows x 128).
constexpr size_t mma_x_bytes(int64_t cols, int64_t n) {
    const int g = mma_group_rows(cols);
    const int64_t rows = n < g ? n : g;
    return size_t((cols / 32) * rows * 128);
}
// Whether a job streams its rows through wide stages: rows of 128 blocks or more (shorter ones
// measured no gain) whose x leaves the wide rings room.
constexpr bool mma_wide_stages(int64_t cols, int64_t n) {
    return cols / 32 >= 128 && mma_x_bytes(cols, n) + ring_shape<16>::staging <= kMmaSharedMax;
}
// Shared bytes of a block: the group's x, after which the stage rings.
constexpr size_t mma_shared_bytes(int64_t cols, int64_t n) {
    return mma_x_bytes(cols, n) + (mma_wide_stages(cols, n) ? ring_shape<16>::staging : ring_shape<8>::staging);
}

// The eight e2m1 values of qs word q as four .f16x2 registers, each value times 2^-14, in 11
// operations: first every byte's low nibble (L) and high nibble (H) in the form of an fp16 high
// byte (sign at bit 7, magnitude at bits 3:1: 2^-14 times the value), each one mask, two shifts
// and one lop3 (the shifted copies meet only at bits the final mask clears); then bytes 1 and 3
// of L and H are the registers of the odd bytes' nibbles as they stand, and one byte permutation
// moves bytes 0 and 2 up for the even ones.
// (a | b) & c in one lop3 (written out: the compiler otherwise splits the masks apart again).
__device__ __forceinline__ uint32_t or_and(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xA8;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
__device__ __forceinline__ uint32_t and_mask(uint32_t a, uint32_t m) {
    uint32_t r;
    asm("and.b32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(m));
    return r;
}
__device__ __forceinline__ void decode_word(uint32_t q, uint32_t (&d)[4]) {
    const uint32_t lo = and_mask(q, 0x0F0F0F0Fu), hi = and_mask(q, 0xF0F0F0F0u);
    const uint32_t L = or_and(lo << 1, lo << 4, 0x8E8E8E8Eu);
    const uint32_t H = or_and(hi, hi >> 3, 0x8E8E8E8Eu);
    d[0] = __byte_perm(L, 0u, 0x2404u);  // nibbles 0, 4: elements 4t, 4t+2
    d[1] = __byte_perm(H, 0u, 0x2404u);  // nibbles 1, 5: elements 4t+16, 4t+18
    d[2] = L & 0xFF00FF00u;              // nibbles 2, 6: elements 4t+1, 4t+3
    d[3] = H & 0xFF00FF00u;              // nibbles 3, 7: elements 4t+17, 4t+19
}

// One 32-block of a warp's 16-row tile: rows A's and B's fragments (dA, dB: d0..d3 as
// decode_word gives them) times the block's x fragments, two mmas into a zeroed accumulator,
// then added to the rows' accumulators times the block scales (sA, sB), in block order.
__device__ __forceinline__ void block_products(const uint32_t (&dA)[4], const uint32_t (&dB)[4], float sA, float sB,
                                               const uint4 xv, float (&acc)[4]) {
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a0[4] = {dA[0], dB[0], dA[1], dB[1]};
    const uint32_t a1[4] = {dA[2], dB[2], dA[3], dB[3]};
    float d[4];
    mma_16816(d, a0, xv.x, xv.y, zero);
    mma_16816(d, a1, xv.z, xv.w, d);
    acc[0] = __fmaf_rn(sA, d[0], acc[0]);
    acc[1] = __fmaf_rn(sA, d[1], acc[1]);
    acc[2] = __fmaf_rn(sB, d[2], acc[2]);
    acc[3] = __fmaf_rn(sB, d[3], acc[3]);
}

__device__ __forceinline__ uint32_t pack_half2(__half lo, __half hi) {
    return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}

__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }  // |e| <= 126

// Stages the group's x rows [r0, r0 + nr) of the job in `xs` (layout above) and their scale
// exponents in `sexp`. Every thread of the block (kWarps warps; red: kWarps rows) takes part
// (ends with a barrier).
template <int kWarps = kMmaWarps>
__device__ __forceinline__ void stage_x(const mm_job& jb, int64_t r0, int nr, uint4* xs, int* sexp,
                                        float (*red)[kMmaGroupRows]) {
    constexpr int kBlockThreads = kWarps * kWarp;
    const int tid = int(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
    // Read-only loads (x is not written in this kernel), unrolled, so that a thread's loads are in
    // flight together: at 4 rows of 5120 columns the loads one after the other cost ~3 us.
    const float* __restrict__ xrow[kMmaGroupRows];
#pragma unroll
    for (int r = 0; r < kMmaGroupRows; ++r) xrow[r] = jb.x + (r0 + (r < nr ? r : 0)) * jb.x_stride;
    float m[kMmaGroupRows] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int cols = int(jb.cols);
#pragma unroll 4
    for (int e = tid; e < cols; e += kBlockThreads)
#pragma unroll
        for (int r = 0; r < kMmaGroupRows; ++r)
            if (r < nr) m[r] = fmaxf(m[r], fabsf(__ldg(xrow[r] + e)));
#pragma unroll
    for (int r = 0; r < kMmaGroupRows; ++r) m[r] = warp_max(m[r]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < kMmaGroupRows; ++r) red[warp][r] = m[r];
    __syncthreads();
    if (tid < kMmaGroupRows) {
        float mx = 0.0f;
        for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red[w][tid]);
        // max |x| 2^s in [2^14, 2^15); zeros (and inf/NaN rows) keep s = 0.
        sexp[tid] = (mx > 0.0f && mx <= 3.402823466e38f) ? 14 - ilogbf(mx) : 0;
    }
    __syncthreads();
    const int blocks = int(jb.cols / 32);
    const int items = blocks * nr * 4;
    // An item: x row r's elements 4t..4t+3 and 16+4t..16+4t+3 of block b, as its hi and lo
    // halves; kItemsAhead items' values loaded before the first is converted.
    constexpr int kItemsAhead = 4;
    for (int i0 = tid; i0 < items; i0 += kItemsAhead * kBlockThreads) {
        float v[kItemsAhead][8];
#pragma unroll
        for (int a = 0; a < kItemsAhead; ++a) {
            const int i = i0 + a * kBlockThreads < items ? i0 + a * kBlockThreads : i0;
            const int t = i & 3, br = i >> 2, r = br % nr, b = br / nr;
            const float* p = jb.x + (r0 + r) * jb.x_stride + b * 32 + 4 * t;
#pragma unroll
            for (int k = 0; k < 8; ++k) v[a][k] = __ldg(p + (k & 3) + 16 * (k >> 2));
        }
#pragma unroll
        for (int a = 0; a < kItemsAhead; ++a) {
            const int i = i0 + a * kBlockThreads;
            if (i >= items) break;
            const int t = i & 3, br = i >> 2, r = br % nr, b = br / nr;
            const int s = sexp[r];
            const int s1 = s / 2, s2 = s - s1;  // |s1|, |s2| <= 82: two exact steps
            const float f1 = pow2f(s1), f2 = pow2f(s2);
            __half hi[8], lo[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const float x = __fmul_rn(__fmul_rn(v[a][k], f1), f2);
                hi[k] = __float2half_rn(x);
                lo[k] = __float2half_rn(__fsub_rn(x, __half2float(hi[k])));
            }
            // k: 0..3 = x[4t..4t+3], 4..7 = x[16+4t..16+4t+3].
            const uint4 h{pack_half2(hi[0], hi[2]), pack_half2(hi[4], hi[6]), pack_half2(hi[1], hi[3]),
                          pack_half2(hi[5], hi[7])};
            const uint4 l{pack_half2(lo[0], lo[2]), pack_half2(lo[4], lo[6]), pack_half2(lo[1], lo[3]),
                          pack_half2(lo[5], lo[7])};
            uint4* dst = xs + ((int64_t(b) * nr + r) * 2) * 4 + t;
            dst[0] = h;
            dst[4] = l;
        }
    }
    __syncthreads();
}

// Copies stage `s` (blocks SB s .. SB s + SB - 1) of the warp's 16 rows into `buf`: lane l
// copies the pieces l + 32j (row (l + 32j) / pieces, piece (l + 32j) % pieces). `last`: copy
// only the pieces that hold the row's bytes (the row's end may be the allocation's).
template <class R>
__device__ __forceinline__ void issue_stage(const uint8_t* const (&src)[R::per_lane], const int (&dst)[R::per_lane],
                                            uint32_t buf, int s, int bytes, bool last) {
#pragma unroll
    for (int j = 0; j < R::per_lane; ++j) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(src[j] + int64_t(s) * (R::blocks * 17));
        const int piece = dst[j] % R::pitch;
        const int delta = int(a & 15);
        const uint8_t* p = reinterpret_cast<const uint8_t*>(a & ~uintptr_t(15)) + piece;
        if (!last || piece < delta + bytes) cp_async16(buf + uint32_t(dst[j]), p);
    }
}


// The first R::stages - 1 stages of a warp's tile, issued before the block stages x (the
// weights do not depend on it); compute_tile issues the rest.
template <class R>
__device__ __forceinline__ void prefetch_tile(const uint8_t* const (&src)[R::per_lane], const int (&dst)[R::per_lane],
                                              int64_t blocks, uint8_t* ring) {
    const uint32_t ring_addr = smem_addr(ring);
    const int stages = int((blocks + R::blocks - 1) / R::blocks);
    const int last_bytes = int(blocks - int64_t(stages - 1) * R::blocks) * 17;
#pragma unroll
    for (int s = 0; s < R::stages - 1; ++s) {
        if (s < stages)
            issue_stage<R>(src, dst, ring_addr + uint32_t(s * R::stage_bytes), s,
                           s == stages - 1 ? last_bytes : R::blocks * 17, s == stages - 1);
        cp_async_commit();
    }
}

// One warp's tile over the whole row (after prefetch_tile): rows A (fragment row g) and B (g + 8) of lane (g, t) at
// rowA, rowB; the stage sources of its copies in src/dst. Returns the accumulators c0..c3
// (row A x columns 2t, 2t+1; row B x columns 2t, 2t+1) of the hi columns with the lo columns
// added (lanes t < 2: x rows 2t, 2t+1; lanes t >= 2 return garbage). NR: the group's x rows
// (a template argument, so that the x offsets are immediates).
template <class R, int NR>
__device__ __forceinline__ void compute_tile(const uint8_t* rowA, const uint8_t* rowB,
                                             const uint8_t* const (&src)[R::per_lane], const int (&dst)[R::per_lane],
                                             int64_t blocks, const uint4* xs, uint8_t* ring,
                                             int lane, float (&out)[4]) {
    constexpr int nr = NR;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t ring_addr = smem_addr(ring);
    const int stages = int((blocks + R::blocks - 1) / R::blocks);
    const int last_bytes = int(blocks - int64_t(stages - 1) * R::blocks) * 17;
    // This lane's B column: x row r (a copy of the group's last row past its end), part p.
    const int col = g, xr = (col & 3) < nr ? (col & 3) : nr - 1, part = col >> 2;
    const uint4* xl = xs + (xr * 2 + part) * 4 + t;
    constexpr int xstride = nr * 8;  // uint4 per block
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int slot = 0;  // the ring slot of stage s
    for (int s = 0; s < stages; ++s) {
        {
            const int sn = s + R::stages - 1;
            const int slot_n = slot == 0 ? R::stages - 1 : slot - 1;  // (s + R::stages - 1) % R::stages
            if (sn < stages)
                issue_stage<R>(src, dst, ring_addr + uint32_t(slot_n * R::stage_bytes), sn,
                               sn == stages - 1 ? last_bytes : R::blocks * 17,
                            sn == stages - 1);
            cp_async_commit();
        }
        cp_async_wait<R::stages - 1>();
        __syncwarp();
        const uint8_t* buf = ring + slot * R::stage_bytes;
        slot = slot == R::stages - 1 ? 0 : slot + 1;
        const int dA = int((reinterpret_cast<uintptr_t>(rowA) + uintptr_t(s) * (R::blocks * 17)) & 15);
        const int dB = int((reinterpret_cast<uintptr_t>(rowB) + uintptr_t(s) * (R::blocks * 17)) & 15);
        const uint8_t* bA = buf + g * R::pitch + dA;
        const uint8_t* bB = buf + (g + 8) * R::pitch + dB;
        const uint8_t* qA = bA + 4 * t;
        const uint8_t* qB = bB + 4 * t;
        const uint4* xb = xl + int64_t(s) * R::blocks * xstride;
        const int spans = s == stages - 1 ? last_bytes / (17 * 4) : R::blocks / 4;
#pragma unroll
        for (int sp = 0; sp < R::blocks / 4; ++sp) {
            if (sp >= spans) break;
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = sp * 4 + jj;
                // qs word t of block j: bytes 17j + 1 + 4t .. of the stage's data (4-aligned start).
                const int mis = (j + 1) & 3;
                const int off = 17 * j + 1 - mis;
                uint32_t wA, wB;
                if (mis == 0) {
                    wA = *reinterpret_cast<const uint32_t*>(qA + off);
                    wB = *reinterpret_cast<const uint32_t*>(qB + off);
                } else {
                    wA = __funnelshift_r(*reinterpret_cast<const uint32_t*>(qA + off),
                                         *reinterpret_cast<const uint32_t*>(qA + off + 4), 8 * mis);
                    wB = __funnelshift_r(*reinterpret_cast<const uint32_t*>(qB + off),
                                         *reinterpret_cast<const uint32_t*>(qB + off + 4), 8 * mis);
                }
                const float sA = __uint_as_float(uint32_t(bA[17 * j]) << 23);
                const float sB = __uint_as_float(uint32_t(bB[17 * j]) << 23);
                uint32_t dAw[4], dBw[4];
                decode_word(wA, dAw);
                decode_word(wB, dBw);
                block_products(dAw, dBw, sA, sB, xb[j * xstride], acc);
            }
        }
        __syncwarp();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = __shfl_xor_sync(kFullMask, acc[i], 2);
        out[i] = __fadd_rn(acc[i], lo);
    }
}

// ---- tiled weights (model/mxfp4_tiles.h) ----
// The same products as compute_tile, from tiled strips: lane (g, t) loads its 16 bytes of a
// unit of rows A (g) and B (g + 8) straight into registers (a unit: 4 blocks), kTileAhead units
// ahead of the one it computes, and decodes them with fragments_of_tiled. The fragments, the two mmas
// per block into a zeroed accumulator and the scaled adds in block order are compute_tile's, so
// a row's bits are the rows kernel's.
inline constexpr int kTileAhead = 2;  // units in flight per lane (3 and 4 measured no faster)

struct tile_unit_regs {
    uint4 a, b;        // tiled words of the unit's 4 blocks, rows A and B
    uint32_t sa, sb;   // their 4 scales
};

__device__ __forceinline__ uint4 load_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t load_stream4(const void* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}

// Unit u of the strips at A and B (unit u's bytes at u * kUnitBytes).
__device__ __forceinline__ void load_tile_unit(tile_unit_regs& r, const uint8_t* A, const uint8_t* B, int64_t u,
                                               int lane) {
    const int64_t at = u * mxfp4_tiles::kUnitBytes;
    r.a = load_stream16(A + at + lane * 16);
    r.b = load_stream16(B + at + lane * 16);
    r.sa = load_stream4(A + at + mxfp4_tiles::kUnitWeightBytes + (lane >> 2) * 4);
    r.sb = load_stream4(B + at + mxfp4_tiles::kUnitWeightBytes + (lane >> 2) * 4);
}

// The first kTileAhead units of a warp's tile (weights only: may run before the kernel's
// predecessor has finished).
__device__ __forceinline__ void prefetch_tiles(tile_unit_regs (&buf)[kTileAhead], const uint8_t* A, const uint8_t* B,
                                               int64_t units, int lane) {
#pragma unroll
    for (int i = 0; i < kTileAhead; ++i) load_tile_unit(buf[i], A, B, i < units ? i : units - 1, lane);
}

// Units kTileAhead .. kTileL2Units - 1 of a warp's tile asked of L2 (no registers held): with the
// registers' units, the first ~8 KB of a warp's weights are on their way while the block stages
// x (measured: +2-5% on flash's experts; 16 units ahead was slower).
inline constexpr int kTileL2Units = 8;
__device__ __forceinline__ void prefetch_tiles_l2(const uint8_t* A, const uint8_t* B, int64_t units, int lane) {
    for (int64_t u = kTileAhead; u < kTileL2Units && u < units; ++u) {
        const int64_t at = u * mxfp4_tiles::kUnitBytes;
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(A + at + lane * 16));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(B + at + lane * 16));
        if (lane == 0) {
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(A + at + mxfp4_tiles::kUnitWeightBytes));
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(B + at + mxfp4_tiles::kUnitWeightBytes));
        }
    }
}

__device__ __forceinline__ float block_scale(uint32_t s4, int jj) {
    return __uint_as_float(((s4 >> (8 * jj)) & 0xFFu) << 23);
}

__device__ __forceinline__ void tile_block(uint32_t wA, uint32_t wB, float sA, float sB, const uint4 xv,
                                           float (&acc)[4]) {
    const auto fA = mxfp4_tiles::fragments_of_tiled(wA), fB = mxfp4_tiles::fragments_of_tiled(wB);
    block_products(fA.d, fB.d, sA, sB, xv, acc);
}

template <int NR>
__device__ __forceinline__ void tile_unit_products(const tile_unit_regs& c, const uint4* xb, float (&acc)[4]) {
    constexpr int xstride = NR * 8;  // uint4 per block
    tile_block(c.a.x, c.b.x, block_scale(c.sa, 0), block_scale(c.sb, 0), xb[0], acc);
    tile_block(c.a.y, c.b.y, block_scale(c.sa, 1), block_scale(c.sb, 1), xb[xstride], acc);
    tile_block(c.a.z, c.b.z, block_scale(c.sa, 2), block_scale(c.sb, 2), xb[2 * xstride], acc);
    tile_block(c.a.w, c.b.w, block_scale(c.sa, 3), block_scale(c.sb, 3), xb[3 * xstride], acc);
}

// One warp's tile over the whole row from tiled strips A and B (after prefetch_tiles into buf).
// Returns what compute_tile returns.
template <int NR>
__device__ __forceinline__ void compute_tiles(tile_unit_regs (&buf)[kTileAhead], const uint8_t* A, const uint8_t* B,
                                              int64_t units, const uint4* xs, int lane, float (&out)[4]) {
    constexpr int nr = NR;
    const int g = lane >> 2, t = lane & 3;
    const int col = g, xr = (col & 3) < nr ? (col & 3) : nr - 1, part = col >> 2;
    const uint4* xl = xs + (xr * 2 + part) * 4 + t;
    constexpr int64_t xunit = int64_t(nr) * 8 * mxfp4_tiles::kUnitBlocks;  // uint4 per unit
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t u = 0;
    for (; u + kTileAhead <= units; u += kTileAhead) {
#pragma unroll
        for (int i = 0; i < kTileAhead; ++i) {
            const tile_unit_regs c = buf[i];
            const int64_t next = u + i + kTileAhead < units ? u + i + kTileAhead : units - 1;
            load_tile_unit(buf[i], A, B, next, lane);
            tile_unit_products<nr>(c, xl + (u + i) * xunit, acc);
        }
    }
#pragma unroll
    for (int i = 0; i < kTileAhead; ++i)
        if (u + i < units) tile_unit_products<nr>(buf[i], xl + (u + i) * xunit, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = __shfl_xor_sync(kFullMask, acc[i], 2);
        out[i] = __fadd_rn(acc[i], lo);
    }
}

}  // namespace moestream::cuda::kernels::mma
