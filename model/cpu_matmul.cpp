// Every (out row, x row) value is one call of the same row-dot kernel, which is what makes the
// result independent of batching and threading (see cpu_matmul.h). The kernel is picked once per
// call, mirroring quant.cpp's dispatcher (kernel_isa() names the set it uses), so the inner loops
// pay no per-row type checks; tests check the result equals quant::dot_row bit for bit, which
// catches the two tables drifting apart.
#include "model/cpu_matmul.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "config/assert.h"
#include "model/quant.h"
#include "model/quant_internal.h"

namespace moestream {
namespace {

using dot_fn = float (*)(const void* row, const float* x, int64_t n);

// Weight bytes of one tile when n_rows > 1. The tile stays in L2 (256 KiB or more on current
// x86) while every x row passes over it, each x row staying in L1 for the tile's dots, so W is
// read from memory once and x once per tile; a bigger tile means fewer passes over x.
constexpr int64_t kTileBytes = 192 << 10;
// Least weight bytes a chunk is worth: below this, waking another thread costs more than it saves.
constexpr int64_t kMinChunkBytes = 32 << 10;

template <ggml_type T>
float dot_checked(const void* row, const float* x, int64_t n) {
    return quant::dot_row(T, row, x, n);
}

dot_fn pick_dot(ggml_type type) {
    namespace d = quant::detail;
    const std::string_view isa = quant::kernel_isa();
    const bool avx512 = isa == "avx512";
    if (avx512 || isa == "avx2") {
        switch (type) {
            case ggml_type::f32: return d::dot_f32_avx2;
            case ggml_type::f16: return d::dot_f16_avx2;
            case ggml_type::bf16: return d::dot_bf16_avx2;
            case ggml_type::q8_0: return avx512 ? d::dot_q8_0_avx512 : d::dot_q8_0_avx2;
            case ggml_type::mxfp4: return avx512 ? d::dot_mxfp4_avx512 : d::dot_mxfp4_avx2;
            default: break;
        }
    }
    // Scalar (or an ISA this file does not know): through the public entry point, always right.
    switch (type) {
        case ggml_type::f32: return dot_checked<ggml_type::f32>;
        case ggml_type::f16: return dot_checked<ggml_type::f16>;
        case ggml_type::bf16: return dot_checked<ggml_type::bf16>;
        case ggml_type::q8_0: return dot_checked<ggml_type::q8_0>;
        case ggml_type::mxfp4: return dot_checked<ggml_type::mxfp4>;
        default: break;
    }
    MS_ASSERT_MSG(false, "matmul: type has no CPU kernel");
    return nullptr;
}

struct job {
    dot_fn dot;
    const uint8_t* w;
    int64_t row_bytes, in_cols, tile_rows;
    const float* x;
    int64_t n_rows, x_stride;
    float* y;
    int64_t y_stride;

    // Out rows [begin, end) for every x row.
    void run(int64_t begin, int64_t end) const {
        if (n_rows == 1) {
            for (int64_t o = begin; o < end; ++o) y[o] = dot(w + o * row_bytes, x, in_cols);
            return;
        }
        for (int64_t t = begin; t < end; t += tile_rows) {
            const int64_t t_end = std::min(end, t + tile_rows);
            for (int64_t r = 0; r < n_rows; ++r) {
                const float* xr = x + r * x_stride;
                float* yr = y + r * y_stride;
                for (int64_t o = t; o < t_end; ++o) yr[o] = dot(w + o * row_bytes, xr, in_cols);
            }
        }
    }
};

job make_job(ggml_type type, const void* w, int64_t out_rows, int64_t in_cols, const float* x,
             int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride) {
    const dtype_traits& t = dtype_info(type);
    MS_ASSERT_MSG(t.compute_supported, "matmul: type has no CPU kernel");
    MS_ASSERT(out_rows >= 0 && n_rows >= 0);
    MS_ASSERT_MSG(in_cols > 0 && in_cols % t.block_elems == 0, "matmul: in_cols is not a multiple of the block size");
    MS_ASSERT_MSG(n_rows <= 1 || x_stride >= in_cols, "matmul: x rows overlap");
    MS_ASSERT_MSG(n_rows <= 1 || y_stride >= out_rows, "matmul: y rows overlap");
    const int64_t rb = row_bytes(t, in_cols);
    if (out_rows > 0 && n_rows > 0) {
        MS_ASSERT(w != nullptr && x != nullptr && y != nullptr);
        // As integers: relational comparison of pointers into different arrays is unspecified.
        const auto addr = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
        const uintptr_t x_end = addr(x + (n_rows - 1) * x_stride + in_cols);
        const uintptr_t y_end = addr(y + (n_rows - 1) * y_stride + out_rows);
        MS_ASSERT_MSG(x_end <= addr(y) || y_end <= addr(x), "matmul: x and y overlap");
    }
    return job{pick_dot(type), static_cast<const uint8_t*>(w), rb, in_cols, std::max<int64_t>(1, kTileBytes / rb),
               x, n_rows, x_stride, y, y_stride};
}

}  // namespace

void matmul(thread_pool& pool, ggml_type type, const void* w, int64_t out_rows, int64_t in_cols,
            const float* x, int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride) {
    const job j = make_job(type, w, out_rows, in_cols, x, n_rows, x_stride, y, y_stride);
    if (out_rows == 0 || n_rows == 0) return;
    const int64_t grain = std::max<int64_t>(1, kMinChunkBytes / (j.row_bytes * n_rows));
    pool.parallel_for(out_rows, grain, [&j](int64_t begin, int64_t end) { j.run(begin, end); });
}

void matmul(ggml_type type, const void* w, int64_t out_rows, int64_t in_cols, const float* x,
            int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride) {
    const job j = make_job(type, w, out_rows, in_cols, x, n_rows, x_stride, y, y_stride);
    if (out_rows == 0 || n_rows == 0) return;
    j.run(0, out_rows);
}

}  // namespace moestream
