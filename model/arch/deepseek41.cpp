// DeepSeek-V4.1 backbone forward (dsv41-architecture.md §3.6), generalised from the reference's
// "prefill from 0, then one token" to any number of rows per sequence and several sequences per
// forward: per-row window visibility, the ratio-2 pending pair across forwards, per-row
// compressed-entry visibility, candidate pinning and top-k.
#include "model/arch/deepseek41.h"

#include <algorithm>
#include <cmath>
#include <numeric>

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

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

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
    : hp_(hp), w_(w), draft_(draft), experts_(experts), be_(be), opts_(opts) {
    freqs_plain_ = rope_table(hp, hp.rope_theta, false);
    freqs_yarn_ = rope_table(hp, hp.compress_rope_theta, true);
    MS_ASSERT(int(w.layers.size()) == hp.n_layers);
}

model::~model() = default;

namespace {

// One forward's view of a sequence.
struct item_rows {
    sequence_state* seq;
    int64_t start;  // positions before this forward
    int64_t first;  // first row of the item in the batch
    int64_t count;  // rows
};

}  // namespace

status model::forward(std::span<const forward_item> batch, std::vector<float>& logits) {
    const hparams& hp = hp_;
    const detail::env env{hp, be_, experts_, opts_};
    const int hc = hp.hc_mult;
    const int64_t dim = hp.dim, hd = hp.head_dim;

    // ---- validate and lay out the rows ----
    std::vector<item_rows> items;
    detail::rows_info rows;
    for (const auto& it : batch) {
        MS_ASSERT(it.seq != nullptr);
        if (it.tokens.empty()) return make_error("a forward item has no tokens");
        for (const auto& other : items)
            if (other.seq == it.seq) return make_error("a sequence appears twice in one forward");
        if (it.seq->size() + int64_t(it.tokens.size()) > it.seq->capacity())
            return make_error("the sequence would exceed its context of " + std::to_string(it.seq->capacity()) +
                              " tokens (" + std::to_string(it.seq->size()) + " + " + std::to_string(it.tokens.size()) + ")");
        for (int32_t t : it.tokens)
            if (t < 0 || t >= hp.vocab)
                return make_error("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(hp.vocab));
        if (draft_ && it.seq->draft_rings_.empty()) return make_error("the sequence was made without DSpark state");
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

    // Token histories (previous tokens + this forward's) for the engram look-back.
    std::vector<std::vector<int32_t>> history(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
        history[i].assign(items[i].seq->tokens_.begin(), items[i].seq->tokens_.end());
        history[i].insert(history[i].end(), batch[i].tokens.begin(), batch[i].tokens.end());
    }

    // ---- embedding, 4 identical streams, one-hot carried mix ----
    std::vector<float> H(static_cast<size_t>(R * hc * dim));
    for (size_t i = 0; i < items.size(); ++i)
        for (int64_t t = 0; t < items[i].count; ++t) {
            float* h = H.data() + (items[i].first + t) * hc * dim;
            detail::embedding_row(w_.token_embd, batch[i].tokens[size_t(t)], h);
            for (int k = 1; k < hc; ++k) std::copy_n(h, dim, h + k * dim);
        }
    std::vector<float> p_in(static_cast<size_t>(R * hc), 0.0f);
    for (int64_t r = 0; r < R; ++r) p_in[size_t(r * hc)] = 1.0f;

    std::vector<std::vector<float>> layer_kv(static_cast<size_t>(hp.n_layers));  // window rows, committed at the end
    std::vector<float> taps;
    const int n_taps = int(hp.dspark_target_layers.size());
    if (draft_) taps.assign(size_t(R * n_taps * dim), 0.0f);

    // Per-row state carried between layers of this forward.
    std::vector<std::vector<int32_t>> selection(static_cast<size_t>(R));   // latest index source's picks
    std::vector<std::vector<uint8_t>> cand_mask(static_cast<size_t>(R));   // candidate source's entry mask
    const int last_source = hp.kv_source_layers.empty() ? -1 : hp.kv_source_layers.back();

    std::vector<float> x(static_cast<size_t>(R * dim)), xq, qr, q, a, f, u;
    detail::hc_mix mixA, mixF;
    bool x_collapsed = false;  // x already holds the next attention input (fused into the MoE's output pass)
    std::vector<attention_row> arows(static_cast<size_t>(R));
    std::vector<std::vector<const uint16_t*>> keys(static_cast<size_t>(R));
    std::vector<uint16_t> kv_bits;  // this forward's window keys of the layer, bf16
    // Buffers of one layer's steps, kept from layer to layer (a decode step would otherwise
    // allocate and clear them 40 times); each is emptied or fully written where it is used.
    std::vector<float> qi;      // the indexer's query, when the layer is an index source
    std::vector<float> wi;      // the indexer's head weights
    std::vector<float> ca, cz;  // the compressor's projections, when the layer is a kv source
    std::vector<float> lat, ik, sc, bscore;
    std::vector<int64_t> idx, at, n_vis;
    std::vector<int32_t> order, ids;
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
        const layer_weights& lw = w_.layers[size_t(L)];
        const int ratio = hp.compress_ratios[size_t(L)];
        // The layer's small vectors (norm weights, routing bias, mix parameters) are read by this
        // thread between the parallel steps, long after the last token evicted them: fetch them
        // now, so they arrive while the first step streams the big weights.
        for (const vector_view* v : {&lw.attn_norm, &lw.attn_sinks, &lw.q_a_norm, &lw.kv_a_norm, &lw.ffn_norm,
                                     &lw.exp_probs_b, &lw.hc_attn_base, &lw.hc_attn_scale, &lw.hc_ffn_base,
                                     &lw.hc_ffn_scale, &lw.compressor_norm, &lw.index_k_norm})
            if (!v->empty()) prefetch_to_l2(v->data, v->size * int64_t(sizeof(float)));
        const float* freqs = ratio > 0 ? freqs_yarn_.data() : freqs_plain_.data();

        // ---- engram (§3.2) ----
        if (hp.is_engram_layer(L)) {
            const size_t e_idx = size_t(std::find(hp.engram_layers.begin(), hp.engram_layers.end(), L) - hp.engram_layers.begin());
            const int64_t cols = hp.engram_columns(), ehd = hp.engram_head_dim, in = cols * ehd;
            std::vector<float> ucat(static_cast<size_t>(R * in)), kv5(static_cast<size_t>(R * (hc + 1) * dim));
            for (int64_t r = 0; r < R; ++r)
                for (int64_t c = 0; c < cols; ++c) {
                    const int64_t row = engram_rows[size_t((r * n_eng + int64_t(e_idx)) * cols + c)];
                    MS_ASSERT(row >= 0 && row < lw.engram_rows);
                    engram_row er{lw.engram_values + row * ehd, lw.engram_scales + row * (ehd / 32)};
                    if (opts_.engram) {
                        auto got = opts_.engram->row(int(e_idx), row);
                        if (!got) {
                            restore();
                            return got.err();
                        }
                        er = *got;
                    }
                    quant::dequantize_fp8_row_scaled(er.values, er.scales, ehd, ucat.data() + r * in + c * ehd);
                }
            be_.round_bf16(ucat.data(), int64_t(ucat.size()));
            detail::act_quant(env, act_quant_kind::fp8_e8m0_32, ucat.data(), int64_t(ucat.size()));
            be_.matmul(lw.engram_wkv, ucat.data(), in, R, kv5.data(), (hc + 1) * dim, true);
            be_.engram_gate(H.data(), R, hc, dim, kv5.data(), lw.engram_qk.data, float(hp.norm_eps));
            detail::observe(env, "engram_out", L, H.data(), {R, hc, dim});
        }
        detail::observe(env, "layer_in", L, H.data(), {R, hc, dim});
        if (draft_) {
            const auto tap = std::find(hp.dspark_target_layers.begin(), hp.dspark_target_layers.end(), L);
            if (tap != hp.dspark_target_layers.end()) {
                const int64_t k = tap - hp.dspark_target_layers.begin();
                for (int64_t r = 0; r < R; ++r)
                    for (int64_t d = 0; d < dim; ++d) {
                        float s = 0;
                        for (int j = 0; j < hc; ++j) s += H[size_t((r * hc + j) * dim + d)];
                        taps[size_t((r * n_taps + k) * dim + d)] = round_to_bf16(s / float(hc));
                    }
            }
        }

        // ---- attention sub-layer ----
        if (!x_collapsed) be_.hc_collapse(H.data(), R, hc, dim, p_in.data(), x.data());
        x_collapsed = false;
        be_.rms_norm(x.data(), R, dim, lw.attn_norm.data, float(hp.norm_eps), x.data(), true);
        const float* x_fp8 = x.data();  // input of the fp8 linears wq_a and wkv
        if (opts_.act_quant) {
            xq.assign(x.begin(), x.end());
            detail::act_quant(env, act_quant_kind::fp8_e8m0_32, xq.data(), int64_t(xq.size()));
            x_fp8 = xq.data();
        }
        qi.clear();
        wi.clear();
        ca.clear();
        cz.clear();
        const int src_layer = ratio > 0 ? latest_at_or_before(hp.kv_source_layers, L) : -1;
        {
            // Batched with q_a / kv: this sub-layer's own hc mix (it only serves the expand and
            // the FFN's collapse), the indexer's weight projection and the compressor's.
            extra.assign(1, mixA.job(env, H, R, lw.hc_attn_fn));
            if (ratio > 0 && hp.is_index_source(L)) {
                wi.resize(size_t(R * hp.index_n_heads));
                extra.push_back({lw.index_proj, x.data(), dim, R, wi.data(), hp.index_n_heads, true});
            }
            if (ratio > 0 && src_layer == L) {
                ca.resize(size_t(R * hd));
                extra.push_back({lw.compressor_kv, x.data(), dim, R, ca.data(), hd, ratio == 1});
                if (ratio == 2) {
                    cz.resize(size_t(R * hd));
                    extra.push_back({lw.compressor_gate, x.data(), dim, R, cz.data(), hd, false});
                }
            }
            detail::query_and_kv(env, lw, x_fp8, rows, freqs, qr, q, layer_kv[size_t(L)], &qi, extra);
        }
        mixA.compute(env, H, R, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale, true);
        const std::vector<float>& kv = layer_kv[size_t(L)];
        detail::observe(env, "q", L, q.data(), {R, hp.q_dim()});
        detail::observe(env, "kv", L, kv.data(), {R, hd});

        auto source_of = [&](const item_rows& it, int layer) -> sequence_state::source_cache& {
            for (auto& c : it.seq->sources_)
                if (c.layer == layer) return c;
            MS_ASSERT_MSG(false, "no compressed cache for the layer");
            return it.seq->sources_.front();
        };

        // Compressor of a kv-source layer (§3.4.3-5): append this forward's latents and index keys.
        if (ratio > 0 && src_layer == L) {
            MS_ASSERT(int64_t(ca.size()) == R * hd);  // computed in the first parallel step
            for (const auto& it : items) {
                auto& c = source_of(it, L);
                lat.clear();
                idx.clear();
                for (int64_t t = 0; t < it.count; ++t) {
                    const int64_t r = it.first + t, p = it.start + t;
                    const float* ar = ca.data() + r * hd;
                    if (ratio == 1) {
                        lat.insert(lat.end(), ar, ar + hd);
                        idx.push_back(p);
                        continue;
                    }
                    const float* zr = cz.data() + r * hd;
                    if (p % 2 == 0) {  // first of a pair: wait (across forwards) for its partner
                        float* slot = c.pending.data() + (p / 2) * 2 * hd;
                        std::copy_n(ar, hd, slot);
                        std::copy_n(zr, hd, slot + hd);
                        continue;
                    }
                    const float* a0 = t > 0 ? ca.data() + (r - 1) * hd : c.pending.data() + (p / 2) * 2 * hd;
                    const float* z0 = t > 0 ? cz.data() + (r - 1) * hd : c.pending.data() + (p / 2) * 2 * hd + hd;
                    for (int64_t ch = 0; ch < hd; ++ch) {
                        const float m = std::max(z0[ch], zr[ch]);
                        const float e0 = std::exp(z0[ch] - m), e1 = std::exp(zr[ch] - m);
                        lat.push_back((e0 * a0[ch] + e1 * ar[ch]) / (e0 + e1));
                    }
                    idx.push_back(p / 2);
                }
                const int64_t ne = int64_t(idx.size());
                if (ne == 0) continue;
                be_.round_bf16(lat.data(), int64_t(lat.size()));
                be_.rms_norm(lat.data(), ne, hd, lw.compressor_norm.data, float(hp.norm_eps), lat.data(), true);
                ik.resize(size_t(ne * hp.index_head_dim));
                be_.matmul(lw.index_k, lat.data(), hd, ne, ik.data(), hp.index_head_dim, true);
                be_.rms_norm(ik.data(), ne, hp.index_head_dim, lw.index_k_norm.data, float(hp.norm_eps), ik.data(), true);
                at.resize(idx.size());
                for (size_t k = 0; k < idx.size(); ++k) at[k] = idx[k] * ratio;  // a latent stands for its group's first token
                be_.rope(ik.data(), ne, hp.index_head_dim, 1, hp.index_head_dim, hp.rope_dim, at.data(), freqs, false);
                be_.rope(lat.data(), ne, hd, 1, hd, hp.rope_dim, at.data(), freqs, false);
                // After the index keys took the unrotated latent (§3.8).
                detail::act_quant(env, act_quant_kind::fp4_e8m0_32, ik.data(), int64_t(ik.size()));
                detail::act_quant(env, act_quant_kind::fp4_e4m3_16, lat.data(), int64_t(lat.size()));
                for (int64_t k = 0; k < ne; ++k) {
                    MS_ASSERT_MSG(idx[size_t(k)] == c.entries, "compressed entries must be appended in order");
                    detail::store_keys(lat.data() + k * hd, 1, hd, c.latents.data() + c.entries * hd);
                    std::copy_n(ik.data() + k * hp.index_head_dim, hp.index_head_dim,
                                c.index_keys.data() + c.entries * hp.index_head_dim);
                    ++c.entries;
                }
            }
        }

        // Indexer of an index-source layer (§3.4.6-8).
        if (ratio > 0 && hp.is_index_source(L)) {
            const int nh = hp.index_n_heads;
            const int64_t ihd = hp.index_head_dim;
            MS_ASSERT(int64_t(qi.size()) == R * nh * ihd && int64_t(wi.size()) == R * nh);
            be_.rope(qi.data(), R, nh * ihd, nh, ihd, hp.rope_dim, rows.pos.data(), freqs, false);
            detail::act_quant(env, act_quant_kind::fp4_e8m0_32, qi.data(), int64_t(qi.size()));
            const float wscale = 1.0f / std::sqrt(float(ihd * nh));
            for (auto& v : wi) v = round_to_bf16(v * wscale);
            const bool is_cand_source = L == hp.candidate_source_layer;
            const bool cand_consumer = L > hp.candidate_source_layer && src_layer == hp.candidate_source_layer;
            for (const auto& it : items) {
                auto& own = source_of(it, src_layer);
                const int64_t n_total = own.entries;
                for (int64_t t = 0; t < it.count; ++t) selection[size_t(it.first + t)].clear();
                if (n_total == 0) {
                    for (int64_t t = 0; t < it.count; ++t) cand_mask[size_t(it.first + t)].clear();
                    continue;
                }
                const float* key_base = own.index_keys.data();
                // The reference's stale shared slot: on a single-token step at an even position a
                // ratio-2 owner publishes nothing, so the indexer reads the previous forward's last
                // publisher (the ratio-1 source) instead of its own keys.
                if (opts_.ref_compat && it.count == 1 && ratio == 2 && it.start % 2 == 0 && last_source >= 0) {
                    auto& stale = source_of(it, last_source);
                    MS_ASSERT(stale.entries >= n_total);
                    key_base = stale.index_keys.data();
                }
                n_vis.resize(size_t(it.count));
                for (int64_t t = 0; t < it.count; ++t) n_vis[size_t(t)] = (it.start + t + 1) / ratio;
                sc.resize(size_t(it.count * n_total));
                be_.indexer_scores(qi.data() + it.first * nh * ihd, wi.data() + it.first * nh, it.count, nh, ihd,
                                   key_base, n_total, n_vis.data(), sc.data());
                for (int64_t t = 0; t < it.count; ++t) {
                    const int64_t r = it.first + t, pos = it.start + t;
                    float* s = sc.data() + t * n_total;
                    if (is_cand_source) {
                        // Level 1: blocks of candidate_block_size, block score = max, the block of the
                        // newest visible entry pinned, top candidate_topk_blocks kept (§3.4.7).
                        const int64_t bs = hp.candidate_block_size;
                        const int64_t n_blocks = (n_total + bs - 1) / bs;
                        bscore.assign(size_t(n_blocks), -kInf);
                        for (int64_t j = 0; j < n_total; ++j) bscore[size_t(j / bs)] = std::max(bscore[size_t(j / bs)], s[j]);
                        const int64_t pin = floor_div(n_vis[size_t(t)] - 1, bs);
                        if (pin >= 0) bscore[size_t(pin)] = kInf;
                        const int64_t keep = std::min(hp.candidate_topk_blocks, n_blocks);
                        order.resize(size_t(keep));
                        detail::top_k(bscore.data(), n_blocks, keep, order.data());
                        auto& mask = cand_mask[size_t(r)];
                        mask.assign(size_t(n_total), 0);
                        for (int64_t k = 0; k < keep; ++k) {
                            const int64_t b = order[size_t(k)];
                            if (bscore[size_t(b)] == -kInf) continue;
                            for (int64_t j = b * bs; j < std::min(n_total, (b + 1) * bs); ++j) mask[size_t(j)] = 1;
                        }
                        if (opts_.hook) opts_.hook->mask({pick_kind::candidates, L, pos, it.count}, mask);
                    } else if (cand_consumer && !cand_mask[size_t(r)].empty()) {
                        const auto& mask = cand_mask[size_t(r)];
                        for (int64_t j = 0; j < n_total; ++j)
                            if (j >= int64_t(mask.size()) || !mask[size_t(j)]) s[j] = -kInf;
                    }
                    // Level 2: top-k over every entry present, ties to the lower index, back in
                    // index order; entries this row cannot see become -1.
                    const int64_t k = std::min(hp.index_topk, n_total);
                    ids.assign(size_t(hp.index_topk), -1);
                    if (k == n_total) {  // every entry is picked (short contexts): index order, no sort
                        std::iota(ids.begin(), ids.begin() + k, 0);
                    } else {
                        detail::top_k(s, n_total, k, ids.data());
                        std::sort(ids.begin(), ids.begin() + k);
                    }
                    for (int64_t j = 0; j < k; ++j)
                        if (ids[size_t(j)] >= n_vis[size_t(t)]) ids[size_t(j)] = -1;
                    if (opts_.hook) opts_.hook->picks({pick_kind::indexer, L, pos, it.count}, ids);
                    auto& sel = selection[size_t(r)];
                    for (int32_t id : ids)
                        if (id >= 0) {
                            MS_ASSERT_MSG(id < n_total, "indexer pick out of range");
                            sel.push_back(id);
                        }
                    std::sort(sel.begin(), sel.end());
                }
                if (opts_.observer) detail::observe(env, "lid_score", L, sc.data(), {it.count, n_total});
            }
        }

        // ---- sparse attention over window + selected compressed entries ----
        kv_bits.resize(kv.size());
        detail::store_keys(kv.data(), int64_t(kv.size()) / hd, hd, kv_bits.data());
        for (const auto& it : items) {
            const auto& ring = it.seq->rings_[size_t(L)];
            const int64_t cap = it.seq->ring_capacity_;
            const sequence_state::source_cache* c = ratio > 0 ? &source_of(it, src_layer) : nullptr;
            for (int64_t t = 0; t < it.count; ++t) {
                const int64_t r = it.first + t, pos = it.start + t;
                auto& kl = keys[size_t(r)];
                kl.clear();
                for (int64_t p = std::max<int64_t>(0, pos - hp.window + 1); p <= pos; ++p)
                    kl.push_back(p < it.start ? ring.data() + (p % cap) * hd : kv_bits.data() + (it.first + p - it.start) * hd);
                if (c)
                    for (int32_t j : selection[size_t(r)]) kl.push_back(c->latents.data() + j * hd);
                arows[size_t(r)].keys = kl.data();
                arows[size_t(r)].n_keys = int64_t(kl.size());
            }
        }
        // The output projection's pass also expands the streams and collapses them into the MoE
        // input (with the attention's own mix: V4.1 threading). x is free: its readers ran.
        const hc_update updA{H.data(), mixA.post.data(), mixA.comb.data(), mixA.pre.data(), x.data(), hc};
        detail::attend_and_project(env, lw, q, arows, rows, freqs, a, &updA);
        detail::observe(env, "attn_out", L, a.data(), {R, dim});

        // ---- MoE sub-layer ----
        be_.rms_norm(x.data(), R, dim, lw.ffn_norm.data, float(hp.norm_eps), x.data(), true);
        const matmul_job mixF_job = mixF.job(env, H, R, lw.hc_ffn_fn);  // batched with the router
        const layer_weights* next = L + 1 < hp.n_layers ? &w_.layers[size_t(L + 1)] : nullptr;
        // The MoE's output pass expands the streams too and, unless the next layer's engram must
        // change them first, collapses them into its attention input (x is free by then).
        const bool collapse_next = next && !hp.is_engram_layer(L + 1);
        const auto update_F = [&]() -> hc_update {
            mixF.compute(env, H, R, lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale, true);
            return {H.data(), mixF.post.data(), mixF.comb.data(), mixF.pre.data(), collapse_next ? x.data() : nullptr, hc};
        };
        if (auto st = detail::moe(env, lw, L, hp.n_experts, hp.n_active, x.data(), rows, f, {&mixF_job, 1}, next, update_F);
            !st) {
            restore();
            return st;
        }
        detail::observe(env, "ffn_moe_out", L, f.data(), {R, dim});
        p_in = mixF.pre;  // collapses the next layer's attention input where the pass did not
        x_collapsed = collapse_next;
    }

    // ---- final collapse with the last FFN mix, norm, LM head ----
    std::vector<float> h(static_cast<size_t>(R * dim)), hn(static_cast<size_t>(R * dim));
    be_.hc_collapse(H.data(), R, hc, dim, p_in.data(), h.data());
    be_.rms_norm(h.data(), R, dim, w_.output_norm.data, float(hp.norm_eps), hn.data(), true);
    detail::observe(env, "final_streams", -1, H.data(), {R, hc, dim});
    detail::observe(env, "final_hidden", -1, h.data(), {R, dim});
    detail::observe(env, "final_normed", -1, hn.data(), {R, dim});
    std::vector<int64_t> out_rows;
    for (size_t i = 0; i < items.size(); ++i) {
        if (batch[i].all_logits)
            for (int64_t t = 0; t < items[i].count; ++t) out_rows.push_back(items[i].first + t);
        else
            out_rows.push_back(items[i].first + items[i].count - 1);
    }
    std::vector<float> xin(out_rows.size() * size_t(dim));
    for (size_t k = 0; k < out_rows.size(); ++k) std::copy_n(hn.data() + out_rows[k] * dim, dim, xin.data() + k * dim);
    logits.resize(out_rows.size() * size_t(hp.vocab));
    be_.matmul(w_.output, xin.data(), dim, int64_t(out_rows.size()), logits.data(), hp.vocab, false);

    // ---- DSpark: every row's main_kv into the stage rings (§5.2 prefill/decode) ----
    std::vector<std::vector<float>> stage_kv;
    if (draft_) {
        std::vector<float> mx(static_cast<size_t>(R * dim));
        std::vector<float> tq(taps);  // main_proj input (fp8 linear)
        detail::act_quant(env, act_quant_kind::fp8_e8m0_32, tq.data(), int64_t(tq.size()));
        be_.matmul(draft_->fc, tq.data(), n_taps * dim, R, mx.data(), dim, true);
        be_.rms_norm(mx.data(), R, dim, draft_->enc_norm.data, float(hp.norm_eps), mx.data(), true);
        detail::act_quant(env, act_quant_kind::fp8_e8m0_32, mx.data(), int64_t(mx.size()));  // input of each stage's wkv
        for (int s = 0; s < hp.n_mtp; ++s)
            detail::window_kv(env, draft_->stages[size_t(s)], mx.data(), rows, freqs_plain_.data(), stage_kv.emplace_back());
        detail::observe(env, "dspark_main_hidden", -1, taps.data(), {R, n_taps * dim});
    }

    // ---- commit: tokens, window rings, DSpark rings ----
    for (size_t i = 0; i < items.size(); ++i) {
        auto& it = items[i];
        auto& seq = *it.seq;
        const int64_t cap = seq.ring_capacity_;
        const int64_t from = std::max<int64_t>(0, it.count - cap);
        for (int64_t t = from; t < it.count; ++t) {
            const int64_t p = it.start + t, r = it.first + t;
            for (int L = 0; L < hp.n_layers; ++L)
                detail::store_keys(layer_kv[size_t(L)].data() + r * hd, 1, hd, seq.rings_[size_t(L)].data() + (p % cap) * hd);
            for (int s = 0; s < int(stage_kv.size()); ++s)
                detail::store_keys(stage_kv[size_t(s)].data() + r * hd, 1, hd, seq.draft_rings_[size_t(s)].data() + (p % cap) * hd);
        }
        seq.tokens_.insert(seq.tokens_.end(), batch[i].tokens.begin(), batch[i].tokens.end());
        if (draft_) {
            const float* last = taps.data() + (it.first + it.count - 1) * n_taps * dim;
            seq.last_main_hidden_.assign(last, last + n_taps * dim);
        }
    }
    return {};
}

}  // namespace moestream::dsv41
