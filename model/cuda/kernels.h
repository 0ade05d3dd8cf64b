// Launchers of the CUDA kernels (the .cu files of this folder), called by cuda_backend.cpp. Plain
// C++: no Asio and nothing CUDA-specific beyond the runtime API's stream type. Every pointer is
// device memory (descriptor arrays too: the backend stages them); every launcher enqueues on
// `s` and returns the launch's error (cudaSuccess when it was enqueued).
//
// Reduction orders are fixed per op shape (the determinism contract of cuda_backend.h). Where a
// kernel mirrors the CPU backend's operation order exactly (element-wise formulas without
// contraction, the attention and indexer dots' 32-lane pattern, the shared exp of
// model/numeric.h), its diff test asks for identical bits; the matmuls, norms' sums in their own
// order and libm-based ops (sin/cos, log1p) are compared with tolerances.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "config/dtype.h"
#include "model/act_quant.h"
#include "model/backend.h"

namespace moestream::cuda::kernels {

// ---- matmuls ----
// One matmul job as the kernels read it: y[r][o] = W[o] · x[r] for o < rows, r < n.
struct mm_job {
    const uint8_t* w = nullptr;   // rows x row_bytes
    const uint8_t* up = nullptr;  // a SwiGLU pair's up weights (same shape), or null
    const float* x = nullptr;
    float* y = nullptr;
    float* u = nullptr;           // the pair's up outputs
    const float* swiglu_w = nullptr;  // per x row (null: 1)
    int64_t rows = 0, cols = 0, row_bytes = 0;
    int64_t x_stride = 0, y_stride = 0, u_stride = 0;
    int32_t n = 0;
    uint32_t flags = 0;
    float swiglu_limit = 0;
    int64_t first_block = 0;  // the job's first thread block (a prefix sum over the launch's jobs)
    int32_t block_rows = 0;   // output rows per block (plan_matmul); MXFP4 tensor-core jobs: -tiles per block;
                              // Q8_0 tiled jobs of the decode kernel: tiles per block
};
// kTiles: MXFP4 weights in the tile layout (model/mxfp4_tiles.h); kQ8Tiles: Q8_0 weights in
// theirs (model/q8_0_tiles.h). A launch's jobs are all tiled or none is.
inline constexpr uint32_t kRound = 1, kRouterScore = 2, kSwiglu = 4, kTiles = 8, kQ8Tiles = 16;
// Warps a thread block of the matmul kernel runs, the most output rows a block takes, and the
// most x rows a group holds (its x rows are staged in shared memory: kChunkFloats floats per 32
// columns).
inline constexpr int kMatmulWarps = 8;
inline constexpr int kMatmulBlockRows = 32;
inline constexpr int kMatmulRows = 8;
inline constexpr int64_t kChunkFloats = 33;
// Shared memory a matmul block may use: two blocks fit an SM of the Hopper class (228 KiB).
inline constexpr size_t kMatmulSharedBytes = 110u << 10;
// x rows per group for rows of `cols` columns (0: not even one fits).
constexpr int matmul_group_rows(int64_t cols) {
    const int64_t per_row = ((cols + 31) / 32) * kChunkFloats * 4;
    const int64_t fit = int64_t(kMatmulSharedBytes) / per_row;
    return int(fit < kMatmulRows ? fit : kMatmulRows);
}
// Plans one launch of `type` over the host array `jobs` (their shapes and n set): each job's
// block_rows and first_block, the launch's blocks and the largest shared memory a block uses
// (blocks -1 when some job's rows are too long for the kernel's shared memory). More rows per
// block share one copy of x; fewer give a small launch enough blocks to fill the GPU. The plan
// never changes a value: a row's bits depend only on its job's shape, its weights and its x row.
struct matmul_plan {
    int64_t blocks = 0;
    size_t shared = 0;
    // MXFP4 launches: 0 runs the kernel that holds both paths; 8 or 16 the tensor-core path
    // alone, with rings of stages of that many 32-blocks (every job takes the mma path with that
    // ring), whose registers are not shared with the CUDA-core path.
    int mxfp4_ring = 0;
    // MXFP4 launches of tiled jobs: the kernel that reads the tile layout; `uniform_blocks`: the
    // blocks of every job when all have the same (a layer's experts: a block finds its job by one
    // division instead of a search over the descriptors), else 0.
    bool tiles = false;
    int64_t uniform_blocks = 0;
    int tile_warps = 16;  // warps a block of the tiled kernel (16: one block an SM; 8: two)
    bool tiles_wide = false;  // tiled MXFP4 with many x rows: the prefill kernel (the same bits)
    // Q8_0 launches of tiled jobs (matmul_q8.cuh): 1 the kernel that spreads a tile's slices
    // over a block's warps (decode's few x rows), 2 the one whose warps take 16 x rows of their
    // own tiles slice after slice (prefill). Both give the same bits.
    int q8_kernel = 0;
};
matmul_plan plan_matmul(ggml_type type, mm_job* jobs, int n_jobs);
// A launch's descriptors passed in the kernel's parameters instead of device memory (a stream
// launch of at most kInlineJobs jobs: no copy has to go before it). Planned as for matmul().
inline constexpr int kInlineJobs = 8;
struct inline_jobs {
    mm_job j[kInlineJobs];
};
// Every job has weights of `type` (F32, F16, BF16, Q8_0 or MXFP4), planned by plan_matmul. MXFP4
// jobs whose cols are a multiple of 128 (up to 24,000) run on the tensor cores (matmul_mma.cuh:
// 16 weight rows a warp, x split into fp16 hi + lo, 512-thread blocks, up to ~227 KiB of shared
// memory); other MXFP4 shapes, in the same launch, on the CUDA-core path. Tiled jobs (kTiles,
// kQ8Tiles) run their layout's tensor-core kernels (matmul_q8.cuh for Q8_0), the decode or the
// prefill shape by the launch's rows, with the same bits.
// staged_jobs: the descriptors were staged by the host (not written by a kernel of the step), so
// the CUDA-core kernel may read them, and prefetch its weights, before its predecessor ends.
// `inline_from`: the jobs are these (jobs null); they then count as staged.
cudaError_t matmul(cudaStream_t s, ggml_type type, const mm_job* jobs, int n_jobs, const matmul_plan& plan,
                   bool staged_jobs, const inline_jobs* inline_from = nullptr);

// Tiles MXFP4 matrices in place (model/mxfp4_tiles.h): every matrix's rows a multiple of 8, its
// cols tileable. The kernel lets no dependent kernel start before it has finished (a matmul may
// load weights before it waits for its predecessor).
struct tile_matrix {
    uint8_t* data = nullptr;
    int32_t rows = 0, cols = 0;
};
inline constexpr int kMaxTileMatrices = 24;  // a fill's 8 experts x gate, up, down
struct tile_batch {
    int n = 0;
    tile_matrix m[kMaxTileMatrices];
};
cudaError_t tile_mxfp4(cudaStream_t s, const tile_batch& batch);
// The same for views of backend memory (each MXFP4, rows layout, tileable), in launches of up to
// kMaxTileMatrices; `launches` (when given) counts them.
cudaError_t tile_mxfp4(cudaStream_t s, std::span<const weight_view> matrices, uint64_t* launches = nullptr);

// ---- sums and updates ----
// f[r][d] = bf16(Σ_e src[e][d] for e in [starts[r], starts[r + 1])) in order, then the hc update
// (when upd.H is set) as backend::output_sum describes.
cudaError_t sum_rows(cudaStream_t s, const float* const* src, const int64_t* starts, int64_t n, int64_t dim,
                     float* f, hc_update upd);

// ---- element-wise ----
cudaError_t rms_norm(cudaStream_t s, const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                     bool round);
// jobs: device memory, `rows` their rows in all.
cudaError_t norm_rows(cudaStream_t s, const norm_job* jobs, int n_jobs, int64_t rows);
cudaError_t round_bf16(cudaStream_t s, float* x, int64_t count);
cudaError_t scale_round(cudaStream_t s, float* x, int64_t count, float scale);
cudaError_t add(cudaStream_t s, float* y, const float* x, int64_t count);
cudaError_t rope(cudaStream_t s, float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim,
                 int64_t rope_dim, const int64_t* pos, const float* freqs, bool inverse);
cudaError_t embed(cudaStream_t s, ggml_type type, const uint8_t* table, int64_t row_bytes, int64_t dim,
                  const int32_t* tokens, int64_t n, int copies, float* out);
cudaError_t stream_mean(cudaStream_t s, const float* H, int64_t n, int hc, int64_t dim, float* out,
                        int64_t out_stride);
cudaError_t copy_rows(cudaStream_t s, const row_copy* jobs, int64_t n_jobs, int64_t count);
cudaError_t gather_rows(cudaStream_t s, const float* src, int64_t src_stride, const int64_t* rows, int64_t m,
                        int64_t dim, float* dst);
cudaError_t pool_pairs(cudaStream_t s, const pair_pool* jobs, int64_t n_jobs, int64_t dim);
// Keys of every job, `total` of them in all; bad counts keys that were not bf16 values.
cudaError_t store_keys(cudaStream_t s, const key_store* jobs, const int64_t* first_key, int64_t n_jobs, int64_t total,
                       int64_t head_dim, unsigned int* bad);
cudaError_t dequant_fp8_rows(cudaStream_t s, const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t n,
                             float* out);
cudaError_t argmax_rows(cudaStream_t s, const float* x, int64_t n, int64_t cols, int32_t* out);
cudaError_t swiglu(cudaStream_t s, float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w);
cudaError_t simulate_quant(cudaStream_t s, act_quant_kind kind, float* x, int64_t count);

// ---- hyper-connections ----
// mix [n][(2 + hc) * hc] = fn · H (from a matmul); writes pre, post, comb.
cudaError_t hc_mixes(cudaStream_t s, const float* H, const float* mix, int64_t n, int hc, int64_t dim,
                     const float* base, const float* scale, int iters, float hc_eps, float norm_eps, float* pre,
                     float* post, float* comb);
cudaError_t hc_collapse(cudaStream_t s, const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out);
cudaError_t hc_expand(cudaStream_t s, const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                      const float* comb, float* out);
cudaError_t engram_gate(cudaStream_t s, float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                        float norm_eps);

// ---- attention and the indexer ----
// max_keys: the most keys of any row (ring + fresh + selection_len); work: device memory for
// attention_work_floats(n_rows, ...) floats (the scores, probabilities, chunk sums and maxes);
// tile_heads: heads a block takes (1..16; which block computes a value never changes it),
// attention_tile_heads's plan for the launch unless a caller measures another.
size_t attention_work_floats(int64_t n_rows, int n_heads, int64_t head_dim, int64_t max_keys);
int attention_tile_heads(int64_t n_rows, int n_heads, int64_t head_dim, int64_t max_keys);
cudaError_t attention(cudaStream_t s, const attention_row* rows, int64_t n_rows, int n_heads, int64_t head_dim,
                      float scale, const float* sinks, bool bf16_probs, int64_t max_keys, float* work,
                      int tile_heads);
cudaError_t indexer_scores(cudaStream_t s, const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                           const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores);
// p's pointers are device pointers, n_visible too; block_scores: room for rows * ceil(n_total /
// block_size) floats when p is a candidate source.
cudaError_t indexer_select(cudaStream_t s, const indexer_pick& p, float* block_scores);
// sorted_picks/sorted_weights (both or neither; select and weights required): order_picks of the
// result too, in the same kernel (moe_kernels.h's order_picks gives the same values).
cudaError_t route(cudaStream_t s, const float* scores, const float* bias, int64_t n, int n_experts, int k,
                  double route_scale, bool select, int32_t* picks, float* weights, int32_t* sorted_picks = nullptr,
                  float* sorted_weights = nullptr);

// Largest dynamic shared memory a block may be given (set at start-up from the device).
void set_shared_memory_limit(size_t bytes);

}  // namespace moestream::cuda::kernels
