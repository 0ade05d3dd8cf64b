// Sub-layer building blocks of DeepSeek-V4.1 (§3.3-§3.5), shared by backbone layers and DSpark
// stages. Roundings follow the reference: every linear's output, norm output and RoPE output is
// rounded to bf16; the router, SwiGLU internals and the MoE accumulator stay fp32.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "model/arch/deepseek41_internal.h"
#include "model/bf16.h"
#include "model/quant.h"

namespace moestream::dsv41::detail {

matmul_job hc_mix::job(const env& e, const std::vector<float>& H, int64_t n, const weight_view& fn) {
    fn_h.resize(size_t(n * fn.rows));
    return {fn, H.data(), e.hp.hc_mult * e.hp.dim, n, fn_h.data(), fn.rows, false};
}

void hc_mix::compute(const env& e, const std::vector<float>& H, int64_t n, const weight_view& fn,
                     const vector_view& base, const vector_view& scale, bool fn_h_ready) {
    const int hc = e.hp.hc_mult;
    pre.resize(size_t(n * hc));
    post.resize(size_t(n * hc));
    comb.resize(size_t(n * hc * hc));
    e.be.hc_mixes(H.data(), n, hc, e.hp.dim, fn, base.data, scale.data, e.hp.hc_sinkhorn_iters, float(e.hp.hc_eps),
                  float(e.hp.norm_eps), pre.data(), post.data(), comb.data(), fn_h_ready ? fn_h.data() : nullptr);
}

// kv = W_kv · x  ->  RoPE(RMSNorm(kv)) (+ the fp8 round trip with act_quant), in place.
void finish_window_kv(const env& e, const layer_weights& lw, const rows_info& rows, const float* freqs,
                      std::vector<float>& kv) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    e.be.rms_norm(kv.data(), n, hp.head_dim, lw.kv_a_norm.data, float(hp.norm_eps), kv.data(), true);
    e.be.rope(kv.data(), n, hp.head_dim, 1, hp.head_dim, hp.rope_dim, rows.pos.data(), freqs, false);
    act_quant(e, act_quant_kind::fp8_e8m0_32, kv.data(), int64_t(kv.size()));
}

void query_and_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
                  std::vector<float>& qr, std::vector<float>& q, std::vector<float>& kv, std::vector<float>* qi,
                  std::span<const matmul_job> extra) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    qr.resize(size_t(n * hp.q_lora_rank));
    q.resize(size_t(n * hp.q_dim()));
    kv.resize(size_t(n * hp.head_dim));
    thread_local std::vector<matmul_job> first, second;  // kept between calls
    first.assign({{lw.q_a, x, hp.dim, n, qr.data(), hp.q_lora_rank, true},
                  {lw.kv, x, hp.dim, n, kv.data(), hp.head_dim, true}});
    first.insert(first.end(), extra.begin(), extra.end());
    e.be.matmul_batch(first);
    e.be.rms_norm(qr.data(), n, hp.q_lora_rank, lw.q_a_norm.data, float(hp.norm_eps), qr.data(), true);
    act_quant(e, act_quant_kind::fp8_e8m0_32, qr.data(), int64_t(qr.size()));  // input of wq_b and indexer wq_b
    finish_window_kv(e, lw, rows, freqs, kv);
    second.assign(1, {lw.q_b, qr.data(), hp.q_lora_rank, n, q.data(), hp.q_dim(), true});
    if (qi && !lw.index_q_b.empty()) {
        const int64_t width = int64_t(hp.index_n_heads) * hp.index_head_dim;
        qi->resize(size_t(n * width));
        second.push_back({lw.index_q_b, qr.data(), hp.q_lora_rank, n, qi->data(), width, true});
    }
    e.be.matmul_batch(second);
    e.be.rope(q.data(), n, hp.q_dim(), hp.n_heads, hp.head_dim, hp.rope_dim, rows.pos.data(), freqs, false);
}

void window_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
               std::vector<float>& kv) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    kv.resize(size_t(n * hp.head_dim));
    e.be.matmul(lw.kv, x, hp.dim, n, kv.data(), hp.head_dim, true);
    finish_window_kv(e, lw, rows, freqs, kv);
}

namespace {

// Buffers of attend_and_project, kept between calls (a decode step makes one call per layer).
struct attend_scratch {
    std::vector<float> o, u;
    std::vector<matmul_job> groups;
};
thread_local attend_scratch t_attend;

}  // namespace

void attend_and_project(const env& e, const layer_weights& lw, const std::vector<float>& q,
                        std::vector<attention_row>& arows, const rows_info& rows, const float* freqs,
                        std::vector<float>& out, const hc_update* upd) {
    const auto& hp = e.hp;
    const int64_t n = rows.n();
    std::vector<float>& o = t_attend.o;
    o.resize(size_t(n * hp.q_dim()));
    for (int64_t r = 0; r < n; ++r) {
        arows[size_t(r)].q = q.data() + r * hp.q_dim();
        arows[size_t(r)].out = o.data() + r * hp.q_dim();
    }
    e.be.attention(arows, hp.n_heads, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim)), lw.attn_sinks.data,
                   e.opts.act_quant);
    // The values carry the rotated tail: turn it back at the query's own position.
    e.be.rope(o.data(), n, hp.q_dim(), hp.n_heads, hp.head_dim, hp.rope_dim, rows.pos.data(), freqs, true);
    // Grouped output: group g (heads g*hpg .. ) through its own row block of W_oa.
    const int64_t group_in = hp.head_dim * hp.heads_per_group();
    const int64_t low = hp.o_lora_rank * hp.o_groups;
    std::vector<float>& u = t_attend.u;
    u.resize(size_t(n * low));
    std::vector<matmul_job>& groups = t_attend.groups;
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

void top_k(const float* v, int64_t n, int64_t k, int32_t* out) {
    MS_ASSERT(k >= 0 && k <= n);
    if (k == 0) return;
    // Small k (the router's picks): insertion into the sorted prefix, no allocation. Entries come
    // in ascending index, so an equal score never displaces an earlier one: the same order as
    // the sort below (score descending, then lower index).
    if (k <= 16) {
        int64_t held = 0;
        for (int64_t i = 0; i < n; ++i) {
            const float x = v[i];
            if (held == k && !(x > v[out[k - 1]])) continue;
            int64_t at = held < k ? held++ : k - 1;
            while (at > 0 && x > v[out[at - 1]]) {
                out[at] = out[at - 1];
                --at;
            }
            out[at] = int32_t(i);
        }
        return;
    }
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return v[a] > v[b] || (v[a] == v[b] && a < b);
    });
    std::copy(idx.begin(), idx.begin() + k, out);
}

namespace {

// Every expert's rows of one MoE step: its input rows, their routing weights, and its buffers.
struct expert_work {
    std::vector<int64_t> rows;
    std::vector<float> w, x, g, u, y;
    const float* in = nullptr;  // its input rows: x, or the step's own input when it takes every row
    bool down_in_output = false;  // its down projection runs inside output_sum
    expert_weights ew;
};

// moe()'s buffers, kept per thread between calls: decode runs it 40 times a token, and fresh
// vectors (allocated, zero-filled, freed) cost more there than the routing arithmetic.
struct moe_scratch {
    std::vector<float> xq, scores, biased, shared_g, shared_u, ahead, weights;
    std::vector<int32_t> picks, needed, predicted, pending;
    std::vector<size_t> group;
    std::vector<matmul_job> jobs;
    std::vector<output_term> terms;
    std::vector<expert_work> work;
};
thread_local moe_scratch t_moe;

// Experts whose down projections run inside output_sum (decode's few): each of its units reads
// a slice of every one of them, which pays off while there are few; a prefill's hundreds go
// through matmul_batch first and output_sum only adds them up.
constexpr size_t kMaxDownsInOutput = 16;

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

}  // namespace

status moe(const env& e, const layer_weights& lw, int layer, int n_experts, int n_active, const float* x,
           const rows_info& rows, std::vector<float>& out, std::span<const matmul_job> extra,
           const layer_weights* next, const std::function<hc_update()>& update) {
    const auto& hp = e.hp;
    moe_scratch& sc = t_moe;
    const int64_t n = rows.n(), dim = hp.dim;
    const float limit = float(hp.swiglu_limit);
    // SwiGLU inside the gate/up passes, unless act_quant must round its output in 32-blocks.
    const bool pair = !e.opts.act_quant;
    // Routed and shared experts are fp4/fp8 linears: their input goes through the fp8 round trip
    // (the router, fp32, sees x itself).
    const float* xe = x;
    std::vector<float>& xq = sc.xq;
    if (e.opts.act_quant) {
        xq.assign(x, x + n * dim);
        act_quant(e, act_quant_kind::fp8_e8m0_32, xq.data(), n * dim);
        xe = xq.data();
    }
    // One parallel step: the router, the shared expert's gate/up (they need no routing) and the
    // caller's extra work.
    const expert_weights shared_ew{lw.gate_shexp, lw.up_shexp, lw.down_shexp};
    const int64_t sinter = lw.gate_shexp.rows;
    std::vector<float>&scores = sc.scores, &biased = sc.biased, &shared_g = sc.shared_g, &shared_u = sc.shared_u;
    scores.resize(size_t(n * n_experts));
    biased.resize(size_t(n_experts));
    shared_g.resize(size_t(n * sinter));
    shared_u.resize(size_t(n * sinter));
    std::vector<float>& ahead = sc.ahead;  // the next layer's router on this input (look-ahead)
    ahead.clear();
    {
        std::vector<matmul_job>& first = sc.jobs;
        first.clear();
        first.push_back({lw.gate_inp, x, dim, n, scores.data(), n_experts, false, true});
        push_gate_up(first, shared_ew, xe, dim, n, shared_g.data(), shared_u.data(), limit, nullptr, pair);
        first.insert(first.end(), extra.begin(), extra.end());
        if (next && e.opts.lookahead) {
            ahead.resize(size_t(n * n_experts));
            first.push_back({next->gate_inp, x, dim, n, ahead.data(), n_experts, false, true});
        }
        e.be.matmul_batch(first);
    }
    std::optional<hc_update> upd;
    if (update) upd = update();
    // Router in fp32 (§3.5): scores s = sqrt(softplus(W_g x)) (formed in the parallel step); the
    // bias only selects.
    std::vector<int32_t>& picks = sc.picks;
    std::vector<float>& weights = sc.weights;
    picks.resize(size_t(n * n_active));
    weights.resize(size_t(n * n_active));
    MS_ASSERT(lw.exp_probs_b.size == n_experts);
    const float* bias = lw.exp_probs_b.data;
    for (int64_t r = 0; r < n; ++r) {
        float* s = scores.data() + r * n_experts;
        for (int i = 0; i < n_experts; ++i) biased[size_t(i)] = s[i] + bias[i];
        std::span<int32_t> p(picks.data() + r * n_active, size_t(n_active));
        top_k(biased.data(), n_experts, n_active, p.data());
        if (e.opts.hook)
            e.opts.hook->picks({layer >= hp.n_layers ? pick_kind::draft_router : pick_kind::router, layer,
                                rows.pos[size_t(r)], rows.seq_rows[size_t(r)]},
                               p);
        float sum = 0;
        for (int32_t id : p) {
            MS_ASSERT_MSG(id >= 0 && id < n_experts, "router pick out of range");
            sum += s[id];
        }
        for (int k = 0; k < n_active; ++k)
            weights[size_t(r * n_active + k)] = float(s[p[size_t(k)]] / (sum + 1e-20f) * hp.route_scale);
    }
    observe(e, "router_scores", layer, scores.data(), {n, n_experts});

    // The union of the rows' experts, announced at once (one read queue for the whole layer).
    std::vector<int32_t>& needed = sc.needed;
    needed.assign(picks.begin(), picks.end());
    std::sort(needed.begin(), needed.end());
    needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
    e.experts.need(layer, needed);
    if (!ahead.empty()) {
        std::vector<int32_t>& predicted = sc.predicted;
        predicted.resize(size_t(n * n_active));
        MS_ASSERT(next->exp_probs_b.size == n_experts);
        for (int64_t r = 0; r < n; ++r) {
            float* s = ahead.data() + r * n_experts;
            for (int i = 0; i < n_experts; ++i) s[i] += next->exp_probs_b.data[i];
            top_k(s, n_experts, n_active, predicted.data() + r * n_active);
        }
        std::sort(predicted.begin(), predicted.end());
        predicted.erase(std::unique(predicted.begin(), predicted.end()), predicted.end());
        e.experts.hint(layer + 1, predicted);
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
        ex.w.clear();
        ex.ew = {};
        ex.down_in_output = false;
    }
    for (size_t k = 0; k < needed.size(); ++k) {
        auto& ex = work[k];
        for (int64_t r = 0; r < n; ++r)
            for (int j = 0; j < n_active; ++j)
                if (picks[size_t(r * n_active + j)] == needed[k]) {
                    ex.rows.push_back(r);
                    ex.w.push_back(weights[size_t(r * n_active + j)]);
                }
        const int64_t m = int64_t(ex.rows.size());
        if (m == n) {  // every row, in order (decode's single row): no copy
            ex.in = xe;
            continue;
        }
        ex.x.resize(size_t(m * dim));
        for (int64_t i = 0; i < m; ++i) std::copy_n(xe + ex.rows[size_t(i)] * dim, dim, ex.x.data() + i * dim);
        ex.in = ex.x.data();
    }
    auto& shared = work.back();
    shared.ew = shared_ew;
    for (int64_t r = 0; r < n; ++r) shared.rows.push_back(r);
    std::swap(shared.g, shared_g);  // computed with the router (the swap keeps both buffers)
    std::swap(shared.u, shared_u);
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
            auto ready = e.experts.acquire_ready(layer, pending, cap);
            if (!ready) return ready.err();
            for (auto& [id, ew] : *ready) {
                const size_t k = size_t(std::lower_bound(needed.begin(), needed.end(), id) - needed.begin());
                MS_ASSERT(k < needed.size() && needed[k] == id);
                auto& ex = work[k];
                ex.ew = ew;
                const int64_t m = int64_t(ex.rows.size()), in = ex.ew.gate.rows;
                ex.g.resize(size_t(m * in));
                ex.u.resize(size_t(m * in));
                push_gate_up(jobs, ex.ew, ex.in, dim, m, ex.g.data(), ex.u.data(), limit, ex.w.data(), pair);
                group.push_back(k);
                pending.erase(std::find(pending.begin(), pending.end(), id));
            }
            e.be.matmul_batch(jobs);
            jobs.clear();
        }
        if (!shared_done) {
            group.push_back(work.size() - 1);  // its gate/up ran with the router
            shared_done = true;
        }
        for (size_t k : group) {
            auto& ex = work[k];
            const int64_t m = int64_t(ex.rows.size()), in = ex.ew.gate.rows;
            if (!pair) {
                e.be.swiglu(ex.g.data(), ex.u.data(), m, in, limit, k + 1 < work.size() ? ex.w.data() : nullptr);
                act_quant(e, act_quant_kind::fp8_e8m0_32, ex.g.data(), m * in);
            }
            if (pending.empty() && group.size() <= kMaxDownsInOutput) {
                ex.down_in_output = true;
                continue;
            }
            ex.y.resize(size_t(m * dim));
            jobs.push_back({ex.ew.down, ex.g.data(), in, m, ex.y.data(), dim, true});
        }
        if (jobs.empty()) break;  // the last group: its downs run in output_sum
        e.be.matmul_batch(jobs);
        for (size_t k : group)
            if (k + 1 < work.size()) e.experts.release(layer, needed[k]);
    }
    std::vector<output_term>& terms = sc.terms;
    terms.clear();
    for (const auto& ex : work) {
        const int64_t m = int64_t(ex.rows.size());
        output_term t{{}, nullptr, ex.y.data(), m == n ? nullptr : ex.rows.data(), m};
        if (ex.down_in_output) {
            t.w = ex.ew.down;
            t.h = ex.g.data();
            t.y = nullptr;
        }
        terms.push_back(t);
    }
    out.resize(size_t(n * dim));
    e.be.output_sum(terms, n, dim, out.data(), upd ? &*upd : nullptr);
    for (size_t k = 0; k + 1 < work.size(); ++k)
        if (work[k].down_in_output) e.experts.release(layer, needed[k]);
    return {};
}

void embedding_row(const weight_view& table, int32_t token, float* out) {
    quant::dequantize_row(table.type, table.row(token), out, table.cols);
    round_to_bf16(out, table.cols);
}

void observe(const env& e, std::string_view name, int layer, const float* data, std::initializer_list<int64_t> shape) {
    if (!e.opts.observer) return;
    e.opts.observer->tensor(name, layer, data, std::span<const int64_t>(shape.begin(), shape.size()));
}

}  // namespace moestream::dsv41::detail
