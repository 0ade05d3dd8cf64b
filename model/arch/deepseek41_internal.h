// Building blocks shared by the backbone forward (deepseek41.cpp) and the DSpark draft
// (deepseek41_dspark.cpp). Internal to model/arch.
#pragma once

#include <atomic>
#include <cmath>
#include <coroutine>
#include <functional>
#include <limits>
#include <vector>

#include "model/arch/deepseek41.h"
#include "model/bf16.h"

namespace moestream::dsv41::detail {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

template <class T>
using barray = backend_array<T>;

// Every row's output after the 4-stream hyper-connection bookkeeping of one sub-layer.
struct hc_mix {
    explicit hc_mix(backend& be) : pre(be), post(be), comb(be), fn_h(be) {}
    barray<float> pre, post, comb, fn_h;
};

// Every expert's rows of one MoE step (host bookkeeping) and where its values sit in the
// workspace's per-assignment arrays.
struct expert_work {
    std::vector<int64_t> rows;    // its input rows
    std::vector<int64_t> assign;  // their assignments r * n_active + j (the routing weights' index)
    int64_t first = 0;            // its first assignment in the concatenated arrays
    const float* in = nullptr;    // its input rows: gathered, or the step's own input when it takes every row
    const float* w = nullptr;     // its rows' routing weights
    float *g = nullptr, *u = nullptr, *y = nullptr;
    bool down_in_output = false;  // its down projection runs inside output_sum
    expert_weights ew;
};

// moe()'s host bookkeeping, kept in the workspace between calls (decode runs it 40 times a
// token); not thread_local: a forward suspended in moe() may continue on another thread.
struct moe_scratch {
    std::vector<int32_t> picks, needed, predicted, pending, predicted_all;
    std::vector<int64_t> x_rows, w_index;
    std::vector<size_t> group;
    std::vector<matmul_job> jobs;
    std::vector<output_term> terms;
    std::vector<expert_work> work;
};

// The buffers one forward (or draft) uses, in the backend's memory, kept from forward to forward
// so that a decode step allocates nothing; each is fully written where it is used before it is
// read. One forward runs at a time per model.
struct workspace {
    explicit workspace(backend& b) : be(b) {}
    backend& be;
    // The last forward's routing: the distinct experts of its rows summed over the host-routed
    // MoE layers, and the MoE layers routed on the backend (whose picks the host never sees).
    int64_t routed_experts = 0, layers_routed_on_backend = 0;
    // Per target layer: the last forward's union (distinct experts of its rows; -1: routed on
    // the backend) and its rows' picks when it had at most kMaxRecordedRows rows (picks_rows of
    // them, else 0), [n_layers][kMaxRecordedRows * n_active]; model::last_forward_picks.
    std::vector<int32_t> layer_union, row_picks;
    int64_t picks_rows = 0;
    // Experts the next forward will probably need per target layer (model::hint_next_forward),
    // folded into its look-ahead hints and dropped when that forward ends.
    std::vector<std::vector<int32_t>> carried_hints;
    barray<float> freqs_plain{be}, freqs_yarn{be};  // the RoPE tables (model::rope_freqs)
    // rows of the forward
    barray<int32_t> tokens{be};
    barray<int64_t> pos{be};
    barray<float> H{be}, x{be}, xq{be}, qr{be}, q{be}, a{be}, f{be}, p_in{be}, taps{be};
    barray<float> layer_kv{be};   // [n_layers][rows][head_dim] window keys, committed to the rings at the end
    barray<uint16_t> kv_bits{be};  // the current layer's window keys, stored for attention
    hc_mix mixA{be}, mixF{be};
    // compressor and indexer
    barray<float> qi{be}, wi{be}, ca{be}, cz{be}, lat{be}, ik{be}, sc{be};
    barray<int64_t> at{be};
    barray<int32_t> selection{be};  // [rows][index_topk]: the latest index source's picks
    barray<uint8_t> cand_mask{be};  // [rows][mask_stride]: the candidate source's entry masks
    // engram
    barray<uint8_t> engram_bytes{be};
    barray<float> ucat{be}, kv5{be};
    // head, logits, DSpark commit
    barray<float> h{be}, hn{be}, xin{be}, logits{be}, mx{be}, tq{be}, stage_kv{be};
    // attend_and_project
    barray<float> o{be}, u{be};
    // moe
    barray<float> moe_xq{be}, scores{be}, weights{be}, shared_g{be}, shared_u{be}, shared_y{be};
    barray<int32_t> picks{be};
    // The look-ahead layers' router scores, one [rows][n_experts] block per layer (L+1, L+2, ...).
    barray<float> ahead{be};
    // Every look-ahead layer's picks side by side (L+1, then L+2, ...): one download.
    barray<int32_t> predicted_all{be};
    barray<int32_t> sorted_picks{be};  // the slot-table MoE's assignments (backend::route_ordered)
    barray<float> sorted_weights{be};
    barray<float> ex_x{be}, ex_w{be}, ex_g{be}, ex_u{be}, ex_y{be};
    // draft
    barray<int32_t> draft_tokens{be};
    barray<float> markov_e{be}, markov_bias{be}, conf_in{be}, confidence{be};
    moe_scratch moe_host;  // moe()'s host bookkeeping
};

struct env {
    const hparams& hp;
    backend& be;
    expert_source& experts;
    const model_options& opts;
    workspace& ws;
    coro::executor& resume;  // where the forward continues after waiting for experts
};

// Rows of one forward: position of each row (several sequences concatenated), on the host and
// in the backend (`pos_dev`, for RoPE).
struct rows_info {
    std::vector<int64_t> pos;
    std::vector<int64_t> seq_rows;  // rows its sequence has in this forward (pick sites)
    const int64_t* pos_dev = nullptr;
    int64_t n() const { return int64_t(pos.size()); }
};

// The fn · H matmul of a sub-layer's mix, for the caller to batch with other work.
matmul_job mix_job(const env& e, const float* H, int64_t n, const weight_view& fn, hc_mix& mix);
// The mixes from H (fn_h_ready: mix_job's product was computed).
void compute_mix(const env& e, const float* H, int64_t n, const weight_view& fn, const vector_view& base,
                 const vector_view& scale, hc_mix& mix, bool fn_h_ready = false);

// The most rows a step routes through the slot table (every expert resident): each assignment
// is a job of its own there, so experts that several rows share are read once per row; decode
// and verification blocks have few rows, a prefill's hundreds are grouped by expert on the host.
inline constexpr int64_t kMaxSlotTableRows = 8;
// The most rows of a forward whose picks are kept (a verification block of several sequences).
inline constexpr int64_t kMaxRecordedRows = 64;

// q = RoPE(W_qb · RMSNorm(W_qa · x)) with its latent qr (kept for the indexer) and the window kv
// rows RoPE(RMSNorm(W_kv · x)) from the same input, their matmuls batched: q_a with kv, then q_b with the
// indexer's q_b when the layer has one (qi: unrotated, [n, index heads * index_head_dim]).
// `extra` matmuls (independent of these) join the first parallel step. kv: n * head_dim floats.
void query_and_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
                  barray<float>& qr, barray<float>& q, float* kv, barray<float>* qi,
                  std::span<const matmul_job> extra = {});
// Window kv rows: RoPE(RMSNorm(W_kv · x)) into kv (n * head_dim floats).
void window_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
               float* kv);
// Attention over per-row key lists, de-rotation and the grouped output projection -> out [n, dim];
// `upd` (may be null): the residual update, applied in the output projection's pass.
void attend_and_project(const env& e, const layer_weights& lw, const barray<float>& q,
                        std::vector<attention_row>& arows, const rows_info& rows, const float* freqs,
                        barray<float>& out, const hc_update* upd = nullptr);
// MoE FFN of §3.5 -> out [n, dim]. `layer` numbers the expert source (n_layers + stage for drafts).
// `extra` matmuls (independent of the MoE) join the router's parallel step.
// `ahead`: the following layers that opts.lookahead_layers reaches (L+1, L+2, ...; at most
// kMaxLookaheadLayers), whose routers predict their experts from this input when opts.lookahead is on.
// `update` (may be empty): called after the router's step (so `extra` may compute what it needs);
// the residual update it returns is applied in the pass that forms `out`.
// A coroutine: it suspends while its experts are not resident (the caller co_awaits it).
coro::task<status> moe(const env& e, const layer_weights& lw, int layer, int n_experts, int n_active,
                       const float* x, const rows_info& rows, barray<float>& out,
                       std::span<const matmul_job> extra = {}, std::span<const layer_weights* const> ahead = {},
                       const std::function<hc_update()>& update = {});

// co_await download_landed(be, ticket, ex): backend::download_landed() as an awaitable; when it
// resumes, the bytes are in place. A download that has landed does not suspend the coroutine;
// otherwise the wake posts it to `ex`, and the ask after the wake finds the bytes (the backend's
// contract).
class download_landed {
  public:
    download_landed(backend& be, backend::download_ticket t, coro::executor& ex) : be_(be), t_(t), ex_(ex) {}
    download_landed(const download_landed&) = delete;
    download_landed& operator=(const download_landed&) = delete;

    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
        landed_ = be_.download_landed(t_, [this, h] {
            race_.wake(ex_, h);
        });
        if (landed_) return false;  // no wake is kept
        return race_.stay_suspended();
    }
    void await_resume() {
        if (landed_) return;
        landed_ = be_.download_landed(t_, {});
        MS_ASSERT_MSG(landed_, "a download not landed when its wake came");
    }

  private:
    backend& be_;
    backend::download_ticket t_;
    coro::executor& ex_;
    bool landed_ = false;
    coro::wake_race race_;
};

// Activation round trip of §3.8 when the act_quant option is on (count: whole rows).
inline void act_quant(const env& e, act_quant_kind kind, float* x, int64_t count) {
    if (e.opts.act_quant) e.be.simulate_quant(kind, x, count);
}

// Observer helper: no-op without an observer; reads the tensor back from the backend.
void observe(const env& e, std::string_view name, int layer, const float* data, std::initializer_list<int64_t> shape);

}  // namespace moestream::dsv41::detail
