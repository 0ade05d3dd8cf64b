// Sub-layer building blocks of DeepSeek-V4.1 (§3.3-§3.5), shared by backbone layers and DSpark
// stages. Roundings follow the reference: every linear's output, norm output and RoPE output is
// rounded to bf16; the router, SwiGLU internals and the MoE accumulator stay fp32.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "config/event_trace.h"
#include "model/arch/deepseek41_internal.h"

namespace moestream::dsv41::detail {

matmul_job mix_job(const env& e, const float* H, int64_t n, const weight_view& fn, hc_mix& mix) {
    mix.fn_h.resize(size_t(n * fn.rows));
    return {fn, H, e.hp.hc_mult * e.hp.dim, n, mix.fn_h.data(), fn.rows, false};
}

void compute_mix(const env& e, const float* H, int64_t n, const weight_view& fn, const vector_view& base,
                 const vector_view& scale, hc_mix& mix, bool fn_h_ready) {
    const int hc = e.hp.hc_mult;
    mix.pre.resize(size_t(n * hc));
    mix.post.resize(size_t(n * hc));
    mix.comb.resize(size_t(n * hc * hc));
    e.be.hc_mixes(H, n, hc, e.hp.dim, fn, base.data, scale.data, e.hp.hc_sinkhorn_iters, float(e.hp.hc_eps),
                  float(e.hp.norm_eps), mix.pre.data(), mix.post.data(), mix.comb.data(),
                  fn_h_ready ? mix.fn_h.data() : nullptr);
}

// kv = W_kv · x  ->  RoPE(RMSNorm(kv)) (+ the fp8 round trip with act_quant), in place: the norm
// job of it (the caller's batch may hold other norms).
norm_job window_kv_norm(const env& e, const layer_weights& lw, const rows_info& rows, const float* freqs, float* kv) {
    const auto& hp = e.hp;
    return {kv, rows.n(), hp.head_dim, lw.kv_a_norm.data, float(hp.norm_eps), kv, true, 1, hp.rope_dim,
            rows.pos_dev, freqs};
}

void finish_window_kv(const env& e, const layer_weights& lw, const rows_info& rows, const float* freqs, float* kv) {
    const norm_job job = window_kv_norm(e, lw, rows, freqs, kv);
    e.be.norm_rows({&job, 1});
    act_quant(e, act_quant_kind::fp8_e8m0_32, kv, rows.n() * e.hp.head_dim);
}

void query_and_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
                  barray<float>& qr, barray<float>& q, float* kv, barray<float>* qi, std::span<const matmul_job> extra) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    qr.resize(size_t(n * hp.q_lora_rank));
    q.resize(size_t(n * hp.q_dim()));
    thread_local std::vector<matmul_job> first, second;  // kept between calls
    first.assign({{lw.q_a, x, hp.dim, n, qr.data(), hp.q_lora_rank, true},
                  {lw.kv, x, hp.dim, n, kv, hp.head_dim, true}});
    first.insert(first.end(), extra.begin(), extra.end());
    e.be.matmul_batch(first);
    // q_a's norm beside kv's norm and rotation: one step.
    const norm_job norms[] = {{qr.data(), n, hp.q_lora_rank, lw.q_a_norm.data, float(hp.norm_eps), qr.data(), true},
                              window_kv_norm(e, lw, rows, freqs, kv)};
    e.be.norm_rows(norms);
    act_quant(e, act_quant_kind::fp8_e8m0_32, qr.data(), int64_t(qr.size()));  // input of wq_b and indexer wq_b
    act_quant(e, act_quant_kind::fp8_e8m0_32, kv, n * hp.head_dim);
    second.assign(1, {lw.q_b, qr.data(), hp.q_lora_rank, n, q.data(), hp.q_dim(), true});
    if (qi && !lw.index_q_b.empty()) {
        const int64_t width = int64_t(hp.index_n_heads) * hp.index_head_dim;
        qi->resize(size_t(n * width));
        second.push_back({lw.index_q_b, qr.data(), hp.q_lora_rank, n, qi->data(), width, true});
    }
    e.be.matmul_batch(second);
    e.be.rope(q.data(), n, hp.q_dim(), hp.n_heads, hp.head_dim, hp.rope_dim, rows.pos_dev, freqs, false);
}

void window_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
               float* kv) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    e.be.matmul(lw.kv, x, hp.dim, n, kv, hp.head_dim, true);
    finish_window_kv(e, lw, rows, freqs, kv);
}

void attend_and_project(const env& e, const layer_weights& lw, const barray<float>& q,
                        std::vector<attention_row>& arows, const rows_info& rows, const float* freqs,
                        barray<float>& out, const hc_update* upd) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    barray<float>& o = e.ws.o;
    o.resize(size_t(n * hp.q_dim()));
    for (int64_t r = 0; r < n; ++r) {
        arows[size_t(r)].q = q.data() + r * hp.q_dim();
        arows[size_t(r)].out = o.data() + r * hp.q_dim();
    }
    e.be.attention(arows, hp.n_heads, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim)), lw.attn_sinks.data,
                   e.opts.act_quant);
    // The values carry the rotated tail: turn it back at the query's own position.
    e.be.rope(o.data(), n, hp.q_dim(), hp.n_heads, hp.head_dim, hp.rope_dim, rows.pos_dev, freqs, true);
    // Grouped output: group g (heads g*hpg .. ) through its own row block of W_oa.
    const int64_t group_in = hp.head_dim * hp.heads_per_group();
    const int64_t low = hp.o_lora_rank * hp.o_groups;
    barray<float>& u = e.ws.u;
    u.resize(size_t(n * low));
    thread_local std::vector<matmul_job> groups;  // kept between calls
    groups.clear();
    for (int g = 0; g < hp.o_groups; ++g)
        groups.push_back({lw.out_a.slice_rows(g * hp.o_lora_rank, hp.o_lora_rank), o.data() + g * group_in, hp.q_dim(),
                          n, u.data() + g * hp.o_lora_rank, low, true});
    e.be.matmul_batch(groups);
    out.resize(size_t(n * hp.dim));
    act_quant(e, act_quant_kind::fp8_e8m0_32, u.data(), int64_t(u.size()));
    // W_ob with the residual update in the same pass.
    const output_term term{lw.out_b, u.data(), nullptr, nullptr, n};
    e.be.output_sum({&term, 1}, n, hp.dim, out.data(), upd);
}

namespace {


// Experts whose down projections run inside output_sum (decode's few): each of its units reads
// a slice of every one of them, which pays off while there are few; a prefill's hundreds go
// through matmul_batch first and output_sum only adds them up.
constexpr size_t kMaxDownsInOutput = 16;

constexpr int64_t kMaxTerms = 33;  // a row's routed experts and the shared one

// The gate/up job of an expert: one SwiGLU pair, or (with act_quant, whose fp8 round trip of
// the activation works on 32-element blocks that tiles need not respect) two plain matmuls.
void push_gate_up(std::vector<matmul_job>& jobs, const expert_weights& ew, const float* x, int64_t dim, int64_t m,
                  float* g, float* u, float limit, const float* w, bool pair) {
    const int64_t in = ew.gate.rows;
    matmul_job gate{ew.gate, x, dim, m, g, in, true};
    if (!pair) {
        jobs.push_back(gate);
        jobs.push_back({ew.up, x, dim, m, u, in, true});
        return;
    }
    gate.up = ew.up;
    gate.u = u;
    gate.u_stride = in;
    gate.swiglu_limit = limit;
    gate.swiglu_w = w;
    jobs.push_back(gate);
}

// Sorted distinct ids.
void distinct(std::vector<int32_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
}

// moe() with every expert resident: the rows' picks in ascending id order, every assignment's
// gate/up and down through the slot table, then output_sum adds each row's experts in that order
// and the shared expert last: the same values, in the same order, as the host-scheduled path.
status moe_through_slots(const env& e, const layer_weights& lw, const expert_slot_table& t, const float* xe, int64_t n,
                         int64_t k, int64_t inter, bool pair, float limit, barray<float>& out,
                         const std::optional<hc_update>& upd) {
    workspace& ws = e.ws;
    const int64_t dim = e.hp.dim, n_assign = n * k, sinter = lw.gate_shexp.rows;
    MS_ASSERT_MSG(t.gate.rows == inter && t.up.rows == inter && t.gate.cols == dim && t.down.rows == dim,
                  "an expert's shape differs from moe_inter");
    // (ws.sorted_picks and ws.sorted_weights: formed with the picks, route_ordered in moe().)
    ws.ex_g.resize(size_t(n_assign * inter));
    ws.ex_u.resize(size_t(n_assign * inter));
    ws.ex_y.resize(size_t(n_assign * dim));
    e.be.moe_gate_up(t, xe, n, int(k), ws.sorted_picks.data(), ws.sorted_weights.data(), ws.ex_g.data(),
                     ws.ex_u.data(), pair, limit);
    if (!pair) {
        e.be.swiglu(ws.ex_g.data(), ws.ex_u.data(), n_assign, inter, limit, ws.sorted_weights.data());
        act_quant(e, act_quant_kind::fp8_e8m0_32, ws.ex_g.data(), n_assign * inter);
        e.be.swiglu(ws.shared_g.data(), ws.shared_u.data(), n, sinter, limit, nullptr);
        act_quant(e, act_quant_kind::fp8_e8m0_32, ws.shared_g.data(), n * sinter);
    }
    e.be.moe_down(t, ws.ex_g.data(), n, int(k), ws.sorted_picks.data(), ws.ex_y.data());
    output_term terms[kMaxTerms];
    MS_ASSERT(k + 1 <= kMaxTerms);
    for (int64_t j = 0; j < k; ++j) terms[j] = {{}, nullptr, ws.ex_y.data() + j * n * dim, nullptr, n};
    terms[k] = {lw.down_shexp, ws.shared_g.data(), nullptr, nullptr, n};
    out.resize(size_t(n * dim));
    e.be.output_sum({terms, size_t(k + 1)}, n, dim, out.data(), upd ? &*upd : nullptr);
    return {};
}

}  // namespace

coro::task<status> moe(const env& e, const layer_weights& lw, int layer, int n_experts, int n_active,
                       const float* x, const rows_info& rows, barray<float>& out, std::span<const matmul_job> extra,
                       std::span<const layer_weights* const> ahead, const std::function<hc_update()>& update) {
    const auto& hp = e.hp;
    workspace& ws = e.ws;
    moe_scratch& sc = ws.moe_host;
    const int64_t n = rows.n(), dim = hp.dim;
    const float limit = float(hp.swiglu_limit);
    // SwiGLU inside the gate/up passes, unless act_quant must round its output in 32-blocks.
    const bool pair = !e.opts.act_quant;
    // Routed and shared experts are fp4/fp8 linears: their input goes through the fp8 round trip
    // (the router, fp32, sees x itself).
    const float* xe = x;
    if (e.opts.act_quant) {
        ws.moe_xq.resize(size_t(n * dim));
        e.be.copy(ws.moe_xq.data(), x, size_t(n * dim) * sizeof(float));
        act_quant(e, act_quant_kind::fp8_e8m0_32, ws.moe_xq.data(), n * dim);
        xe = ws.moe_xq.data();
    }
    // One parallel step: the router, the shared expert's gate/up (they need no routing) and the
    // caller's extra work.
    const expert_weights shared_ew{lw.gate_shexp, lw.up_shexp, lw.down_shexp};
    const int64_t sinter = lw.gate_shexp.rows;
    ws.scores.resize(size_t(n * n_experts));
    ws.shared_g.resize(size_t(n * sinter));
    ws.shared_u.resize(size_t(n * sinter));
    // Every expert resident in the backend's slots: the routing stays on the backend (no read of
    // the picks, so no wait for the device, and a CUDA graph of the step stays valid).
    const expert_slot_table* table = e.opts.hook || n > kMaxSlotTableRows ? nullptr : e.experts.slot_table(layer);
    // The following layers' routers on this input (their picks are prefetch hints: nothing to
    // fetch when every expert is resident). Layer L+1+d's scores are block d of ws.ahead.
    MS_ASSERT(ahead.size() <= size_t(kMaxLookaheadLayers));
    const bool look_ahead = !ahead.empty() && e.opts.lookahead && !table;
    const size_t n_ahead = look_ahead ? ahead.size() : 0;
    const size_t ahead_block = size_t(n * n_experts);
    {
        std::vector<matmul_job>& first = sc.jobs;
        first.clear();
        first.push_back({lw.gate_inp, x, dim, n, ws.scores.data(), n_experts, false, true});
        push_gate_up(first, shared_ew, xe, dim, n, ws.shared_g.data(), ws.shared_u.data(), limit, nullptr, pair);
        first.insert(first.end(), extra.begin(), extra.end());
        ws.ahead.resize(n_ahead * ahead_block);
        for (size_t d = 0; d < n_ahead; ++d)
            first.push_back({ahead[d]->gate_inp, x, dim, n, ws.ahead.data() + d * ahead_block, n_experts, false, true});
        e.be.matmul_batch(first);
    }
    std::optional<hc_update> upd;
    if (update) upd = update();
    // Router in fp32 (§3.5): scores s = sqrt(softplus(W_g x)) (formed in the parallel step); the
    // bias only selects; the weights come from the unbiased scores.
    const int64_t k = n_active, n_assign = n * k;
    ws.picks.resize(size_t(n_assign));
    ws.weights.resize(size_t(n_assign));
    MS_ASSERT(lw.exp_probs_b.size == n_experts);
    if (table) {
        // The slot-table ops take the picks in ascending id order: formed with them.
        ws.sorted_picks.resize(size_t(n_assign));
        ws.sorted_weights.resize(size_t(n_assign));
        e.be.route_ordered(ws.scores.data(), lw.exp_probs_b.data, n, n_experts, int(k), hp.route_scale,
                           ws.picks.data(), ws.weights.data(), ws.sorted_picks.data(), ws.sorted_weights.data());
    } else {
        e.be.route(ws.scores.data(), lw.exp_probs_b.data, n, n_experts, int(k), hp.route_scale, true, ws.picks.data(),
                   ws.weights.data());
    }
    const int64_t inter = hp.moe_inter;
    if (table) {
        observe(e, "router_scores", layer, ws.scores.data(), {n, n_experts});
        if (layer < e.hp.n_layers) {
            ++ws.layers_routed_on_backend;
            ws.layer_union[size_t(layer)] = -1;  // the host never sees these picks
        }
        co_return moe_through_slots(e, lw, *table, xe, n, k, inter, pair, limit, out, upd);
    }
    // The look-ahead layers' routes go to the backend right behind this layer's, before its picks
    // are read back: the device runs them while the host announces this layer's union, and one
    // more download then brings all their picks (predicted_all: L+1, then L+2, ...), instead of
    // a launch and a wait for each after the announcement (~45 us a layer on the H200's host).
    ws.predicted_all.resize(n_ahead * size_t(n_assign));
    for (size_t d = 0; d < n_ahead; ++d) {
        MS_ASSERT(ahead[d]->exp_probs_b.size == n_experts);
        e.be.route(ws.ahead.data() + d * ahead_block, ahead[d]->exp_probs_b.data, n, n_experts, int(k), 1.0, true,
                   ws.predicted_all.data() + d * size_t(n_assign), nullptr);
    }
    // The picks are the host's to schedule with (a few bytes), awaited: the forward suspends
    // until they land (no thread waits on the device). The look-ahead layers' picks are queued
    // right behind them and read after the announcement below.
    std::vector<int32_t>& picks = sc.picks;
    picks.resize(size_t(n_assign));
    trace::mark(trace::ev::picks_wait, layer, int32_t(n));
    const backend::download_ticket picks_ticket =
        e.be.download_begin(picks.data(), ws.picks.data(), picks.size() * sizeof(int32_t));
    backend::download_ticket ahead_ticket;
    if (n_ahead > 0) {
        sc.predicted_all.resize(n_ahead * size_t(n_assign));
        ahead_ticket = e.be.download_begin(sc.predicted_all.data(), ws.predicted_all.data(),
                                           sc.predicted_all.size() * sizeof(int32_t));
    }
    co_await download_landed(e.be, picks_ticket, e.resume);
    if (e.opts.hook) {
        // (The hook's upload must not find a download in flight: take the predictions first.)
        if (n_ahead > 0) co_await download_landed(e.be, ahead_ticket, e.resume);
        for (int64_t r = 0; r < n; ++r)
            e.opts.hook->picks({layer >= hp.n_layers ? pick_kind::draft_router : pick_kind::router, layer,
                                rows.pos[size_t(r)], rows.seq_rows[size_t(r)]},
                               std::span<int32_t>(picks.data() + r * k, size_t(k)));
        for (int32_t id : picks) MS_ASSERT_MSG(id >= 0 && id < n_experts, "router pick out of range");
        e.be.upload(ws.picks.data(), picks.data(), picks.size() * sizeof(int32_t));
        e.be.route(ws.scores.data(), lw.exp_probs_b.data, n, n_experts, int(k), hp.route_scale, false,
                   ws.picks.data(), ws.weights.data());
    }
    observe(e, "router_scores", layer, ws.scores.data(), {n, n_experts});

    // The union of the rows' experts, announced at once (one read queue for the whole layer).
    std::vector<int32_t>& needed = sc.needed;
    needed.assign(picks.begin(), picks.end());
    distinct(needed);
    if (layer < hp.n_layers) {
        ws.routed_experts += int64_t(needed.size());
        ws.layer_union[size_t(layer)] = int32_t(needed.size());
        ws.picks_rows = n <= kMaxRecordedRows ? n : 0;
        if (ws.picks_rows > 0)
            std::copy(picks.begin(), picks.end(),
                      ws.row_picks.begin() + std::ptrdiff_t(size_t(layer) * size_t(kMaxRecordedRows) * size_t(k)));
    }
    trace::mark(trace::ev::need, layer, int32_t(needed.size()));
    e.experts.need(layer, needed);
    // Hints carried from the previous forward (model::hint_next_forward) for the next layer.
    std::vector<int32_t>* carried =
        layer + 1 < hp.n_layers && !ws.carried_hints[size_t(layer + 1)].empty() ? &ws.carried_hints[size_t(layer + 1)]
                                                                               : nullptr;
    if (carried && !look_ahead) {
        e.experts.hint(layer + 1, *carried);
        carried->clear();
    }
    // The look-ahead layers' picks, routed above: one download for all of them (landed by now,
    // normally: it was queued right behind the picks).
    if (n_ahead > 0 && !e.opts.hook) co_await download_landed(e.be, ahead_ticket, e.resume);
    // Nearest layer first (the tiers read hints in the order they come); the carried hints join
    // the next layer's.
    for (size_t d = 0; d < n_ahead; ++d) {
        std::vector<int32_t>& predicted = sc.predicted;
        const auto from = sc.predicted_all.begin() + std::ptrdiff_t(d * size_t(n_assign));
        predicted.assign(from, from + std::ptrdiff_t(n_assign));
        if (d == 0 && carried) {
            predicted.insert(predicted.end(), carried->begin(), carried->end());
            carried->clear();
        }
        distinct(predicted);
        trace::mark(trace::ev::hint, layer + 1 + int(d), int32_t(predicted.size()));
        e.experts.hint(layer + 1 + int(d), predicted);
    }

    // Every expert's rows are gathered; the experts are taken in groups of what the source lets
    // the model hold at once (all of them when everything is resident), and each group's gate/up
    // projections run as one parallel step. The down projections of the last group (all of
    // them in decode) run inside output_sum, which adds every expert's output in a fixed order,
    // ascending expert id then the shared expert, whatever the grouping or the order the
    // experts became resident in; earlier groups' run as a step of their own first.
    std::vector<expert_work>& work = sc.work;
    work.resize(needed.size() + 1);
    for (auto& ex : work) {
        ex.rows.clear();
        ex.assign.clear();
        ex.ew = {};
        ex.down_in_output = false;
    }
    sc.x_rows.clear();
    sc.w_index.clear();
    int64_t next_first = 0;
    for (size_t j = 0; j < needed.size(); ++j) {
        auto& ex = work[j];
        for (int64_t r = 0; r < n; ++r)
            for (int64_t i = 0; i < k; ++i)
                if (picks[size_t(r * k + i)] == needed[j]) {
                    ex.rows.push_back(r);
                    ex.assign.push_back(r * k + i);
                }
        ex.first = next_first;
        next_first += int64_t(ex.rows.size());
        sc.w_index.insert(sc.w_index.end(), ex.assign.begin(), ex.assign.end());
        if (int64_t(ex.rows.size()) != n) sc.x_rows.insert(sc.x_rows.end(), ex.rows.begin(), ex.rows.end());
    }
    MS_ASSERT(next_first == n_assign);
    // The rows' inputs (experts that take every row, in order, read the step's input) and their
    // routing weights, each gathered in one step; a single row's weights are read in place.
    ws.ex_x.resize(sc.x_rows.size() * size_t(dim));
    if (!sc.x_rows.empty())
        e.be.gather_rows(xe, dim, sc.x_rows.data(), int64_t(sc.x_rows.size()), dim, ws.ex_x.data());
    if (n > 1) {
        ws.ex_w.resize(size_t(n_assign));
        e.be.gather_rows(ws.weights.data(), 1, sc.w_index.data(), n_assign, 1, ws.ex_w.data());
    }
    ws.ex_g.resize(size_t(n_assign * inter));
    ws.ex_u.resize(size_t(n_assign * inter));
    ws.ex_y.resize(size_t(n_assign * dim));
    int64_t x_at = 0;
    for (size_t j = 0; j < needed.size(); ++j) {
        auto& ex = work[j];
        const int64_t m = int64_t(ex.rows.size());
        if (m == n) {
            ex.in = xe;
        } else {
            ex.in = ws.ex_x.data() + x_at * dim;
            x_at += m;
        }
        ex.w = n > 1 ? ws.ex_w.data() + ex.first : ws.weights.data() + ex.assign[0];
        ex.g = ws.ex_g.data() + ex.first * inter;
        ex.u = ws.ex_u.data() + ex.first * inter;
        ex.y = ws.ex_y.data() + ex.first * dim;
    }
    auto& shared = work.back();
    shared.ew = shared_ew;
    for (int64_t r = 0; r < n; ++r) shared.rows.push_back(r);
    shared.g = ws.shared_g.data();  // computed with the router
    shared.u = ws.shared_u.data();
    // Experts are computed as they become resident (expert-granular overlap with the reads of the
    // others), in groups of what is ready; the shared expert joins the first group.
    const int64_t cap = std::max<int64_t>(1, e.experts.max_held());
    std::vector<int32_t>& pending = sc.pending;
    pending.assign(needed.begin(), needed.end());
    std::vector<size_t>& group = sc.group;
    std::vector<matmul_job>& jobs = sc.jobs;
    bool shared_done = false;
    while (!pending.empty() || !shared_done) {
        group.clear();
        jobs.clear();
        if (!pending.empty()) {
            // Suspends (no thread waits) until the source has at least one of them resident.
            trace::mark(trace::ev::wait_begin, layer, int32_t(pending.size()));
            auto ready = co_await experts_ready(e.experts, layer, pending, cap, e.resume);
            if (!ready) co_return ready.err();
            trace::mark(trace::ev::wait_end, layer, int32_t(ready->size()));
            for (auto& [id, ew] : *ready) {
                const size_t j = size_t(std::lower_bound(needed.begin(), needed.end(), id) - needed.begin());
                MS_ASSERT(j < needed.size() && needed[j] == id);
                auto& ex = work[j];
                ex.ew = ew;
                MS_ASSERT_MSG(ew.gate.rows == inter && ew.up.rows == inter, "an expert's shape differs from moe_inter");
                push_gate_up(jobs, ex.ew, ex.in, dim, int64_t(ex.rows.size()), ex.g, ex.u, limit, ex.w, pair);
                group.push_back(j);
                pending.erase(std::find(pending.begin(), pending.end(), id));
            }
            e.be.matmul_batch(jobs);
            jobs.clear();
        }
        if (!shared_done) {
            group.push_back(work.size() - 1);  // its gate/up ran with the router
            shared_done = true;
        }
        for (size_t j : group) {
            auto& ex = work[j];
            const int64_t m = int64_t(ex.rows.size()), in = ex.ew.gate.rows;
            if (!pair) {
                e.be.swiglu(ex.g, ex.u, m, in, limit, j + 1 < work.size() ? ex.w : nullptr);
                act_quant(e, act_quant_kind::fp8_e8m0_32, ex.g, m * in);
            }
            if (pending.empty() && group.size() <= kMaxDownsInOutput) {
                ex.down_in_output = true;
                continue;
            }
            if (j + 1 == work.size()) {  // the shared expert's own outputs
                ws.shared_y.resize(size_t(n * dim));
                ex.y = ws.shared_y.data();
            }
            jobs.push_back({ex.ew.down, ex.g, in, m, ex.y, dim, true});
        }
        if (jobs.empty()) break;  // the last group: its downs run in output_sum
        e.be.matmul_batch(jobs);
        for (size_t j : group)
            if (j + 1 < work.size()) e.experts.release(layer, needed[j]);
    }
    std::vector<output_term>& terms = sc.terms;
    terms.clear();
    for (const auto& ex : work) {
        const int64_t m = int64_t(ex.rows.size());
        output_term t{{}, nullptr, ex.y, m == n ? nullptr : ex.rows.data(), m};
        if (ex.down_in_output) {
            t.w = ex.ew.down;
            t.h = ex.g;
            t.y = nullptr;
        }
        terms.push_back(t);
    }
    out.resize(size_t(n * dim));
    e.be.output_sum(terms, n, dim, out.data(), upd ? &*upd : nullptr);
    for (size_t j = 0; j + 1 < work.size(); ++j)
        if (work[j].down_in_output) e.experts.release(layer, needed[j]);
    trace::mark(trace::ev::moe_end, layer, 0);
    co_return status{};
}

void observe(const env& e, std::string_view name, int layer, const float* data, std::initializer_list<int64_t> shape) {
    if (!e.opts.observer) return;
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    thread_local std::vector<float> host;
    if (!e.be.host_memory()) {
        host.resize(size_t(count));
        e.be.download(host.data(), data, host.size() * sizeof(float));
        data = host.data();
    }
    e.opts.observer->tensor(name, layer, data, std::span<const int64_t>(shape.begin(), shape.size()));
}

}  // namespace moestream::dsv41::detail
