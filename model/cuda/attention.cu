// Sparse attention with sinks (§3.4.9) and the indexer's scores (§3.4.6), following the CPU
// backend's operations: each dot product takes value d of a 32-value chunk in lane d % 32, the
// chunks in order, then the lanes in the CPU kernels' tree (warp_sum); the softmax's max, its
// exponentials and its denominator summed in key order; each output value the keys' weighted
// sum over fixed 64-key chunks in order, then the chunks in order (the CPU: one run over the
// keys), and exp (numeric::exp_float against glibc's expf, which disagree in rare last bits).
#include "model/attention_keys.h"
#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunkKeys = 64;  // keys a block of the scores and partial kernels takes
constexpr int kMaxTileHeads = 16;  // heads a block of the scores and partial kernels takes at most

// Key i of a row (ring keys, then fresh ones, then selected entries; n_sel valid ids).
__device__ __forceinline__ const uint16_t* key_at(const attention_row& a, int64_t head_dim, int64_t i) {
    if (i < a.ring_count) return a.ring + ((a.ring_first + i) % a.ring_capacity) * head_dim;
    i -= a.ring_count;
    if (i < a.fresh_count) return a.fresh + i * head_dim;
    i -= a.fresh_count;
    return a.latents + int64_t(a.selection[i]) * head_dim;
}

// The row's key count: the selection ends at its first negative id (found by the whole block).
__device__ int64_t row_key_count(const attention_row& a) {
    __shared__ unsigned long long first_invalid;
    if (threadIdx.x == 0) first_invalid = (unsigned long long)a.selection_len;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < a.selection_len; i += blockDim.x)
        if (a.selection[i] < 0) atomicMin(&first_invalid, (unsigned long long)i);
    __syncthreads();
    return a.ring_count + a.fresh_count + int64_t(first_invalid);
}

// Decode attention in three launches, so that a row's keys spread over many blocks (one block a
// (row, head), walking a 2k context's keys, was latency-bound at 55 us a layer on mini):
//   scores:   (row, heads, 64 keys) a block, a warp a key: dot(q, key) with the 32 lanes as the
//             accumulators of the CPU's pattern, then its lane tree (k_attention_scores below);
//             and each head's max over the chunk.
//   partial:  (row, heads, 64 keys): the max over all scores (the chunks' maxes), the chunk's
//             exp(s - max) (bf16 when the model rounds them), and Σ p v over the chunk's keys in
//             order, per value.
//   combine:  (row, head): the denominator (the sink's term, then every key's in order) and each
//             value's chunk sums in order, times 1 / denominator.
// So a value depends on the keys and the fixed 64-key chunks, never on the batch or the grid. The
// CPU sums all keys in one run (cpu_backend.cpp): the two differ in the last bits of some values.
// A block of the scores and partial kernels takes a tile of up to kMaxTileHeads heads of its row:
// every head shares the row's keys (MQA, K = V), so a key is read once for the tile, not once a
// head. A prefill's rows, each in blocks of one head, were latency-bound small blocks: 65% of a
// 2k-token prefill on mini-lite. The tile changes which block computes a value, never its
// operations (each score and each chunk's sum is computed alone, as before), so the host sizes it
// from the launch (attention_tile_heads): one head a block for a decode row, whose few chunks
// need the heads to fill the GPU.
// The scores kernel: a warp a key, kScoreKeysPerWarp keys a warp, so a block of 16 warps takes a
// 64-key chunk. Lane l holds the CPU's accumulator l (values l, l + 32, ... of the key, in order)
// and the lanes meet in warp_sum's butterfly, so a score is the CPU pattern's bits. Every value
// of the warp's keys is loaded before the first product (heads up to kScoreMaxDim wide; wider
// ones load a key at a time): a thread a key, reading its key's 512 bytes in 8 dependent steps,
// kept the whole layer waiting on memory latency.
constexpr int kScoreKeysPerWarp = 4;
constexpr int kScoreWarps = kChunkKeys / kScoreKeysPerWarp;
constexpr int kScoreThreads = kScoreWarps * kWarp;
constexpr int kScoreMaxDim = 512;
constexpr int kScoreVals = kScoreMaxDim / kWarp;  // values a lane holds of each key

// warp_sum's butterfly over the lanes' accumulators (lane k meets lane k + 16, then + 8, + 4, + 2,
// + 1; lane 0 ends with the dot), then the scale: a score's bits as the CPU forms them.
__device__ __forceinline__ float lane_tree_score(float acc, int lane, float scale) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        const float other = __shfl_down_sync(kFullMask, acc, o);
        if (lane < o) acc = __fadd_rn(acc, other);
    }
    return __fmul_rn(acc, scale);
}

// A key's score from the values lane `lane` holds of it (heads up to kScoreMaxDim wide).
__device__ __forceinline__ float key_score(const float (&kv)[kScoreVals], const float* q_s, int64_t head_dim, int lane,
                                           float scale) {
    float acc = 0.0f;
#pragma unroll
    for (int m = 0; m < kScoreVals; ++m)
        if (lane + kWarp * m < head_dim) acc = __fadd_rn(acc, __fmul_rn(kv[m], q_s[lane + kWarp * m]));
    return lane_tree_score(acc, lane, scale);
}

// A key's score read a value at a time (heads wider than kScoreMaxDim).
__device__ __forceinline__ float wide_key_score(const uint16_t* key, const float* qh, int64_t head_dim, int lane,
                                                float scale) {
    float acc = 0.0f;
    for (int64_t d = lane; d < head_dim; d += kWarp)
        acc = __fadd_rn(acc, __fmul_rn(bf16_bits_value(__ldg(key + key_word(d, head_dim))), qh[d]));
    return lane_tree_score(acc, lane, scale);
}

// The row of block x and the first head and head count of its tile.
struct tile_of_block {
    int64_t row;
    int h0, heads;
};
__device__ __forceinline__ tile_of_block block_tile(int n_heads, int tile_heads) {
    const int tiles = (n_heads + tile_heads - 1) / tile_heads;
    const int h0 = int(blockIdx.x % unsigned(tiles)) * tile_heads;
    return {int64_t(blockIdx.x / unsigned(tiles)), h0, min(tile_heads, n_heads - h0)};
}

// Scores of a (row, head tile, 64-key chunk) block, and each head's max over the chunk's scores
// (chunk_max[(row head) * chunks + chunk]; the max is exact in any order, so the softmax's max
// is the max of its chunks' maxes).
__global__ void __launch_bounds__(kScoreThreads) k_attention_scores(const attention_row* __restrict__ rows, int n_heads,
                                                                    int tile_heads, int64_t head_dim, float scale,
                                                                    float* scores, float* chunk_max, int64_t max_keys) {
    grid_dependency_prologue();
    extern __shared__ float q_s[];  // [tile heads][head_dim]
    __shared__ float max_s[kScoreWarps][kMaxTileHeads];
    const tile_of_block t = block_tile(n_heads, tile_heads);
    const attention_row& a = rows[t.row];
    const int64_t n_keys = row_key_count(a);
    for (int64_t d = threadIdx.x; d < t.heads * head_dim; d += blockDim.x) q_s[d] = a.q[t.h0 * head_dim + d];
    __syncthreads();
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const int64_t first = int64_t(blockIdx.y) * kChunkKeys + warp * kScoreKeysPerWarp;
    const auto score_at = [&](int hh, int64_t i) -> float& {
        return scores[(t.row * n_heads + t.h0 + hh) * max_keys + i];
    };
    // Each head of the tile: the warp's keys' scores (score_of(head, k)), written, and their max.
    const auto chunk_scores = [&](const auto& score_of) {
        for (int hh = 0; hh < t.heads; ++hh) {
            float mx = -1e30f;
#pragma unroll
            for (int k = 0; k < kScoreKeysPerWarp; ++k) {
                if (first + k >= n_keys) break;  // the warp's valid keys are a prefix of its keys
                const float sc = score_of(hh, k);
                if (lane == 0) score_at(hh, first + k) = sc;
                mx = fmaxf(mx, sc);
            }
            if (lane == 0) max_s[warp][hh] = mx;
        }
    };
    if (head_dim <= kScoreMaxDim) {
        float kv[kScoreKeysPerWarp][kScoreVals];
#pragma unroll
        for (int k = 0; k < kScoreKeysPerWarp; ++k) {
            const bool valid = first + k < n_keys;
            const uint16_t* key = valid ? key_at(a, head_dim, first + k) : nullptr;
#pragma unroll
            for (int m = 0; m < kScoreVals; ++m) {
                const int64_t d = lane + kWarp * m;
                kv[k][m] = valid && d < head_dim ? bf16_bits_value(__ldg(key + key_word(d, head_dim))) : 0.0f;
            }
        }
        chunk_scores([&](int hh, int k) { return key_score(kv[k], q_s + hh * head_dim, head_dim, lane, scale); });
    } else {
        chunk_scores([&](int hh, int k) {
            return wide_key_score(key_at(a, head_dim, first + k), q_s + hh * head_dim, head_dim, lane, scale);
        });
    }
    __syncthreads();
    if (int(threadIdx.x) < t.heads) {
        float m = max_s[0][threadIdx.x];
        for (int w = 1; w < kScoreWarps; ++w) m = fmaxf(m, max_s[w][threadIdx.x]);
        chunk_max[(t.row * n_heads + t.h0 + threadIdx.x) * gridDim.y + blockIdx.y] = m;
    }
}

// The softmax's max of (row, head): its chunks' maxes (each from -1e30, as the CPU's max).
__device__ __forceinline__ float row_head_max(const float* chunk_max, int64_t rh, int chunks, int64_t n_keys) {
    const int used = int((n_keys + kChunkKeys - 1) / kChunkKeys);
    float m = -1e30f;
    for (int c = 0; c < used; ++c) m = fmaxf(m, chunk_max[rh * chunks + c]);
    return m;
}

// Each head's weights over a (row, head tile, 64-key chunk) block's keys, and Σ p v over them in
// key order for every value of every head of the tile: a value of a key is read once for the tile.
__global__ void __launch_bounds__(kThreads) k_attention_partial(const attention_row* __restrict__ rows, int n_heads,
                                                                int tile_heads, int64_t head_dim, bool bf16_probs,
                                                                const float* scores, const float* chunk_max,
                                                                float* probs, float* partial, int64_t max_keys) {
    grid_dependency_prologue();
    __shared__ float p_s[kMaxTileHeads][kChunkKeys];
    __shared__ float m_s[kMaxTileHeads];
    __shared__ const uint16_t* key_s[kChunkKeys];
    const tile_of_block t = block_tile(n_heads, tile_heads);
    const attention_row& a = rows[t.row];
    const int64_t n_keys = row_key_count(a);
    const int64_t i0 = int64_t(blockIdx.y) * kChunkKeys;
    if (i0 >= n_keys) return;
    const int chunks = int(gridDim.y);
    const int in_chunk = int(n_keys - i0 < kChunkKeys ? n_keys - i0 : kChunkKeys);
    const int64_t rh0 = t.row * n_heads + t.h0;
    if (int(threadIdx.x) < t.heads) m_s[threadIdx.x] = row_head_max(chunk_max, rh0 + threadIdx.x, chunks, n_keys);
    if (int(threadIdx.x) < in_chunk) key_s[threadIdx.x] = key_at(a, head_dim, i0 + threadIdx.x);
    __syncthreads();
    for (int v = int(threadIdx.x); v < t.heads * kChunkKeys; v += int(blockDim.x)) {
        const int hh = v / kChunkKeys, k = v % kChunkKeys;
        if (k >= in_chunk) continue;
        const int64_t at = (rh0 + hh) * max_keys + i0 + k;
        const float p = numeric::exp_float(__fsub_rn(scores[at], m_s[hh]));
        probs[at] = p;  // the denominator takes the unrounded values
        p_s[hh][k] = bf16_probs ? numeric::round_bf16(p) : p;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        const int64_t word = key_word(d, head_dim);
        float acc[kMaxTileHeads];
#pragma unroll
        for (int hh = 0; hh < kMaxTileHeads; ++hh) acc[hh] = 0.0f;
        const auto add_keys = [&](int k, float v) {
#pragma unroll
            for (int hh = 0; hh < kMaxTileHeads; ++hh)
                if (hh < t.heads) acc[hh] = __fadd_rn(acc[hh], __fmul_rn(p_s[hh][k], v));
        };
        int k = 0;
        for (; k + 16 <= in_chunk; k += 16) {
            float v[16];
#pragma unroll
            for (int u = 0; u < 16; ++u) v[u] = bf16_bits_value(__ldg(key_s[k + u] + word));
#pragma unroll
            for (int u = 0; u < 16; ++u) add_keys(k + u, v[u]);
        }
        for (; k < in_chunk; ++k) add_keys(k, bf16_bits_value(__ldg(key_s[k] + word)));
#pragma unroll
        for (int hh = 0; hh < kMaxTileHeads; ++hh)
            if (hh < t.heads) partial[((rh0 + hh) * chunks + blockIdx.y) * head_dim + d] = acc[hh];
    }
}

__global__ void __launch_bounds__(kThreads) k_attention_combine(const attention_row* __restrict__ rows, int n_heads,
                                                                int64_t head_dim, const float* __restrict__ sinks,
                                                                const float* chunk_max, const float* probs,
                                                                const float* partial, int64_t max_keys, int chunks) {
    grid_dependency_prologue();
    constexpr int kSegment = 1024;  // weights staged at a time for the denominator's serial sum
    __shared__ float p_s[kSegment];
    __shared__ float denom_s;
    const int64_t rh = blockIdx.x;
    const attention_row& a = rows[rh / n_heads];
    const int h = int(rh % n_heads);
    const int64_t n_keys = row_key_count(a);
    float* out = a.out + h * head_dim;
    if (n_keys == 0) {  // no key visible: the output is zero (the sink alone carries no value)
        for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) out[d] = 0.0f;
        return;
    }
    const float m = row_head_max(chunk_max, rh, chunks, n_keys);
    // The softmax's denominator (cpu_backend.cpp softmax_with_sink): the sink's term, then every
    // key's weight in order, one thread adding from shared memory what the block loaded at once
    // (one thread loading them, eight at a time, waited on memory a few dozen times a head).
    const float* p = probs + rh * max_keys;
    if (threadIdx.x == 0) denom_s = numeric::exp_float(__fsub_rn(sinks[h], m));
    for (int64_t s0 = 0; s0 < n_keys; s0 += kSegment) {
        const int len = int(n_keys - s0 < kSegment ? n_keys - s0 : kSegment);
        for (int i = int(threadIdx.x); i < len; i += int(blockDim.x)) p_s[i] = p[s0 + i];
        __syncthreads();
        if (threadIdx.x == 0) {
            float denom = denom_s;
            for (int i = 0; i < len; ++i) denom = __fadd_rn(denom, p_s[i]);
            denom_s = denom;
        }
        __syncthreads();
    }
    const float inv = __fdiv_rn(1.0f, denom_s);
    const int used = int((n_keys + kChunkKeys - 1) / kChunkKeys);
    const float* part = partial + rh * chunks * head_dim;
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int c = 0; c < used; ++c) acc = __fadd_rn(acc, part[c * head_dim + d]);
        out[d] = numeric::round_bf16(__fmul_rn(acc, inv));
    }
}

// One warp per (row, entry): every head's dot in the CPU's lane order, then the bf16 sum over heads.
__global__ void k_indexer_scores(const float* __restrict__ q, const float* __restrict__ w, int64_t n, int n_heads,
                                 int64_t head_dim, const float* __restrict__ keys, int64_t n_keys,
                                 const int64_t* __restrict__ n_visible, float* scores) {
    grid_dependency_prologue();
    const int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
    const int lane = int(threadIdx.x) % kWarp;
    if (item >= n * n_keys) return;
    const int64_t r = item / n_keys, j = item % n_keys;
    if (j >= n_visible[r]) {
        if (lane == 0) scores[item] = -__int_as_float(0x7f800000);
        return;
    }
    const float* k = keys + j * head_dim;
    float s = 0.0f;
    for (int h = 0; h < n_heads; ++h) {
        const float* qh = q + (r * n_heads + h) * head_dim;
        float acc = 0.0f;
        for (int64_t d = lane; d < head_dim; d += kWarp) acc = __fadd_rn(acc, __fmul_rn(qh[d], k[d]));
        const float qk = numeric::round_bf16(warp_sum(acc));
        s = __fadd_rn(s, numeric::round_bf16(__fmul_rn(fmaxf(qk, 0.0f), w[r * n_heads + h])));
    }
    if (lane == 0) scores[item] = numeric::round_bf16(s);
}

size_t g_shared_limit = 48 << 10;

int64_t chunks_of(int64_t max_keys) { return (std::max<int64_t>(max_keys, 1) + kChunkKeys - 1) / kChunkKeys; }

}  // namespace

void set_shared_memory_limit(size_t bytes) { g_shared_limit = bytes; }

int attention_tile_heads(int64_t n_rows, int n_heads, int64_t head_dim, int64_t max_keys) {
    // The most heads (a power of two) that still leaves two blocks an SM, and whose queries fit
    // the scores kernel's shared memory.
    const int64_t chunks = chunks_of(max_keys);
    int tile = kMaxTileHeads;
    while (tile > 1 && (tile >= 2 * n_heads || n_rows * ((n_heads + tile - 1) / tile) * chunks < 2 * int64_t(sm_count()) ||
                        size_t(tile) * size_t(head_dim) * sizeof(float) > g_shared_limit))
        tile /= 2;
    return tile;
}

size_t attention_work_floats(int64_t n_rows, int n_heads, int64_t head_dim, int64_t max_keys) {
    const int64_t rh = n_rows * n_heads, keys = std::max<int64_t>(max_keys, 1);
    return size_t(rh * (2 * keys + chunks_of(max_keys) * (head_dim + 1)));
}

cudaError_t attention(cudaStream_t s, const attention_row* rows, int64_t n_rows, int n_heads, int64_t head_dim,
                      float scale, const float* sinks, bool bf16_probs, int64_t max_keys, float* work,
                      int tile_heads) {
    if (n_rows == 0) return cudaSuccess;
    const int64_t rh = n_rows * n_heads, keys = std::max<int64_t>(max_keys, 1), chunks = chunks_of(max_keys);
    if (tile_heads < 1 || tile_heads > kMaxTileHeads) return cudaErrorInvalidValue;
    const int64_t blocks = n_rows * ((n_heads + tile_heads - 1) / tile_heads);
    if (rh > int64_t(0x7fffffff) || chunks > 65535) return cudaErrorInvalidConfiguration;
    const size_t q_bytes = size_t(std::min(tile_heads, n_heads)) * size_t(head_dim) * sizeof(float);
    if (q_bytes > g_shared_limit) return cudaErrorInvalidValue;
    if (q_bytes > (48 << 10)) {
        const cudaError_t e =
            cudaFuncSetAttribute(k_attention_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, int(q_bytes));
        if (e != cudaSuccess) return e;
    }
    float* scores = work;
    float* probs = scores + rh * keys;
    float* partial = probs + rh * keys;
    float* chunk_max = partial + rh * chunks * head_dim;
    const dim3 grid{unsigned(blocks), unsigned(chunks)};
    if (cudaError_t e = launch_kernel(s, k_attention_scores, grid, dim3(kScoreThreads), q_bytes, rows, n_heads,
                                      tile_heads, head_dim, scale, scores, chunk_max, keys);
        e != cudaSuccess)
        return e;
    if (cudaError_t e = launch_kernel(s, k_attention_partial, grid, dim3(kThreads), 0, rows, n_heads, tile_heads,
                                      head_dim, bf16_probs, static_cast<const float*>(scores),
                                      static_cast<const float*>(chunk_max), probs, partial, keys);
        e != cudaSuccess)
        return e;
    return launch_kernel(s, k_attention_combine, dim3(unsigned(rh)), dim3(kThreads), 0, rows, n_heads, head_dim, sinks,
                         static_cast<const float*>(chunk_max), static_cast<const float*>(probs),
                         static_cast<const float*>(partial), keys, int(chunks));
}

cudaError_t indexer_scores(cudaStream_t s, const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                           const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) {
    if (n * n_keys == 0) return cudaSuccess;
    const unsigned blocks = grid_for(n * n_keys, kWarps);
    return launch_kernel(s, k_indexer_scores, dim3(blocks), dim3(kThreads), 0, q, w, n, n_heads, head_dim, keys,
                         n_keys, n_visible, scores);
}

}  // namespace moestream::cuda::kernels
