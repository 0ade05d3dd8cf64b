#include "scheduler/model_loader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "model/quant.h"
#include "scheduler/model_gguf.h"

namespace moestream {
namespace {

struct binder {
    const gguf::model_file& f;
    loaded_model& m;
    std::string prefix;  // "blk.3." for block tensors
    std::string error;

    const gguf::tensor_info* find(const std::string& name) {
        const auto* t = f.tensor(name);
        if (!t && error.empty()) error = f.shard_path(0) + ": tensor '" + name + "' is missing";
        return t;
    }
    weight_view weight(const std::string& name) {
        const auto* t = find(prefix + name);
        if (!t) return {};
        int64_t rows = 1;
        for (int k = 1; k < t->n_dims; ++k) rows *= t->ne[size_t(k)];
        return weight_view::contiguous(f.data(*t).data(), t->type, t->ne[0], rows);
    }
    weight_view optional_weight(const std::string& name) {
        return f.tensor(prefix + name) ? weight(name) : weight_view{};
    }
    vector_view vec(const std::string& name) {
        const auto* t = find(prefix + name);
        if (!t) return {};
        int64_t n = 1;
        for (int k = 0; k < t->n_dims; ++k) n *= t->ne[size_t(k)];
        const auto bytes = f.data(*t);
        if (t->type == ggml_type::f32) return {reinterpret_cast<const float*>(bytes.data()), n};
        if (!dtype_info(t->type).compute_supported) {
            if (error.empty()) error = f.shard_path(0) + ": tensor '" + prefix + name + "' has a non-float type";
            return {};
        }
        auto& out = m.converted.emplace_back(size_t(n));
        quant::dequantize_row(t->type, bytes.data(), out.data(), n);
        return {out.data(), n};
    }
    vector_view optional_vec(const std::string& name) { return f.tensor(prefix + name) ? vec(name) : vector_view{}; }
};

void bind_block(binder& b, dsv41::layer_weights& lw, const dsv41::hparams& hp, int layer, bool draft) {
    b.prefix = "blk." + std::to_string(layer) + ".";
    lw.attn_norm = b.vec("attn_norm.weight");
    lw.attn_sinks = b.vec("attn_sinks.weight");
    lw.q_a = b.weight("attn_q_a.weight");
    lw.q_a_norm = b.vec("attn_q_a_norm.weight");
    lw.q_b = b.weight("attn_q_b.weight");
    lw.kv = b.weight("attn_kv.weight");
    lw.kv_a_norm = b.vec("attn_kv_a_norm.weight");
    lw.out_a = b.weight("attn_output_a.weight");
    lw.out_b = b.weight("attn_output_b.weight");
    lw.hc_attn_fn = b.weight("hc_attn_fn.weight");
    lw.hc_ffn_fn = b.weight("hc_ffn_fn.weight");
    if (lw.hc_attn_fn.type != ggml_type::f32 || lw.hc_ffn_fn.type != ggml_type::f32)
        if (b.error.empty()) b.error = b.f.shard_path(0) + ": " + b.prefix + "hc_*_fn.weight must be F32";
    lw.hc_attn_base = b.vec("hc_attn_base.weight");
    lw.hc_attn_scale = b.vec("hc_attn_scale.weight");
    lw.hc_ffn_base = b.vec("hc_ffn_base.weight");
    lw.hc_ffn_scale = b.vec("hc_ffn_scale.weight");
    lw.ffn_norm = b.vec("ffn_norm.weight");
    lw.gate_inp = b.weight("ffn_gate_inp.weight");
    lw.exp_probs_b = b.vec("exp_probs_b.bias");
    lw.gate_shexp = b.weight("ffn_gate_shexp.weight");
    lw.up_shexp = b.weight("ffn_up_shexp.weight");
    lw.down_shexp = b.weight("ffn_down_shexp.weight");
    if (draft) return;
    if (hp.is_kv_source(layer)) {
        lw.compressor_kv = b.weight("attn_compressor_kv.weight");
        lw.compressor_gate = b.optional_weight("attn_compressor_gate.weight");
        lw.compressor_norm = b.vec("attn_compressor_norm.weight");
        lw.index_k = b.weight("indexer.attn_k.weight");
        lw.index_k_norm = b.vec("indexer.k_norm.weight");
    }
    if (hp.is_index_source(layer)) {
        lw.index_q_b = b.weight("indexer.attn_q_b.weight");
        lw.index_proj = b.weight("indexer.proj.weight");
    }
    if (hp.is_engram_layer(layer)) {
        lw.engram_wkv = b.weight("engram_wkv.weight");
        const auto q = b.vec("engram_q.weight"), k = b.vec("engram_k.weight");
        if (!q.empty() && !k.empty()) {
            // Only the product of the two per-stream weights is ever used (§3.2).
            auto& qk = b.m.converted.emplace_back(size_t(q.size));
            for (int64_t i = 0; i < q.size; ++i) qk[size_t(i)] = q[i] * k[i];
            lw.engram_qk = {qk.data(), q.size};
        }
        const auto* v = b.find(b.prefix + "engram_embd.weight");
        const auto* s = b.find(b.prefix + "engram_embd_scale.weight");
        if (v && s) {
            lw.engram_values = reinterpret_cast<const uint8_t*>(b.f.data(*v).data());
            lw.engram_scales = reinterpret_cast<const uint8_t*>(b.f.data(*s).data());
            lw.engram_rows = v->ne[1];
        }
    }
}

result<std::vector<int64_t>> i64_table(const gguf::model_file& f, const std::string& name) {
    const auto* t = f.tensor(name);
    if (!t) return make_error(f.shard_path(0) + ": tensor '" + name + "' is missing");
    if (t->type != ggml_type::i64) return make_error(f.shard_path(0) + ": tensor '" + name + "' must be I64");
    const auto bytes = f.data(*t);
    std::vector<int64_t> out(bytes.size() / 8);
    std::memcpy(out.data(), bytes.data(), out.size() * 8);
    return out;
}

}  // namespace

namespace {
result<loaded_model::file_stamp> stamp_of(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return make_error(path + ": " + std::strerror(errno));
    return loaded_model::file_stamp{path, uint64_t(st.st_size),
                                    int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)};
}
}  // namespace

status loaded_model::verify_unchanged() const {
    for (const auto& s : stamps) {
        auto now = stamp_of(s.path);
        if (!now) return make_error(now.message() + " (the model file disappeared while in use)");
        if (now->size != s.size || now->mtime_ns != s.mtime_ns)
            return make_error(s.path + " changed on disk since it was loaded (size " + std::to_string(s.size) + " -> " +
                              std::to_string(now->size) + ", modification time changed: " +
                              (now->mtime_ns != s.mtime_ns ? "yes" : "no") + "): restart with the new file");
    }
    return {};
}

dsv41::expert_weights loaded_model::expert(int layer, int32_t e) const {
    MS_ASSERT_MSG(layer >= 0 && size_t(layer) < expert_index.size(), "expert of a layer the model does not have");
    const expert_tensors& x = expert_index[size_t(layer)];
    auto view = [&](const gguf::tensor_info* t) {
        MS_ASSERT(e >= 0 && e < t->ne[2]);
        const size_t per_expert = size_t(row_bytes(dtype_info(t->type), t->ne[0]) * t->ne[1]);
        return weight_view::contiguous(x.file->data(*t).data() + per_expert * size_t(e), t->type, t->ne[0], t->ne[1]);
    };
    return {view(x.gate), view(x.up), view(x.down)};
}

int64_t loaded_model::total_experts() const {
    int64_t n = 0;
    for (size_t L = 0; L < expert_index.size(); ++L)
        n += int64_t(L) < hp.n_layers ? hp.n_experts : hp.dspark_n_experts;
    return n;
}

namespace {

// Fills expert_index for the target's layers and the draft's stages (the tensors were checked).
void index_experts(loaded_model& m) {
    auto add = [&](const gguf::model_file& f, int block) {
        const std::string prefix = "blk." + std::to_string(block) + ".";
        loaded_model::expert_tensors x{&f, f.tensor(prefix + "ffn_gate_exps.weight"), f.tensor(prefix + "ffn_up_exps.weight"),
                                       f.tensor(prefix + "ffn_down_exps.weight")};
        MS_ASSERT_MSG(x.gate && x.up && x.down, "expert tensor missing after load checks");
        m.expert_index.push_back(x);
    };
    for (int L = 0; L < m.hp.n_layers; ++L) add(m.target, L);
    if (m.draft_file)
        for (int s = 0; s < m.hp.n_mtp; ++s) add(*m.draft_file, s);
}

}  // namespace

result<std::unique_ptr<loaded_model>> load_model(const std::string& path, const std::string& draft_path) {
    auto file = gguf::model_file::open(path);
    if (!file) return file.err();
    auto hp = read_hparams(*file);
    if (!hp) return hp.err();
    if (auto st = check_tensors(*file, *hp, false); !st) return st.err();
    auto m = std::make_unique<loaded_model>(loaded_model{*hp, std::move(*file), std::nullopt, {}, std::nullopt, {}, {}, {}, {}});
    binder b{m->target, *m, "", ""};
    m->weights.token_embd = b.weight("token_embd.weight");
    m->weights.output = b.weight("output.weight");
    m->weights.output_norm = b.vec("output_norm.weight");
    m->weights.layers.resize(size_t(hp->n_layers));
    for (int L = 0; L < hp->n_layers; ++L) bind_block(b, m->weights.layers[size_t(L)], m->hp, L, false);
    if (!b.error.empty()) return make_error(b.error);
    if (!hp->engram_layers.empty()) {
        const auto* tm = m->target.tensor("engram_token_map.weight");
        if (!tm || tm->type != ggml_type::i32) return make_error(path + ": engram_token_map.weight missing or not I32");
        const auto bytes = m->target.data(*tm);
        m->token_map.resize(bytes.size() / 4);
        std::memcpy(m->token_map.data(), bytes.data(), bytes.size());
        if (int64_t(m->token_map.size()) != hp->vocab) return make_error(path + ": engram token map size differs from the vocabulary");
        m->weights.engram.token_map = m->token_map;
        for (auto [name, dst] : {std::pair{"engram_primes.weight", &m->weights.engram.primes},
                                 std::pair{"engram_offsets.weight", &m->weights.engram.offsets},
                                 std::pair{"engram_multipliers.weight", &m->weights.engram.multipliers}}) {
            auto t = i64_table(m->target, name);
            if (!t) return t.err();
            *dst = std::move(*t);
        }
        const size_t nl = hp->engram_layers.size();
        if (m->weights.engram.primes.size() != nl * size_t(hp->engram_columns()) ||
            m->weights.engram.offsets.size() != nl * size_t(hp->engram_columns()) ||
            m->weights.engram.multipliers.size() != nl * size_t(hp->engram_max_ngram))
            return make_error(path + ": engram side tables do not match the engram hyper-parameters");
        const int64_t pad = hp->engram_pad_id;
        if (pad < 0 || pad >= hp->vocab) return make_error(path + ": engram pad id outside the vocabulary");
        for (size_t e = 0; e < nl; ++e) {
            const auto& lw = m->weights.layers[size_t(hp->engram_layers[e])];
            int64_t rows = 0;
            for (int64_t c = 0; c < hp->engram_columns(); ++c) {
                const int64_t prime = m->weights.engram.primes[e * size_t(hp->engram_columns()) + size_t(c)];
                if (prime <= 0 || m->weights.engram.offsets[e * size_t(hp->engram_columns()) + size_t(c)] != rows)
                    return make_error(path + ": engram offsets are not the prefix sums of the primes");
                rows += prime;
            }
            if (rows != lw.engram_rows)
                return make_error(path + ": engram table of layer " + std::to_string(hp->engram_layers[e]) + " has " +
                                  std::to_string(lw.engram_rows) + " rows, the primes need " + std::to_string(rows));
        }
    }
    for (size_t i = 0; i < m->target.shard_count(); ++i) {
        auto st = stamp_of(m->target.shard_path(uint32_t(i)));
        if (!st) return st.err();
        m->stamps.push_back(*st);
    }
    if (!draft_path.empty()) {
        if (auto st = stamp_of(draft_path); st) m->stamps.push_back(*st);
        auto df = gguf::model_file::open(draft_path);
        if (!df) return df.err();
        auto dhp = read_hparams(*df);
        if (!dhp) return dhp.err();
        if (dhp->dim != hp->dim || dhp->vocab != hp->vocab)
            return make_error(draft_path + ": the draft's dim/vocabulary do not match the target " + path);
        m->hp.dspark_n_experts = dhp->dspark_n_experts;
        m->hp.dspark_n_active = dhp->dspark_n_active;
        m->hp.dspark_block_size = dhp->dspark_block_size;
        m->hp.dspark_markov_rank = dhp->dspark_markov_rank;
        m->hp.dspark_noise_token = dhp->dspark_noise_token;
        if (auto st = check_tensors(*df, m->hp, true); !st) return st.err();
        m->draft_file = std::move(*df);
        binder d{*m->draft_file, *m, "", ""};
        dsv41::draft_weights dw;
        dw.fc = d.weight("fc.weight");
        dw.enc_norm = d.vec("enc.output_norm.weight");
        dw.output_norm = d.vec("output_norm.weight");
        dw.markov_embed = d.weight("markov_w1.weight");
        dw.markov_head = d.weight("markov_w2.weight");
        dw.conf_proj = d.weight("conf_proj.weight");
        dw.stages.resize(size_t(m->hp.n_mtp));
        for (int s = 0; s < m->hp.n_mtp; ++s) bind_block(d, dw.stages[size_t(s)], m->hp, s, true);
        if (!d.error.empty()) return make_error(d.error);
        m->draft = std::move(dw);
    }
    index_experts(*m);
    return m;
}

}  // namespace moestream
