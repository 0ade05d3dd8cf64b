// Matmuls of every weight type (F32, F16, BF16, Q8_0, MXFP4) for any number of x rows, several
// jobs per launch (a layer's experts, q_a with kv, the output groups).
//
// One warp computes one output row o against a group of up to kMatmulRows x rows: lane l takes
// the 32-element chunks b = l, l + 32, ... of the row in order, decodes each chunk's weights
// once for all the group's rows, and adds its chunk dot (a sequential fused sum over the 32
// elements, times the block scale for Q8_0 and MXFP4) into its own accumulator; the warp's lanes
// are then added in the fixed butterfly of warp_sum. The group's x rows sit in shared memory,
// padded so that the lanes' reads of their chunks (128 bytes apart in x) fall in different banks:
// read from global memory, each such read touched 32 cache lines. So a value depends only on the weight row,
// the x row and cols: never on how many rows the batch has, which group or warp computed it, or
// the grid (the determinism contract of cuda_backend.h). One kernel serves decode and prefill;
// weights are read once per group of rows. MXFP4 launches run k_matmul_mxfp4: the tensor-core
// path of matmul_mma.cuh for the shapes it takes (cols a multiple of 128), this one (with 16
// warps a block) for the others, chosen per job by its shape.
#include <algorithm>
#include <cstdlib>

#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"
#include "model/cuda/matmul_mma.cuh"
#include "model/cuda/matmul_q8.cuh"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = kMatmulWarps * kWarp;

// Chunk b of a row in two steps: fetch() issues its loads into `raw`, decode() turns them into
// the 32 weights (zeros past cols) and the chunk's scale. A lane fetches kAhead chunks before it
// decodes the first, so that many loads are in flight per lane (the MXFP4 chunk is 17 bytes:
// one at a time left the memory system idle); the chunks are still added in order.
template <ggml_type T>
struct chunk_decoder;

// F32 and F16 chunks are fetched as floats already: decoding is a copy.
struct float_chunk {
    static constexpr int kAhead = 1;
    struct raw {
        float v[32];
    };
    static __device__ __forceinline__ void decode(const raw& r, float (&w)[32], float& scale) {
        scale = 1.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) w[j] = r.v[j];
    }
};

template <>
struct chunk_decoder<ggml_type::f32> : float_chunk {
    static __device__ __forceinline__ void fetch(const uint8_t* row, int64_t b, int64_t cols, raw& r) {
        const float* p = reinterpret_cast<const float*>(row) + b * 32;
        const int64_t left = cols - b * 32;
        if (left >= 32 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
                r.v[4 * i] = v.x, r.v[4 * i + 1] = v.y, r.v[4 * i + 2] = v.z, r.v[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int j = 0; j < 32; ++j) r.v[j] = j < left ? __ldg(p + j) : 0.0f;
        }
    }
};

template <>
struct chunk_decoder<ggml_type::f16> : float_chunk {
    static __device__ __forceinline__ void fetch(const uint8_t* row, int64_t b, int64_t cols, raw& r) {
        const __half* p = reinterpret_cast<const __half*>(row) + b * 32;
        const int64_t left = cols - b * 32;
#pragma unroll
        for (int j = 0; j < 32; ++j) r.v[j] = j < left ? __half2float(p[j]) : 0.0f;
    }
};

// 32 bf16 values as 16 words (value 2i in the low half of word i; zero bits past cols).
template <>
struct chunk_decoder<ggml_type::bf16> {
    static constexpr int kAhead = 1;  // 64 bytes a chunk already; two spill
    struct raw {
        uint32_t words[16];
    };
    static __device__ __forceinline__ void fetch(const uint8_t* row, int64_t b, int64_t cols, raw& r) {
        const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + b * 32;
        const int64_t left = cols - b * 32;
        if (left >= 32 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
                r.words[4 * i] = v.x, r.words[4 * i + 1] = v.y, r.words[4 * i + 2] = v.z, r.words[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const uint32_t lo = 2 * i < left ? __ldg(p + 2 * i) : 0u;
                const uint32_t hi = 2 * i + 1 < left ? __ldg(p + 2 * i + 1) : 0u;
                r.words[i] = lo | (hi << 16);
            }
        }
    }
    static __device__ __forceinline__ void decode(const raw& r, float (&w)[32], float& scale) {
        scale = 1.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            w[2 * i] = bf16_bits_value(r.words[i] & 0xffffu);
            w[2 * i + 1] = bf16_bits_value(r.words[i] >> 16);
        }
    }
};

// Small integers as floats without the (quarter-rate) conversion instruction: byte k of `word`
// placed in the mantissa of 2^23 (0x4B0000bb), then `minus` (2^23, plus an offset) taken away;
// exact.
__device__ __forceinline__ float byte_as_float(uint32_t word, int k, float minus) {
    return __fsub_rn(__uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | uint32_t(k))), minus);
}

// ggml block_q8_0: fp16 scale d, then 32 int8 values (34 bytes, 2-byte aligned). The values are
// offset by 128 (xor 0x80) to be bytes, and the offset taken away with 2^23.
template <>
struct chunk_decoder<ggml_type::q8_0> {
    static constexpr int kAhead = 2;
    struct raw {
        uint32_t words[9];  // bytes 0..35: d in bytes 0-1, qs in 2..33
    };
    static __device__ __forceinline__ void fetch(const uint8_t* row, int64_t b, int64_t, raw& r) {
        load_words<9>(row + b * 34, r.words);
    }
    static __device__ __forceinline__ void decode(const raw& r, float (&w)[32], float& scale) {
        scale = __half2float(__ushort_as_half(uint16_t(r.words[0] & 0xffffu)));
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t q = __funnelshift_r(r.words[i], r.words[i + 1], 16) ^ 0x80808080u;  // qs 4i..4i+3
#pragma unroll
            for (int k = 0; k < 4; ++k) w[4 * i + k] = byte_as_float(q, k, 8388736.0f);  // 2^23 + 128
        }
    }
};

// ggml block_mxfp4: e8m0 exponent, then 16 bytes (element j low nibble, j + 16 high nibble);
// values are e2m1 doubled, the scale 2^(e - 128) (ggml's convention). Four magnitudes at once by
// a byte permutation over the table {0, 1, 2, 3, 4, 6, 8, 12} (the selector gathers the four
// 3-bit codes: bytes 0, 2, 1, 3 of the result), the sign bit put on the float.
template <>
struct chunk_decoder<ggml_type::mxfp4> {
    static constexpr int kAhead = 4;
    struct raw {
        uint32_t words[5];  // bytes 0..19
    };
    static __device__ __forceinline__ void fetch(const uint8_t* row, int64_t b, int64_t, raw& r) {
        load_words<5>(row + b * 17, r.words);
    }
    static __device__ __forceinline__ void low_nibbles(uint32_t q, float* out) {
        const uint32_t code = q & 0x07070707u;
        const uint32_t mag = __byte_perm(0x03020100u, 0x0C080604u, code | (code >> 12));
        constexpr int at[4] = {0, 2, 1, 3};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float v = byte_as_float(mag, at[k], 8388608.0f);
            out[k] = __uint_as_float(__float_as_uint(v) ^ ((q << (28 - 8 * k)) & 0x80000000u));
        }
    }
    static __device__ __forceinline__ void decode(const raw& r, float (&w)[32], float& scale) {
        scale = numeric::e8m0_half_value(uint8_t(r.words[0] & 0xffu));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t q = __funnelshift_r(r.words[i], r.words[i + 1], 8);  // qs bytes 4i..4i+3
            low_nibbles(q, &w[4 * i]);
            low_nibbles(q >> 4, &w[16 + 4 * i]);
        }
    }
};

// Adds chunk b's dots with every row of the group into acc. xs holds the group's x rows in
// shared memory, chunk after chunk with one float of padding (kChunkFloats), zeros past cols: the
// 32 lanes, each at its own chunk, read 32 different banks.
__device__ __forceinline__ void chunk_dots(const float (&w)[32], float scale, const float* xs, int64_t row_floats,
                                           int nr, int64_t b, float (&acc)[kMatmulRows]) {
#pragma unroll
    for (int r = 0; r < kMatmulRows; ++r) {
        if (r >= nr) break;
        const float* xr = xs + r * row_floats + b * kChunkFloats;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) s = __fmaf_rn(w[j], xr[j], s);
        acc[r] = __fmaf_rn(scale, s, acc[r]);
    }
}

__device__ __forceinline__ float router_score(float v) {
    const float softplus = v > 20.0f ? v : log1pf(numeric::exp_float(v));
    return __fsqrt_rn(softplus);
}

// The epilogue of output o of x row `row`: v the dot with W[o], vu with the pair's up row.
__device__ __forceinline__ void store_output(const mm_job& jb, float v, float vu, int64_t row, int64_t o, bool pair) {
    if (jb.flags & kRound) v = numeric::round_bf16(v);
    if (jb.flags & kRouterScore) v = router_score(v);
    if (pair) {
        const float u = (jb.flags & kRound) ? numeric::round_bf16(vu) : vu;
        jb.u[row * jb.u_stride + o] = u;
        // SwiGLU with the V4.1 clamps, as the CPU's swiglu_row: each operation rounded alone.
        const float limit = jb.swiglu_limit;
        const float gv = fminf(v, limit);
        const float uv = fminf(fmaxf(u, -limit), limit);
        const float e = numeric::exp_float(-gv);
        const float wr = jb.swiglu_w ? jb.swiglu_w[row] : 1.0f;
        v = numeric::round_bf16(__fmul_rn(wr, __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, e)), uv)));
    }
    jb.y[row * jb.y_stride + o] = v;
}

// One output row o of job jb against the group's nr x rows (in shared memory), by one warp.
template <ggml_type T>
__device__ __forceinline__ void matmul_row(const mm_job& jb, const float* xs, int64_t row_floats, int64_t r0, int nr,
                                           int64_t o, int lane) {
    const int64_t chunks = (jb.cols + 31) / 32;
    const uint8_t* wrow = jb.w + o * jb.row_bytes;
    const uint8_t* urow = jb.up ? jb.up + o * jb.row_bytes : nullptr;
    float acc[kMatmulRows], accu[kMatmulRows];
#pragma unroll
    for (int r = 0; r < kMatmulRows; ++r) acc[r] = 0.0f, accu[r] = 0.0f;
    using dec = chunk_decoder<T>;
    constexpr int ahead = dec::kAhead;
    for (int64_t b0 = lane; b0 < chunks; b0 += kWarp * ahead) {
        // Every fetch first (a chunk past the row fetches the row's last one, so no load is
        // conditional), then the chunks in order.
        typename dec::raw rw[ahead], ru[ahead];
#pragma unroll
        for (int a = 0; a < ahead; ++a) {
            const int64_t b = b0 + a * kWarp < chunks ? b0 + a * kWarp : chunks - 1;
            dec::fetch(wrow, b, jb.cols, rw[a]);
            if (urow) dec::fetch(urow, b, jb.cols, ru[a]);
        }
#pragma unroll
        for (int a = 0; a < ahead; ++a) {
            const int64_t b = b0 + a * kWarp;
            if (b >= chunks) break;
            float w[32], scale;
            dec::decode(rw[a], w, scale);
            chunk_dots(w, scale, xs, row_floats, nr, b, acc);
            if (urow) {
                dec::decode(ru[a], w, scale);
                chunk_dots(w, scale, xs, row_floats, nr, b, accu);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kMatmulRows; ++r) {
        if (r >= nr) break;
        const float v = warp_sum(acc[r]);
        const float vu = urow ? warp_sum(accu[r]) : 0.0f;
        if (lane != r) continue;  // lane r writes row r (the values are the same in every lane)
        store_output(jb, v, vu, r0 + r, o, urow != nullptr);
    }
}

// Where a launch's descriptors are: device memory (staged by the host or written by a kernel of
// the step) or the kernel's parameters (inline_jobs, kernels.h). A kernel takes either as a
// __grid_constant__ parameter, whose address may be taken: every descriptor read below goes
// through a plain pointer either way.
using device_jobs = const mm_job*;
__device__ __forceinline__ const mm_job* jobs_in(device_jobs src) { return src; }
__device__ __forceinline__ const mm_job* jobs_in(const inline_jobs& src) { return src.j; }

// The job a block belongs to (binary search over first_block).
__device__ __forceinline__ const mm_job& find_job(const mm_job* __restrict__ jobs, int n_jobs, int64_t blk) {
    int lo = 0, hi = n_jobs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (jobs[mid].first_block <= blk) lo = mid;
        else hi = mid - 1;
    }
    return jobs[lo];
}

// A block of kWarps warps takes block_rows output rows of one job against one group of its x
// rows: it copies the group's x rows into shared memory once (coalesced), then each warp
// computes its output rows from there (the warp count changes which warp computes a row, never
// its value).
template <ggml_type T, int kWarps>
__device__ __forceinline__ void cuda_core_block(const mm_job& jb, int64_t local, float* xs) {
    constexpr int kBlockThreads = kWarps * kWarp;
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const int64_t chunks = (jb.cols + 31) / 32;
    const int group = matmul_group_rows(jb.cols);
    const int64_t row_blocks = (jb.rows + jb.block_rows - 1) / jb.block_rows;
    const int64_t g = local / row_blocks, rb = local % row_blocks;
    const int64_t r0 = g * group;
    const int nr = jb.n - r0 < group ? int(jb.n - r0) : group;
    const int64_t row_floats = chunks * kChunkFloats;
    const int64_t padded = chunks * 32;
    // Row by row, 32-bit indices (a 64-bit division per element cost more than the loads).
    const int cols = int(jb.cols), pad = int(padded);
    for (int r = 0; r < nr; ++r) {
        const float* xr = jb.x + (r0 + r) * jb.x_stride;
        float* dst = xs + r * row_floats;
#pragma unroll 4
        for (int e = int(threadIdx.x); e < pad; e += kBlockThreads)
            dst[(e >> 5) * kChunkFloats + (e & 31)] = e < cols ? xr[e] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < (jb.block_rows + kWarps - 1) / kWarps; ++k) {
        const int64_t o = rb * jb.block_rows + k * kWarps + warp;
        if (k * kWarps + warp < jb.block_rows && o < jb.rows) matmul_row<T>(jb, xs, row_floats, r0, nr, o, lane);
    }
}

// Asks L2 for the weight rows block `blk` will read (its rows are contiguous; the pair's up
// rows too). Run before the kernel waits for its predecessor (grid_dependency_prologue), so
// DRAM's latency passes while the kernel before it still runs: weights never depend on it. Only
// for launches whose descriptors the host staged (they were on the device before the step's
// first kernel); a prefetch never returns data, so it cannot make a load read stale bytes.
__device__ __forceinline__ void prefetch_block_weights(const mm_job* __restrict__ jobs, int n_jobs, int64_t blk) {
    const mm_job& jb = find_job(jobs, n_jobs, blk);
    const int64_t row_blocks = (jb.rows + jb.block_rows - 1) / jb.block_rows;
    const int64_t o0 = ((blk - jb.first_block) % row_blocks) * jb.block_rows;
    const int64_t rows = jb.rows - o0 < jb.block_rows ? jb.rows - o0 : jb.block_rows;
    const int64_t lines = (rows * jb.row_bytes + 127) / 128;
    for (int64_t i = threadIdx.x; i < lines; i += blockDim.x) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(jb.w + o0 * jb.row_bytes + i * 128));
        if (jb.up) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(jb.up + o0 * jb.row_bytes + i * 128));
    }
}

template <ggml_type T, class Src>
__global__ void __launch_bounds__(kThreads, 2) k_matmul(const __grid_constant__ Src src, int n_jobs, bool staged_jobs) {
    const mm_job* __restrict__ jobs = jobs_in(src);
    extern __shared__ float xs[];
    const int64_t blk = blockIdx.x;
    if (staged_jobs) prefetch_block_weights(jobs, n_jobs, blk);
    grid_dependency_prologue();
    const mm_job& jb = find_job(jobs, n_jobs, blk);
    cuda_core_block<T, kMatmulWarps>(jb, blk - jb.first_block, xs);
}

// Where warp `warp` of an mma launch's block `local` (from its job's first) works: its job's
// group of x rows [r0, r0 + nr) and its tile of 16 weight rows (a pair's 8 gate and 8 up rows),
// or none (active false). A shape question: never a value's.
struct mma_place {
    bool pair = false, active = false;
    int64_t r0 = 0, tile = 0;
    int nr = 0;
};
__device__ __forceinline__ mma_place place_in(const mm_job& jb, int64_t local, int warp) {
    const int per_block = -jb.block_rows;
    mma_place p;
    p.pair = jb.up != nullptr;
    const int64_t tile_rows = p.pair ? 8 : 16;
    const int64_t tiles = (jb.rows + tile_rows - 1) / tile_rows;
    const int64_t chunks = (tiles + per_block - 1) / per_block;
    const int64_t grp = local / chunks, chunk = local % chunks;
    const int gsz = mma::mma_group_rows(jb.cols);
    p.r0 = grp * gsz;
    p.nr = jb.n - p.r0 < gsz ? int(jb.n - p.r0) : gsz;
    p.tile = chunk * per_block + warp;
    p.active = warp < per_block && p.tile < tiles;
    return p;
}

// The outputs of x row r0 + xr of fragment rows oA (vA) and oB (vB) of a tile (a pair's gate and
// up row oA). Rows past the matrix are not stored.
__device__ __forceinline__ void store_fragment_rows(const mm_job& jb, float vA, float vB, int64_t row, int64_t oA,
                                                    int64_t oB, bool pair) {
    if (pair) {
        if (oA < jb.rows) store_output(jb, vA, vB, row, oA, true);
    } else {
        if (oA < jb.rows) store_output(jb, vA, 0.0f, row, oA, false);
        if (oB < jb.rows) store_output(jb, vB, 0.0f, row, oB, false);
    }
}

// A warp's outputs of an mma tile (compute_tile's or compute_tiles' `out`): lanes t < 2 hold x
// rows 2t and 2t + 1 of fragment rows oA and oB (a pair's gate and up row oA), scaled back by
// 2^(14 - s) of their x row. Rows past the matrix are not stored.
__device__ __forceinline__ void store_tile_outputs(const mm_job& jb, const float (&out)[4], const int* sexp, int64_t r0,
                                                   int nr, int64_t oA, int64_t oB, bool pair, int lane) {
    const int t = lane & 3;
    if (t >= 2) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int xr = 2 * t + i;
        if (xr >= nr) continue;
        const int e = 14 - sexp[xr];
        const float vA = scalbnf(out[i], e), vB = scalbnf(out[2 + i], e);
        store_fragment_rows(jb, vA, vB, r0 + xr, oA, oB, pair);
    }
}

// One warp's tile of an mma job through rings of shape R: its copies, the group's x staged
// meanwhile (every warp of the block takes part), then the products. Returns false for a warp
// with no tile (after the staging barriers).
template <class R>
__device__ __forceinline__ bool mma_tile(const mm_job& jb, int64_t tile, bool active, int64_t r0, int nr,
                                         uint8_t* smem, int* sexp, float (*red)[mma::kMmaGroupRows], float (&out)[4],
                                         int64_t& oA, int64_t& oB) {
    const bool pair = jb.up != nullptr;
    const int64_t blocks = jb.cols / 32;
    uint4* xs = reinterpret_cast<uint4*>(smem);
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    uint8_t* ring = smem + blocks * nr * 128 + size_t(warp) * R::stages * R::stage_bytes;
    // Fragment row f (0..15) of the tile: its weight row (clamped to the matrix: rows past the
    // end are loaded but never stored) and output index.
    auto row_of = [&](int f, int64_t& o) -> const uint8_t* {
        if (pair) {
            o = tile * 8 + (f & 7);
            const int64_t oc = o < jb.rows ? o : jb.rows - 1;
            return (f < 8 ? jb.w : jb.up) + oc * jb.row_bytes;
        }
        o = tile * 16 + f;
        const int64_t oc = o < jb.rows ? o : jb.rows - 1;
        return jb.w + oc * jb.row_bytes;
    };
    const uint8_t* src[R::per_lane];
    int dst[R::per_lane];
#pragma unroll
    for (int j = 0; j < R::per_lane; ++j) {
        const int i = lane + 32 * j, f = i / R::pieces;
        int64_t o;
        src[j] = row_of(f, o);
        dst[j] = f * R::pitch + (i % R::pieces) * 16;
    }
    if (active) mma::prefetch_tile<R>(src, dst, blocks, ring);
    mma::stage_x(jb, r0, nr, xs, sexp, red);
    if (!active) return false;
    const int g = lane >> 2;
    const uint8_t* rowA = row_of(g, oA);
    const uint8_t* rowB = row_of(g + 8, oB);
    switch (nr) {
        case 1: mma::compute_tile<R, 1>(rowA, rowB, src, dst, blocks, xs, ring, lane, out); break;
        case 2: mma::compute_tile<R, 2>(rowA, rowB, src, dst, blocks, xs, ring, lane, out); break;
        case 3: mma::compute_tile<R, 3>(rowA, rowB, src, dst, blocks, xs, ring, lane, out); break;
        default: mma::compute_tile<R, 4>(rowA, rowB, src, dst, blocks, xs, ring, lane, out); break;
    }
    return true;
}

// MXFP4 launches. kRing 0: a job planned for the tensor cores (block_rows = -tiles per block, see
// matmul_mma.cuh) runs the mma path with the ring its shape asks for, the others (shapes it does
// not take) the CUDA-core one. kRing 8 or 16: every job is an mma job with that ring, so the
// kernel holds one path and its registers are that path's alone (the kernel with both sat at
// the 128-register cap and ran 3-12% behind a lab kernel of the same arithmetic).
template <int kRing, class Src>
__global__ void __launch_bounds__(mma::kMmaThreads, 1) k_matmul_mxfp4(const __grid_constant__ Src src, int n_jobs) {
    grid_dependency_prologue();
    const mm_job* __restrict__ jobs = jobs_in(src);
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float red[mma::kMmaWarps][mma::kMmaGroupRows];
    __shared__ int sexp[mma::kMmaGroupRows];
    const int64_t blk = blockIdx.x;
    const mm_job& jb = find_job(jobs, n_jobs, blk);
    const int64_t local = blk - jb.first_block;
    if constexpr (kRing == 0) {
        if (jb.block_rows > 0) {
            cuda_core_block<ggml_type::mxfp4, mma::kMmaWarps>(jb, local, reinterpret_cast<float*>(smem));
            return;
        }
    }
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const mma_place at = place_in(jb, local, warp);
    const bool pair = at.pair, active = at.active;
    const int64_t r0 = at.r0, tile = at.tile;
    const int nr = at.nr;
    float out[4];
    int64_t oA = 0, oB = 0;
    // The ring's shape is the job's (its shape alone decides it), never a value's.
    bool ran;
    if constexpr (kRing == 0)
        ran = mma::mma_wide_stages(jb.cols, jb.n)
                  ? mma_tile<mma::ring_shape<16>>(jb, tile, active, r0, nr, smem, sexp, red, out, oA, oB)
                  : mma_tile<mma::ring_shape<8>>(jb, tile, active, r0, nr, smem, sexp, red, out, oA, oB);
    else
        ran = mma_tile<mma::ring_shape<kRing>>(jb, tile, active, r0, nr, smem, sexp, red, out, oA, oB);
    if (!ran) return;
    store_tile_outputs(jb, out, sexp, r0, nr, oA, oB, pair, lane);
}

// One warp's tile of a tiled job and its outputs, for a group of NR x rows (a template
// argument, so that the accumulators of x rows past the group are never computed).
template <int NR>
__device__ __forceinline__ void tiles_warp(const mm_job& jb, mma::tile_unit_regs (&buf)[mma::kTileAhead],
                                           const uint8_t* A, const uint8_t* B, int64_t units, const uint4* xs,
                                           const int* sexp, int64_t r0, int64_t tile, bool pair, int lane) {
    float out[4];
    mma::compute_tiles<NR>(buf, A, B, units, xs, lane, out);
    const int g = lane >> 2;
    store_tile_outputs(jb, out, sexp, r0, NR, pair ? tile * 8 + g : tile * 16 + g, tile * 16 + 8 + g, pair, lane);
}

// The strips (8 rows, `strip` bytes each: both tile layouts) of a tiled job's 16-row tile `tile`:
// a pair's gate and up strips, else two consecutive strips (the first twice when the matrix ends
// after it: its second half is computed, never stored).
__device__ __forceinline__ void tile_strips(const mm_job& jb, int64_t tile, int64_t strip, const uint8_t*& A,
                                            const uint8_t*& B) {
    static_assert(mxfp4_tiles::kStripRows == 8 && q8_0_tiles::kStripRows == 8);
    if (jb.up) {
        A = jb.w + tile * strip;
        B = jb.up + tile * strip;
    } else {
        A = jb.w + 2 * tile * strip;
        B = (2 * tile + 1) * 8 < jb.rows ? A + strip : A;
    }
}

// MXFP4 launches whose jobs are all tiled (model/mxfp4_tiles.h; kTiles): the mma path's tiles,
// groups and products (mma::compute_tiles), the weights loaded straight into registers. With
// host-staged descriptors a warp's first units are loaded before the kernel waits for its
// predecessor: weights never depend on it (the tiler, the one kernel that writes weights, lets
// no dependent start before it ends: tiles.cu).
// kWarps: the block's warps, 16 (one block an SM) or 8 (two: a block of the next launch may
// start on an SM, and ask for its weights, while the other still runs; MOESTREAM_TILE_WARPS=8,
// to measure). Which warp computes a tile never changes its values.
template <class Src, int kWarps>
__global__ void __launch_bounds__(kWarps * kWarp, mma::kMmaWarps / kWarps)
    k_matmul_mxfp4_tiles(const __grid_constant__ Src src, int n_jobs, int64_t uniform_blocks, bool staged_jobs) {
    if (!staged_jobs) grid_dependency_prologue();
    const mm_job* __restrict__ jobs = jobs_in(src);
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float red[kWarps][mma::kMmaGroupRows];
    __shared__ int sexp[mma::kMmaGroupRows];
    const int64_t blk = blockIdx.x;
    const mm_job& jb = uniform_blocks > 0 ? jobs[blk / uniform_blocks] : find_job(jobs, n_jobs, blk);
    const int64_t local = blk - jb.first_block;
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const mma_place at = place_in(jb, local, warp);
    const bool pair = at.pair, active = at.active;
    const int64_t r0 = at.r0, tile = at.tile;
    const int nr = at.nr;
    const int64_t units = jb.cols / (32 * mxfp4_tiles::kUnitBlocks);
    const uint8_t *A = jb.w, *B = jb.w;
    tile_strips(jb, tile, mxfp4_tiles::strip_bytes(jb.cols), A, B);
    mma::tile_unit_regs buf[mma::kTileAhead];
    if (active) {
        mma::prefetch_tiles(buf, A, B, units, lane);
        mma::prefetch_tiles_l2(A, B, units, lane);
    }
    if (staged_jobs) grid_dependency_prologue();
    uint4* xs = reinterpret_cast<uint4*>(smem);
    mma::stage_x<kWarps>(jb, r0, nr, xs, sexp, red);
    if (!active) return;
    switch (nr) {
        case 1: tiles_warp<1>(jb, buf, A, B, units, xs, sexp, r0, tile, pair, lane); break;
        case 2: tiles_warp<2>(jb, buf, A, B, units, xs, sexp, r0, tile, pair, lane); break;
        case 3: tiles_warp<3>(jb, buf, A, B, units, xs, sexp, r0, tile, pair, lane); break;
        default: tiles_warp<4>(jb, buf, A, B, units, xs, sexp, r0, tile, pair, lane); break;
    }
}

// ---- Q8_0 in the tile layout (matmul_q8.cuh: the arithmetic both kernels share) ----

// Tiles of 16 fragment rows of a job (a SwiGLU pair's: 8 gate and the same 8 up rows).
__host__ __device__ __forceinline__ int64_t job_row_tiles(const mm_job& jb) {
    const int64_t tile_rows = jb.up ? 8 : 16;
    return (jb.rows + tile_rows - 1) / tile_rows;
}
// The decode kernel's most tiles a block: its warps take one slice each of kWarps / slices
// tiles, or (rows of kWarps slices or more) the slices of one tile in turn. The planner may give
// a block fewer (its job's block_rows), so that a small launch spreads over more SMs.
__host__ __device__ __forceinline__ int q8_split_tiles(int64_t slices) {
    return slices >= q8::kWarps ? 1 : int(q8::kWarps / slices);
}
// Where warp `warp` of a prefill-shaped launch's block `local` (from its job's first) works: its
// job's group of 16 x rows [r0, r0 + nr) (live: the n8 tiles holding rows) and its 16-row tile,
// if any (a block takes kWarps consecutive tiles of one group).
struct wide_place {
    int64_t r0, tile;
    int nr, live;
    bool active;
};
__device__ __forceinline__ wide_place wide_place_in(const mm_job& jb, int64_t local, int warp) {
    const int64_t row_tiles = job_row_tiles(jb), tile_blocks = (row_tiles + q8::kWarps - 1) / q8::kWarps;
    const int64_t grp = local / tile_blocks, tb = local % tile_blocks;
    wide_place p;
    p.r0 = grp * q8::kPrefillRows;
    p.nr = jb.n - p.r0 < q8::kPrefillRows ? int(jb.n - p.r0) : q8::kPrefillRows;
    p.live = (p.nr + 3) / 4;
    p.tile = tb * q8::kWarps + warp;
    p.active = p.tile < row_tiles;
    return p;
}

// Slice p's units of a row of `units`.
__device__ __forceinline__ int q8_slice_units(int64_t p, int64_t units) {
    const int64_t left = units - p * q8_0_tiles::kSliceUnits;
    return int(left < q8_0_tiles::kSliceUnits ? left : q8_0_tiles::kSliceUnits);
}

// Decode (groups of up to 4 x rows): a block takes q8_split_tiles tiles of one group; warp w
// computes slice w % slices of tile w / slices (or slices w, w + 8, ... of the block's one tile),
// keeps each slice's value in shared memory, and after the block's barrier the slices' values
// are added in order. Shared memory: each warp's slice of x, then the values [tile][slice][16][4].
template <class Src>
__global__ void __launch_bounds__(q8::kThreads, 2)
    k_matmul_q8_split(const __grid_constant__ Src src, int n_jobs, bool staged_jobs) {
    if (!staged_jobs) grid_dependency_prologue();
    constexpr int NX = q8::kDecodeRows;
    const mm_job* __restrict__ jobs = jobs_in(src);
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int sx[q8::kWarps][NX];
    const int64_t blk = blockIdx.x;
    const mm_job& jb = find_job(jobs, n_jobs, blk);
    const int64_t local = blk - jb.first_block;
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const bool pair = jb.up != nullptr;
    const int P = int(q8_0_tiles::slices(jb.cols));
    const int tpb = jb.block_rows;  // tiles a block (plan_q8_tiles)
    const int64_t row_tiles = job_row_tiles(jb), tile_blocks = (row_tiles + tpb - 1) / tpb;
    const int64_t grp = local / tile_blocks, tb = local % tile_blocks;
    const int64_t r0 = grp * NX;
    const int nr = jb.n - r0 < NX ? int(jb.n - r0) : NX;
    const int tib = P >= q8::kWarps ? 0 : warp / P;
    const int p0 = P >= q8::kWarps ? warp : warp % P;
    const int pstep = P >= q8::kWarps ? q8::kWarps : P;
    const int64_t tile = tb * tpb + tib;
    const bool active = tib < tpb && tile < row_tiles;
    const int64_t units = jb.cols / q8_0_tiles::kUnitCols;
    uint4* xs = reinterpret_cast<uint4*>(smem) + warp * q8::slice_x_uint4(NX);
    float* values = reinterpret_cast<float*>(smem + size_t(q8::kWarps) * q8::slice_x_uint4(NX) * 16);
    auto run_of = [&](int p) {
        const int pn = p + pstep;
        return q8::unit_run{int64_t(p) * q8_0_tiles::kSliceUnits,
                            P >= q8::kWarps && pn < P ? int64_t(pn) * q8_0_tiles::kSliceUnits : -1,
                            q8_slice_units(p, units)};
    };
    const uint8_t *A = nullptr, *B = nullptr;
    q8::unit_regs buf[q8::kAhead];
    if (active) {
        tile_strips(jb, tile, q8_0_tiles::strip_bytes(jb.cols), A, B);
        const q8::unit_run first = run_of(p0);
#pragma unroll
        for (int i = 0; i < q8::kAhead; ++i)
            if (const int64_t u = first.after(i); u >= 0) q8::load_unit(buf[i], A, B, u, lane);
        if (staged_jobs) q8::prefetch_units_l2(A, B, first, lane);
    }
    if (staged_jobs) grid_dependency_prologue();
    if (active) {
        int xo[1];
        q8::lane_x_offsets<1>(nr, lane, xo);
        const float* rows[NX];
        int at[NX];
#pragma unroll
        for (int r = 0; r < NX; ++r) {
            rows[r] = r < nr ? jb.x + (r0 + r) * jb.x_stride : nullptr;
            at[r] = r < nr ? r : -1;
        }
        const int g = lane >> 2, t = lane & 3;
        for (int p = p0; p < P; p += pstep) {
            const q8::unit_run run = run_of(p);
            // Two x rows at a time (registers: two blocks an SM), the group's rows only.
#pragma unroll
            for (int h = 0; h < NX; h += 2) {
                if (h >= nr) break;
                const float* pair_rows[2] = {rows[h], rows[h + 1]};
                const int pair_at[2] = {at[h], at[h + 1]};
                q8::slice_x<2> xv;
                q8::load_slice_x<2>(xv, pair_rows, int64_t(p) * q8_0_tiles::kSliceCols, run.n * 4, lane);
                int s[2];
                q8::store_slice_x<2>(xv, pair_at, NX, run.n * 4, xs, s, lane);
                if (lane == 0) sx[warp][h] = s[0], sx[warp][h + 1] = s[1];
            }
            __syncwarp();
            float acc[1][4];
            q8::slice_products<1>(buf, A, B, run, units - 1, xs, NX * 8, xo, 1, lane, acc);
            float v[4];
            q8::slice_value(acc[0], 0, lane, [&](int xr) { return sx[warp][xr]; }, v);
            if (t < 2)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int xr = 2 * t + (i & 1);
                    if (xr < nr) values[((int64_t(tib) * P + p) * 16 + (i < 2 ? g : g + 8)) * NX + xr] = v[i];
                }
            __syncwarp();  // the slice's x is read before the next one overwrites it
        }
    }
    __syncthreads();
    const int per_tile = pair ? 8 : 16;
    for (int idx = int(threadIdx.x); idx < tpb * per_tile * NX; idx += q8::kThreads) {
        const int ti = idx / (per_tile * NX), f = (idx / NX) % per_tile, xr = idx % NX;
        const int64_t tl = tb * tpb + ti;
        if (xr >= nr || tl >= row_tiles) continue;
        auto total = [&](int fr) {
            const float* q = values + (int64_t(ti) * P * 16 + fr) * NX + xr;
            float sum = q[0];
            for (int p = 1; p < P; ++p) sum = __fadd_rn(sum, q[p * 16 * NX]);
            return sum;
        };
        if (pair) store_fragment_rows(jb, total(f), total(f + 8), r0 + xr, tl * 8 + f, 0, true);
        else if (tl * 16 + f < jb.rows) store_output(jb, total(f), 0.0f, r0 + xr, tl * 16 + f, false);
    }
}

// Prefill (groups of up to 16 x rows): a block takes kWarps tiles of one group, a tile a warp,
// slice after slice: each slice's x is staged by every warp (two x rows each) while the slice
// before is computed, in two buffers, and each slice's value is added to the warp's totals.
template <class Src>
__global__ void __launch_bounds__(q8::kThreads, 1)
    k_matmul_q8_wide(const __grid_constant__ Src src, int n_jobs, bool staged_jobs) {
    if (!staged_jobs) grid_dependency_prologue();
    constexpr int NX = q8::kPrefillRows, NT = NX / 4;
    const mm_job* __restrict__ jobs = jobs_in(src);
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int sexp[2][NX];
    const int64_t blk = blockIdx.x;
    const mm_job& jb = find_job(jobs, n_jobs, blk);
    const int64_t local = blk - jb.first_block;
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const bool pair = jb.up != nullptr;
    const int P = int(q8_0_tiles::slices(jb.cols));
    const wide_place at_ = wide_place_in(jb, local, warp);
    const int64_t r0 = at_.r0, tile = at_.tile;
    const int nr = at_.nr, live = at_.live;
    const bool active = at_.active;
    const int64_t units = jb.cols / q8_0_tiles::kUnitCols;
    uint4* xs = reinterpret_cast<uint4*>(smem);  // two slices' buffers
    const uint8_t *A = nullptr, *B = nullptr;
    q8::unit_regs buf[q8::kAhead];
    if (active) {
        tile_strips(jb, tile, q8_0_tiles::strip_bytes(jb.cols), A, B);
#pragma unroll
        for (int i = 0; i < q8::kAhead; ++i)
            if (i < units) q8::load_unit(buf[i], A, B, i, lane);
        if (staged_jobs) q8::prefetch_units_l2(A, B, q8::unit_run{0, -1, int(units < 64 ? units : 64)}, lane);
    }
    if (staged_jobs) grid_dependency_prologue();
    // This warp's x rows to stage: warp and warp + kWarps of the group.
    const float* rows[2];
    int at[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp + h * q8::kWarps;
        rows[h] = r < nr ? jb.x + (r0 + r) * jb.x_stride : nullptr;
        at[h] = r < nr ? r : -1;
    }
    q8::slice_x<2> xv;
    int s[2];
    q8::load_slice_x<2>(xv, rows, 0, q8_slice_units(0, units) * 4, lane);
    q8::store_slice_x<2>(xv, at, NX, q8_slice_units(0, units) * 4, xs, s, lane);
    if (lane == 0) sexp[0][warp] = s[0], sexp[0][warp + q8::kWarps] = s[1];
    int xo[NT];
    q8::lane_x_offsets<NT>(nr, lane, xo);
    float total[NT][4];
    for (int p = 0; p < P; ++p) {
        __syncthreads();
        const bool more = p + 1 < P;
        const int nb_next = more ? q8_slice_units(p + 1, units) * 4 : 0;
        if (more) q8::load_slice_x<2>(xv, rows, int64_t(p + 1) * q8_0_tiles::kSliceCols, nb_next, lane);
        if (active) {
            const q8::unit_run run{int64_t(p) * q8_0_tiles::kSliceUnits,
                                   more ? int64_t(p + 1) * q8_0_tiles::kSliceUnits : -1, q8_slice_units(p, units)};
            float acc[NT][4];
            q8::slice_products<NT>(buf, A, B, run, units - 1, xs + (p & 1) * q8::slice_x_uint4(NX), NX * 8, xo, live,
                                   lane, acc);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (j >= live) break;
                float v[4];
                q8::slice_value(acc[j], j, lane, [&](int xr) { return sexp[p & 1][xr]; }, v);
#pragma unroll
                for (int i = 0; i < 4; ++i) total[j][i] = p == 0 ? v[i] : __fadd_rn(total[j][i], v[i]);
            }
        }
        if (more) {
            q8::store_slice_x<2>(xv, at, NX, nb_next, xs + ((p + 1) & 1) * q8::slice_x_uint4(NX), s, lane);
            if (lane == 0) sexp[(p + 1) & 1][warp] = s[0], sexp[(p + 1) & 1][warp + q8::kWarps] = s[1];
        }
    }
    if (!active) return;
    const int g = lane >> 2, t = lane & 3;
    if (t >= 2) return;
    const int64_t oA = pair ? tile * 8 + g : tile * 16 + g, oB = tile * 16 + 8 + g;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int xr = 4 * j + 2 * t + i;
            if (j < live && xr < nr) store_fragment_rows(jb, total[j][i], total[j][2 + i], r0 + xr, oA, oB, pair);
        }
}

// ---- tiled MXFP4, prefill ----

// One unit of a warp's tiled strips against NT n8 tiles of x (the first `live` hold x rows): each
// block's fragments decoded once for all of them (mma::tile_unit_products' products and order).
template <int NT>
__device__ __forceinline__ void tiles_unit_products_wide(const mma::tile_unit_regs& c, const uint4* xb, int xblock,
                                                         const int (&xo)[NT], int live, float (&acc)[NT][4]) {
    const uint32_t wa[4] = {c.a.x, c.a.y, c.a.z, c.a.w}, wb[4] = {c.b.x, c.b.y, c.b.z, c.b.w};
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        const auto fA = mxfp4_tiles::fragments_of_tiled(wa[jj]), fB = mxfp4_tiles::fragments_of_tiled(wb[jj]);
        const float sA = mma::block_scale(c.sa, jj), sB = mma::block_scale(c.sb, jj);
#pragma unroll
        for (int j = 0; j < NT; ++j)
            if (j < live) mma::block_products(fA.d, fB.d, sA, sB, xb[jj * xblock + xo[j]], acc[j]);
    }
}

// Tiled MXFP4 jobs with many x rows (a prefill's experts): k_matmul_mxfp4_tiles' arithmetic (each
// x row's exponent from its whole row, the blocks' products added in order over the whole row,
// hi and lo added at the end), so the same bits, in k_matmul_q8_wide's shape: a block takes
// kWarps tiles of a group of 16 x rows, a tile a warp, reading each unit's weights once for the
// 16 rows; x staged slice by slice (512 columns) in two buffers while the slice before is
// computed. The x rows' exponents come first (each warp's two rows read whole).
template <class Src>
__global__ void __launch_bounds__(q8::kThreads, 1)
    k_matmul_mxfp4_tiles_wide(const __grid_constant__ Src src, int n_jobs, bool staged_jobs) {
    if (!staged_jobs) grid_dependency_prologue();
    constexpr int NX = q8::kPrefillRows, NT = NX / 4;
    const mm_job* __restrict__ jobs = jobs_in(src);
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int sexp[NX];
    const int64_t blk = blockIdx.x;
    const mm_job& jb = find_job(jobs, n_jobs, blk);
    const int64_t local = blk - jb.first_block;
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const bool pair = jb.up != nullptr;
    const wide_place at_ = wide_place_in(jb, local, warp);
    const int64_t r0 = at_.r0, tile = at_.tile;
    const int nr = at_.nr, live = at_.live;
    const bool active = at_.active;
    const int64_t units = jb.cols / (32 * mxfp4_tiles::kUnitBlocks);
    const int64_t slice_units = q8_0_tiles::kSliceUnits;
    const int P = int((units + slice_units - 1) / slice_units);
    const uint8_t *A = jb.w, *B = jb.w;
    tile_strips(jb, tile, mxfp4_tiles::strip_bytes(jb.cols), A, B);
    mma::tile_unit_regs buf[mma::kTileAhead];
    if (active) mma::prefetch_tiles(buf, A, B, units, lane);
    if (staged_jobs) grid_dependency_prologue();
    const float* rows[2];
    int at[2], s[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp + h * q8::kWarps;
        rows[h] = r < nr ? jb.x + (r0 + r) * jb.x_stride : nullptr;
        at[h] = r < nr ? r : -1;
        float m = 0.0f;
        if (rows[h])
            for (int64_t e = lane; e < jb.cols; e += kWarp) m = fmaxf(m, fabsf(__ldg(rows[h] + e)));
        s[h] = q8::x_exponent(warp_max(m));
    }
    if (lane == 0) sexp[warp] = s[0], sexp[warp + q8::kWarps] = s[1];
    auto slice_blocks = [&](int p) { return q8_slice_units(p, units) * 4; };
    uint4* xs = reinterpret_cast<uint4*>(smem);
    q8::slice_x<2> xv;
    q8::load_slice_x<2>(xv, rows, 0, slice_blocks(0), lane);
    q8::store_slice_x_scaled<2>(xv, at, NX, slice_blocks(0), xs, s, lane);
    int xo[NT];
    q8::lane_x_offsets<NT>(nr, lane, xo);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int p = 0; p < P; ++p) {
        __syncthreads();
        const bool more = p + 1 < P;
        if (more) q8::load_slice_x<2>(xv, rows, int64_t(p + 1) * q8_0_tiles::kSliceCols, slice_blocks(p + 1), lane);
        if (active) {
            const uint4* xp = xs + (p & 1) * q8::slice_x_uint4(NX);
            const int64_t u0 = int64_t(p) * slice_units;
            const int n = q8_slice_units(p, units);
            for (int k = 0; k < n; k += mma::kTileAhead) {
#pragma unroll
                for (int i = 0; i < mma::kTileAhead; ++i) {
                    if (k + i >= n) break;
                    const mma::tile_unit_regs c = buf[i];
                    const int64_t ahead = u0 + k + i + mma::kTileAhead;
                    if (ahead < units) mma::load_tile_unit(buf[i], A, B, ahead, lane);
                    tiles_unit_products_wide<NT>(c, xp + (k + i) * 4 * (NX * 8), NX * 8, xo, live, acc);
                }
            }
        }
        if (more)
            q8::store_slice_x_scaled<2>(xv, at, NX, slice_blocks(p + 1), xs + ((p + 1) & 1) * q8::slice_x_uint4(NX), s,
                                        lane);
    }
    if (!active) return;
    const int g = lane >> 2;
    const int64_t oA = pair ? tile * 8 + g : tile * 16 + g, oB = tile * 16 + 8 + g;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        float out[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = __fadd_rn(acc[j][i], __shfl_xor_sync(kFullMask, acc[j][i], 2));
        if (j < live) store_tile_outputs(jb, out, sexp + 4 * j, r0 + 4 * j, nr - 4 * j, oA, oB, pair, lane);
    }
}

// Raises kernel K's dynamic shared memory limit to `limit` once (per kernel: K is a template
// argument), when a launch needs more than the default 48 KiB.
template <auto K>
cudaError_t opt_in_shared(size_t shared, size_t limit) {
    static bool opted_in = false;
    if (shared <= (48u << 10) || opted_in) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit));
    if (e == cudaSuccess) opted_in = true;
    return e;
}

template <ggml_type T, class Src>
cudaError_t launch_matmul(cudaStream_t s, const Src& src, int n_jobs, unsigned blocks, size_t shared,
                          bool staged_jobs) {
    if (shared > kMatmulSharedBytes) return cudaErrorInvalidValue;
    if (const cudaError_t e = opt_in_shared<k_matmul<T, Src>>(shared, kMatmulSharedBytes); e != cudaSuccess) return e;
    return launch_kernel(s, k_matmul<T, Src>, dim3(blocks), dim3(kThreads), shared, src, n_jobs, staged_jobs);
}

constexpr size_t kMxfp4SharedMax = mma::kMmaSharedMax;

template <int kRing, class Src>
cudaError_t launch_mxfp4_kernel(cudaStream_t s, const Src& src, int n_jobs, unsigned blocks, size_t shared) {
    if (shared > kMxfp4SharedMax) return cudaErrorInvalidValue;
    if (const cudaError_t e = opt_in_shared<k_matmul_mxfp4<kRing, Src>>(shared, kMxfp4SharedMax); e != cudaSuccess)
        return e;
    return launch_kernel(s, k_matmul_mxfp4<kRing, Src>, dim3(blocks), dim3(mma::kMmaThreads), shared, src, n_jobs);
}

template <class Src, int kWarps>
cudaError_t launch_mxfp4_tiles_kernel(cudaStream_t s, const Src& src, int n_jobs, unsigned blocks, size_t shared,
                                      int64_t uniform_blocks, bool staged_jobs) {
    if (shared > kMxfp4SharedMax) return cudaErrorInvalidValue;
    if (const cudaError_t e = opt_in_shared<k_matmul_mxfp4_tiles<Src, kWarps>>(shared, kMxfp4SharedMax);
        e != cudaSuccess)
        return e;
    return launch_kernel(s, k_matmul_mxfp4_tiles<Src, kWarps>, dim3(blocks), dim3(kWarps * kWarp), shared, src,
                         n_jobs, uniform_blocks, staged_jobs);
}

template <class Src>
cudaError_t launch_mxfp4_tiles(cudaStream_t s, const Src& src, int n_jobs, unsigned blocks, size_t shared,
                               const matmul_plan& plan, bool staged_jobs) {
    if (plan.tiles_wide) {
        if (shared > kMxfp4SharedMax) return cudaErrorInvalidValue;
        if (const cudaError_t e = opt_in_shared<k_matmul_mxfp4_tiles_wide<Src>>(shared, kMxfp4SharedMax);
            e != cudaSuccess)
            return e;
        return launch_kernel(s, k_matmul_mxfp4_tiles_wide<Src>, dim3(blocks), dim3(q8::kThreads), shared, src, n_jobs,
                             staged_jobs);
    }
    switch (plan.tile_warps) {
        case 8: return launch_mxfp4_tiles_kernel<Src, 8>(s, src, n_jobs, blocks, shared, plan.uniform_blocks, staged_jobs);
        case mma::kMmaWarps:
            return launch_mxfp4_tiles_kernel<Src, mma::kMmaWarps>(s, src, n_jobs, blocks, shared, plan.uniform_blocks,
                                                                  staged_jobs);
        default: return cudaErrorInvalidValue;
    }
}

template <class Src>
cudaError_t launch_mxfp4(cudaStream_t s, const Src& src, int n_jobs, unsigned blocks, size_t shared, int ring) {
    switch (ring) {
        case 0: return launch_mxfp4_kernel<0>(s, src, n_jobs, blocks, shared);
        case 8: return launch_mxfp4_kernel<8>(s, src, n_jobs, blocks, shared);
        case 16: return launch_mxfp4_kernel<16>(s, src, n_jobs, blocks, shared);
        default: return cudaErrorInvalidValue;
    }
}

template <class Src>
cudaError_t launch_q8_tiles(cudaStream_t s, const Src& src, int n_jobs, unsigned blocks, const matmul_plan& plan,
                            bool staged_jobs) {
    const size_t shared = plan.shared;
    if (shared > mma::kMmaSharedMax) return cudaErrorInvalidValue;
    if (plan.q8_kernel == 1) {
        if (const cudaError_t e = opt_in_shared<k_matmul_q8_split<Src>>(shared, mma::kMmaSharedMax); e != cudaSuccess)
            return e;
        return launch_kernel(s, k_matmul_q8_split<Src>, dim3(blocks), dim3(q8::kThreads), shared, src, n_jobs,
                             staged_jobs);
    }
    if (const cudaError_t e = opt_in_shared<k_matmul_q8_wide<Src>>(shared, mma::kMmaSharedMax); e != cudaSuccess)
        return e;
    return launch_kernel(s, k_matmul_q8_wide<Src>, dim3(blocks), dim3(q8::kThreads), shared, src, n_jobs, staged_jobs);
}

template <class Src>
cudaError_t launch_planned(cudaStream_t s, ggml_type type, const Src& src, int n_jobs, unsigned blocks,
                           const matmul_plan& plan, bool staged_jobs) {
    const size_t shared = plan.shared;
    switch (type) {
        case ggml_type::f32: return launch_matmul<ggml_type::f32>(s, src, n_jobs, blocks, shared, staged_jobs);
        case ggml_type::f16: return launch_matmul<ggml_type::f16>(s, src, n_jobs, blocks, shared, staged_jobs);
        case ggml_type::bf16: return launch_matmul<ggml_type::bf16>(s, src, n_jobs, blocks, shared, staged_jobs);
        case ggml_type::q8_0:
            return plan.q8_kernel ? launch_q8_tiles(s, src, n_jobs, blocks, plan, staged_jobs)
                                  : launch_matmul<ggml_type::q8_0>(s, src, n_jobs, blocks, shared, staged_jobs);
        case ggml_type::mxfp4:
            return plan.tiles ? launch_mxfp4_tiles(s, src, n_jobs, blocks, shared, plan, staged_jobs)
                              : launch_mxfp4(s, src, n_jobs, blocks, shared, plan.mxfp4_ring);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

namespace {

int64_t plan_job(mm_job& job, int block_rows) {
    const int group = matmul_group_rows(job.cols);
    if (group == 0) return -1;
    const int64_t groups = (job.n + group - 1) / group;
    job.block_rows = block_rows;
    return groups * ((job.rows + block_rows - 1) / block_rows);
}

size_t shared_bytes(int64_t n, int64_t cols) {
    const int group = matmul_group_rows(cols);
    const int64_t rows = n < group ? n : group;
    return size_t(rows * ((cols + 31) / 32) * kChunkFloats) * sizeof(float);
}

}  // namespace

namespace {

// Whether a MXFP4 job takes the tensor-core path: a shape question (cols a multiple of 128 and
// small enough for one x row in shared memory), plus 4-byte aligned rows (always so for the
// model's tensors: a stage's block offsets are then known mod 4).
bool takes_mma(const mm_job& j) {
    return mma::mma_group_rows(j.cols) > 0 && j.row_bytes % 4 == 0 && j.row_bytes >= j.cols / 32 * 17 &&
           reinterpret_cast<uintptr_t>(j.w) % 4 == 0 && reinterpret_cast<uintptr_t>(j.up) % 4 == 0;
}

int64_t mma_tiles(const mm_job& j) {
    const int64_t tile_rows = j.up ? 8 : 16;
    const int g = mma::mma_group_rows(j.cols);
    return ((j.n + g - 1) / g) * ((j.rows + tile_rows - 1) / tile_rows);
}

// Tiles a block of an mma launch of `tiles` tiles over `slots` blocks running at once (SMs times
// blocks an SM), at most `most`: one wave where they fit (which block or warp computes a tile
// never changes its values).
int64_t tiles_per_block(int64_t tiles, int64_t slots, int most) {
    const int64_t per_block = (tiles + slots - 1) / slots;
    return per_block < 1 ? 1 : per_block > most ? most : per_block;
}

// An mma job's blocks at `per_block` tiles a block, which its block_rows says (-per_block).
int64_t plan_mma_job(mm_job& j, int64_t per_block) {
    const int64_t tile_rows = j.up ? 8 : 16;
    const int g = mma::mma_group_rows(j.cols);
    const int64_t row_tiles = (j.rows + tile_rows - 1) / tile_rows;
    j.block_rows = -int32_t(per_block);
    return ((j.n + g - 1) / g) * ((row_tiles + per_block - 1) / per_block);
}

// Tiled MXFP4 (every job of the launch): the mma path's tiles per block, spread over the SMs in
// one wave where they can; -1 blocks when a job is not tiled or its shape does not tile.
matmul_plan plan_mxfp4_tiles(mm_job* jobs, int n_jobs) {
    matmul_plan p;
    p.tiles = true;
    int64_t tiles = 0, most = 0;
    for (int i = 0; i < n_jobs; ++i) {
        const mm_job& j = jobs[i];
        if (!(j.flags & kTiles) || !mxfp4_tiles::tileable(j.rows, j.cols, j.row_bytes) ||
            mma::mma_group_rows(j.cols) == 0)
            return {-1, 0};
        tiles += mma_tiles(j);
        const size_t sh = mma::mma_x_bytes(j.cols, j.n);
        if (sh > p.shared) p.shared = sh;
        most = j.n > most ? j.n : most;
    }
    // Many x rows (a prefill's experts): the kernel that reads a unit once for 16 of them (the
    // same bits). MOESTREAM_MXFP4_WIDE_ROWS: the most x rows a job may have for the other one.
    static const int64_t narrow_rows = [] {
        const char* v = std::getenv("MOESTREAM_MXFP4_WIDE_ROWS");
        return v ? int64_t(std::atoi(v)) : int64_t(2 * q8::kDecodeRows);
    }();
    if (most > narrow_rows) {
        p.tiles_wide = true;
        p.shared = 2 * size_t(q8::slice_x_uint4(q8::kPrefillRows)) * 16;
        for (int i = 0; i < n_jobs; ++i) {
            mm_job& j = jobs[i];
            j.first_block = p.blocks;
            j.block_rows = 0;
            p.blocks += ((j.n + q8::kPrefillRows - 1) / q8::kPrefillRows) *
                        ((job_row_tiles(j) + q8::kWarps - 1) / q8::kWarps);
        }
        return p;
    }
    // Blocks of tile_warps warps, kMmaWarps / tile_warps of them an SM.
    static const int warps = [] {
        const char* v = std::getenv("MOESTREAM_TILE_WARPS");
        return v && std::atoi(v) == 8 ? 8 : mma::kMmaWarps;
    }();
    p.tile_warps = warps;
    const int64_t per_block = tiles_per_block(tiles, sm_count() * (mma::kMmaWarps / warps), warps);
    for (int i = 0; i < n_jobs; ++i) {
        mm_job& j = jobs[i];
        j.first_block = p.blocks;
        const int64_t b = plan_mma_job(j, per_block);
        p.uniform_blocks = i == 0 || p.uniform_blocks == b ? b : -1;
        p.blocks += b;
    }
    if (p.uniform_blocks < 0) p.uniform_blocks = 0;
    return p;
}

// MXFP4: tiles per block (the same for every mma job of the launch) so that the launch's
// tiles spread over the SMs in one wave where they can (which block or warp computes a tile
// never changes its values); the other jobs as the CUDA-core kernel plans them, with 16 warps.
matmul_plan plan_mxfp4(mm_job* jobs, int n_jobs) {
    if (n_jobs > 0 && (jobs[0].flags & kTiles)) return plan_mxfp4_tiles(jobs, n_jobs);
    matmul_plan p;
    int64_t tiles = 0, core_blocks = 0;
    bool narrow = false, wide = false;  // mma jobs with rings of 8 / 16 blocks
    for (int i = 0; i < n_jobs; ++i) {
        mm_job& j = jobs[i];
        if (j.flags & kTiles) return {-1, 0};  // a launch is tiled throughout or not at all
        if (takes_mma(j)) {
            tiles += mma_tiles(j);
            const size_t sh = mma::mma_shared_bytes(j.cols, j.n);
            if (sh > p.shared) p.shared = sh;
            (mma::mma_wide_stages(j.cols, j.n) ? wide : narrow) = true;
        } else {
            const int64_t b = plan_job(j, kMatmulBlockRows);
            if (b < 0) return {-1, 0};
            core_blocks += b;
            const size_t sh = shared_bytes(j.n, j.cols);
            if (sh > p.shared) p.shared = sh;
        }
    }
    const int64_t per_block = tiles_per_block(tiles, sm_count(), mma::kMmaWarps);
    const int core_rows = core_blocks < 264 ? mma::kMmaWarps : kMatmulBlockRows;
    for (int i = 0; i < n_jobs; ++i) {
        mm_job& j = jobs[i];
        j.first_block = p.blocks;
        p.blocks += takes_mma(j) ? plan_mma_job(j, per_block) : plan_job(j, core_rows);
    }
    // One path and one ring in the launch: the kernel of that path alone (MOESTREAM_MXFP4_SPLIT=0
    // keeps the kernel with both, for A/B runs of bench kernels on one machine).
    static const bool split = [] {
        const char* v = std::getenv("MOESTREAM_MXFP4_SPLIT");
        return !(v && v[0] == '0');
    }();
    if (split && core_blocks == 0 && wide != narrow) p.mxfp4_ring = wide ? 16 : 8;
    return p;
}

// Tiled Q8_0 (every job of the launch): the decode kernel while every job's x rows fit two of its
// groups (MOESTREAM_Q8_SPLIT_ROWS), else the prefill kernel; -1 blocks when a job is not tiled.
// The kernels give the same bits, so the choice is speed's alone.
matmul_plan plan_q8_tiles(mm_job* jobs, int n_jobs) {
    static const int64_t split_rows = [] {
        const char* v = std::getenv("MOESTREAM_Q8_SPLIT_ROWS");
        return v ? int64_t(std::atoi(v)) : int64_t(2 * q8::kDecodeRows);
    }();
    matmul_plan p;
    int64_t most = 0;
    for (int i = 0; i < n_jobs; ++i) {
        const mm_job& j = jobs[i];
        if (!(j.flags & kQ8Tiles) || !q8_0_tiles::tileable(j.rows, j.cols, j.row_bytes)) return {-1, 0};
        most = j.n > most ? j.n : most;
    }
    p.q8_kernel = most <= split_rows ? 1 : 2;
    // Decode: the most tiles a block, halved (all jobs alike) while the launch has fewer blocks
    // than two an SM, so that a small matmul's loads come from more SMs at once.
    int shrink = 1;
    if (p.q8_kernel == 1) {
        auto blocks_at = [&](int div) {
            int64_t total = 0;
            for (int i = 0; i < n_jobs; ++i) {
                const mm_job& j = jobs[i];
                const int tpb = std::max(1, q8_split_tiles(q8_0_tiles::slices(j.cols)) / div);
                total += ((j.n + q8::kDecodeRows - 1) / q8::kDecodeRows) * ((job_row_tiles(j) + tpb - 1) / tpb);
            }
            return total;
        };
        while (shrink < q8::kWarps && blocks_at(shrink) < 2 * int64_t(sm_count())) shrink *= 2;
    }
    for (int i = 0; i < n_jobs; ++i) {
        mm_job& j = jobs[i];
        const int64_t P = q8_0_tiles::slices(j.cols), row_tiles = job_row_tiles(j);
        size_t shared;
        int64_t b;
        if (p.q8_kernel == 1) {
            const int tpb = std::max(1, q8_split_tiles(P) / shrink);
            j.block_rows = tpb;
            b = ((j.n + q8::kDecodeRows - 1) / q8::kDecodeRows) * ((row_tiles + tpb - 1) / tpb);
            shared = size_t(q8::kWarps) * q8::slice_x_uint4(q8::kDecodeRows) * 16 +
                     size_t(tpb) * size_t(P) * 16 * q8::kDecodeRows * sizeof(float);
        } else {
            b = ((j.n + q8::kPrefillRows - 1) / q8::kPrefillRows) * ((row_tiles + q8::kWarps - 1) / q8::kWarps);
            shared = 2 * size_t(q8::slice_x_uint4(q8::kPrefillRows)) * 16;
        }
        j.first_block = p.blocks;
        if (p.q8_kernel != 1) j.block_rows = 0;
        p.blocks += b;
        if (shared > p.shared) p.shared = shared;
    }
    return p;
}

}  // namespace

matmul_plan plan_matmul(ggml_type type, mm_job* jobs, int n_jobs) {
    if (type == ggml_type::mxfp4) return plan_mxfp4(jobs, n_jobs);
    if (type == ggml_type::q8_0 && n_jobs > 0 && (jobs[0].flags & kQ8Tiles)) return plan_q8_tiles(jobs, n_jobs);
    matmul_plan p;
    int64_t blocks = 0;
    for (int i = 0; i < n_jobs; ++i) {
        const int64_t b = plan_job(jobs[i], kMatmulBlockRows);
        if (b < 0) return {-1, 0};
        blocks += b;
        const size_t sh = shared_bytes(jobs[i].n, jobs[i].cols);
        if (sh > p.shared) p.shared = sh;
    }
    // Enough blocks for two per SM of a 132-SM part, else fewer rows per block.
    constexpr int64_t kEnough = 264;
    int rows = kMatmulBlockRows;
    while (rows > kMatmulWarps && blocks < kEnough) rows /= 2, blocks *= 2;
    for (int i = 0; i < n_jobs; ++i) {
        jobs[i].first_block = p.blocks;
        p.blocks += plan_job(jobs[i], rows);
    }
    return p;
}

cudaError_t matmul(cudaStream_t s, ggml_type type, const mm_job* jobs, int n_jobs, const matmul_plan& plan,
                   bool staged_jobs, const inline_jobs* inline_from) {
    const int64_t total_blocks = plan.blocks;
    if (n_jobs == 0 || total_blocks == 0) return cudaSuccess;
    if (total_blocks > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
    const unsigned blocks = unsigned(total_blocks);
    if (inline_from) {
        if (jobs != nullptr || n_jobs > kInlineJobs) return cudaErrorInvalidValue;
        return launch_planned(s, type, *inline_from, n_jobs, blocks, plan, true);
    }
    return launch_planned(s, type, device_jobs(jobs), n_jobs, blocks, plan, staged_jobs);
}

}  // namespace moestream::cuda::kernels
