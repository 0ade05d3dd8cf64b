// DeepSeek-V4.1 forward pass and its DSpark draft head (dsv41-architecture.md §3, §5), written
// against the backend ops (model/backend.h) and weight views; no file or device code here.
//
// One forward runs several sequences at once (continuous batching): each item brings its own
// state and 1..T new tokens, so the same call is a prompt prefill, a chunk of one, a single-token
// decode step or the k+1 causal rows of a speculative verification. Expert weights are reached only
// through `expert_source` (announce what a layer needs, then await what is resident), so the
// streaming scheduler plugs in without touching this code.
//
// The forward is a coroutine (model/coro.h): at each host-scheduled MoE layer it awaits its
// experts (experts_ready below) and is suspended, occupying no thread, until the source has one
// resident; it then continues on the executor it was started with. forward() and draft() are
// the plain-call forms: they run the coroutine to completion on the calling thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/result.h"
#include "model/arch/deepseek41_hparams.h"
#include "model/backend.h"
#include "model/coro.h"
#include "model/tensor.h"

namespace moestream::dsv41 {

// ---- weights -------------------------------------------------------------------------------
struct layer_weights {
    vector_view attn_norm, attn_sinks, q_a_norm, kv_a_norm, ffn_norm, exp_probs_b;
    vector_view hc_attn_base, hc_attn_scale, hc_ffn_base, hc_ffn_scale;
    weight_view hc_attn_fn, hc_ffn_fn;  // F32 [24, hc*dim]
    weight_view q_a, q_b, kv, out_a, out_b;
    weight_view gate_inp, gate_shexp, up_shexp, down_shexp;
    // kv sources
    weight_view compressor_kv, compressor_gate;  // gate: ratio 2 only
    vector_view compressor_norm;
    weight_view index_k;
    vector_view index_k_norm;
    // index sources
    weight_view index_q_b, index_proj;
    // engram layers
    weight_view engram_wkv;
    vector_view engram_qk;            // q_weight ⊙ k_weight, [hc, dim]
    const uint8_t* engram_values = nullptr;  // e4m3 [rows, head_dim]
    const uint8_t* engram_scales = nullptr;  // e8m0 [rows, head_dim / 32]
    int64_t engram_rows = 0;
};

struct engram_side_tables {
    std::span<const int32_t> token_map;  // [vocab] compressed ids (negative: DEAD)
    std::vector<int64_t> primes;         // [engram layers][ngram orders - 1][heads]
    std::vector<int64_t> offsets;        // [engram layers][columns]
    std::vector<int64_t> multipliers;    // [engram layers][max_ngram]
};

struct model_weights {
    weight_view token_embd;  // [vocab, dim]
    weight_view output;      // [vocab, dim]
    vector_view output_norm;
    std::vector<layer_weights> layers;
    engram_side_tables engram;
};

struct draft_weights {
    weight_view fc;            // [dim, 3*dim]
    vector_view enc_norm;      // main_norm
    vector_view output_norm;   // stage 2 norm
    weight_view markov_embed;  // [vocab, rank]
    weight_view markov_head;   // [vocab, rank]
    weight_view conf_proj;     // [1, dim + rank]
    std::vector<layer_weights> stages;
};

// ---- experts -------------------------------------------------------------------------------
struct expert_weights {
    weight_view gate, up, down;
};

using ready_experts = std::vector<std::pair<int32_t, expert_weights>>;
// Called once with what async_ready() found, on a thread of the source's choosing.
using ready_callback = std::function<void(result<ready_experts>)>;

// Layers are numbered 0..n_layers-1 for the target and n_layers + s for DSpark stage s.
class expert_source {
  public:
    virtual ~expert_source() = default;
    // The distinct experts (ascending) one forward needs at a layer, announced before any get() of
    // that layer so that every miss can be requested at once.
    virtual void need(int layer, std::span<const int32_t> experts) = 0;
    // Weights of one announced expert, valid until release(). May block until it is resident.
    virtual result<expert_weights> get(int layer, int32_t expert) = 0;
    // Some of `pending` (announced, not yet got) that are resident now, at least one (blocking
    // until one is) and at most `max`, each as get() would return it (to be released). The model
    // computes whatever is ready while the rest is still arriving; its reduction order is fixed,
    // so the answer's order and grouping never change results. Default: get() of the first `max`
    // in order (right for sources where everything is resident).
    virtual result<std::vector<std::pair<int32_t, expert_weights>>> acquire_ready(int layer,
                                                                                 std::span<const int32_t> pending,
                                                                                 int64_t max) {
        std::vector<std::pair<int32_t, expert_weights>> out;
        for (int32_t id : pending.first(size_t(std::min<int64_t>(max, int64_t(pending.size()))))) {
            auto w = get(layer, id);
            if (!w) {
                for (auto& [held, unused] : out) release(layer, held);
                return w.err();
            }
            out.emplace_back(id, *w);
        }
        return out;
    }
    // acquire_ready() without blocking: `done` gets the same answer once at least one of `pending`
    // is resident (or an error), possibly before this returns, possibly later on another thread.
    // `pending` is the caller's and may change once this returns: a source that answers later
    // keeps a copy. Default: acquire_ready() at once (sources whose experts are always resident).
    virtual void async_ready(int layer, std::span<const int32_t> pending, int64_t max, ready_callback done) {
        done(acquire_ready(layer, pending, max));
    }
    // The model is done with an expert it got (a cache may now evict it).
    virtual void release(int layer, int32_t expert) { (void)layer, (void)expert; }
    // How many experts the model may hold (got, not yet released) at once; the model works
    // through a layer's experts in groups of this size.
    virtual int64_t max_held() const { return INT64_MAX; }
    // The layer's routed experts when every one of them sits in a slot of the compute backend
    // for as long as the source lives: the model may then route on the backend (order_picks,
    // moe_gate_up, moe_down) without reading the picks. Null otherwise (the default).
    virtual const expert_slot_table* slot_table(int layer) { return (void)layer, nullptr; }
    // A cheap prediction: these experts of a later layer will probably be needed soon (ascending).
    // Sources may start reading them at a lower priority than demands; ignoring it is correct.
    virtual void hint(int layer, std::span<const int32_t> experts) { (void)layer, (void)experts; }
};

// co_await experts_ready(source, layer, pending, max, ex): async_ready() as an awaitable. When the
// answer is there at once the coroutine does not suspend; otherwise it is suspended and the
// source's callback posts it to `ex` (the executor the forward runs on).
class experts_ready {
  public:
    experts_ready(expert_source& src, int layer, std::span<const int32_t> pending, int64_t max, coro::executor& ex)
        : src_(src), layer_(layer), pending_(pending), max_(max), ex_(ex) {}
    experts_ready(const experts_ready&) = delete;
    experts_ready& operator=(const experts_ready&) = delete;

    bool await_ready() const noexcept { return false; }
    // Whichever of this and the callback comes second continues the coroutine: the callback by
    // posting it (we are suspended), this by not suspending (the answer came inside the call).
    bool await_suspend(std::coroutine_handle<> h) {
        src_.async_ready(layer_, pending_, max_, [this, h](result<ready_experts> r) {
            out_.emplace(std::move(r));
            race_.wake(ex_, h);
        });
        return race_.stay_suspended();
    }
    result<ready_experts> await_resume() {
        MS_ASSERT(out_.has_value());
        return std::move(*out_);
    }

  private:
    expert_source& src_;
    int layer_;
    std::span<const int32_t> pending_;
    int64_t max_;
    coro::executor& ex_;
    std::optional<result<ready_experts>> out_;
    coro::wake_race race_;
};

// ---- engram rows -------------------------------------------------------------------------------
// Rows of an engram table (e4m3 values and their e8m0 scales). Row ids depend only on token ids,
// so a forward hashes all of them before its first layer and announces them with prefetch(); the
// engram layers (1 and 14 of 40) then read them with row(), normally long after they arrived.
struct engram_row {
    const uint8_t* values = nullptr;  // head_dim e4m3 bytes
    const uint8_t* scales = nullptr;  // head_dim / 32 e8m0 bytes
};

class engram_source {
  public:
    virtual ~engram_source() = default;
    // Every row id (with repeats) of engram layer `engram_index` this forward will read.
    virtual void prefetch(int engram_index, std::span<const int64_t> rows) = 0;
    // One announced row; valid until end_forward(), or only until the next row() call when the
    // source had no room to keep it (the forward copies each row at once). May block until it
    // arrived, unless row_ready() said it would not.
    virtual result<engram_row> row(int engram_index, int64_t row) = 0;
    // row() without waiting, for a coroutine: true when row(engram_index, row), the caller's next
    // call, answers at once (the row is there, or its read failed). Else false, having started
    // what the row needs, and `wake` runs once (on a thread of the source's, possibly before this
    // returns) when the caller should ask again; it must only hand over (post). Default: true.
    virtual bool row_ready(int engram_index, int64_t row, std::function<void()> wake) {
        (void)engram_index, (void)row, (void)wake;
        return true;
    }
    virtual void end_forward() {}
};

// while (!co_await engram_row_ready(src, e, row, ex)) {}: row_ready() as an awaitable (true: the
// row is there; false: woken, ask again). When the row is there, or the wake comes inside the
// call, the coroutine does not suspend; otherwise the wake posts it to `ex`.
class engram_row_ready {
  public:
    engram_row_ready(engram_source& src, int engram_index, int64_t row, coro::executor& ex)
        : src_(src), index_(engram_index), row_(row), ex_(ex) {}
    engram_row_ready(const engram_row_ready&) = delete;
    engram_row_ready& operator=(const engram_row_ready&) = delete;

    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
        ready_ = src_.row_ready(index_, row_, [this, h] {
            race_.wake(ex_, h);
        });
        if (ready_) return false;  // no wake is kept
        return race_.stay_suspended();
    }
    bool await_resume() const noexcept { return ready_; }

  private:
    engram_source& src_;
    int index_;
    int64_t row_;
    coro::executor& ex_;
    bool ready_ = false;
    coro::wake_race race_;
};

// ---- hooks ---------------------------------------------------------------------------------
enum class pick_kind { router, indexer, candidates, draft_router };

struct pick_site {
    pick_kind kind;
    int layer;          // backbone layer, or n_layers + stage for the draft router
    int64_t pos;        // position of the query row
    int64_t rows;       // rows of this sequence in the forward (1 for a decode step)
};

// Sees (and may replace) every selection the model makes: router top-k (expert ids, any order),
// indexer top-k (entry ids, -1 = none), candidate masks (one byte per entry). Used by tests and by
// `moestream logits --force-picks` to compare against recorded picks.
class pick_hook {
  public:
    virtual ~pick_hook() = default;
    virtual void picks(const pick_site&, std::span<int32_t> ids) { (void)ids; }
    virtual void mask(const pick_site&, std::span<uint8_t> entries) { (void)entries; }
};

// Receives named intermediate tensors (row-major, shape outermost first) for dumps.
class tensor_observer {
  public:
    virtual ~tensor_observer() = default;
    virtual void tensor(std::string_view name, int layer, const float* data, std::span<const int64_t> shape) = 0;
};

// ---- per-sequence state ----------------------------------------------------------------------
// Window rings, compressed caches with their index keys and ratio-2 pending pairs, DSpark rings
// and the last DSpark taps live in the backend's memory (one allocation per sequence); the token
// history and the cache lengths on the host, which schedules with them.
class sequence_state {
  public:
    // Room for `max_tokens` positions; truncate() can go back at most `rollback` positions past
    // what the window rings still hold (ring capacity = window + rollback).
    sequence_state(backend& be, const hparams& hp, int64_t max_tokens, int64_t rollback, bool with_draft);
    // The backend memory such a sequence takes (start-up planning).
    static size_t memory_bytes(const hparams& hp, int64_t max_tokens, int64_t rollback, bool with_draft);

    int64_t size() const { return int64_t(tokens_.size()); }
    int64_t capacity() const { return max_tokens_; }
    std::span<const int32_t> tokens() const { return tokens_; }
    // Forgets every position >= n; an error unless can_truncate_to(n).
    status truncate(int64_t n);
    // Whether truncate(n) succeeds: n is 0 (starting over), or n <= size() and the window and
    // DSpark rings still hold the `window` positions before n (the next forward and draft read
    // them). Without rolled-back rows that is n >= size() - rollback.
    bool can_truncate_to(int64_t n) const { return n == 0 || (n > 0 && n <= size() && n >= truncation_floor()); }
    // The smallest n > 0 truncate() accepts; with `rows_ahead`, once a forward of that many rows
    // has run (whether they are kept or rolled back afterwards: each overwrites a ring slot).
    int64_t truncation_floor(int64_t rows_ahead = 0) const;
    // Becomes a copy of `other` (same backend, shapes and rollback): one pass over its memory.
    void copy_from(const sequence_state& other);
    // The taps of the latest forward's last row (mean of the streams entering the tap layers), as
    // a host copy; empty before the first forward with a draft and after truncate().
    std::vector<float> last_main_hidden() const;

  private:
    friend class model;
    struct source_cache {
        int layer = -1;
        int ratio = 0;
        uint16_t* latents = nullptr;  // [entries, head_dim], rotated, bf16 (attention keys)
        float* index_keys = nullptr;  // [entries, index_head_dim], rotated
        float* pending = nullptr;     // ratio 2: (a, z) of every even position, [groups, 2, head_dim]
        int64_t entries = 0;
    };
    struct layout;  // where each part sits in memory_
    backend* be_;
    int64_t max_tokens_;
    int64_t ring_capacity_;
    int64_t rollback_;
    backend_array<std::byte> memory_;
    std::vector<int32_t> tokens_;
    // Positions [0, rings_written_) were written to the rings since the last truncate(0). Those at
    // size() and beyond were rolled back (rejected verification rows), but each overwrote the ring
    // slot of the position ring_capacity_ before it, so the rings hold exactly the positions
    // [rings_written_ - ring_capacity_, size()). Always >= size(); == size() without rollbacks.
    // The compressed caches, index keys and ratio-2 pending pairs are indexed by position, not
    // ring slots: rows past size() write only entries a later forward rewrites before reading.
    int64_t rings_written_ = 0;
    std::vector<uint16_t*> rings_;        // per layer [ring_capacity, head_dim], bf16 (attention keys)
    std::vector<source_cache> sources_;   // one per kv source layer
    std::vector<uint16_t*> draft_rings_;  // per DSpark stage, as rings_
    float* last_main_hidden_ = nullptr;   // [taps * dim]
    int64_t main_hidden_size_ = 0;
    bool has_main_hidden_ = false;
};

// ---- the model -------------------------------------------------------------------------------
struct forward_item {
    sequence_state* seq = nullptr;
    std::span<const int32_t> tokens;
    bool all_logits = false;  // logits for every row (prefill checks, verification) or the last one
};

struct model_options {
    bool ref_compat = false;  // reproduce the reference's stale index-key slot (§3.4.6)
    pick_hook* hook = nullptr;
    tensor_observer* observer = nullptr;
    // Simulate the reference's fp8/fp4 activation round trips (§3.8): only useful to compare with a
    // reference run that had them on (the fp8 fixture); costs speed.
    bool act_quant = false;
    // Where engram rows come from; null: straight from the weights' tables (memory mapped).
    engram_source* engram = nullptr;
    // Look-ahead: layer L+1's router applied to layer L's FFN input predicts L+1's experts, sent
    // to the expert source as a hint while layer L computes. Changes I/O only, never results.
    bool lookahead = false;
    // Layers the look-ahead predicts: 1 = L+1 only; d = L+1 .. L+d, all from the same input (a
    // longer lead for the disk, at a lower hit rate the further it reaches). The nearest layer's
    // hints go to the source first. At most kMaxLookaheadLayers (config/config.h).
    int lookahead_layers = 1;
};

struct draft_output {
    std::vector<int32_t> tokens;     // block_size drafts for positions p+2 .. p+1+block_size
    std::vector<float> logits;       // [block_size, vocab], Markov bias included
    std::vector<float> confidence;   // [block_size] raw logits
};

namespace detail {
struct workspace;
}

// The weights' views point into the backend's memory (for the CPU backend: the memory mapping;
// see scheduler/device_weights.h for a device), except the engram tables, which the host reads.
class model {
  public:
    model(const hparams& hp, const model_weights& w, const draft_weights* draft, expert_source& experts,
          backend& be, model_options opts = {});
    ~model();

    const hparams& hp() const { return hp_; }
    backend& compute() const { return be_; }
    bool has_draft() const { return draft_ != nullptr; }
    // A fresh sequence in this model's backend, with DSpark state when the model has a draft.
    std::unique_ptr<sequence_state> new_sequence(int64_t max_tokens, int64_t rollback) const;
    void set_options(model_options opts) { opts_ = opts; }
    const model_options& options() const { return opts_; }

    // One forward over the batch. logits: [Σ rows_out, vocab] where rows_out is the item's token
    // count when all_logits, else 1. Errors (bad token id, sequence full, expert read failure)
    // leave every sequence unchanged. The coroutine continues on `ex` after every wait for
    // experts; batch, logits and the sequences must outlive it. One forward or draft at a time.
    coro::task<status> forward_async(std::span<const forward_item> batch, std::vector<float>& logits,
                                     coro::executor& ex);
    // forward_async() run to completion on the calling thread.
    status forward(std::span<const forward_item> batch, std::vector<float>& logits);

    // DSpark draft after a decode step: the sequence's last position p has been consumed and the
    // target produced `next_token` for p+1. `forced` (optional, block_size ids) replaces the
    // Markov chain's argmax choices (tests compare against recorded drafts).
    status draft(const sequence_state& seq, int32_t next_token, draft_output& out,
                 std::span<const int32_t> forced = {});
    coro::task<status> draft_async(const sequence_state& seq, int32_t next_token, draft_output& out,
                                   std::span<const int32_t> forced, coro::executor& ex);

    // The distinct experts the last forward's rows routed to, summed over its MoE layers (the
    // union a verification block loads); -1 when layers routed on the backend (slot tables),
    // whose picks the host does not see.
    int64_t last_forward_experts() const;
    // The same for one target layer (-1: routed on the backend, or not a target layer).
    int64_t last_forward_layer_experts(int layer) const;
    // The experts batch row `row` of the last forward picked at target layer `layer` (n_active
    // ids, router order); empty when the forward had more than 64 rows or the layer routed on
    // the backend.
    std::span<const int32_t> last_forward_picks(int layer, int64_t row) const;
    // After a forward: the experts that its batch rows `rows` picked (a speculative step's kept
    // rows, which the next step's rows follow; neighbouring positions route alike) are a hint for
    // the next forward's. The first layer's go to the expert source at once, so their reads
    // overlap what runs before that forward (sampling, the next draft); each later layer's join
    // the look-ahead hint sent while the layer before it computes. I/O only, never results.
    // False when those rows' picks were not kept.
    bool hint_next_forward(std::span<const int64_t> rows);

    // After a forward that fed `seq`, and a truncate() that kept one of its rows as the last one:
    // the DSpark head's input becomes the features of `row`, that row's index in the forward's
    // batch (the items' rows in order: a sequence's own row plus the rows of the items before
    // it), so speculative decoding keeps an accepted prefix of a verification block, alone or
    // batched (spec::keep_rows). An error without a draft head.
    status keep_main_hidden(sequence_state& seq, int64_t row);

    // RoPE frequency tables (per pair), exposed for tests: base rope_theta, and compress base + YaRN.
    const std::vector<float>& rope_freqs(bool compressed) const { return compressed ? freqs_yarn_ : freqs_plain_; }

  private:
    const hparams hp_;
    const model_weights& w_;
    const draft_weights* draft_;
    expert_source& experts_;
    backend& be_;
    model_options opts_;
    std::vector<float> freqs_plain_, freqs_yarn_;
    std::unique_ptr<detail::workspace> ws_;  // the forward's buffers, in the backend, kept between forwards
};

// Engram hash rows (§3.2) of position `pos` given the token history up to and including pos:
// writes engram_columns() row ids (offsets included) per engram layer into rows_out.
void engram_hash(const hparams& hp, const engram_side_tables& t, std::span<const int32_t> history, int64_t pos,
                 std::span<int64_t> rows_out);

}  // namespace moestream::dsv41
