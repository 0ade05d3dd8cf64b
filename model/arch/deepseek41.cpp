// DeepSeek-V4.1 backbone forward (dsv41-architecture.md §3.6), generalised from the reference's
// "prefill from 0, then one token" to any number of rows per sequence and several sequences per
// forward: per-row window visibility, the ratio-2 pending pair across forwards, per-row
// compressed-entry visibility, candidate pinning and top-k.
#include "model/arch/deepseek41.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "config/event_trace.h"
#include "model/arch/deepseek41_internal.h"
#include "model/bf16.h"
#include "model/prefetch.h"
#include "model/quant.h"

namespace moestream::dsv41 {

using detail::kInf;

namespace {

// f_i = base^(-2i/d) in fp32; with `yarn`, the frequency blend of §3.0 (no magnitude factor).
std::vector<float> rope_table(const hparams& hp, double base, bool yarn) {
    const int64_t d = hp.rope_dim, pairs = d / 2;
    std::vector<float> f(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) f[size_t(i)] = 1.0f / std::pow(float(base), float(2 * i) / float(d));
    if (!yarn) return f;
    auto corr = [&](double r) {
        return double(d) * std::log(double(hp.original_seq_len) / (r * 2 * M_PI)) / (2 * std::log(base));
    };
    const double low = std::max(std::floor(corr(hp.beta_fast)), 0.0);
    const double high = std::min(std::ceil(corr(hp.beta_slow)), double(d - 1));
    for (int64_t i = 0; i < pairs; ++i) {
        const float ramp = std::clamp((float(i) - float(low)) / std::max(float(high - low), 0.001f), 0.0f, 1.0f);
        const float smooth = 1.0f - ramp;
        f[size_t(i)] = f[size_t(i)] / float(hp.rope_factor) * (1.0f - smooth) + f[size_t(i)] * smooth;
    }
    return f;
}

// The latest layer of `set` at or before `layer` (-1 if none).
int latest_at_or_before(const std::vector<int>& set, int layer) {
    int best = -1;
    for (int s : set)
        if (s <= layer) best = std::max(best, s);
    return best;
}

}  // namespace

void engram_hash(const hparams& hp, const engram_side_tables& t, std::span<const int32_t> history, int64_t pos,
                 std::span<int64_t> rows_out) {
    const int orders = hp.engram_max_ngram;
    const int64_t cols = hp.engram_columns();
    MS_ASSERT(int64_t(rows_out.size()) == cols * int64_t(hp.engram_layers.size()));
    MS_ASSERT(pos >= 0 && pos < int64_t(history.size()));
    const int64_t pad = t.token_map[size_t(hp.engram_pad_id)];
    std::vector<int64_t> g(static_cast<size_t>(orders));
    bool blocked = false;  // once a look-back leaves the sequence or meets a DEAD id, the rest is pad
    for (int s = 0; s < orders; ++s) {
        if (!blocked && (pos - s < 0 || t.token_map[size_t(history[size_t(pos - s)])] < 0)) blocked = true;
        g[size_t(s)] = blocked ? pad : t.token_map[size_t(history[size_t(pos - s)])];
    }
    for (size_t e = 0; e < hp.engram_layers.size(); ++e) {
        const int64_t* m = t.multipliers.data() + e * size_t(orders);
        int64_t r = g[0] * m[0];
        for (int n = 1; n < orders; ++n) {
            r ^= g[size_t(n)] * m[n];
            for (int h = 0; h < hp.engram_n_heads; ++h) {
                const int64_t col = int64_t(n - 1) * hp.engram_n_heads + h;
                const int64_t prime = t.primes[(e * size_t(orders - 1) + size_t(n - 1)) * size_t(hp.engram_n_heads) + size_t(h)];
                rows_out[e * size_t(cols) + size_t(col)] = r % prime + t.offsets[e * size_t(cols) + size_t(col)];
            }
        }
    }
}

model::model(const hparams& hp, const model_weights& w, const draft_weights* draft, expert_source& experts,
             backend& be, model_options opts)
    : hp_(hp), w_(w), draft_(draft), experts_(experts), be_(be), opts_(opts),
      ws_(std::make_unique<detail::workspace>(be)) {
    freqs_plain_ = rope_table(hp, hp.rope_theta, false);
    freqs_yarn_ = rope_table(hp, hp.compress_rope_theta, true);
    MS_ASSERT(int(w.layers.size()) == hp.n_layers);
    // The routing record and the carried hints, allocated once (a decode step allocates nothing).
    ws_->layer_union.assign(size_t(hp.n_layers), -1);
    ws_->row_picks.assign(size_t(hp.n_layers) * size_t(detail::kMaxRecordedRows) * size_t(hp.n_active), 0);
    ws_->carried_hints.resize(size_t(hp.n_layers));
    for (auto& h : ws_->carried_hints) h.reserve(size_t(detail::kMaxRecordedRows) * size_t(hp.n_active));
    for (auto [host, dev] : {std::pair{&freqs_plain_, &ws_->freqs_plain}, std::pair{&freqs_yarn_, &ws_->freqs_yarn}}) {
        dev->resize(host->size());
        be.upload(dev->data(), host->data(), host->size() * sizeof(float));
    }
}

model::~model() = default;

std::unique_ptr<sequence_state> model::new_sequence(int64_t max_tokens, int64_t rollback) const {
    return std::make_unique<sequence_state>(be_, hp_, max_tokens, rollback, has_draft());
}

namespace {

// One forward's view of a sequence.
struct item_rows {
    sequence_state* seq;
    int64_t start;  // positions before this forward
    int64_t first;  // first row of the item in the batch
    int64_t count;  // rows
};

// backend::step_begin() .. step_end() around a forward, ended on every path out of it.
class step_scope {
  public:
    step_scope(backend& be, bool on) : be_(on ? &be : nullptr) {
        if (be_) be_->step_begin();
    }
    step_scope(const step_scope&) = delete;
    step_scope& operator=(const step_scope&) = delete;
    ~step_scope() { end(); }
    void end() {
        if (be_) be_->step_end();
        be_ = nullptr;
    }

  private:
    backend* be_;
};

template <class T>
void upload_vector(backend& be, backend_array<T>& dst, const std::vector<T>& src) {
    dst.resize(src.size());
    be.upload(dst.data(), src.data(), src.size() * sizeof(T));
}

}  // namespace

status model::forward(std::span<const forward_item> batch, std::vector<float>& logits) {
    return coro::run_sync([&](coro::executor& ex) { return forward_async(batch, logits, ex); });
}

coro::task<status> model::forward_async(std::span<const forward_item> batch, std::vector<float>& logits,
                                         coro::executor& ex) {
    const hparams& hp = hp_;
    detail::workspace& ws = *ws_;
    const detail::env env{hp, be_, experts_, opts_, ws, ex};
    const int hc = hp.hc_mult;
    ws.routed_experts = ws.layers_routed_on_backend = 0;
    const int64_t dim = hp.dim, hd = hp.head_dim;

    // ---- validate and lay out the rows ----
    std::vector<item_rows> items;
    detail::rows_info rows;
    for (const auto& it : batch) {
        MS_ASSERT(it.seq != nullptr);
        if (it.tokens.empty()) co_return make_error("a forward item has no tokens");
        if (it.seq->be_ != &be_) co_return make_error("a sequence made for another backend");
        for (const auto& other : items)
            if (other.seq == it.seq) co_return make_error("a sequence appears twice in one forward");
        if (it.seq->size() + int64_t(it.tokens.size()) > it.seq->capacity())
            co_return make_error("the sequence would exceed its context of " + std::to_string(it.seq->capacity()) +
                              " tokens (" + std::to_string(it.seq->size()) + " + " + std::to_string(it.tokens.size()) + ")");
        for (int32_t t : it.tokens)
            if (t < 0 || t >= hp.vocab)
                co_return make_error("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(hp.vocab));
        if (draft_ && it.seq->draft_rings_.empty()) co_return make_error("the sequence was made without DSpark state");
        items.push_back({it.seq, it.seq->size(), rows.n(), int64_t(it.tokens.size())});
        for (int64_t t = 0; t < int64_t(it.tokens.size()); ++t) {
            rows.pos.push_back(it.seq->size() + t);
            rows.seq_rows.push_back(int64_t(it.tokens.size()));
        }
    }
    const int64_t R = rows.n();
    std::vector<int64_t> entries_before;
    for (const auto& it : items)
        for (const auto& c : it.seq->sources_) entries_before.push_back(c.entries);
    auto restore = [&] {
        size_t k = 0;
        for (const auto& it : items)
            for (auto& c : it.seq->sources_) c.entries = entries_before[k++];
    };
    // A forward of few rows with every expert in the backend's slots reads nothing back before
    // its logits (no picks, no observer, no hook): the backend may capture it as one step (one
    // CUDA graph, replayed from step to step).
    bool capturable = !opts_.hook && !opts_.observer && R <= detail::kMaxSlotTableRows;
    for (int L = 0; L < hp.n_layers && capturable; ++L) capturable = experts_.slot_table(L) != nullptr;
    step_scope step(be_, capturable);
    upload_vector(be_, ws.pos, rows.pos);
    rows.pos_dev = ws.pos.data();

    // Token histories (previous tokens + this forward's) for the engram look-back.
    std::vector<std::vector<int32_t>> history(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
        history[i].assign(items[i].seq->tokens_.begin(), items[i].seq->tokens_.end());
        history[i].insert(history[i].end(), batch[i].tokens.begin(), batch[i].tokens.end());
    }

    // ---- embedding, 4 identical streams, one-hot carried mix ----
    {
        std::vector<int32_t> tokens;
        for (const auto& it : batch) tokens.insert(tokens.end(), it.tokens.begin(), it.tokens.end());
        upload_vector(be_, ws.tokens, tokens);
    }
    ws.H.resize(size_t(R * hc * dim));
    be_.embed(w_.token_embd, ws.tokens.data(), R, hc, ws.H.data());
    {
        std::vector<float> p_in(static_cast<size_t>(R * hc), 0.0f);
        for (int64_t r = 0; r < R; ++r) p_in[size_t(r * hc)] = 1.0f;
        upload_vector(be_, ws.p_in, p_in);
    }
    float* H = ws.H.data();

    ws.layer_kv.resize(size_t(hp.n_layers * R * hd));  // window rows, committed at the end
    const auto layer_kv = [&](int L) { return ws.layer_kv.data() + int64_t(L) * R * hd; };
    const int n_taps = int(hp.dspark_target_layers.size());
    if (draft_) ws.taps.resize(size_t(R * n_taps * dim));

    // Per-row state carried between layers of this forward: the latest index source's picks
    // (-1: none yet) and the candidate source's entry masks (mask_len[r] entries; 0: none).
    ws.selection.resize(size_t(R * hp.index_topk));
    be_.fill(ws.selection.data(), 0xff, ws.selection.bytes());
    std::vector<int64_t> mask_len(static_cast<size_t>(R), 0);
    int64_t mask_stride = 0;
    const int last_source = hp.kv_source_layers.empty() ? -1 : hp.kv_source_layers.back();

    ws.x.resize(size_t(R * dim));
    float* x = ws.x.data();
    bool x_collapsed = false;  // x already holds the next attention input (fused into the MoE's output pass)
    std::vector<attention_row> arows(static_cast<size_t>(R));
    std::vector<int64_t> idx, at, n_vis;
    std::vector<pair_pool> pools;
    std::vector<row_copy> stash;
    std::vector<key_store> stores;
    std::vector<matmul_job> extra;
    // Engram rows depend only on token ids: hash every row of every engram layer now and
    // announce them, so the reads overlap the layers before the first engram layer.
    const int64_t n_eng = int64_t(hp.engram_layers.size()), ecols = hp.engram_columns();
    std::vector<int64_t> engram_rows(static_cast<size_t>(R * ecols * n_eng));  // [row][engram layer][col]
    if (n_eng > 0) {
        for (size_t i = 0; i < items.size(); ++i)
            for (int64_t t = 0; t < items[i].count; ++t)
                engram_hash(hp, w_.engram, history[i], items[i].start + t,
                            std::span<int64_t>(engram_rows).subspan(size_t((items[i].first + t) * ecols * n_eng),
                                                                    size_t(ecols * n_eng)));
        if (opts_.engram) {
            std::vector<int64_t> ids(static_cast<size_t>(R * ecols));
            for (int64_t e = 0; e < n_eng; ++e) {
                for (int64_t r = 0; r < R; ++r)
                    std::copy_n(engram_rows.data() + (r * n_eng + e) * ecols, ecols, ids.data() + r * ecols);
                opts_.engram->prefetch(int(e), ids);
            }
        }
    }
    struct engram_done {  // end_forward() on every exit path
        engram_source* src;
        ~engram_done() {
            if (src) src->end_forward();
        }
    } engram_scope{opts_.engram};

    for (int L = 0; L < hp.n_layers; ++L) {
        trace::mark(trace::ev::layer_begin, L, int32_t(R));
        const layer_weights& lw = w_.layers[size_t(L)];
        const int ratio = hp.compress_ratios[size_t(L)];
        // The layer's small vectors (norm weights, routing bias, mix parameters) are read by the
        // CPU backend's thread between the parallel steps, long after the last token evicted
        // them: fetch them now, so they arrive while the first step streams the big weights.
        if (be_.host_memory())
            for (const vector_view* v : {&lw.attn_norm, &lw.attn_sinks, &lw.q_a_norm, &lw.kv_a_norm, &lw.ffn_norm,
                                         &lw.exp_probs_b, &lw.hc_attn_base, &lw.hc_attn_scale, &lw.hc_ffn_base,
                                         &lw.hc_ffn_scale, &lw.compressor_norm, &lw.index_k_norm})
                if (!v->empty()) prefetch_to_l2(v->data, v->size * int64_t(sizeof(float)));
        const float* freqs = ratio > 0 ? ws.freqs_yarn.data() : ws.freqs_plain.data();

        // ---- engram (§3.2): the host reads the rows, the backend dequantizes them ----
        if (hp.is_engram_layer(L)) {
            const size_t e_idx = size_t(std::find(hp.engram_layers.begin(), hp.engram_layers.end(), L) - hp.engram_layers.begin());
            const int64_t cols = hp.engram_columns(), ehd = hp.engram_head_dim, in = cols * ehd;
            const int64_t n_rows = R * cols, value_bytes = n_rows * ehd, scale_bytes = n_rows * (ehd / 32);
            std::vector<uint8_t> bytes(static_cast<size_t>(value_bytes + scale_bytes));
            for (int64_t r = 0; r < R; ++r)
                for (int64_t c = 0; c < cols; ++c) {
                    const int64_t row = engram_rows[size_t((r * n_eng + int64_t(e_idx)) * cols + c)];
                    MS_ASSERT(row >= 0 && row < lw.engram_rows);
                    engram_row er{lw.engram_values + row * ehd, lw.engram_scales + row * (ehd / 32)};
                    if (opts_.engram) {
                        // Suspended (no thread waits) while the row is on its way from disk.
                        while (!co_await engram_row_ready(*opts_.engram, int(e_idx), row, ex)) {
                        }
                        auto got = opts_.engram->row(int(e_idx), row);
                        if (!got) {
                            restore();
                            co_return got.err();
                        }
                        er = *got;
                    }
                    const int64_t k = r * cols + c;
                    std::copy_n(er.values, ehd, bytes.data() + k * ehd);
                    std::copy_n(er.scales, ehd / 32, bytes.data() + value_bytes + k * (ehd / 32));
                }
            upload_vector(be_, ws.engram_bytes, bytes);
            ws.ucat.resize(size_t(R * in));
            ws.kv5.resize(size_t(R * (hc + 1) * dim));
            be_.dequant_fp8_rows(ws.engram_bytes.data(), ws.engram_bytes.data() + value_bytes, n_rows, ehd,
                                 ws.ucat.data());
            detail::act_quant(env, act_quant_kind::fp8_e8m0_32, ws.ucat.data(), int64_t(ws.ucat.size()));
            be_.matmul(lw.engram_wkv, ws.ucat.data(), in, R, ws.kv5.data(), (hc + 1) * dim, true);
            be_.engram_gate(H, R, hc, dim, ws.kv5.data(), lw.engram_qk.data, float(hp.norm_eps));
            detail::observe(env, "engram_out", L, H, {R, hc, dim});
        }
        detail::observe(env, "layer_in", L, H, {R, hc, dim});
        if (draft_) {
            const auto tap = std::find(hp.dspark_target_layers.begin(), hp.dspark_target_layers.end(), L);
            if (tap != hp.dspark_target_layers.end()) {
                const int64_t k = tap - hp.dspark_target_layers.begin();
                be_.stream_mean(H, R, hc, dim, ws.taps.data() + k * dim, n_taps * dim);
            }
        }

        // ---- attention sub-layer ----
        if (!x_collapsed) be_.hc_collapse(H, R, hc, dim, ws.p_in.data(), x);
        x_collapsed = false;
        be_.rms_norm(x, R, dim, lw.attn_norm.data, float(hp.norm_eps), x, true);
        const float* x_fp8 = x;  // input of the fp8 linears wq_a and wkv
        if (opts_.act_quant) {
            ws.xq.resize(size_t(R * dim));
            be_.copy(ws.xq.data(), x, ws.xq.bytes());
            detail::act_quant(env, act_quant_kind::fp8_e8m0_32, ws.xq.data(), int64_t(ws.xq.size()));
            x_fp8 = ws.xq.data();
        }
        const bool index_source = ratio > 0 && hp.is_index_source(L);
        const int src_layer = ratio > 0 ? latest_at_or_before(hp.kv_source_layers, L) : -1;
        float* kv = layer_kv(L);
        {
            // Batched with q_a / kv: this sub-layer's own hc mix (it only serves the expand and
            // the FFN's collapse), the indexer's weight projection and the compressor's.
            extra.assign(1, detail::mix_job(env, H, R, lw.hc_attn_fn, ws.mixA));
            if (index_source) {
                ws.wi.resize(size_t(R * hp.index_n_heads));
                extra.push_back({lw.index_proj, x, dim, R, ws.wi.data(), hp.index_n_heads, true});
            }
            if (ratio > 0 && src_layer == L) {
                ws.ca.resize(size_t(R * hd));
                extra.push_back({lw.compressor_kv, x, dim, R, ws.ca.data(), hd, ratio == 1});
                if (ratio == 2) {
                    ws.cz.resize(size_t(R * hd));
                    extra.push_back({lw.compressor_gate, x, dim, R, ws.cz.data(), hd, false});
                }
            }
            detail::query_and_kv(env, lw, x_fp8, rows, freqs, ws.qr, ws.q, kv, index_source ? &ws.qi : nullptr, extra);
        }
        detail::compute_mix(env, H, R, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale, ws.mixA, true);
        detail::observe(env, "q", L, ws.q.data(), {R, hp.q_dim()});
        detail::observe(env, "kv", L, kv, {R, hd});

        auto source_of = [&](const item_rows& it, int layer) -> sequence_state::source_cache& {
            for (auto& c : it.seq->sources_)
                if (c.layer == layer) return c;
            MS_ASSERT_MSG(false, "no compressed cache for the layer");
            return it.seq->sources_.front();
        };

        // Compressor of a kv-source layer (§3.4.3-5): append this forward's latents and index keys.
        if (ratio > 0 && src_layer == L) {
            const float* ca = ws.ca.data();
            const float* cz = ws.cz.data();
            for (const auto& it : items) {
                auto& c = source_of(it, L);
                idx.clear();
                pools.clear();
                stash.clear();
                ws.lat.resize(size_t(it.count * hd));
                float* lat = ws.lat.data();
                if (ratio == 1) {  // a latent per row
                    be_.copy(lat, ca + it.first * hd, size_t(it.count * hd) * sizeof(float));
                    for (int64_t t = 0; t < it.count; ++t) idx.push_back(it.start + t);
                } else {
                    for (int64_t t = 0; t < it.count; ++t) {
                        const int64_t r = it.first + t, p = it.start + t;
                        if (p % 2 == 0) {  // first of a pair: wait (across forwards) for its partner
                            float* slot = c.pending + (p / 2) * 2 * hd;
                            stash.push_back({ca + r * hd, slot});
                            stash.push_back({cz + r * hd, slot + hd});
                            continue;
                        }
                        const float* a0 = t > 0 ? ca + (r - 1) * hd : c.pending + (p / 2) * 2 * hd;
                        const float* z0 = t > 0 ? cz + (r - 1) * hd : c.pending + (p / 2) * 2 * hd + hd;
                        pools.push_back({a0, z0, ca + r * hd, cz + r * hd, lat + int64_t(idx.size()) * hd});
                        idx.push_back(p / 2);
                    }
                    // A pooling at the forward's first row reads the pair a previous forward left
                    // in slot (start - 1) / 2; this forward's stashes write later slots.
                    if (!pools.empty()) be_.pool_pairs(pools, hd);
                    if (!stash.empty()) be_.copy_rows(stash, hd);
                }
                const int64_t ne = int64_t(idx.size());
                if (ne == 0) continue;
                be_.round_bf16(lat, ne * hd);
                be_.rms_norm(lat, ne, hd, lw.compressor_norm.data, float(hp.norm_eps), lat, true);
                ws.ik.resize(size_t(ne * hp.index_head_dim));
                be_.matmul(lw.index_k, lat, hd, ne, ws.ik.data(), hp.index_head_dim, true);
                be_.rms_norm(ws.ik.data(), ne, hp.index_head_dim, lw.index_k_norm.data, float(hp.norm_eps), ws.ik.data(),
                             true);
                at.resize(idx.size());
                for (size_t k = 0; k < idx.size(); ++k) at[k] = idx[k] * ratio;  // a latent stands for its group's first token
                upload_vector(be_, ws.at, at);
                be_.rope(ws.ik.data(), ne, hp.index_head_dim, 1, hp.index_head_dim, hp.rope_dim, ws.at.data(), freqs, false);
                be_.rope(lat, ne, hd, 1, hd, hp.rope_dim, ws.at.data(), freqs, false);
                // After the index keys took the unrotated latent (§3.8).
                detail::act_quant(env, act_quant_kind::fp4_e8m0_32, ws.ik.data(), int64_t(ws.ik.size()));
                detail::act_quant(env, act_quant_kind::fp4_e4m3_16, lat, ne * hd);
                for (int64_t k = 0; k < ne; ++k)
                    MS_ASSERT_MSG(idx[size_t(k)] == c.entries + k, "compressed entries must be appended in order");
                const key_store store{lat, c.latents + c.entries * hd, ne};
                be_.store_keys({&store, 1}, hd);
                be_.copy(c.index_keys + c.entries * hp.index_head_dim, ws.ik.data(),
                         size_t(ne * hp.index_head_dim) * sizeof(float));
                c.entries += ne;
            }
        }

        // Indexer of an index-source layer (§3.4.6-8).
        if (index_source) {
            const int nh = hp.index_n_heads;
            const int64_t ihd = hp.index_head_dim;
            MS_ASSERT(int64_t(ws.qi.size()) == R * nh * ihd && int64_t(ws.wi.size()) == R * nh);
            be_.rope(ws.qi.data(), R, nh * ihd, nh, ihd, hp.rope_dim, rows.pos_dev, freqs, false);
            detail::act_quant(env, act_quant_kind::fp4_e8m0_32, ws.qi.data(), int64_t(ws.qi.size()));
            be_.scale_round(ws.wi.data(), int64_t(ws.wi.size()), 1.0f / std::sqrt(float(ihd * nh)));
            const bool is_cand_source = L == hp.candidate_source_layer;
            const bool cand_consumer = L > hp.candidate_source_layer && src_layer == hp.candidate_source_layer;
            if (is_cand_source) {
                mask_stride = 0;
                for (const auto& it : items) mask_stride = std::max(mask_stride, source_of(it, src_layer).entries);
                ws.cand_mask.resize(size_t(R * std::max<int64_t>(mask_stride, 1)));
            }
            for (const auto& it : items) {
                auto& own = source_of(it, src_layer);
                const int64_t n_total = own.entries;
                int32_t* sel = ws.selection.data() + it.first * hp.index_topk;
                be_.fill(sel, 0xff, size_t(it.count * hp.index_topk) * sizeof(int32_t));
                if (n_total == 0) {
                    for (int64_t t = 0; t < it.count; ++t) mask_len[size_t(it.first + t)] = 0;
                    continue;
                }
                const float* key_base = own.index_keys;
                // The reference's stale shared slot: on a single-token step at an even position a
                // ratio-2 owner publishes nothing, so the indexer reads the previous forward's last
                // publisher (the ratio-1 source) instead of its own keys.
                if (opts_.ref_compat && it.count == 1 && ratio == 2 && it.start % 2 == 0 && last_source >= 0) {
                    auto& stale = source_of(it, last_source);
                    MS_ASSERT(stale.entries >= n_total);
                    key_base = stale.index_keys;
                }
                n_vis.resize(size_t(it.count));
                for (int64_t t = 0; t < it.count; ++t) n_vis[size_t(t)] = (it.start + t + 1) / ratio;
                ws.sc.resize(size_t(it.count * n_total));
                be_.indexer_scores(ws.qi.data() + it.first * nh * ihd, ws.wi.data() + it.first * nh, it.count, nh, ihd,
                                   key_base, n_total, n_vis.data(), ws.sc.data());
                indexer_pick pick;
                pick.scores = ws.sc.data();
                pick.rows = it.count;
                pick.n_total = n_total;
                pick.n_visible = n_vis.data();
                pick.topk = hp.index_topk;
                pick.selection = sel;
                pick.block_size = hp.candidate_block_size;
                pick.topk_blocks = hp.candidate_topk_blocks;
                pick.mask = ws.cand_mask.data() + it.first * mask_stride;
                pick.mask_stride = mask_stride;
                if (is_cand_source) {
                    pick.cand = indexer_pick::candidates::source;
                } else if (cand_consumer && mask_len[size_t(it.first)] > 0) {
                    // Every row of an item shares its mask's length (the source's entries then).
                    pick.cand = indexer_pick::candidates::consumer;
                    pick.mask_len = mask_len[size_t(it.first)];
                }
                be_.indexer_select(pick);
                if (is_cand_source)
                    for (int64_t t = 0; t < it.count; ++t) mask_len[size_t(it.first + t)] = n_total;
                if (opts_.hook) {
                    // Tests and --force-picks see (and may replace) every mask and selection.
                    std::vector<uint8_t> mask(static_cast<size_t>(n_total));
                    std::vector<int32_t> ids(static_cast<size_t>(hp.index_topk));
                    for (int64_t t = 0; t < it.count; ++t) {
                        const int64_t pos = it.start + t;
                        if (is_cand_source) {
                            uint8_t* m = pick.mask + t * mask_stride;
                            be_.download(mask.data(), m, mask.size());
                            opts_.hook->mask({pick_kind::candidates, L, pos, it.count}, mask);
                            be_.upload(m, mask.data(), mask.size());
                        }
                        int32_t* row_sel = sel + t * hp.index_topk;
                        be_.download(ids.data(), row_sel, ids.size() * sizeof(int32_t));
                        opts_.hook->picks({pick_kind::indexer, L, pos, it.count}, ids);
                        // The selection is the valid picks in ascending order, whatever order the
                        // hook left them in.
                        std::vector<int32_t> valid;
                        for (int32_t id : ids)
                            if (id >= 0) {
                                MS_ASSERT_MSG(id < n_total, "indexer pick out of range");
                                valid.push_back(id);
                            }
                        std::sort(valid.begin(), valid.end());
                        valid.resize(ids.size(), -1);
                        be_.upload(row_sel, valid.data(), valid.size() * sizeof(int32_t));
                    }
                }
                if (opts_.observer) detail::observe(env, "lid_score", L, ws.sc.data(), {it.count, n_total});
            }
        }

        // ---- sparse attention over window + selected compressed entries ----
        ws.kv_bits.resize(size_t(R * hd));
        {
            const key_store store{kv, ws.kv_bits.data(), R};
            be_.store_keys({&store, 1}, hd);
        }
        for (const auto& it : items) {
            const int64_t cap = it.seq->ring_capacity_;
            const sequence_state::source_cache* c = ratio > 0 ? &source_of(it, src_layer) : nullptr;
            for (int64_t t = 0; t < it.count; ++t) {
                const int64_t r = it.first + t, pos = it.start + t;
                const int64_t lo = std::max<int64_t>(0, pos - hp.window + 1);
                // Positions before this forward come from the ring, the rest from this forward's rows.
                const int64_t fresh_lo = std::max(lo, it.start);
                attention_row& ar = arows[size_t(r)];
                ar.ring = it.seq->rings_[size_t(L)];
                ar.ring_capacity = cap;
                ar.ring_first = lo;
                ar.ring_count = std::max<int64_t>(0, it.start - lo);
                ar.fresh = ws.kv_bits.data() + (it.first + fresh_lo - it.start) * hd;
                ar.fresh_count = pos - fresh_lo + 1;
                ar.latents = c ? c->latents : nullptr;
                ar.selection = c ? ws.selection.data() + r * hp.index_topk : nullptr;
                ar.selection_len = c ? hp.index_topk : 0;
            }
        }
        // The output projection's pass also expands the streams and collapses them into the MoE
        // input (with the attention's own mix: V4.1 threading). x is free: its readers ran.
        const hc_update updA{H, ws.mixA.post.data(), ws.mixA.comb.data(), ws.mixA.pre.data(), x, hc};
        detail::attend_and_project(env, lw, ws.q, arows, rows, freqs, ws.a, &updA);
        trace::mark(trace::ev::attn_end, L, int32_t(R));
        detail::observe(env, "attn_out", L, ws.a.data(), {R, dim});

        // ---- MoE sub-layer ----
        be_.rms_norm(x, R, dim, lw.ffn_norm.data, float(hp.norm_eps), x, true);
        const matmul_job mixF_job = detail::mix_job(env, H, R, lw.hc_ffn_fn, ws.mixF);  // batched with the router
        const layer_weights* next = L + 1 < hp.n_layers ? &w_.layers[size_t(L + 1)] : nullptr;
        // The MoE's output pass expands the streams too and, unless the next layer's engram must
        // change them first, collapses them into its attention input (x is free by then).
        const bool collapse_next = next && !hp.is_engram_layer(L + 1);
        const auto update_F = [&]() -> hc_update {
            detail::compute_mix(env, H, R, lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale, ws.mixF, true);
            return {H, ws.mixF.post.data(), ws.mixF.comb.data(), ws.mixF.pre.data(), collapse_next ? x : nullptr, hc};
        };
        // The layers the look-ahead predicts from this input: L+1 .. L+lookahead_layers.
        const layer_weights* ahead[kMaxLookaheadLayers] = {};
        size_t n_ahead = 0;
        for (int d = 1; d <= opts_.lookahead_layers && d <= kMaxLookaheadLayers && L + d < hp.n_layers; ++d)
            ahead[n_ahead++] = &w_.layers[size_t(L + d)];
        if (auto st = co_await detail::moe(env, lw, L, hp.n_experts, hp.n_active, x, rows, ws.f, {&mixF_job, 1},
                                           {ahead, n_ahead}, update_F);
            !st) {
            restore();
            co_return st;
        }
        detail::observe(env, "ffn_moe_out", L, ws.f.data(), {R, dim});
        // The FFN's mix collapses the next layer's attention input where the pass did not.
        ws.p_in.resize(size_t(R * hc));
        be_.copy(ws.p_in.data(), ws.mixF.pre.data(), ws.p_in.bytes());
        x_collapsed = collapse_next;
    }

    // ---- final collapse with the last FFN mix, norm, LM head ----
    ws.h.resize(size_t(R * dim));
    ws.hn.resize(size_t(R * dim));
    be_.hc_collapse(H, R, hc, dim, ws.p_in.data(), ws.h.data());
    be_.rms_norm(ws.h.data(), R, dim, w_.output_norm.data, float(hp.norm_eps), ws.hn.data(), true);
    detail::observe(env, "final_streams", -1, H, {R, hc, dim});
    detail::observe(env, "final_hidden", -1, ws.h.data(), {R, dim});
    detail::observe(env, "final_normed", -1, ws.hn.data(), {R, dim});
    std::vector<int64_t> out_rows;
    for (size_t i = 0; i < items.size(); ++i) {
        if (batch[i].all_logits)
            for (int64_t t = 0; t < items[i].count; ++t) out_rows.push_back(items[i].first + t);
        else
            out_rows.push_back(items[i].first + items[i].count - 1);
    }
    const int64_t n_out = int64_t(out_rows.size());
    ws.xin.resize(size_t(n_out * dim));
    be_.gather_rows(ws.hn.data(), dim, out_rows.data(), n_out, dim, ws.xin.data());
    ws.logits.resize(size_t(n_out * hp.vocab));
    be_.matmul(w_.output, ws.xin.data(), dim, n_out, ws.logits.data(), hp.vocab, false);

    // ---- DSpark: every row's main_kv into the stage rings (§5.2 prefill/decode) ----
    if (draft_) {
        ws.mx.resize(size_t(R * dim));
        ws.tq.resize(ws.taps.size());  // main_proj input (fp8 linear)
        be_.copy(ws.tq.data(), ws.taps.data(), ws.taps.bytes());
        detail::act_quant(env, act_quant_kind::fp8_e8m0_32, ws.tq.data(), int64_t(ws.tq.size()));
        be_.matmul(draft_->fc, ws.tq.data(), n_taps * dim, R, ws.mx.data(), dim, true);
        be_.rms_norm(ws.mx.data(), R, dim, draft_->enc_norm.data, float(hp.norm_eps), ws.mx.data(), true);
        detail::act_quant(env, act_quant_kind::fp8_e8m0_32, ws.mx.data(), int64_t(ws.mx.size()));  // input of each stage's wkv
        ws.stage_kv.resize(size_t(hp.n_mtp * R * hd));
        for (int s = 0; s < hp.n_mtp; ++s)
            detail::window_kv(env, draft_->stages[size_t(s)], ws.mx.data(), rows, ws.freqs_plain.data(),
                              ws.stage_kv.data() + int64_t(s) * R * hd);
        detail::observe(env, "dspark_main_hidden", -1, ws.taps.data(), {R, n_taps * dim});
    }

    // ---- commit: tokens, window rings, DSpark rings ----
    stores.clear();
    for (size_t i = 0; i < items.size(); ++i) {
        auto& it = items[i];
        auto& seq = *it.seq;
        const int64_t cap = seq.ring_capacity_;
        const int64_t from = std::max<int64_t>(0, it.count - cap);
        for (int64_t t = from; t < it.count; ++t) {
            const int64_t p = it.start + t, r = it.first + t;
            for (int L = 0; L < hp.n_layers; ++L)
                stores.push_back({layer_kv(L) + r * hd, seq.rings_[size_t(L)] + (p % cap) * hd, 1});
            if (draft_)
                for (int s = 0; s < hp.n_mtp; ++s)
                    stores.push_back({ws.stage_kv.data() + (int64_t(s) * R + r) * hd,
                                      seq.draft_rings_[size_t(s)] + (p % cap) * hd, 1});
        }
        seq.tokens_.insert(seq.tokens_.end(), batch[i].tokens.begin(), batch[i].tokens.end());
        seq.rings_written_ = std::max(seq.rings_written_, seq.size());  // rolled-back rows may have reached further
        if (draft_) {
            be_.copy(seq.last_main_hidden_, ws.taps.data() + (it.first + it.count - 1) * n_taps * dim,
                     size_t(n_taps * dim) * sizeof(float));
            seq.has_main_hidden_ = true;
        }
    }
    be_.store_keys(stores, hd);
    step.end();
    logits.resize(size_t(n_out * hp.vocab));
    // Awaited: the compute thread is free while the step runs on the device.
    const backend::download_ticket logits_ticket =
        be_.download_begin(logits.data(), ws.logits.data(), logits.size() * sizeof(float));
    co_await detail::download_landed(be_, logits_ticket, ex);
    for (auto& h : ws.carried_hints) h.clear();  // they were for this forward
    co_return status{};
}

int64_t model::last_forward_experts() const {
    return ws_->layers_routed_on_backend > 0 ? -1 : ws_->routed_experts;
}

int64_t model::last_forward_layer_experts(int layer) const {
    if (layer < 0 || layer >= hp_.n_layers) return -1;
    return ws_->layer_union[size_t(layer)];
}

std::span<const int32_t> model::last_forward_picks(int layer, int64_t row) const {
    const detail::workspace& ws = *ws_;
    if (layer < 0 || layer >= hp_.n_layers || row < 0 || row >= ws.picks_rows || ws.layer_union[size_t(layer)] < 0)
        return {};
    const size_t k = size_t(hp_.n_active);
    return std::span<const int32_t>(ws.row_picks).subspan((size_t(layer) * size_t(detail::kMaxRecordedRows) + size_t(row)) * k, k);
}

bool model::hint_next_forward(std::span<const int64_t> rows) {
    detail::workspace& ws = *ws_;
    if (rows.empty() || int64_t(rows.size()) > detail::kMaxRecordedRows) return false;
    for (int64_t r : rows)
        if (r < 0 || r >= ws.picks_rows) return false;
    bool any = false;
    for (int L = 0; L < hp_.n_layers; ++L) {
        std::vector<int32_t>& h = ws.carried_hints[size_t(L)];
        h.clear();
        for (int64_t r : rows) {
            const auto p = last_forward_picks(L, r);
            h.insert(h.end(), p.begin(), p.end());
        }
        std::sort(h.begin(), h.end());
        h.erase(std::unique(h.begin(), h.end()), h.end());
        any |= !h.empty();
    }
    // The first layer has no layer before it to predict it: its hint goes out now, so its reads
    // overlap whatever runs before the next forward (sampling, the next draft).
    if (!ws.carried_hints[0].empty()) {
        experts_.hint(0, ws.carried_hints[0]);
        ws.carried_hints[0].clear();
    }
    return any;
}

}  // namespace moestream::dsv41
