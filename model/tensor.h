// A tiny read-only view of a weight matrix in one of the GGUF storage types: `rows` rows of `cols`
// elements (ggml's ne1 x ne0), row r at data + r * row_stride. No ownership, no framework: the
// model holds views into memory-mapped files (or expert slots) and hands them to backend ops.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/assert.h"
#include "config/dtype.h"

namespace moestream {

// How a matrix's bytes are ordered. `rows`: the file's (ggml) rows. `mxfp4_tiles`: MXFP4 rows
// regrouped for the GPU's tensor-core kernel (model/mxfp4_tiles.h), the same bytes per strip of
// 8 rows; only the CUDA backend makes and reads them (slots of its expert cache). `q8_0_tiles`:
// dense Q8_0 matrices regrouped likewise (model/q8_0_tiles.h) when the CUDA backend uploads them.
enum class weight_layout : uint8_t { rows, mxfp4_tiles, q8_0_tiles };

struct weight_view {
    const void* data = nullptr;
    ggml_type type = ggml_type::f32;
    int64_t cols = 0;        // elements per row (the input dimension of a linear)
    int64_t rows = 0;        // rows (the output dimension)
    size_t row_stride = 0;   // bytes between consecutive rows
    weight_layout layout = weight_layout::rows;

    bool empty() const { return data == nullptr; }
    const std::byte* row(int64_t r) const {
        MS_ASSERT(r >= 0 && r < rows && layout == weight_layout::rows);
        return static_cast<const std::byte*>(data) + size_t(r) * row_stride;
    }
    // Rows [first, first + count) as a view of their own. A tiled matrix keeps its bytes per
    // strip of 8 rows in the strip's own range: whole strips are a tiled matrix of their own.
    weight_view slice_rows(int64_t first, int64_t count) const {
        MS_ASSERT(first >= 0 && count >= 0 && first + count <= rows);
        MS_ASSERT_MSG(layout == weight_layout::rows || (first % 8 == 0 && count % 8 == 0),
                      "rows of a tiled matrix are contiguous only in whole strips of 8");
        return {row_or_end(first), type, cols, count, row_stride, layout};
    }
    // A contiguous tensor of the given type.
    static weight_view contiguous(const void* data, ggml_type type, int64_t cols, int64_t rows) {
        return {data, type, cols, rows, size_t(row_bytes(dtype_info(type), cols))};
    }

  private:
    const std::byte* row_or_end(int64_t r) const { return static_cast<const std::byte*>(data) + size_t(r) * row_stride; }
};

// A float vector of a known dtype ("f32" parameters: norms, sinks, biases) read as float.
// Holds F32 data only; loaders convert other float types once at load time.
struct vector_view {
    const float* data = nullptr;
    int64_t size = 0;
    bool empty() const { return data == nullptr; }
    float operator[](int64_t i) const {
        MS_ASSERT(i >= 0 && i < size);
        return data[i];
    }
};

}  // namespace moestream
