#include "model/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/bf16.h"
#include "model/cpu_elementwise.h"
#include "model/cpu_matmul.h"
#include "model/prefetch.h"
#include "model/router_score.h"

namespace moestream {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

using elementwise::inv_rms;

// Row-parallel element-wise ops split their rows into chunks of at least this many values, so a
// decode step (one row) runs inline on the calling thread and a prefill is shared out. A row's
// values never depend on the chunking.
constexpr int64_t kMinValuesPerChunk = 16 << 10;

int64_t rows_per_chunk(int64_t values_per_row) {
    return std::max<int64_t>(1, kMinValuesPerChunk / std::max<int64_t>(values_per_row, 1));
}

// A scratch vector of the calling thread, grown to the largest size asked for and kept, so ops
// allocate only while sizes still grow. Workers must reach it through pointers taken by the
// caller (a thread_local named inside a task is the worker's own).
enum scratch_slot {
    k_slot_rope,
    k_slot_mix,
    k_slot_engram_h,
    k_slot_engram_k,
    k_slot_scores,
    k_slot_inv_denom,
    k_slot_key_begin
};
template <class T, scratch_slot Slot>
std::vector<T>& scratch(size_t size) {
    thread_local std::vector<T> v;
    if (v.size() < size) v.resize(size);
    return v;
}

// cos / sin of fp32(pos) * freqs[i] for one position and one frequency table, with the last few
// results kept: a decode step ropes q, kv, the output and the index q of every layer at the same
// position with the same table. The key is the position's fp32 value and the table's values, so
// a hit returns exactly what the computation would.
class rope_table_cache {
  public:
    // Returns cos in [0, pairs) and sin in [pairs, 2 pairs).
    const float* get(float pos, const float* freqs, int64_t pairs) {
        for (entry& e : entries_)
            if (e.pairs == pairs && std::memcmp(&e.pos, &pos, sizeof pos) == 0 &&
                std::memcmp(e.freqs.data(), freqs, size_t(pairs) * sizeof(float)) == 0)
                return e.cos_sin.data();
        entry& e = entries_[next_];
        next_ = (next_ + 1) % kEntries;
        e.pos = pos;
        e.pairs = pairs;
        e.freqs.assign(freqs, freqs + pairs);
        e.cos_sin.resize(size_t(2 * pairs));
        for (int64_t i = 0; i < pairs; ++i) {
            // The reference forms the angle in fp32: fp32(pos) * f_i, then fp32 cos/sin.
            const float theta = pos * freqs[i];
            e.cos_sin[size_t(i)] = std::cos(theta);
            e.cos_sin[size_t(pairs + i)] = std::sin(theta);
        }
        return e.cos_sin.data();
    }

  private:
    static constexpr int kEntries = 4;
    struct entry {
        float pos = 0;
        int64_t pairs = -1;
        std::vector<float> freqs, cos_sin;
    };
    entry entries_[kEntries];
    int next_ = 0;
};

// Bound on the heads of attention and the indexer (per-key scores live on the stack).
constexpr int kMaxHeads = 256;

// Attention processes its rows in groups whose scores (n_keys x n_heads floats per row) fit this
// bound, so the scratch stays bounded on long prefills; a row's values do not depend on its group.
constexpr int64_t kMaxAttentionScores = int64_t(1) << 21;

// Rows whose keys take at most this many bytes go through attention's one-pass form; longer rows
// through the three passes. In the one-pass form every thread reads all of a row's keys, in the
// three passes a share, at the cost of two more pool calls. On the H200 host (16 threads,
// mini-lite's 256-value keys, `bench cpu`'s decode at 64-144 tokens of context): 81 keys took
// 10.5 us in one pass against 16.8 in three (keys then in fp32); with bf16 keys in their
// shuffle-free order, a bound of 256 such keys made attention 0.77-0.88 ms a token against
// 0.97-1.09 with 128 (5 + 5 runs), and 192 or 512 keys measured the same as 256.
constexpr int64_t kFusedKeyBytes = 128 << 10;

// One head's softmax with its sink, in place over its scores p[0..n): the max of the scores
// alone (the reference's kernel starts its running max at -1e30 and adds the sink's term at the
// end, so the weights it rounds to bf16 are relative to the scores' max even when the sink is
// larger), exp(s - max), the denominator (fp32: the sink's term, then the keys in order), the
// weights (rounded to bf16 with bf16_probs); returns 1 / denominator.
float softmax_with_sink(float* p, int64_t n, float sink, bool bf16_probs) {
    float m = -1e30f;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);
    float denom = std::exp(sink - m);
    for (int64_t i = 0; i < n; ++i) denom += (p[i] = std::exp(p[i] - m));
    if (bf16_probs) round_to_bf16(p, n);
    return 1.0f / denom;
}

// Attention for a group of rows (MQA: every head shares the row's keys, K = V). Rows with few
// keys (short contexts) take one parallel pass with one unit per (row, head): the head's scores
// dot(q_h, k) * scale, its softmax, then Σ_i w_h,i k_i times 1 / denominator, rounded to bf16 (a
// decode row's 16 heads keep 16 threads busy at the cost of one pool call instead of three).
// Longer rows take three parallel passes, so that each key is read from memory once per row:
//   1. one unit per (row, key): the key's score against every head, dot(q_h, k) * scale;
//   2. one unit per (row, head): the softmax;
//   3. one unit per (row, slice of head_dim): Σ_i w_h,i k_i[slice] for every head, keys in
//      ascending order, times 1 / denominator, rounded to bf16.
// Every value is computed by the same operations in the same order as a per-(row, head) loop
// would (same dot, same sequential max / sum / accumulation), whatever the form and chunking.
// One query row with its keys as a pointer list (the form the kernels walk).
struct key_row {
    const float* q = nullptr;
    const uint16_t* const* keys = nullptr;
    int64_t n_keys = 0;
    float* out = nullptr;
};

void attention_group(thread_pool& pool, std::span<const key_row> rows, int n_heads, int64_t head_dim,
                     float scale, const float* sinks, bool bf16_probs) {
    const int64_t n_rows = int64_t(rows.size());
    // key_begin[r]: the row's first key in the group's key numbering; its scores sit at
    // scores[key_begin[r] * n_heads + h * n_keys + i] (head-major: pass 2 walks a head's keys).
    std::vector<int64_t>& key_begin = scratch<int64_t, k_slot_key_begin>(size_t(n_rows + 1));
    key_begin[0] = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
        MS_ASSERT(rows[size_t(r)].n_keys >= 0);
        key_begin[size_t(r + 1)] = key_begin[size_t(r)] + rows[size_t(r)].n_keys;
    }
    const int64_t total_keys = key_begin[size_t(n_rows)];
    const int64_t* kb = key_begin.data();
    float* scores = scratch<float, k_slot_scores>(size_t(total_keys * n_heads)).data();
    float* inv_denom = scratch<float, k_slot_inv_denom>(size_t(n_rows * n_heads)).data();

    int64_t max_keys = 0;
    for (const auto& row : rows) max_keys = std::max(max_keys, row.n_keys);
    if (max_keys * head_dim * int64_t(sizeof(uint16_t)) <= kFusedKeyBytes) {
        pool.parallel_for(n_rows * n_heads, [&](int64_t begin, int64_t end) {
            for (int64_t u = begin; u < end; ++u) {
                const int64_t r = u / n_heads;
                const int h = int(u % n_heads);
                const key_row& row = rows[size_t(r)];
                float* out = row.out + h * head_dim;
                if (row.n_keys == 0) {  // no key visible: the output is zero (the sink alone carries no value)
                    std::fill_n(out, head_dim, 0.0f);
                    continue;
                }
                float* p = scores + kb[r] * n_heads + h * row.n_keys;
                elementwise::dot_keys(row.q + h * head_dim, row.keys, row.n_keys, head_dim, p);
                for (int64_t i = 0; i < row.n_keys; ++i) p[i] = p[i] * scale;
                const float inv = softmax_with_sink(p, row.n_keys, sinks[h], bf16_probs);
                elementwise::attend_head(row.keys, row.n_keys, p, inv, head_dim, out);
            }
        });
        return;
    }

    // Pass 1. Grain: a few keys per chunk (each key is n_heads dots).
    const int64_t key_grain = std::max<int64_t>(1, 4096 / (n_heads * head_dim));
    pool.parallel_for(total_keys, key_grain, [&](int64_t begin, int64_t end) {
        int64_t r = std::upper_bound(kb, kb + n_rows + 1, begin) - kb - 1;
        // Keys sit wherever their caches put them, so the hardware cannot see the next one coming:
        // each is prefetched two keys ahead (a decode step's keys come from memory every token).
        const auto key_at = [&](int64_t v) {
            const int64_t rv = std::upper_bound(kb, kb + n_rows + 1, v) - kb - 1;
            return rows[size_t(rv)].keys[v - kb[rv]];
        };
        for (int64_t v = begin; v < std::min(end, begin + 2); ++v) prefetch_to_l2(key_at(v), head_dim * 2);
        for (int64_t u = begin; u < end; ++u) {
            while (u >= kb[r + 1]) ++r;
            const key_row& row = rows[size_t(r)];
            const int64_t i = u - kb[r];
            if (u + 2 < end) prefetch_to_l2(i + 2 < row.n_keys ? row.keys[i + 2] : key_at(u + 2), head_dim * 2);
            float dots[kMaxHeads];
            elementwise::dot_heads(row.q, head_dim, n_heads, row.keys[i], head_dim, dots);
            float* s = scores + kb[r] * n_heads + i;
            for (int h = 0; h < n_heads; ++h) s[h * row.n_keys] = dots[h] * scale;
        }
    });

    // Pass 2.
    pool.parallel_for(n_rows * n_heads, [&](int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u) {
            const int64_t r = u / n_heads;
            const int h = int(u % n_heads);
            const int64_t n_keys = rows[size_t(r)].n_keys;
            inv_denom[u] = softmax_with_sink(scores + kb[r] * n_heads + h * n_keys, n_keys, sinks[h], bf16_probs);
        }
    });

    // Pass 3.
    const int64_t slices = (head_dim + elementwise::kAttentionSlice - 1) / elementwise::kAttentionSlice;
    pool.parallel_for(n_rows * slices, [&](int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u) {
            const int64_t r = u / slices;
            const int64_t d0 = (u % slices) * elementwise::kAttentionSlice;
            const int64_t width = std::min(elementwise::kAttentionSlice, head_dim - d0);
            const key_row& row = rows[size_t(r)];
            if (row.n_keys == 0) {
                // No key visible: the output is zero (the sink alone carries no value).
                for (int h = 0; h < n_heads; ++h) std::fill_n(row.out + h * head_dim + d0, width, 0.0f);
                continue;
            }
            elementwise::attend_slice(row.keys, row.n_keys, scores + kb[r] * n_heads, inv_denom + r * n_heads,
                                      n_heads, head_dim, d0, width, row.out);
        }
    });
}

}  // namespace

cpu_backend::cpu_backend(int threads) : pool_(std::max(1, threads)) {}

std::vector<cpu_backend::op_time> cpu_backend::profile() const { return {std::begin(times_), std::end(times_)}; }

void cpu_backend::reset_profile() {
    for (auto& t : times_) t.calls = 0, t.seconds = 0;
}

void cpu_backend::matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y,
                         int64_t y_stride, bool round) {
    timer t_(*this, k_matmul);
    MS_ASSERT(!w.empty() && n >= 0);
    MS_ASSERT_MSG(w.row_stride == size_t(row_bytes(dtype_info(w.type), w.cols)), "weight rows must be contiguous");
    MS_ASSERT_MSG(w.layout == weight_layout::rows, "the CPU backend reads weights in rows only");
    if (n == 0) return;
    moestream::matmul(pool_, w.type, w.data, w.rows, w.cols, x, n, x_stride, y, y_stride);
    if (round)
        for (int64_t r = 0; r < n; ++r) round_to_bf16(y + r * y_stride, w.rows);
}

void cpu_backend::matmul_batch(std::span<const matmul_job> jobs) {
    timer t_(*this, k_matmul_batch);
    // Split every job's output rows into tiles of about 32 KiB of weights and share the tiles
    // out in one parallel step; each tile runs the single-threaded matmul on its rows, which
    // computes every value exactly as the pooled one does.
    constexpr int64_t kTileBytes = 32 << 10;
    constexpr int64_t kTailBytes = 8 << 10;
    // Shares below this many weight bytes are not worth waking a thread for.
    constexpr int64_t kMinShareBytes = 8 << 10;
    // Weight bytes per output row of each job (both halves of a SwiGLU pair), and in all.
    job_row_bytes_.assign(jobs.size(), 0);
    int64_t total = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        MS_ASSERT_MSG(jobs[j].w.layout == weight_layout::rows && jobs[j].up.layout == weight_layout::rows,
                      "the CPU backend reads weights in rows only");
        const auto& jb = jobs[j];
        MS_ASSERT(!jb.w.empty());
        MS_ASSERT_MSG(jb.w.row_stride == size_t(row_bytes(dtype_info(jb.w.type), jb.w.cols)), "weight rows must be contiguous");
        int64_t rb = int64_t(jb.w.row_stride);
        if (!jb.up.empty()) {
            MS_ASSERT_MSG(jb.up.rows == jb.w.rows && jb.up.cols == jb.w.cols && jb.u != nullptr, "swiglu pair: gate and up differ in shape");
            MS_ASSERT_MSG(jb.up.row_stride == size_t(row_bytes(dtype_info(jb.up.type), jb.up.cols)), "weight rows must be contiguous");
            MS_ASSERT(!jb.router_scores);
            rb += int64_t(jb.up.row_stride);
        }
        if (jb.n == 0) continue;
        job_row_bytes_[j] = rb;
        total += jb.w.rows * rb;
    }
    // Thread shares of equal weight bytes (a pass waits for its largest share): the jobs' rows
    // laid end to end are cut at k/shares of the bytes (at a multiple of four rows, the kernels'
    // group, where a job allows), and each share into tiles of at most kTileBytes within a job.
    const int64_t shares = std::clamp<int64_t>(total / kMinShareBytes, 1, pool_.size());
    tiles_.clear();
    share_starts_.assign(size_t(shares + 1), 0);
    size_t j = 0;
    int64_t row = 0, job_start = 0;  // the next row to hand out; bytes of the jobs before j
    for (int64_t k = 0; k < shares; ++k) {
        share_starts_[size_t(k)] = int64_t(tiles_.size());
        const int64_t share_end = k + 1 == shares ? total : total / shares * (k + 1);
        while (j < jobs.size()) {
            const int64_t rb = job_row_bytes_[j], rows = rb ? jobs[j].w.rows : 0;
            if (row >= rows) {  // this job is handed out (or empty): on to the next
                job_start += rows * rb;
                ++j;
                row = 0;
                continue;
            }
            if (job_start + row * rb >= share_end) break;
            // This share's rows of job j: up to its byte boundary, at the nearest multiple of four.
            int64_t stop = rows;
            if (job_start + rows * rb > share_end)
                stop = std::clamp<int64_t>((share_end - job_start + 2 * rb) / (4 * rb) * 4, row, rows);
            const int64_t per_tile = std::max<int64_t>(1, kTileBytes / rb);
            for (int64_t b = row; b < stop; b += per_tile) tiles_.push_back({int32_t(j), b, std::min(stop, b + per_tile)});
            row = stop;
            if (stop < rows) break;  // the share ends inside this job
        }
        // The share's last tile in small pieces: a thread that runs out of work takes over a
        // slower one's pieces, so the pass ends at most a piece after the mean.
        if (int64_t(tiles_.size()) > share_starts_[size_t(k)]) {
            const tile last = tiles_.back();
            const int64_t rb = job_row_bytes_[size_t(last.job)];
            const int64_t step = std::max<int64_t>(4, kTailBytes / rb / 4 * 4);
            if (last.end - last.begin > step) {
                tiles_.pop_back();
                for (int64_t b = last.begin; b < last.end; b += step)
                    tiles_.push_back({last.job, b, std::min(last.end, b + step)});
            }
        }
    }
    share_starts_[size_t(shares)] = int64_t(tiles_.size());
    // The start of a tile's weight streams (its rows, and its up rows for a SwiGLU pair).
    const auto prefetch_tile = [&](int64_t t) {
        const tile& tl = tiles_[size_t(t)];
        const auto& jb = jobs[size_t(tl.job)];
        const int64_t bytes = std::min<int64_t>(kStreamStartBytes, (tl.end - tl.begin) * int64_t(jb.w.row_stride));
        prefetch_to_l2(jb.w.row(tl.begin), bytes);
        if (!jb.up.empty()) prefetch_to_l2(jb.up.row(tl.begin), bytes);
    };
    // A share starts cold; within it, the next tile's streams start elsewhere unless it continues
    // this tile's rows (which the kernels' look-ahead reaches). Shares are taken piece by piece
    // (one tile a piece), so a thread that is done helps one that is slow.
    const auto share_start = [&](int64_t t) {
        return std::binary_search(share_starts_.begin(), share_starts_.end() - 1, t);
    };
    pool_.parallel_for_pieces(shares, share_starts_.data(), [&](int64_t t) {
        const tile& tl = tiles_[size_t(t)];
        const auto& jb = jobs[size_t(tl.job)];
        const int64_t count = tl.end - tl.begin;
        if (share_start(t)) prefetch_tile(t);
        if (t + 1 < int64_t(tiles_.size()) && tiles_[size_t(t + 1)].job != tl.job && !share_start(t + 1)) prefetch_tile(t + 1);
        moestream::matmul(jb.w.type, jb.w.row(tl.begin), count, jb.w.cols, jb.x, jb.n, jb.x_stride, jb.y + tl.begin,
                          jb.y_stride);
        if (jb.round_bf16)
            for (int64_t r = 0; r < jb.n; ++r) round_to_bf16(jb.y + r * jb.y_stride + tl.begin, count);
        if (jb.router_scores)
            for (int64_t r = 0; r < jb.n; ++r)
                for (int64_t o = tl.begin; o < tl.end; ++o) jb.y[r * jb.y_stride + o] = router_score(jb.y[r * jb.y_stride + o]);
        if (!jb.up.empty()) {
            moestream::matmul(jb.up.type, jb.up.row(tl.begin), count, jb.up.cols, jb.x, jb.n, jb.x_stride,
                              jb.u + tl.begin, jb.u_stride);
            for (int64_t r = 0; r < jb.n; ++r) {
                float* g = jb.y + r * jb.y_stride + tl.begin;
                float* u = jb.u + r * jb.u_stride + tl.begin;
                if (jb.round_bf16) round_to_bf16(u, count);
                // swiglu_row is element-wise: a tile's rows get the bits the whole row would.
                elementwise::swiglu_row(g, u, count, jb.swiglu_limit, jb.swiglu_w ? jb.swiglu_w[r] : 1.0f);
            }
        }
    });
}

namespace {

// Per-thread scratch of output_sum's units (a worker's own thread_local: each unit runs wholly
// on one thread).
struct output_scratch {
    std::vector<float> acc, y;
};
thread_local output_scratch t_output;

}  // namespace

void cpu_backend::output_sum(std::span<const output_term> terms, int64_t n, int64_t dim, float* f,
                             const hc_update* upd) {
    timer t_(*this, k_output_sum);
    MS_ASSERT(n >= 0 && dim > 0 && f != nullptr);
    if (n == 0) return;
    // Bytes a column of f costs: the weight rows it reads, the y values it adds, the update's
    // streams. A unit is a slice of columns (a multiple of 16, so the vector loops take it whole)
    // of about kUnitBytes.
    int64_t column_bytes = 0, max_m = 0;
    for (const auto& t : terms) {
        MS_ASSERT(t.m >= 0 && t.m <= n);
        max_m = std::max(max_m, t.m);
        if (!t.w.empty()) {
            MS_ASSERT_MSG(t.w.rows == dim && t.h != nullptr, "output_sum: a term's W must have dim rows");
            MS_ASSERT_MSG(t.w.row_stride == size_t(row_bytes(dtype_info(t.w.type), t.w.cols)), "weight rows must be contiguous");
            column_bytes += int64_t(t.w.row_stride) + 4 * t.m;
        } else {
            MS_ASSERT_MSG(t.y != nullptr || t.m == 0, "output_sum: a term needs W or y");
            column_bytes += 4 * t.m;
        }
    }
    const int hc = upd ? upd->hc : 0;
    if (upd) MS_ASSERT(upd->H && upd->post && upd->comb && hc >= 1 && (!upd->next || upd->pre));
    column_bytes += 4 * n * (2 + 2 * hc);
    const int64_t unit_bytes = n == 1 ? 32 << 10 : 192 << 10;
    const int64_t by_bytes = (unit_bytes / std::max<int64_t>(column_bytes, 1)) / 16 * 16;
    const int64_t by_threads = (dim + 16 * pool_.size() - 1) / (16 * pool_.size()) * 16;
    const int64_t width = std::max<int64_t>(16, std::min(by_bytes, by_threads));
    const int64_t units = (dim + width - 1) / width;
    // Each thread starts with a run of consecutive units (one piece each), whose rows of every term
    // are one stream for the kernels' look-ahead, so only the run's starts need a prefetch; a
    // thread that is done takes units still unclaimed in a slower thread's run.
    const int64_t runs = std::min<int64_t>(units, pool_.size());
    run_starts_.resize(size_t(runs + 1));
    for (int64_t k = 0; k <= runs; ++k) run_starts_[size_t(k)] = k * units / runs;
    pool_.parallel_for_pieces(runs, run_starts_.data(), [&](int64_t unit) {
        output_scratch& sc = t_output;
        if (std::binary_search(run_starts_.begin(), run_starts_.end() - 1, unit)) {
            const int64_t run_end = *std::upper_bound(run_starts_.begin(), run_starts_.end(), unit);
            for (const auto& t : terms)
                if (!t.w.empty() && t.m > 0)
                    prefetch_to_l2(t.w.row(unit * width), std::min<int64_t>(kStreamStartBytes, (std::min(dim, run_end * width) -
                                                                                                unit * width) * int64_t(t.w.row_stride)));
        }
        const int64_t d0 = unit * width, w = std::min(width, dim - d0);
        sc.acc.assign(size_t(n * w), 0.0f);
        if (sc.y.size() < size_t(max_m * w)) sc.y.resize(size_t(max_m * w));
        for (const auto& t : terms) {
            if (t.m == 0) continue;
            const float* y = t.y ? t.y + d0 : nullptr;
            int64_t y_stride = dim;
            if (!t.w.empty()) {
                moestream::matmul(t.w.type, t.w.row(d0), w, t.w.cols, t.h, t.m, t.w.cols, sc.y.data(), w);
                round_to_bf16(sc.y.data(), t.m * w);
                y = sc.y.data();
                y_stride = w;
            }
            for (int64_t i = 0; i < t.m; ++i) {
                float* a = sc.acc.data() + (t.rows ? t.rows[i] : i) * w;
                const float* yi = y + i * y_stride;
                for (int64_t d = 0; d < w; ++d) a[d] += yi[d];
            }
        }
        for (int64_t r = 0; r < n; ++r) {
            float* fr = f + r * dim + d0;
            const float* a = sc.acc.data() + r * w;
            for (int64_t d = 0; d < w; ++d) fr[d] = round_to_bf16(a[d]);
            if (!upd) continue;
            float* Hr = upd->H + r * hc * dim + d0;
            elementwise::expand_cols(fr, Hr, hc, dim, w, upd->post + r * hc, upd->comb + r * hc * hc, Hr);
            if (upd->next) elementwise::collapse_cols(Hr, hc, dim, w, upd->pre + r * hc, upd->next + r * dim + d0);
        }
    });
}

void cpu_backend::rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                           bool round) {
    timer t_(*this, k_rms_norm);
    pool_.parallel_for(n, rows_per_chunk(dim), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            elementwise::scale_row(x + r * dim, inv_rms(x + r * dim, dim, eps), w, y + r * dim, dim, round);
    });
}

void cpu_backend::round_bf16(float* x, int64_t count) { round_to_bf16(x, count); }

void cpu_backend::rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
                       const int64_t* pos, const float* freqs, bool inverse) {
    timer t_(*this, k_rope);
    MS_ASSERT(rope_dim % 2 == 0 && rope_dim <= head_dim);
    const int64_t pairs = rope_dim / 2;
    thread_local rope_table_cache cache;
    // The inverse turn uses -sin (negation is exact, as in a * c - b * (-s)).
    std::vector<float>& neg_sin = scratch<float, k_slot_rope>(size_t(pairs));
    for (int64_t r = 0; r < n; ++r) {
        const float* cos_sin = cache.get(float(pos[r]), freqs, pairs);
        const float* c = cos_sin;
        const float* s = cos_sin + pairs;
        if (inverse) {
            for (int64_t i = 0; i < pairs; ++i) neg_sin[size_t(i)] = -s[i];
            s = neg_sin.data();
        }
        for (int h = 0; h < n_heads; ++h)
            elementwise::rotate_pairs(x + r * row_stride + h * head_dim + (head_dim - rope_dim), c, s, pairs);
    }
}

void cpu_backend::hc_mixes(const float* H, int64_t n, int hc, int64_t dim, const weight_view& fn, const float* base,
                           const float* scale, int iters, float hc_eps, float norm_eps, float* pre, float* post,
                           float* comb, const float* fn_h) {
    timer t_(*this, k_hc_mixes);
    const int64_t n_mix = (2 + hc) * hc;
    MS_ASSERT(fn.rows == n_mix && fn.cols == hc * dim && fn.type == ggml_type::f32);
    std::vector<float>& mix = scratch<float, k_slot_mix>(size_t(n * n_mix));
    if (fn_h) std::copy(fn_h, fn_h + n * n_mix, mix.begin());
    else matmul(fn, H, hc * dim, n, mix.data(), n_mix, false);
    for (int64_t r = 0; r < n; ++r) {
        float* m = mix.data() + r * n_mix;
        const float s = inv_rms(H + r * hc * dim, hc * dim, norm_eps);
        for (int64_t i = 0; i < n_mix; ++i) m[i] *= s;
        for (int k = 0; k < hc; ++k) {
            pre[r * hc + k] = sigmoid(m[k] * scale[0] + base[k]) + hc_eps;
            post[r * hc + k] = 2.0f * sigmoid(m[hc + k] * scale[1] + base[hc + k]);
        }
        float* C = comb + r * hc * hc;
        for (int i = 0; i < hc; ++i) {
            float mx = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < hc; ++j) {
                C[i * hc + j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
                mx = std::max(mx, C[i * hc + j]);
            }
            float sum = 0;
            for (int j = 0; j < hc; ++j) sum += (C[i * hc + j] = std::exp(C[i * hc + j] - mx));
            for (int j = 0; j < hc; ++j) C[i * hc + j] = C[i * hc + j] / sum + hc_eps;
        }
        auto normalize_columns = [&] {
            for (int j = 0; j < hc; ++j) {
                float sum = 0;
                for (int i = 0; i < hc; ++i) sum += C[i * hc + j];
                for (int i = 0; i < hc; ++i) C[i * hc + j] /= sum + hc_eps;
            }
        };
        normalize_columns();
        for (int it = 1; it < iters; ++it) {
            for (int i = 0; i < hc; ++i) {
                float sum = 0;
                for (int j = 0; j < hc; ++j) sum += C[i * hc + j];
                for (int j = 0; j < hc; ++j) C[i * hc + j] /= sum + hc_eps;
            }
            normalize_columns();
        }
    }
}

void cpu_backend::hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) {
    timer t_(*this, k_hc_collapse);
    pool_.parallel_for(n, rows_per_chunk(hc * dim), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            elementwise::collapse_cols(H + r * hc * dim, hc, dim, dim, p + r * hc, out + r * dim);
    });
}

void cpu_backend::hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                            const float* comb, float* out) {
    timer t_(*this, k_hc_expand);
    pool_.parallel_for(n, rows_per_chunk(hc * dim), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            elementwise::expand_cols(f + r * dim, H + r * hc * dim, hc, dim, dim, post + r * hc, comb + r * hc * hc,
                                     out + r * hc * dim);
    });
}

void cpu_backend::attention(std::span<const attention_row> arows, int n_heads, int64_t head_dim, float scale,
                            const float* sinks, bool bf16_probs) {
    timer t_(*this, k_attention);
    MS_ASSERT(n_heads >= 1 && n_heads <= kMaxHeads && head_dim >= 1);
    // Each row's keys as one pointer list: ring keys, fresh keys, selected compressed entries.
    key_ptrs_.clear();
    key_starts_.assign(1, 0);
    for (const auto& a : arows) {
        MS_ASSERT(a.ring_count >= 0 && a.fresh_count >= 0 && (a.ring_count == 0 || a.ring_capacity > 0));
        for (int64_t p = a.ring_first; p < a.ring_first + a.ring_count; ++p)
            key_ptrs_.push_back(a.ring + (p % a.ring_capacity) * head_dim);
        for (int64_t i = 0; i < a.fresh_count; ++i) key_ptrs_.push_back(a.fresh + i * head_dim);
        for (int64_t i = 0; i < a.selection_len && a.selection[i] >= 0; ++i)
            key_ptrs_.push_back(a.latents + int64_t(a.selection[i]) * head_dim);
        key_starts_.push_back(int64_t(key_ptrs_.size()));
    }
    thread_local std::vector<key_row> rows;  // kept between calls (one per layer in decode)
    rows.resize(arows.size());
    for (size_t r = 0; r < arows.size(); ++r)
        rows[r] = {arows[r].q, key_ptrs_.data() + key_starts_[r], key_starts_[r + 1] - key_starts_[r], arows[r].out};
    size_t first = 0;
    while (first < rows.size()) {
        // The largest group of rows from `first` whose scores fit the bound (at least one row).
        size_t last = first + 1;
        int64_t scores = rows[first].n_keys * n_heads;
        while (last < rows.size() && scores + rows[last].n_keys * n_heads <= kMaxAttentionScores)
            scores += rows[last++].n_keys * n_heads;
        attention_group(pool_, std::span<const key_row>(rows).subspan(first, last - first), n_heads, head_dim, scale,
                        sinks, bf16_probs);
        first = last;
    }
}

void cpu_backend::simulate_quant(act_quant_kind kind, float* x, int64_t count) {
    timer t_(*this, k_quant);
    simulate_act_quant(kind, x, count);
}

void cpu_backend::swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) {
    timer t_(*this, k_swiglu);
    pool_.parallel_for(n, rows_per_chunk(inter), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            elementwise::swiglu_row(g + r * inter, u + r * inter, inter, limit, w ? w[r] : 1.0f);
    });
}

void cpu_backend::indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                                 const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) {
    timer t_(*this, k_indexer);
    MS_ASSERT(n_heads >= 1 && n_heads <= kMaxHeads);
    // One unit per (row, entry), so a single decode row is shared out too; every score is
    // computed alone, whatever unit boundaries the thread count gives.
    const int64_t grain = rows_per_chunk(n_heads * head_dim);
    pool_.parallel_for(n * n_keys, grain, [&](int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u) {
            const int64_t r = u / n_keys, j = u % n_keys;
            if (j >= n_visible[r]) {
                scores[u] = -std::numeric_limits<float>::infinity();
                continue;
            }
            float dots[kMaxHeads];
            elementwise::dot_heads(q + r * n_heads * head_dim, head_dim, n_heads, keys + j * head_dim, head_dim,
                                   dots);
            float s = 0;
            for (int h = 0; h < n_heads; ++h) {
                const float qk = round_to_bf16(dots[h]);
                s += round_to_bf16(std::max(qk, 0.0f) * w[r * n_heads + h]);
            }
            scores[u] = round_to_bf16(s);
        }
    });
}

void cpu_backend::engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                              float norm_eps) {
    timer t_(*this, k_engram);
    float* hn = scratch<float, k_slot_engram_h>(size_t(dim)).data();
    float* kn = scratch<float, k_slot_engram_k>(size_t(dim)).data();
    const float inv_sqrt_dim = 1.0f / std::sqrt(float(dim));
    for (int64_t r = 0; r < n; ++r) {
        const float* value = kv + (r * (hc + 1) + hc) * dim;
        for (int k = 0; k < hc; ++k) {
            float* Hk = H + (r * hc + k) * dim;
            const float* key = kv + (r * (hc + 1) + k) * dim;
            elementwise::scale_row(Hk, inv_rms(Hk, dim, norm_eps), nullptr, hn, dim, true);
            elementwise::scale_row(key, inv_rms(key, dim, norm_eps), nullptr, kn, dim, true);
            const double d = elementwise::sum_of_triple_products(hn, qk + k * dim, kn, dim);
            const float dotv = float(d) * inv_sqrt_dim;
            const float sgn = dotv > 0 ? 1.0f : (dotv < 0 ? -1.0f : 0.0f);
            const float gate = sigmoid(sgn * std::sqrt(std::max(std::fabs(dotv), 1e-6f)));
            for (int64_t i = 0; i < dim; ++i) Hk[i] = round_to_bf16(Hk[i] + gate * value[i]);
        }
    }
}

}  // namespace moestream
