// Every (out row, x row) value comes from the dispatcher's row-dot kernels (quant.cpp's
// pick_row_kernel, the same table dot_row uses): four out rows a pass where there are four, one
// at a time for the rest. The four-row kernel gives each row the single-row kernel's bits, which
// is what makes the result independent of batching, partitioning and threading (see
// cpu_matmul.h); tests check the result equals quant::dot_row bit for bit.
#include "model/cpu_matmul.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "config/assert.h"
#include "model/quant_internal.h"

namespace moestream {
namespace {

// Weight bytes of one tile when n_rows > 1. The tile stays in L2 (256 KiB or more on current
// x86) while every x row passes over it, each x row staying in L1 for the tile's dots, so W is
// read from memory once and x once per tile; a bigger tile means fewer passes over x.
constexpr int64_t kTileBytes = 192 << 10;
// Least weight bytes a chunk is worth: below this, waking another thread costs more than it saves.
constexpr int64_t kMinChunkBytes = 32 << 10;
// Weight bytes of a piece of the pooled matmul (see there).
constexpr int64_t kPieceBytes = 512 << 10;
// The pooled matmul's piece table, per calling thread (a call never re-enters on its thread).
thread_local std::vector<int64_t> t_piece_rows, t_piece_starts;

struct job {
    quant::detail::row_kernel dot;
    const uint8_t* w;
    int64_t row_bytes, in_cols, tile_rows;
    const float* x;
    int64_t n_rows, x_stride;
    float* y;
    int64_t y_stride;
    // x rows that qualify for the bf16-x kernels of the weight type (BF16, MXFP4) go through
    // them (as quant::dot_row does for such rows), from x packed by the kernel's `pack`.
    quant::detail::bf16x_kernel dotx{};
    const uint16_t* xb = nullptr;  // n_rows x in_cols
    const uint8_t* x_exact = nullptr;

    // y row r at out rows [begin, end).
    void gemv(int64_t begin, int64_t end, int64_t r) const {
        float* yr = y + r * y_stride;
        int64_t o = begin;
        if (xb && x_exact[r]) {
            const uint16_t* xr = xb + r * in_cols;
            for (; o + 4 <= end; o += 4) dotx.four(w + o * row_bytes, row_bytes, xr, in_cols, yr + o);
            for (; o < end; ++o) yr[o] = dotx.one(w + o * row_bytes, xr, in_cols);
            return;
        }
        const float* xr = x + r * x_stride;
        for (; o + 4 <= end; o += 4) dot.four(w + o * row_bytes, row_bytes, xr, in_cols, yr + o);
        for (; o < end; ++o) yr[o] = dot.one(w + o * row_bytes, xr, in_cols);
    }

    // Out rows [begin, end) for every x row.
    void run(int64_t begin, int64_t end) const {
        if (n_rows == 1) return gemv(begin, end, 0);
        for (int64_t t = begin; t < end; t += tile_rows) {
            const int64_t t_end = std::min(end, t + tile_rows);
            for (int64_t r = 0; r < n_rows; ++r) gemv(t, t_end, r);
        }
    }
};

// x rows packed for the bf16-x kernels, per thread and reused (a matmul never re-enters on its
// thread while it runs, and workers only read the dispatcher's copy during the call).
struct packed_rows {
    std::vector<uint16_t> bits;
    std::vector<uint8_t> exact;
};
thread_local packed_rows t_packed;

void use_bf16x(job& j, ggml_type type) {
    const quant::detail::bf16x_kernel k = quant::detail::pick_bf16x_kernel(type);
    if (!k.one) return;
    packed_rows& p = t_packed;
    p.bits.resize(size_t(j.n_rows * j.in_cols));
    p.exact.resize(size_t(j.n_rows));
    bool any = false;
    for (int64_t r = 0; r < j.n_rows; ++r) {
        p.exact[size_t(r)] = k.pack(j.x + r * j.x_stride, j.in_cols, p.bits.data() + r * j.in_cols);
        any = any || p.exact[size_t(r)];
    }
    if (!any) return;
    j.dotx = k;
    j.xb = p.bits.data();
    j.x_exact = p.exact.data();
}

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
    job j{quant::detail::pick_row_kernel(type), static_cast<const uint8_t*>(w), rb, in_cols, std::max<int64_t>(1, kTileBytes / rb),
          x, n_rows, x_stride, y, y_stride};
    if (out_rows > 0 && n_rows > 0) use_bf16x(j, type);
    return j;
}

}  // namespace

void matmul(thread_pool& pool, ggml_type type, const void* w, int64_t out_rows, int64_t in_cols,
            const float* x, int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride) {
    const job j = make_job(type, w, out_rows, in_cols, x, n_rows, x_stride, y, y_stride);
    if (out_rows == 0 || n_rows == 0) return;
    const int64_t grain = std::max<int64_t>(1, kMinChunkBytes / (j.row_bytes * n_rows));
    const int64_t chunks = pool.chunk_count(out_rows, grain);
    // Each thread's chunk of rows goes in pieces of about kPieceBytes (whole four-row groups), so
    // that threads done early take over pieces of a slower one's chunk (the 265 MB LM head would
    // otherwise wait for its slowest sixteenth).
    const int64_t piece_rows = std::max<int64_t>(grain, (kPieceBytes / (j.row_bytes * n_rows) + 3) / 4 * 4);
    std::vector<int64_t>& rows = t_piece_rows;  // piece p is rows [rows[p], rows[p + 1])
    std::vector<int64_t>& starts = t_piece_starts;
    rows.clear();
    starts.assign(1, 0);
    for (int64_t k = 0; k < chunks; ++k) {
        const int64_t end = (k + 1) * out_rows / chunks;
        for (int64_t r = k * out_rows / chunks; r < end; r += piece_rows) rows.push_back(r);
        starts.push_back(int64_t(rows.size()));
    }
    rows.push_back(out_rows);
    // Chunk k's last piece ends where chunk k + 1's first begins.
    pool.parallel_for_pieces(chunks, starts.data(), [&j, &rows](int64_t p) { j.run(rows[size_t(p)], rows[size_t(p + 1)]); });
}

void matmul(ggml_type type, const void* w, int64_t out_rows, int64_t in_cols, const float* x,
            int64_t n_rows, int64_t x_stride, float* y, int64_t y_stride) {
    const job j = make_job(type, w, out_rows, in_cols, x, n_rows, x_stride, y, y_stride);
    if (out_rows == 0 || n_rows == 0) return;
    j.run(0, out_rows);
}

}  // namespace moestream
