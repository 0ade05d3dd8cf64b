// The Q8_0 tile layout: how the CUDA backend regroups a dense Q8_0 matrix's bytes when it uploads
// the model's weights, so that its tensor-core matmul (model/cuda/matmul_q8.cuh) reads each
// lane's weights with 16-byte loads that a warp makes 512 consecutive bytes of. Host and device
// (MS_HD) code, so the host tiler, the kernels and the CPU-side tests share every formula.
//
// A matrix of `rows` (a multiple of 8) by `cols` (a multiple of 128) keeps its bytes per strip of
// 8 rows: strip s occupies the same byte range as its 8 ggml rows (8 x cols/32 x 34 bytes), so a
// view of whole strips (rows a multiple of 8 from a multiple of 8) is a tiled matrix of its own.
// A strip is cols/128 units of 4 32-blocks, 1,088 bytes each:
//   bytes 0..1023: for fragment row g (0..7) and lane quad position t (0..3), 32 bytes: 16 at
//     (4g + t) * 16 and 16 at 512 + (4g + t) * 16, the qs words t and t + 4 (elements 4t..4t+3
//     and 16+4t..16+4t+3) of the unit's blocks 0, 1 (the first 16) and 2, 3 (the second), a
//     block's word t before its word t + 4;
//   bytes 1024..1087: the fp16 scales, row g's four at 1024 + 8g.
// The values are the file's int8 bytes unchanged: a lane turns a word into two .f16x2 A
// fragments (elements (4t, 4t+2) and (4t+1, 4t+3)) exactly, since every int8 is an fp16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/numeric.h"

namespace moestream::q8_0_tiles {

inline constexpr int64_t kStripRows = 8;
inline constexpr int64_t kUnitBlocks = 4;
inline constexpr int64_t kUnitCols = 32 * kUnitBlocks;
inline constexpr int64_t kUnitBytes = 1088;
inline constexpr int64_t kUnitWeightBytes = 1024;
inline constexpr int64_t kBlockBytes = 34;  // ggml block_q8_0: fp16 d, 32 int8
// The matmul's summation runs over slices of kSliceUnits units (512 columns): each slice's sum
// starts from zero and the slices' sums are added in order (matmul_q8.cuh). A shape constant,
// so a value never depends on how a launch spreads the slices.
inline constexpr int64_t kSliceUnits = 4;
inline constexpr int64_t kSliceCols = kSliceUnits * kUnitCols;
// The widest rows tiled (the decode kernel keeps a slice's partial sums of a row in shared
// memory: 256 bytes a slice).
inline constexpr int64_t kMaxCols = 65536;

MS_HD int64_t strip_bytes(int64_t cols) { return kStripRows * (cols / 32) * kBlockBytes; }
MS_HD int64_t slices(int64_t cols) { return (cols + kSliceCols - 1) / kSliceCols; }

// Whether a matrix of this shape and row stride can be tiled (Q8_0 is the caller's check).
MS_HD bool tileable(int64_t rows, int64_t cols, int64_t row_stride) {
    return rows > 0 && rows % kStripRows == 0 && cols > 0 && cols % kUnitCols == 0 && cols <= kMaxCols &&
           row_stride == cols / 32 * kBlockBytes;
}

// Where lane (g, t)'s word k (0..7: block k / 2 of the unit, its word t for k even, t + 4 for k
// odd) sits in a unit.
MS_HD int64_t word_offset(int g, int t, int k) { return (k < 4 ? 0 : 512) + (4 * g + t) * 16 + (k % 4) * 4; }

// Unit u of a strip (its 8 ggml rows at `rows8`, row r at r * row_bytes) into its 1,088 bytes.
MS_HD void tile_unit(const uint8_t* rows8, int64_t row_bytes, int64_t u, uint8_t* unit) {
    for (int g = 0; g < kStripRows; ++g) {
        for (int jj = 0; jj < kUnitBlocks; ++jj) {
            const uint8_t* blk = rows8 + g * row_bytes + (kUnitBlocks * u + jj) * kBlockBytes;
            unit[kUnitWeightBytes + 8 * g + 2 * jj] = blk[0];
            unit[kUnitWeightBytes + 8 * g + 2 * jj + 1] = blk[1];
            for (int t = 0; t < 4; ++t)
                for (int h = 0; h < 2; ++h)
                    for (int b = 0; b < 4; ++b)
                        unit[word_offset(g, t, 2 * jj + h) + b] = blk[2 + 4 * (t + 4 * h) + b];
        }
    }
}

// Host: a whole matrix (rows x row_bytes ggml bytes at `src`) into its tiled form at `dst`.
inline void tile_matrix(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
    const int64_t row_bytes = cols / 32 * kBlockBytes, units = cols / kUnitCols;
    for (int64_t s = 0; s < rows / kStripRows; ++s)
        for (int64_t u = 0; u < units; ++u)
            tile_unit(src + s * kStripRows * row_bytes, row_bytes, u, dst + s * strip_bytes(cols) + u * kUnitBytes);
}

}  // namespace moestream::q8_0_tiles
