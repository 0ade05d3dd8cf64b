// The MXFP4 tile layout: how the CUDA backend regroups an MXFP4 matrix's bytes in its expert
// slots so that its tensor-core matmul (model/cuda/matmul_mma.cuh) reads each lane's weights
// with one 16-byte load and decodes them in fewer operations. Host and device (MS_HD) code, so
// the tiler kernel, the matmul and the CPU-side tests share every formula.
//
// A matrix of `rows` (a multiple of 8) by `cols` (a multiple of 128) keeps its bytes per strip
// of 8 rows: strip s occupies the same byte range as its 8 ggml rows (8 x cols/32 x 17 bytes),
// so a strip is tiled in place. A strip is cols/128 units of 4 32-blocks, 544 bytes each:
//   bytes 0..511: for fragment row g (0..7) and lane quad position t (0..3), 16 bytes at
//     (4g + t) * 16: the tiled words (below) of qs word t of the unit's 4 blocks of row g;
//   bytes 512..543: the e8m0 scales, row g's four at 512 + 4g.
// Lane (g, t) of a warp computing rows g and g + 8 of a 16-row tile thus loads its 16 bytes of
// a row with one aligned load, and the warp's 32 loads are 512 consecutive bytes.
//
// The tiled word. The rows kernel decodes qs word q (elements 4t..4t+3 in the low nibbles,
// 4t+16..4t+19 in the high ones) into four .f16x2 A fragments d0..d3 (fragments_of_word: each
// e2m1 value times 2^-14, its 3 magnitude bits at fp16 bits 11:9 and sign at 15: every set bit
// of a fragment lies in kFragmentMask) in 11 operations. The tiled word w holds the same 32 bits
// placed so that
//   d0 = w & M, d1 = (w << 8) & M, d2 = brev(w) & M, d3 = (brev(w) << 8) & M   (M = kFragmentMask)
// (7 operations): the four preimages M, M - 8, 31 - M and 39 - M partition the word's bits. The
// fragments, hence the products and every output bit, are the rows kernel's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/numeric.h"

namespace moestream::mxfp4_tiles {

inline constexpr int64_t kStripRows = 8;
inline constexpr int64_t kUnitBlocks = 4;
inline constexpr int64_t kUnitBytes = 544;
inline constexpr int64_t kUnitWeightBytes = 512;
// The widest rows tiled: the matmul stages at least one x row of them in shared memory (96,000
// bytes, 4 a column: matmul_mma.cuh's kXBudget) and the tiler a whole strip (8 x cols/32 x 17
// bytes); the largest multiple of 128 within both.
inline constexpr int64_t kMaxCols = 23936;
inline constexpr uint32_t kFragmentMask = 0x8E008E00u;

MS_HD uint32_t bit_reverse(uint32_t v) {
#if defined(__CUDA_ARCH__)
    return __brev(v);
#else
    v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
    v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
    v = ((v >> 4) & 0x0F0F0F0Fu) | ((v & 0x0F0F0F0Fu) << 4);
    v = ((v >> 8) & 0x00FF00FFu) | ((v & 0x00FF00FFu) << 8);
    return (v >> 16) | (v << 16);
#endif
}

// The rows kernel's fragments of qs word q: d0 = elements (4t, 4t+2), d1 = (4t+16, 4t+18),
// d2 = (4t+1, 4t+3), d3 = (4t+17, 4t+19), in the low and high halves.
struct fragments {
    uint32_t d[4];
};
MS_HD fragments fragments_of_word(uint32_t q) {
    const uint32_t lo = q & 0x0F0F0F0Fu, hi = q & 0xF0F0F0F0u;
    const uint32_t L = ((lo << 1) | (lo << 4)) & 0x8E8E8E8Eu;
    const uint32_t H = (hi | (hi >> 3)) & 0x8E8E8E8Eu;
    return {{(L << 8) & 0xFF00FF00u, (H << 8) & 0xFF00FF00u, L & 0xFF00FF00u, H & 0xFF00FF00u}};
}

MS_HD uint32_t tiled_word(uint32_t q) {
    const fragments f = fragments_of_word(q);
    return f.d[0] | (f.d[1] >> 8) | bit_reverse(f.d[2]) | bit_reverse(f.d[3] >> 8);
}

MS_HD fragments fragments_of_tiled(uint32_t w) {
    const uint32_t r = bit_reverse(w);
    return {{w & kFragmentMask, (w << 8) & kFragmentMask, r & kFragmentMask, (r << 8) & kFragmentMask}};
}

MS_HD int64_t strip_bytes(int64_t cols) { return kStripRows * (cols / 32) * 17; }

// Whether a matrix of this shape and row stride can be tiled (MXFP4 is the caller's check).
MS_HD bool tileable(int64_t rows, int64_t cols, int64_t row_stride) {
    return rows > 0 && rows % kStripRows == 0 && cols > 0 && cols % (32 * kUnitBlocks) == 0 && cols <= kMaxCols &&
           row_stride == cols / 32 * 17;
}

// Lane (g, t)'s share of unit u of a strip (its 8 ggml rows at `rows8`, row r at r * row_bytes):
// the tiled words of qs word t of blocks 4u..4u+3 of row g (its 16 bytes at (4g + t) * 16), and
// row g's four scales (at kUnitWeightBytes + 4g), block 4u + j in byte j.
struct lane_share {
    uint32_t words[kUnitBlocks];
    uint32_t scales;
};
MS_HD lane_share tile_lane(const uint8_t* rows8, int64_t row_bytes, int64_t u, int g, int t) {
    lane_share r{};
    for (int jj = 0; jj < kUnitBlocks; ++jj) {
        const uint8_t* blk = rows8 + g * row_bytes + (kUnitBlocks * u + jj) * 17;
        const uint32_t q = uint32_t(blk[1 + 4 * t]) | uint32_t(blk[2 + 4 * t]) << 8 | uint32_t(blk[3 + 4 * t]) << 16 |
                           uint32_t(blk[4 + 4 * t]) << 24;
        r.words[jj] = tiled_word(q);
        r.scales |= uint32_t(blk[0]) << (8 * jj);
    }
    return r;
}

// Unit u of a strip: its 544 bytes (byte by byte, little-endian words).
MS_HD void tile_unit(const uint8_t* rows8, int64_t row_bytes, int64_t u, uint8_t* unit) {
    for (int g = 0; g < kStripRows; ++g)
        for (int t = 0; t < 4; ++t) {
            const lane_share share = tile_lane(rows8, row_bytes, u, g, t);
            for (int jj = 0; jj < kUnitBlocks; ++jj)
                for (int b = 0; b < 4; ++b) unit[(4 * g + t) * 16 + 4 * jj + b] = uint8_t(share.words[jj] >> (8 * b));
            if (t == 0)
                for (int b = 0; b < 4; ++b) unit[kUnitWeightBytes + 4 * g + b] = uint8_t(share.scales >> (8 * b));
        }
}

// Host: a whole matrix (rows x row_bytes ggml bytes at `src`) into its tiled form at `dst`.
inline void tile_matrix(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
    const int64_t row_bytes = cols / 32 * 17, units = cols / (32 * kUnitBlocks);
    for (int64_t s = 0; s < rows / kStripRows; ++s)
        for (int64_t u = 0; u < units; ++u)
            tile_unit(src + s * kStripRows * row_bytes, row_bytes, u, dst + s * strip_bytes(cols) + u * kUnitBytes);
}

}  // namespace moestream::mxfp4_tiles
