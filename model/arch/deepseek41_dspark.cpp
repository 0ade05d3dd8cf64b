// DSpark draft head (dsv41-architecture.md §5.2): three window-only V4.1 blocks over 5 draft rows
// [t_{p+1}, noise x4] at positions p+1..p+5 that attend bidirectionally to each other and to the
// stage rings of target features, then the shared LM head, the rank-r Markov bias and confidence.
#include <algorithm>
#include <cmath>

#include "model/arch/deepseek41.h"
#include "model/arch/deepseek41_internal.h"

namespace moestream::dsv41 {

status model::draft(const sequence_state& seq, int32_t next_token, draft_output& out, std::span<const int32_t> forced) {
    return coro::run_sync([&](coro::executor& ex) { return draft_async(seq, next_token, out, forced, ex); });
}

coro::task<status> model::draft_async(const sequence_state& seq, int32_t next_token, draft_output& out,
                                      std::span<const int32_t> forced, coro::executor& ex) {
    if (!draft_) co_return make_error("no DSpark draft head is loaded");
    const hparams& hp = hp_;
    if (seq.size() == 0) co_return make_error("the draft needs at least one consumed position");
    if (seq.be_ != &be_) co_return make_error("draft: a sequence made for another backend");
    if (seq.draft_rings_.empty()) co_return make_error("draft: the sequence was made without DSpark state");
    if (next_token < 0 || next_token >= hp.vocab) co_return make_error("draft: token id out of range");
    const int B = hp.dspark_block_size;
    if (!forced.empty() && int(forced.size()) != B) co_return make_error("draft: forced ids must have block_size entries");
    for (int32_t t : forced)
        if (t < 0 || t >= hp.vocab) co_return make_error("draft: forced token id out of range");
    detail::workspace& ws = *ws_;
    const detail::env env{hp, be_, experts_, opts_, ws, ex};
    const int hc = hp.hc_mult;
    const int64_t dim = hp.dim, hd = hp.head_dim, p = seq.size() - 1;

    detail::rows_info rows;
    for (int r = 0; r < B; ++r) {
        rows.pos.push_back(p + 1 + r);
        rows.seq_rows.push_back(B);
    }
    ws.pos.resize(rows.pos.size());
    be_.upload(ws.pos.data(), rows.pos.data(), ws.pos.bytes());
    rows.pos_dev = ws.pos.data();
    {
        std::vector<int32_t> tokens(static_cast<size_t>(B), hp.dspark_noise_token);
        tokens[0] = next_token;
        ws.tokens.resize(tokens.size());
        be_.upload(ws.tokens.data(), tokens.data(), ws.tokens.bytes());
        std::vector<float> p_in(static_cast<size_t>(B * hc), 0.0f);
        for (int r = 0; r < B; ++r) p_in[size_t(r * hc)] = 1.0f;
        ws.p_in.resize(p_in.size());
        be_.upload(ws.p_in.data(), p_in.data(), ws.p_in.bytes());
    }
    ws.H.resize(size_t(B * hc * dim));
    float* H = ws.H.data();
    be_.embed(w_.token_embd, ws.tokens.data(), B, hc, H);

    ws.x.resize(size_t(B * dim));
    float* x = ws.x.data();
    ws.layer_kv.resize(size_t(B * hd));  // the rows' own keys: never stored
    float* kv = ws.layer_kv.data();
    std::vector<attention_row> arows(static_cast<size_t>(B));
    const float* freqs = ws.freqs_plain.data();  // stages are ratio 0: base rope_theta, no YaRN
    for (int s = 0; s < hp.n_mtp; ++s) {
        const layer_weights& lw = draft_->stages[size_t(s)];
        const int layer = hp.n_layers + s;
        detail::compute_mix(env, H, B, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale, ws.mixA);
        be_.hc_collapse(H, B, hc, dim, ws.p_in.data(), x);
        be_.rms_norm(x, B, dim, lw.attn_norm.data, float(hp.norm_eps), x, true);
        const float* x_fp8 = x;
        if (opts_.act_quant) {
            ws.xq.resize(size_t(B * dim));
            be_.copy(ws.xq.data(), x, ws.xq.bytes());
            detail::act_quant(env, act_quant_kind::fp8_e8m0_32, ws.xq.data(), int64_t(ws.xq.size()));
            x_fp8 = ws.xq.data();
        }
        detail::query_and_kv(env, lw, x_fp8, rows, freqs, ws.qr, ws.q, kv, nullptr);
        // Keys: target features of positions max(0, p-W+1)..p, then the 5 rows; no causal mask.
        ws.kv_bits.resize(size_t(B * hd));
        const key_store store{kv, ws.kv_bits.data(), B};
        be_.store_keys({&store, 1}, hd);
        const int64_t lo = std::max<int64_t>(0, p - hp.window + 1);
        for (auto& ar : arows) {
            ar = {};
            ar.ring = seq.draft_rings_[size_t(s)];
            ar.ring_capacity = seq.ring_capacity_;
            ar.ring_first = lo;
            ar.ring_count = p - lo + 1;
            ar.fresh = ws.kv_bits.data();
            ar.fresh_count = B;
        }
        detail::attend_and_project(env, lw, ws.q, arows, rows, freqs, ws.a);
        be_.hc_expand(ws.a.data(), H, B, hc, dim, ws.mixA.post.data(), ws.mixA.comb.data(), H);
        detail::compute_mix(env, H, B, lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale, ws.mixF);
        be_.hc_collapse(H, B, hc, dim, ws.mixA.pre.data(), x);
        be_.rms_norm(x, B, dim, lw.ffn_norm.data, float(hp.norm_eps), x, true);
        if (auto st = co_await detail::moe(env, lw, layer, hp.dspark_n_experts, hp.dspark_n_active, x, rows, ws.f); !st)
            co_return st;
        be_.hc_expand(ws.f.data(), H, B, hc, dim, ws.mixF.post.data(), ws.mixF.comb.data(), H);
        be_.copy(ws.p_in.data(), ws.mixF.pre.data(), ws.p_in.bytes());
    }
    ws.h.resize(size_t(B * dim));
    ws.hn.resize(size_t(B * dim));
    be_.hc_collapse(H, B, hc, dim, ws.p_in.data(), ws.h.data());
    be_.rms_norm(ws.h.data(), B, dim, draft_->output_norm.data, float(hp.norm_eps), ws.hn.data(), true);
    ws.logits.resize(size_t(B * hp.vocab));
    be_.matmul(w_.output, ws.hn.data(), dim, B, ws.logits.data(), hp.vocab, false);

    // Markov chain: row i's bias comes from its input token (the previous choice), which is the
    // row's argmax unless forced; the chain runs in the backend and only its results come back.
    const int64_t rank = hp.dspark_markov_rank;
    ws.draft_tokens.resize(size_t(B + 1));  // [0]: next_token, [i + 1]: draft i
    be_.upload(ws.draft_tokens.data(), &next_token, sizeof(int32_t));
    if (!forced.empty()) be_.upload(ws.draft_tokens.data() + 1, forced.data(), forced.size_bytes());
    ws.markov_e.resize(size_t(rank));
    ws.markov_bias.resize(size_t(hp.vocab));
    ws.conf_in.resize(size_t(dim + rank));
    ws.confidence.resize(size_t(B));
    for (int i = 0; i < B; ++i) {
        be_.embed(draft_->markov_embed, ws.draft_tokens.data() + i, 1, 1, ws.markov_e.data());
        be_.matmul(draft_->markov_head, ws.markov_e.data(), rank, 1, ws.markov_bias.data(), hp.vocab, false);
        float* li = ws.logits.data() + int64_t(i) * hp.vocab;
        be_.add(li, ws.markov_bias.data(), hp.vocab);
        be_.copy(ws.conf_in.data(), ws.h.data() + i * dim, size_t(dim) * sizeof(float));
        be_.copy(ws.conf_in.data() + dim, ws.markov_e.data(), size_t(rank) * sizeof(float));
        be_.matmul(draft_->conf_proj, ws.conf_in.data(), dim + rank, 1, ws.confidence.data() + i, 1, false);
        if (forced.empty()) be_.argmax_rows(li, 1, hp.vocab, ws.draft_tokens.data() + i + 1);
    }
    out.logits.resize(size_t(B * hp.vocab));
    out.tokens.resize(size_t(B));
    out.confidence.resize(size_t(B));
    // Awaited together (no thread waits for the draft's kernels).
    const backend::download_ticket tickets[] = {
        be_.download_begin(out.logits.data(), ws.logits.data(), out.logits.size() * sizeof(float)),
        be_.download_begin(out.tokens.data(), ws.draft_tokens.data() + 1, out.tokens.size() * sizeof(int32_t)),
        be_.download_begin(out.confidence.data(), ws.confidence.data(), out.confidence.size() * sizeof(float))};
    for (const auto& t : tickets) co_await detail::download_landed(be_, t, ex);
    co_return status{};
}

status model::keep_main_hidden(sequence_state& seq, int64_t row) {
    if (!draft_) return make_error("keep_main_hidden needs a model with a DSpark head");
    const int64_t size = int64_t(hp_.dspark_target_layers.size()) * hp_.dim;
    detail::workspace& ws = *ws_;
    if (row < 0 || (row + 1) * size > int64_t(ws.taps.size()))
        return make_error("keep_main_hidden: row " + std::to_string(row) + " is not a row of the last forward");
    be_.copy(seq.last_main_hidden_, ws.taps.data() + row * size, size_t(size) * sizeof(float));
    seq.has_main_hidden_ = true;
    return {};
}

}  // namespace moestream::dsv41
