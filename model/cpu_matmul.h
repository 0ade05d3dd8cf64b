// y = x W^T on the CPU for the GGUF weight types with kernels (F32, F16, BF16, Q8_0, MXFP4).
//
// W is out_rows consecutive rows of in_cols elements of `type` (row o at
// w + o * row_bytes(dtype_info(type), in_cols)); x is n_rows activation rows of in_cols floats,
// row r at x + r * x_stride; the result goes to y[r * y_stride + o]. fp32 accumulation.
//
// Reproducibility contract: every y value is computed by one fixed kernel with one fixed
// accumulation order (the quant::dot_row kernel of the dispatcher's ISA), so it is bit-identical
// whatever n_rows, the strides, the row's position in the batch, the pool's size or how the work
// is partitioned, and equal to quant::dot_row(type, row o, x row r, in_cols).
//
// Out rows go four at a time through a kernel that shares the x loads and the final sums between
// them (still each row's dot_row bits). Decode (n_rows == 1) streams W once and is memory-bound.
// For n_rows > 1 the out rows are processed in tiles small enough to stay in cache while every x
// row passes over them, so W is still read from memory once. Work is split over out rows.
//
// x and y must not overlap. in_cols must be a multiple of the type's block size.
#pragma once

#include <cstdint>

#include "config/dtype.h"
#include "model/thread_pool.h"

namespace moestream {

void matmul(thread_pool& pool, ggml_type type, const void* w, int64_t out_rows, int64_t in_cols,
            const float* x, int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride);

// Single-threaded, for small matrices (same values as the pooled version).
void matmul(ggml_type type, const void* w, int64_t out_rows, int64_t in_cols, const float* x,
            int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride);

}  // namespace moestream
