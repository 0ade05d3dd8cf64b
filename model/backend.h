// The compute interface the model is written against. Every op works on rows of float
// activations that live in the backend's memory: host memory for the CPU backend, VRAM for CUDA.
// Values that the reference keeps in bf16 are held as floats rounded to bf16 (`round_bf16`
// flags), so the same model code runs exact-to-the-reference on any backend; accumulation is fp32
// everywhere.
//
// Memory rule: every pointer an op takes is backend memory, except where a comment says "host"
// (small index lists the model derives from positions and token counts, and the op descriptors
// themselves: matmul_job, output_term, attention_row... are host structs holding backend
// pointers). The model computes addresses and index lists on the host but never reads or writes
// an activation value there; the only values the host sees are those it schedules with (the
// router's picks, a few bytes per layer) and the results (logits), through download(). Ops are
// ordered: each sees the results of the ops issued before it (on CUDA: one stream).
//
// Row-parallel ops must give bit-identical results for a row whatever the other rows of the
// batch are and whatever the thread count (reproducibility, see cpu_matmul.h); on CUDA whatever
// the batch size, grid shape and slot placement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "config/result.h"
#include "model/act_quant.h"
#include "model/tensor.h"

namespace moestream {

// Keys of one query row of a sparse attention (MQA: every head shares them, K = V), each a
// head_dim-value vector stored as model/attention_keys.h says (bf16 bits in the kernels' order),
// taken in this order: `ring_count` keys of consecutive positions from a ring (position p in slot
// p % ring_capacity), then `fresh_count` consecutive keys (this forward's own rows), then the
// compressed entries `latents + id * head_dim` for the ids of `selection` up to its first -1 (at
// most selection_len; ids ascending, as the indexer leaves them).
struct attention_row {
    const float* q = nullptr;  // n_heads * head_dim
    float* out = nullptr;      // n_heads * head_dim
    const uint16_t* ring = nullptr;
    int64_t ring_capacity = 0;
    int64_t ring_first = 0;  // position of the first ring key
    int64_t ring_count = 0;
    const uint16_t* fresh = nullptr;
    int64_t fresh_count = 0;
    const uint16_t* latents = nullptr;
    const int32_t* selection = nullptr;
    int64_t selection_len = 0;
};

// One matmul of a batch: y[r] = W x[r] for r < n (see backend::matmul).
struct matmul_job {
    weight_view w;
    const float* x = nullptr;
    int64_t x_stride = 0;
    int64_t n = 0;
    float* y = nullptr;
    int64_t y_stride = 0;
    bool round_bf16 = false;
    // The router's scores instead: y = router_score(W x) (sqrt of softplus, model/router_score.h),
    // computed in the parallel pass rather than serially after it.
    bool router_scores = false;
    // A SwiGLU pair (an expert's gate and up): with `up` set, W is the gate, u[r] = up x[r] (same
    // rounding as y) and the pass then leaves y[r] = swiglu(y[r], u[r]) as backend::swiglu would
    // (limit, row weights swiglu_w or 1), each tile of rows as soon as both of its halves are
    // computed, so the activation takes no step of its own.
    weight_view up{};
    float* u = nullptr;
    int64_t u_stride = 0;
    float swiglu_limit = 0;
    const float* swiglu_w = nullptr;
};

// The residual-stream update of §3.3 after a sub-layer whose output is f [n, dim]: H[r][j] =
// bf16(post[r][j] f[r] + Σ_i comb[r][i][j] H[r][i]) in place (hc_expand), then, when `next` is
// set, next[r] = bf16(Σ_k pre[r][k] H[r][k]) (hc_collapse: the following sub-layer's input).
struct hc_update {
    float* H = nullptr;           // [n, hc, dim]
    const float* post = nullptr;  // [n, hc]
    const float* comb = nullptr;  // [n, hc, hc]
    const float* pre = nullptr;   // [n, hc], with next
    float* next = nullptr;        // [n, dim] or null
    int hc = 0;
};

// One term of a sub-layer's output (backend::output_sum): m rows y[i] = bf16(W h[i]) (W: [dim,
// cols]), or, with W empty, m rows y[i] computed earlier. Row i adds into output row rows[i]
// (rows: host, null means row i).
struct output_term {
    weight_view w;
    const float* h = nullptr;       // m x w.cols
    const float* y = nullptr;       // m x dim, when w is empty
    const int64_t* rows = nullptr;  // host: m output rows, or null
    int64_t m = 0;
};

// One latent of the ratio-2 compressor (§3.4.3): per channel c, with m = max(z0[c], z1[c]),
// out[c] = (e0 a0[c] + e1 a1[c]) / (e0 + e1), e_i = exp(z_i[c] - m), in fp32 (not rounded).
struct pair_pool {
    const float *a0 = nullptr, *z0 = nullptr, *a1 = nullptr, *z1 = nullptr;
    float* out = nullptr;
};

// `count` consecutive attention keys into their storage (model/attention_keys.h): the head_dim
// floats of each key at src, which must be bf16 values, as bf16 bits in the kernels' order at dst.
struct key_store {
    const float* src = nullptr;
    uint16_t* dst = nullptr;
    int64_t count = 1;
};

// One RMSNorm of backend::norm_rows: y[r] = w ⊙ x[r] / sqrt(mean(x[r]²) + eps) for r < n (rows of
// dim floats, y may alias x), then, with rope_dim > 0, RoPE on y's rows as rope(y, n, dim,
// rope_heads, dim / rope_heads, rope_dim, pos, freqs, false) would turn them.
struct norm_job {
    const float* x = nullptr;
    int64_t n = 0, dim = 0;
    const float* w = nullptr;
    float eps = 0;
    float* y = nullptr;
    bool round_bf16 = true;
    int rope_heads = 1;
    int64_t rope_dim = 0;
    const int64_t* pos = nullptr;
    const float* freqs = nullptr;
};

// One row copy of backend::copy_rows.
struct row_copy {
    const float* src = nullptr;
    float* dst = nullptr;
};

// How the indexer's picks of one forward item are made from its scores (§3.4.7-8).
struct indexer_pick {
    float* scores = nullptr;           // [rows, n_total]; modified (masked) in place
    int64_t rows = 0;
    int64_t n_total = 0;               // entries present after this forward's writes
    const int64_t* n_visible = nullptr;  // host: per row, floor((pos + 1) / ratio)
    int64_t topk = 0;                  // selection width (index_topk)
    int32_t* selection = nullptr;      // [rows, topk]: the picks ascending, then -1s
    // Candidate blocks: a source writes its rows' masks (one byte per entry, [rows, mask_stride]);
    // a consumer with `mask_valid` reads them and sets the scores outside the mask to -inf first.
    enum class candidates { none, source, consumer } cand = candidates::none;
    uint8_t* mask = nullptr;
    int64_t mask_stride = 0;
    int64_t mask_len = 0;              // consumer: entries the mask covers (later ones are outside)
    int64_t block_size = 0, topk_blocks = 0;
};

// A layer's routed experts in slots of backend memory, found through a table in backend memory:
// expert e's matrices sit at base + slot_of[e] * slot_bytes + each matrix's offset. The routed
// MoE ops read the picks and the table on the backend, so the host never needs the picks and
// where an expert sits never changes a launch (a CUDA graph of the step stays valid).
struct slot_matrix {
    ggml_type type = ggml_type::f32;
    int64_t cols = 0, rows = 0;
    size_t row_stride = 0;
    size_t offset = 0;  // bytes from the slot's start
    weight_layout layout = weight_layout::rows;
    // The matrix in slot `slot` of the table's memory (host reads of slot_of: CPU backend only).
    weight_view in(const std::byte* base, size_t slot_bytes, int64_t slot) const {
        return {base + size_t(slot) * slot_bytes + offset, type, cols, rows, row_stride, layout};
    }
};
struct expert_slot_table {
    const int32_t* slot_of = nullptr;  // backend memory: the slot of each of the layer's experts
    const std::byte* base = nullptr;   // backend memory: slot 0
    size_t slot_bytes = 0;
    slot_matrix gate, up, down;        // every expert of the layer has these shapes
};

// ---- copies beside the ops (issue 15: the device tier's expert uploads) ----
// One piece of a fill: `bytes` from host memory `src` to backend memory `dst`.
struct copy_piece {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
};

// Host -> backend copies on queues of their own (CUDA: copy streams), ordered against the
// backend's ops by events alone, never by a host wait in either direction. The events are made
// with the stream (indices 0 .. events-1), nothing per copy. Calls are safe from any thread,
// concurrently with the backend's ops, provided no two calls use the same event at once.
class copy_stream {
  public:
    virtual ~copy_stream() = default;  // waits for every copy and notification issued
    // Event e marks the ops issued so far by the calling thread, which must be the one issuing
    // the backend's ops (call it between two ops, outside a recorded step).
    virtual void mark_ops(int e) = 0;
    // One fill: the pieces are copied once the ops marked by each event of `after` have
    // finished, then the matrices of `tile` (backend memory the pieces wrote: MXFP4, rows
    // layout, tileable; a backend whose tiles_mxfp4() is false is given none) are tiled in
    // place; ops issued after this call (by any thread) start once all that has finished; then
    // `copied(e)` runs, the first moment the sources may be reused. `e` is this fill's event
    // until then.
    virtual void fill(int e, std::span<const int> after, std::span<const copy_piece> pieces,
                      std::span<const weight_view> tile) = 0;
    // What the stream could not have as asked (e.g. a source region it could not page-lock,
    // so copies from it are staged by the driver: slower, same bytes); empty when nothing.
    virtual std::string notes() const { return {}; }
};

// What make_copy_stream() is asked for.
struct copy_stream_options {
    int events = 0;
    int lanes = 2;  // CUDA: copy streams the fills alternate between (small copies overlap)
    // CUDA: a fill's pieces in one cudaMemcpyBatchAsync (false: one cudaMemcpyAsync a piece, the
    // comparison bench copy prints).
    bool batched = true;
    // Host memory the fills copy from, page-locked for DMA while the stream lives (CUDA:
    // cudaHostRegister); may be empty.
    std::span<std::byte> source;
    // Called once per fill when its copies have finished, on a thread of the stream's (CUDA's
    // callback thread; the calling thread, inside fill(), on the CPU): it must only hand the
    // event on (post it), never block or call the backend.
    std::function<void(int e)> copied;
};

class backend {
  public:
    virtual ~backend() = default;
    virtual const char* name() const = 0;
    // What runs, for logs, /props and /metrics ("16 threads, avx512", "NVIDIA H200, sm_90, 139 GiB").
    virtual std::string device_description() const = 0;
    virtual int threads() const = 0;

    // ---- memory ----
    // Zero-filled backend memory, aligned to 256 bytes; nullptr when there is none left.
    virtual void* allocate(size_t bytes) = 0;
    virtual void release(void* p) = 0;
    // Host -> backend, ordered after the ops issued before it (src may be reused on return).
    virtual void upload(void* dst, const void* src, size_t bytes) = 0;
    // Backend -> host, after every op issued before it has finished.
    virtual void download(void* dst, const void* src, size_t bytes) = 0;
    // download() without waiting (issue 15: the forward awaits the router's picks and its
    // logits, no thread blocks on the device): download_begin() queues the copy behind every op
    // issued before it and returns; download_landed(t, wake) is true once the bytes are in dst
    // (it puts them there), else false, and `wake` runs once (on a thread of the backend's,
    // never inside the call) when they have landed: the caller's next ask answers true. The
    // wake must only hand over (post).
    // Each ticket is asked until it answers true; at most kMaxDownloadsInFlight are in flight.
    // Default: download() at once (the CPU backend's ops have finished when they return).
    static constexpr int kMaxDownloadsInFlight = 4;
    struct download_ticket {
        int32_t slot = -1;  // -1: landed inside download_begin()
    };
    virtual download_ticket download_begin(void* dst, const void* src, size_t bytes) {
        download(dst, src, bytes);
        return {};
    }
    virtual bool download_landed(download_ticket t, std::function<void()> wake) {
        (void)wake;
        return t.slot < 0;
    }
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;
    // Every byte of [dst, dst + bytes) set to `byte` (0xff: int32 -1s).
    virtual void fill(void* dst, uint8_t byte, size_t bytes) = 0;
    // Waits until every op issued so far has finished.
    virtual void synchronize() = 0;
    // Whether backend pointers are host pointers (the CPU backend): tests and tools may then read
    // results in place. The model never relies on it.
    virtual bool host_memory() const = 0;

    // ---- steps ----
    // The ops from step_begin() to step_end() form one step the backend may capture and replay
    // as a unit (CUDA: one graph per step, updated in place while the step keeps its shape).
    // In between the host reads nothing back (download() and synchronize() are bugs there) and
    // uploads come from host memory the call copies (as always). Ops run by step_end() at the
    // latest, in the order issued; a backend that does not capture ignores both calls.
    virtual void step_begin() {}
    virtual void step_end() {}

    // ---- weight layouts ----
    // Whether MXFP4 matrices this backend computes with should be tiled (model/mxfp4_tiles.h):
    // the CUDA backend's tensor-core matmul reads tiled ones faster. The CPU backend never tiles.
    virtual bool tiles_mxfp4() const { return false; }
    // Tiles matrices of backend memory in place (each MXFP4, rows layout, tileable), ordered
    // after the ops issued before it; their views then carry weight_layout::mxfp4_tiles. Only
    // where tiles_mxfp4().
    virtual void tile_mxfp4(std::span<const weight_view> matrices) {
        MS_ASSERT_MSG(matrices.empty(), "this backend does not tile MXFP4 weights");
    }
    // Whether dense Q8_0 matrices this backend multiplies with should be uploaded tiled
    // (model/q8_0_tiles.h, weight_layout::q8_0_tiles; the host tiles them on upload): the CUDA
    // backend's tensor-core Q8_0 matmul reads only those. The CPU backend never tiles.
    virtual bool tiles_q8_0() const { return false; }

    // ---- copy streams ----
    // A copy stream beside the ops (see copy_stream); an error when its streams or events
    // cannot be made.
    virtual result<std::unique_ptr<copy_stream>> make_copy_stream(copy_stream_options opts) = 0;

    // ---- matmuls and sums ----
    // y[r] = W x[r] for r < n (x rows of w.cols floats, y rows of w.rows floats; strides in floats).
    virtual void matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y,
                        int64_t y_stride, bool round_bf16) = 0;
    // Independent matmuls run as one parallel step (decode's many small ones: the experts of a
    // layer, q_a with kv, the output groups), each value as matmul() would compute it.
    virtual void matmul_batch(std::span<const matmul_job> jobs) = 0;
    // A sub-layer's output and the residual update it feeds, in one parallel pass over slices of
    // dim: f[r] = bf16(Σ_t y_t[i] over the terms' rows i that add into r, the terms in the order
    // given, the sum starting from 0), then `upd` (may be null) from f. The MoE's down projections
    // and their weighted sum, or the attention's output projection, followed by hc_expand and
    // hc_collapse: every value as those separate steps would give it.
    virtual void output_sum(std::span<const output_term> terms, int64_t n, int64_t dim, float* f,
                            const hc_update* upd) = 0;

    // ---- element-wise ----
    // y[r] = w ⊙ x[r] / sqrt(mean(x[r]²) + eps); w may be null (weightless); y may alias x.
    virtual void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                          bool round_bf16) = 0;
    // Independent RMSNorms (each then RoPE'd when its job says so) as one step, every value as
    // rms_norm() and rope() give it: q_a's and kv's norms and kv's rotation, one launch on CUDA.
    virtual void norm_rows(std::span<const norm_job> jobs) {
        for (const auto& j : jobs) {
            rms_norm(j.x, j.n, j.dim, j.w, j.eps, j.y, j.round_bf16);
            if (j.rope_dim > 0)
                rope(j.y, j.n, j.dim, j.rope_heads, j.dim / j.rope_heads, j.rope_dim, j.pos, j.freqs, false);
        }
    }
    virtual void round_bf16(float* x, int64_t count) = 0;
    // x[i] = bf16(x[i] * s).
    virtual void scale_round(float* x, int64_t count, float s) = 0;
    // y[i] += x[i] (fp32).
    virtual void add(float* y, const float* x, int64_t count) = 0;
    // Interleaved-pair RoPE on the last rope_dim dims of each head: pair i of row r turns by
    // fp32(pos[r]) * freqs[i] (negated when inverse). Result rounded to bf16.
    virtual void rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
                      const int64_t* pos, const float* freqs, bool inverse) = 0;
    // Rows tokens[r] of an embedding table, dequantized and rounded to bf16, each written `copies`
    // times: out[(r * copies + k) * table.cols ...] (the token embedding into the 4 streams).
    virtual void embed(const weight_view& table, const int32_t* tokens, int64_t n, int copies, float* out) = 0;
    // out[r * out_stride + d] = bf16(Σ_k H[r][k][d] / hc) (the DSpark taps: the streams' mean).
    virtual void stream_mean(const float* H, int64_t n, int hc, int64_t dim, float* out, int64_t out_stride) = 0;
    // Each job's `count` floats from src to dst, as one step (scattered small copies).
    virtual void copy_rows(std::span<const row_copy> jobs, int64_t count) = 0;
    // dst row i = src row rows[i] (rows: host), dim floats each.
    virtual void gather_rows(const float* src, int64_t src_stride, const int64_t* rows, int64_t m, int64_t dim,
                             float* dst) = 0;
    // The ratio-2 compressor's pooling, one job per latent (§3.4.3).
    virtual void pool_pairs(std::span<const pair_pool> jobs, int64_t dim) = 0;
    // Attention keys into their storage; every value must be a bf16 value (a bug upstream otherwise).
    virtual void store_keys(std::span<const key_store> jobs, int64_t head_dim) = 0;
    // `rows` engram rows of n e4m3 values (row-major) with n / 32 e8m0 scales each, dequantized
    // and rounded to bf16 into out [rows, n].
    virtual void dequant_fp8_rows(const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t n,
                                  float* out) = 0;
    // out[r] = the lowest index of the largest of x[r][0..cols).
    virtual void argmax_rows(const float* x, int64_t n, int64_t cols, int32_t* out) = 0;

    // ---- hyper-connections (§3.3) ----
    // Mixes for n rows of 4 streams (H: [n, hc, dim]); fn [24, hc*dim] (F32 view), base [24],
    // scale [3]. Writes pre [n, hc], post [n, hc], comb [n, hc, hc].
    // fn_h: fn · H per row when the caller already computed it (batched with other matmuls), else null.
    virtual void hc_mixes(const float* H, int64_t n, int hc, int64_t dim, const weight_view& fn, const float* base,
                          const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* pre, float* post,
                          float* comb, const float* fn_h) = 0;
    // out[r] = bf16(Σ_k p[r][k] H[r][k])
    virtual void hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) = 0;
    // out[r][j] = bf16(post[r][j] f[r] + Σ_i comb[r][i][j] H[r][i]); out may alias H.
    virtual void hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                           const float* comb, float* out) = 0;

    // ---- attention ----
    // Sparse attention with a per-head sink logit (§3.4.9); output rounded to bf16.
    // With bf16_probs the exp(s - max) weights are rounded to bf16 before they multiply the
    // values (the reference kernel's rounding, §3.8), the denominator still sums fp32 values.
    virtual void attention(std::span<const attention_row> rows, int n_heads, int64_t head_dim, float scale,
                           const float* sinks, bool bf16_probs) = 0;
    // Indexer scores in the reference's bf16 arithmetic (§3.4.6): for row r and entry j <
    // n_visible[r], score = bf16(Σ_h bf16(relu(bf16(q[r]_h · k_j)) · w[r]_h)); later entries get -inf.
    // q [n, n_heads, head_dim], w [n, n_heads], keys [n_keys, head_dim], scores [n, n_keys];
    // n_visible: host.
    virtual void indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                                const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) = 0;
    // The indexer's selection from its scores (§3.4.7-8): the candidate blocks when `cand` says
    // so, then the min(topk, n_total) best entries (ties to the lower index), ascending, entries
    // the row cannot see -1, padded with -1 to topk.
    virtual void indexer_select(const indexer_pick& p) = 0;

    // ---- MoE ----
    // The router's choice (§3.5) for n rows of n_experts scores s (already sqrt(softplus)): with
    // `select`, picks[r] = top-k of s + bias (ties to the lower id, in the top-k's order); then
    // weights[r][j] = s[picks[r][j]] / (Σ_j s[picks] + 1e-20) · route_scale. With select false
    // the picks are given (forced) and only the weights are formed; weights may be null
    // (look-ahead predictions).
    virtual void route(const float* scores, const float* bias, int64_t n, int n_experts, int k, double route_scale,
                       bool select, int32_t* picks, float* weights) = 0;
    // The routed experts' order for the slot-table ops: row r's k picks (distinct) and their
    // weights, ascending by expert id, transposed: sorted_picks[j * n + r] (the j-th smallest).
    // Assignment a = j * n + r is row r's j-th expert in that order; every routed expert's output
    // then adds into its row in ascending id order, as the host-scheduled MoE adds them.
    virtual void order_picks(const int32_t* picks, const float* weights, int64_t n, int k, int32_t* sorted_picks,
                             float* sorted_weights) = 0;
    // route() with select, then order_picks() of its picks and weights: the same values in all
    // four arrays. A backend may do both in one op (the CUDA backend: one kernel instead of two a
    // layer in the resident decode step).
    virtual void route_ordered(const float* scores, const float* bias, int64_t n, int n_experts, int k,
                               double route_scale, int32_t* picks, float* weights, int32_t* sorted_picks,
                               float* sorted_weights) {
        route(scores, bias, n, n_experts, k, route_scale, true, picks, weights);
        order_picks(picks, weights, n, k, sorted_picks, sorted_weights);
    }
    // Every assignment's gate and up projections through the slot table (x: n rows of gate.cols
    // floats, stride gate.cols; g, u: n * k rows of gate.rows floats, assignment a at row a), each
    // value as matmul_batch() computes it: with `swiglu`, the SwiGLU pair job (limit, the
    // assignment's weight from sorted_weights) leaving g = swiglu(gate x, up x); else plain
    // rounded matmuls into g and u.
    virtual void moe_gate_up(const expert_slot_table& t, const float* x, int64_t n, int k, const int32_t* sorted_picks,
                             const float* sorted_weights, float* g, float* u, bool swiglu, float limit) = 0;
    // y[a] = bf16(down_a g[a]) for every assignment (g: n * k rows of down.cols floats; y: rows of down.rows).
    virtual void moe_down(const expert_slot_table& t, const float* g, int64_t n, int k, const int32_t* sorted_picks,
                          float* y) = 0;
    // SwiGLU with the V4.1 clamps, in place into g: g[r] = bf16(w[r] · silu(min(g, limit)) ⊙ clamp(u, ±limit)).
    // w may be null (weight 1). g and u hold n rows of `inter` floats.
    virtual void swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) = 0;

    // ---- other ----
    // Quantise-dequantise in place as the reference's low-precision activations (§3.8).
    virtual void simulate_quant(act_quant_kind kind, float* x, int64_t count) = 0;
    // Engram gated write (§3.2 steps 3-6) for n rows: H [n, hc, dim] is updated in place from
    // kv [n, (hc+1)*dim] (hc keys, then the shared value) and qk = q_weight ⊙ k_weight [hc, dim].
    virtual void engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                             float norm_eps) = 0;
};

// A typed array in a backend's memory, owned (released on destruction). resize() keeps nothing
// (a scratch buffer is written before it is read) and only grows the allocation.
template <class T>
class backend_array {
  public:
    backend_array() = default;
    explicit backend_array(backend& be, size_t n = 0) : be_(&be) { resize(n); }
    backend_array(const backend_array&) = delete;
    backend_array& operator=(const backend_array&) = delete;
    backend_array(backend_array&& o) noexcept { swap(o); }
    backend_array& operator=(backend_array&& o) noexcept {
        backend_array tmp(std::move(o));
        swap(tmp);
        return *this;
    }
    ~backend_array() {
        if (p_) be_->release(p_);
    }
    void bind(backend& be) {
        MS_ASSERT(be_ == nullptr || be_ == &be);
        be_ = &be;
    }
    // Room for n values; previous contents are lost when the allocation grows.
    void resize(size_t n) {
        const bool ok = try_resize(n);
        MS_ASSERT_MSG(ok, "backend memory exhausted");
    }
    // As resize(), but false (and empty) when the backend has no room: for sizes a user chose.
    bool try_resize(size_t n) {
        if (n > cap_) {
            MS_ASSERT(be_ != nullptr);
            if (p_) be_->release(p_);
            p_ = static_cast<T*>(be_->allocate(n * sizeof(T)));
            cap_ = p_ ? n : 0;
            if (!p_) {
                n_ = 0;
                return false;
            }
        }
        n_ = n;
        return true;
    }
    T* data() { return p_; }
    const T* data() const { return p_; }
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    size_t bytes() const { return n_ * sizeof(T); }

  private:
    void swap(backend_array& o) noexcept {
        std::swap(be_, o.be_);
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        std::swap(cap_, o.cap_);
    }
    backend* be_ = nullptr;
    T* p_ = nullptr;
    size_t n_ = 0, cap_ = 0;
};

}  // namespace moestream
