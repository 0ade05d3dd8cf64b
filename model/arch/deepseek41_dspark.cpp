// DSpark draft head (dsv41-architecture.md §5.2): three window-only V4.1 blocks over 5 draft rows
// [t_{p+1}, noise x4] at positions p+1..p+5 that attend bidirectionally to each other and to the
// stage rings of target features, then the shared LM head, the rank-r Markov bias and confidence.
#include <algorithm>
#include <cmath>

#include "model/arch/deepseek41.h"
#include "model/arch/deepseek41_internal.h"
#include "model/bf16.h"
#include "model/quant.h"

namespace moestream::dsv41 {

status model::draft(const sequence_state& seq, int32_t next_token, draft_output& out, std::span<const int32_t> forced) {
    if (!draft_) return make_error("no DSpark draft head is loaded");
    const hparams& hp = hp_;
    if (seq.size() == 0) return make_error("the draft needs at least one consumed position");
    if (next_token < 0 || next_token >= hp.vocab) return make_error("draft: token id out of range");
    const int B = hp.dspark_block_size;
    if (!forced.empty() && int(forced.size()) != B) return make_error("draft: forced ids must have block_size entries");
    const detail::env env{hp, be_, experts_, opts_};
    const int hc = hp.hc_mult;
    const int64_t dim = hp.dim, hd = hp.head_dim, p = seq.size() - 1;

    detail::rows_info rows;
    for (int r = 0; r < B; ++r) {
        rows.pos.push_back(p + 1 + r);
        rows.seq_rows.push_back(B);
    }
    std::vector<float> H(static_cast<size_t>(B * hc * dim));
    for (int r = 0; r < B; ++r) {
        float* h = H.data() + r * hc * dim;
        detail::embedding_row(w_.token_embd, r == 0 ? next_token : hp.dspark_noise_token, h);
        for (int k = 1; k < hc; ++k) std::copy_n(h, dim, h + k * dim);
    }
    std::vector<float> p_in(static_cast<size_t>(B * hc), 0.0f);
    for (int r = 0; r < B; ++r) p_in[size_t(r * hc)] = 1.0f;

    std::vector<float> x(static_cast<size_t>(B * dim)), xq, qr, q, kv, a, f;
    detail::hc_mix mixA, mixF;
    std::vector<attention_row> arows(static_cast<size_t>(B));
    std::vector<const uint16_t*> keys;
    std::vector<uint16_t> kv_bits;  // the rows' own keys, bf16
    const float* freqs = freqs_plain_.data();  // stages are ratio 0: base rope_theta, no YaRN
    for (int s = 0; s < hp.n_mtp; ++s) {
        const layer_weights& lw = draft_->stages[size_t(s)];
        const int layer = hp.n_layers + s;
        mixA.compute(env, H, B, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale);
        be_.hc_collapse(H.data(), B, hc, dim, p_in.data(), x.data());
        be_.rms_norm(x.data(), B, dim, lw.attn_norm.data, float(hp.norm_eps), x.data(), true);
        const float* x_fp8 = x.data();
        if (opts_.act_quant) {
            xq.assign(x.begin(), x.end());
            detail::act_quant(env, act_quant_kind::fp8_e8m0_32, xq.data(), int64_t(xq.size()));
            x_fp8 = xq.data();
        }
        detail::query_and_kv(env, lw, x_fp8, rows, freqs, qr, q, kv, nullptr);  // the rows' own keys: never stored
        // Keys: target features of positions max(0, p-W+1)..p, then the 5 rows; no causal mask.
        keys.clear();
        const auto& ring = seq.draft_rings_[size_t(s)];
        for (int64_t pp = std::max<int64_t>(0, p - hp.window + 1); pp <= p; ++pp)
            keys.push_back(ring.data() + (pp % seq.ring_capacity_) * hd);
        kv_bits.resize(kv.size());
        detail::store_keys(kv.data(), int64_t(kv.size()) / hd, hd, kv_bits.data());
        for (int r = 0; r < B; ++r) keys.push_back(kv_bits.data() + r * hd);
        for (auto& ar : arows) {
            ar.keys = keys.data();
            ar.n_keys = int64_t(keys.size());
        }
        detail::attend_and_project(env, lw, q, arows, rows, freqs, a);
        be_.hc_expand(a.data(), H.data(), B, hc, dim, mixA.post.data(), mixA.comb.data(), H.data());
        mixF.compute(env, H, B, lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale);
        be_.hc_collapse(H.data(), B, hc, dim, mixA.pre.data(), x.data());
        be_.rms_norm(x.data(), B, dim, lw.ffn_norm.data, float(hp.norm_eps), x.data(), true);
        if (auto st = detail::moe(env, lw, layer, hp.dspark_n_experts, hp.dspark_n_active, x.data(), rows, f); !st)
            return st;
        be_.hc_expand(f.data(), H.data(), B, hc, dim, mixF.post.data(), mixF.comb.data(), H.data());
        p_in = mixF.pre;
    }
    std::vector<float> h(static_cast<size_t>(B * dim)), hn(static_cast<size_t>(B * dim));
    be_.hc_collapse(H.data(), B, hc, dim, p_in.data(), h.data());
    be_.rms_norm(h.data(), B, dim, draft_->output_norm.data, float(hp.norm_eps), hn.data(), true);
    out.logits.resize(size_t(B * hp.vocab));
    be_.matmul(w_.output, hn.data(), dim, B, out.logits.data(), hp.vocab, false);

    // Markov chain: row i's bias comes from its input token (the previous choice).
    const int64_t rank = hp.dspark_markov_rank;
    std::vector<float> e(static_cast<size_t>(rank)), bias(static_cast<size_t>(hp.vocab)), cat(static_cast<size_t>(dim + rank));
    out.tokens.assign(size_t(B), 0);
    out.confidence.assign(size_t(B), 0.0f);
    int32_t prev = next_token;
    for (int i = 0; i < B; ++i) {
        detail::embedding_row(draft_->markov_embed, prev, e.data());
        be_.matmul(draft_->markov_head, e.data(), rank, 1, bias.data(), hp.vocab, false);
        float* li = out.logits.data() + int64_t(i) * hp.vocab;
        for (int64_t v = 0; v < hp.vocab; ++v) li[v] += bias[size_t(v)];
        std::copy_n(h.data() + i * dim, dim, cat.data());
        std::copy_n(e.data(), rank, cat.data() + dim);
        be_.matmul(draft_->conf_proj, cat.data(), dim + rank, 1, &out.confidence[size_t(i)], 1, false);
        const int32_t best = int32_t(std::max_element(li, li + hp.vocab) - li);  // first maximum: lowest id
        prev = forced.empty() ? best : forced[size_t(i)];
        out.tokens[size_t(i)] = prev;
    }
    return {};
}

}  // namespace moestream::dsv41
