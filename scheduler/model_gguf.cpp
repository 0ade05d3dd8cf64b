#include "scheduler/model_gguf.h"

#include <algorithm>
#include <map>

namespace moestream {
namespace {

using gguf::kv;
using gguf::value;

std::vector<uint32_t> as_u32(const std::vector<int>& v) { return {v.begin(), v.end()}; }

// Keys shared by the target (prefix deepseek41.) and the draft (prefix dflash.).
void common_keys(std::vector<kv>& out, const std::string& p, const dsv41::hparams& hp, int blocks, int experts,
                 int active) {
    auto u32 = [&](std::string k, uint64_t v) { out.push_back({p + k, value::u32(uint32_t(v))}); };
    auto f32 = [&](std::string k, double v) { out.push_back({p + k, value::f32(float(v))}); };
    u32("embedding_length", hp.dim);
    u32("block_count", blocks);
    u32("vocab_size", hp.vocab);
    u32("context_length", hp.max_position);
    u32("attention.head_count", hp.n_heads);
    u32("attention.head_count_kv", 1);
    u32("attention.key_length", hp.head_dim);
    u32("attention.value_length", hp.head_dim);
    u32("rope.dimension_count", hp.rope_dim);
    u32("attention.q_lora_rank", hp.q_lora_rank);
    u32("attention.sliding_window", hp.window);
    u32("attention.output_group_count", hp.o_groups);
    u32("attention.output_lora_rank", hp.o_lora_rank);
    f32("attention.layer_norm_rms_epsilon", hp.norm_eps);
    f32("rope.freq_base", hp.rope_theta);
    u32("expert_count", experts);
    u32("expert_used_count", active);
    u32("expert_shared_count", hp.n_shared);
    u32("expert_feed_forward_length", hp.moe_inter);
    f32("expert_weights_scale", hp.route_scale);
    out.push_back({p + "expert_weights_norm", value::boolean(hp.norm_topk)});
    out.push_back({p + "expert_scoring_func", value::str("sqrtsoftplus")});
    std::vector<float> clamp(size_t(blocks), float(hp.swiglu_limit));
    out.push_back({p + "swiglu_clamp_exp", value::f32_array(clamp)});
    out.push_back({p + "swiglu_clamp_shexp", value::f32_array(clamp)});
    u32("hyper_connection.count", hp.hc_mult);
    u32("hyper_connection.sinkhorn_iterations", hp.hc_sinkhorn_iters);
    f32("hyper_connection.epsilon", hp.hc_eps);
}

struct reader {
    const gguf::model_file& f;
    std::string p;
    result<int64_t> i(const std::string& k) const { return f.get_i64(p + k); }
    result<double> d(const std::string& k) const { return f.get_f64(p + k); }
    result<std::vector<int>> ints(const std::string& k) const {
        const value* v = f.find(p + k);
        if (!v) return make_error(f.shard_path(0) + ": key '" + p + k + "' is missing");
        const auto* arr = v->as_array();
        if (!arr) return make_error(f.shard_path(0) + ": key '" + p + k + "' must be an array");
        std::vector<int> out;
        for (const auto& x : *arr) {
            auto n = x.as_i64();
            if (!n || *n < INT32_MIN || *n > INT32_MAX)
                return make_error(f.shard_path(0) + ": key '" + p + k + "' must hold integers");
            out.push_back(int(*n));
        }
        return out;
    }
};

#define MS_READ(dst, expr)              \
    do {                                \
        auto r_ = (expr);               \
        if (!r_) return r_.err();       \
        dst = static_cast<std::remove_reference_t<decltype(dst)>>(*r_); \
    } while (0)

status read_common(const reader& r, dsv41::hparams& hp, int& blocks, int& experts, int& active) {
    MS_READ(hp.dim, r.i("embedding_length"));
    MS_READ(blocks, r.i("block_count"));
    MS_READ(hp.vocab, r.i("vocab_size"));
    MS_READ(hp.max_position, r.i("context_length"));
    MS_READ(hp.n_heads, r.i("attention.head_count"));
    MS_READ(hp.head_dim, r.i("attention.key_length"));
    MS_READ(hp.rope_dim, r.i("rope.dimension_count"));
    MS_READ(hp.q_lora_rank, r.i("attention.q_lora_rank"));
    MS_READ(hp.window, r.i("attention.sliding_window"));
    MS_READ(hp.o_groups, r.i("attention.output_group_count"));
    MS_READ(hp.o_lora_rank, r.i("attention.output_lora_rank"));
    MS_READ(hp.norm_eps, r.d("attention.layer_norm_rms_epsilon"));
    MS_READ(hp.rope_theta, r.d("rope.freq_base"));
    MS_READ(experts, r.i("expert_count"));
    MS_READ(active, r.i("expert_used_count"));
    MS_READ(hp.n_shared, r.i("expert_shared_count"));
    MS_READ(hp.moe_inter, r.i("expert_feed_forward_length"));
    MS_READ(hp.route_scale, r.d("expert_weights_scale"));
    MS_READ(hp.hc_mult, r.i("hyper_connection.count"));
    MS_READ(hp.hc_sinkhorn_iters, r.i("hyper_connection.sinkhorn_iterations"));
    MS_READ(hp.hc_eps, r.d("hyper_connection.epsilon"));
    auto norm = r.f.get_bool(r.p + "expert_weights_norm");
    if (!norm) return norm.err();
    hp.norm_topk = *norm;
    return {};
}

}  // namespace

std::vector<kv> target_metadata(const dsv41::hparams& hp) {
    const std::string p = std::string(kTargetArch) + ".";
    std::vector<kv> out;
    out.push_back({"general.architecture", value::str(kTargetArch)});
    common_keys(out, p, hp, hp.n_layers, hp.n_experts, hp.n_active);
    auto u32 = [&](std::string k, uint64_t v) { out.push_back({p + k, value::u32(uint32_t(v))}); };
    auto f32 = [&](std::string k, double v) { out.push_back({p + k, value::f32(float(v))}); };
    auto u32s = [&](std::string k, const std::vector<int>& v) {
        auto w = as_u32(v);
        out.push_back({p + k, value::u32_array(w)});
    };
    u32s("attention.compress_ratios", hp.compress_ratios);
    f32("attention.compress_rope_freq_base", hp.compress_rope_theta);
    u32("attention.indexer.head_count", hp.index_n_heads);
    u32("attention.indexer.key_length", hp.index_head_dim);
    u32("attention.indexer.top_k", hp.index_topk);
    u32("attention.candidate_block_size", hp.candidate_block_size);
    u32("attention.candidate_topk_blocks", hp.candidate_topk_blocks);
    u32("attention.candidate_source_layer_id", hp.candidate_source_layer);
    u32s("kv_source_layer_ids", hp.kv_source_layers);
    u32s("index_source_layer_ids", hp.index_source_layers);
    u32s("dspark_target_layer_ids", hp.dspark_target_layers);
    u32("dspark_noise_token_id", uint64_t(hp.dspark_noise_token));
    u32("hash_layer_count", 0);
    out.push_back({p + "rope.scaling.type", value::str("yarn")});
    f32("rope.scaling.factor", hp.rope_factor);
    u32("rope.scaling.original_context_length", hp.original_seq_len);
    f32("rope.scaling.yarn_beta_fast", hp.beta_fast);
    f32("rope.scaling.yarn_beta_slow", hp.beta_slow);
    out.push_back({p + "engram.present", value::boolean(!hp.engram_layers.empty())});
    u32s("engram.layer_ids", hp.engram_layers);
    std::vector<uint64_t> rows;
    std::vector<value> rows_v;
    for (size_t e = 0; e < hp.engram_layers.size(); ++e) rows_v.push_back(value::u64(uint64_t(dsv41::engram_rows(hp, e))));
    out.push_back({p + "engram.num_embeddings", value::array(gguf::value_type::u64, rows_v)});
    u32("engram_head_dim", hp.engram_head_dim);
    u32("engram_n_heads", hp.engram_n_heads);
    u32("engram_max_ngram_size", hp.engram_max_ngram);
    u32("engram_vocab_size", hp.engram_prime_start);
    u32("engram_pad_token_id", hp.engram_pad_id);
    return out;
}

std::vector<kv> draft_metadata(const dsv41::hparams& hp) {
    const std::string p = std::string(kDraftArch) + ".";
    std::vector<kv> out;
    out.push_back({"general.architecture", value::str(kDraftArch)});
    common_keys(out, p, hp, hp.n_mtp, hp.dspark_n_experts, hp.dspark_n_active);
    out.push_back({p + "block_size", value::u32(uint32_t(hp.dspark_block_size))});
    auto taps = as_u32(hp.dspark_target_layers);
    out.push_back({p + "target_layers", value::u32_array(taps)});
    out.push_back({p + "markov_rank", value::u32(uint32_t(hp.dspark_markov_rank))});
    out.push_back({p + "dsv41_semantics", value::boolean(true)});
    out.push_back({"tokenizer.ggml.mask_token_id", value::u32(uint32_t(hp.dspark_noise_token))});
    return out;
}

result<dsv41::hparams> read_hparams(const gguf::model_file& f) {
    auto arch = f.get_string("general.architecture");
    if (!arch) return arch.err();
    dsv41::hparams hp;
    int blocks = 0, experts = 0, active = 0;
    if (*arch == kTargetArch) {
        reader r{f, std::string(kTargetArch) + "."};
        MS_TRY(read_common(r, hp, blocks, experts, active));
        hp.n_layers = blocks;
        hp.n_experts = experts;
        hp.n_active = active;
        MS_READ(hp.compress_ratios, r.ints("attention.compress_ratios"));
        hp.n_mtp = std::max(0, int(hp.compress_ratios.size()) - hp.n_layers);
        MS_READ(hp.compress_rope_theta, r.d("attention.compress_rope_freq_base"));
        MS_READ(hp.index_n_heads, r.i("attention.indexer.head_count"));
        MS_READ(hp.index_head_dim, r.i("attention.indexer.key_length"));
        MS_READ(hp.index_topk, r.i("attention.indexer.top_k"));
        MS_READ(hp.candidate_block_size, r.i("attention.candidate_block_size"));
        MS_READ(hp.candidate_topk_blocks, r.i("attention.candidate_topk_blocks"));
        MS_READ(hp.candidate_source_layer, r.i("attention.candidate_source_layer_id"));
        MS_READ(hp.kv_source_layers, r.ints("kv_source_layer_ids"));
        MS_READ(hp.index_source_layers, r.ints("index_source_layer_ids"));
        MS_READ(hp.dspark_target_layers, r.ints("dspark_target_layer_ids"));
        // Optional: files from other converters may lack it; the DSpark file carries it too.
        if (f.find(r.p + "dspark_noise_token_id")) MS_READ(hp.dspark_noise_token, r.i("dspark_noise_token_id"));
        MS_READ(hp.rope_factor, r.d("rope.scaling.factor"));
        MS_READ(hp.original_seq_len, r.i("rope.scaling.original_context_length"));
        MS_READ(hp.beta_fast, r.d("rope.scaling.yarn_beta_fast"));
        MS_READ(hp.beta_slow, r.d("rope.scaling.yarn_beta_slow"));
        MS_READ(hp.engram_layers, r.ints("engram.layer_ids"));
        MS_READ(hp.engram_head_dim, r.i("engram_head_dim"));
        MS_READ(hp.engram_n_heads, r.i("engram_n_heads"));
        MS_READ(hp.engram_max_ngram, r.i("engram_max_ngram_size"));
        MS_READ(hp.engram_prime_start, r.i("engram_vocab_size"));
        MS_READ(hp.engram_pad_id, r.i("engram_pad_token_id"));
        if (hp.n_mtp == 0) hp.dspark_target_layers.clear();
    } else if (*arch == kDraftArch) {
        reader r{f, std::string(kDraftArch) + "."};
        MS_TRY(read_common(r, hp, blocks, experts, active));
        hp.n_mtp = blocks;
        hp.n_layers = 0;
        hp.dspark_n_experts = experts;
        hp.dspark_n_active = active;
        MS_READ(hp.dspark_block_size, r.i("block_size"));
        MS_READ(hp.dspark_target_layers, r.ints("target_layers"));
        MS_READ(hp.dspark_markov_rank, r.i("markov_rank"));
        MS_READ(hp.dspark_noise_token, f.get_i64("tokenizer.ggml.mask_token_id"));
        return hp;  // the draft's structure is checked by check_tensors; roles live in the target
    } else {
        return make_error(f.shard_path(0) + ": architecture '" + *arch + "' is not supported (deepseek41, dflash)");
    }
    auto v = dsv41::validate(hp);
    if (!v) return make_error(f.shard_path(0) + ": " + v.message());
    return hp;
}

status check_tensors(const gguf::model_file& f, const dsv41::hparams& hp, bool draft) {
    auto specs = draft ? dsv41::draft_tensors(hp) : dsv41::target_tensors(hp);
    std::map<std::string, const dsv41::tensor_spec*, std::less<>> expected;
    for (const auto& s : specs) expected[s.name] = &s;
    const std::string& path = f.shard_path(0);
    for (const auto& t : f.tensors()) {
        auto it = expected.find(t.name);
        if (it == expected.end()) return make_error(path + ": unexpected tensor '" + t.name + "'");
        const auto& s = *it->second;
        bool same = int(s.shape.size()) == t.n_dims;
        for (size_t k = 0; same && k < s.shape.size(); ++k) same = s.shape[k] == t.ne[k];
        if (!same) {
            std::string want, got;
            for (auto n : s.shape) want += (want.empty() ? "" : ", ") + std::to_string(n);
            for (int k = 0; k < t.n_dims; ++k) got += (got.empty() ? "" : ", ") + std::to_string(t.ne[k]);
            return make_error(path + ": tensor '" + t.name + "' has shape {" + got + "}, the architecture needs {" + want + "}");
        }
        const bool table = s.kind == dsv41::tensor_spec::role::engram_table || s.kind == dsv41::tensor_spec::role::side_table;
        if (table ? t.type != s.type : !dtype_info(t.type).compute_supported)
            return make_error(path + ": tensor '" + t.name + "' has type " + std::string(dtype_name(t.type)) +
                              ", which is not usable here (expected " + std::string(dtype_name(s.type)) + ")");
    }
    if (f.tensors().size() != specs.size())
        for (const auto& s : specs)
            if (!f.tensor(s.name)) return make_error(path + ": tensor '" + s.name + "' is missing");
    return {};
}

void append_tokenizer_metadata(std::vector<kv>& out, const tokenizer_data& t) {
    out.push_back({"tokenizer.ggml.model", value::str(t.model)});
    out.push_back({"tokenizer.ggml.pre", value::str(t.pre)});
    out.push_back({"tokenizer.ggml.tokens", value::str_array(t.tokens)});
    out.push_back({"tokenizer.ggml.token_type", value::i32_array(t.token_types)});
    out.push_back({"tokenizer.ggml.merges", value::str_array(t.merges)});
    out.push_back({"tokenizer.ggml.bos_token_id", value::u32(uint32_t(t.bos_id))});
    out.push_back({"tokenizer.ggml.eos_token_id", value::u32(uint32_t(t.eos_id))});
    out.push_back({"tokenizer.ggml.padding_token_id", value::u32(uint32_t(t.pad_id))});
    out.push_back({"tokenizer.ggml.add_bos_token", value::boolean(t.add_bos)});
    out.push_back({"tokenizer.ggml.add_eos_token", value::boolean(t.add_eos)});
    if (!t.chat_template.empty()) out.push_back({"tokenizer.chat_template", value::str(t.chat_template)});
}

result<tokenizer_data> read_tokenizer_data(const gguf::model_file& f) {
    tokenizer_data t;
    const std::string& path = f.shard_path(0);
    auto strings = [&](const char* key, std::vector<std::string>& dst) -> status {
        const value* v = f.find(key);
        if (!v || !v->as_array()) return make_error(path + ": key '" + std::string(key) + "' is missing or not an array");
        dst.clear();
        dst.reserve(v->as_array()->size());
        for (const auto& x : *v->as_array()) {
            auto s = x.as_string();
            if (!s) return make_error(path + ": key '" + std::string(key) + "' must hold strings");
            dst.push_back(std::move(*s));
        }
        return {};
    };
    MS_READ(t.model, f.get_string("tokenizer.ggml.model"));
    if (t.model != "gpt2") return make_error(path + ": tokenizer model '" + t.model + "' is not supported (gpt2 byte-level BPE)");
    if (auto pre = f.get_string("tokenizer.ggml.pre")) t.pre = *pre;
    MS_TRY(strings("tokenizer.ggml.tokens", t.tokens));
    MS_TRY(strings("tokenizer.ggml.merges", t.merges));
    const value* types = f.find("tokenizer.ggml.token_type");
    if (types && types->as_array()) {
        for (const auto& x : *types->as_array()) {
            auto n = x.as_i64();
            if (!n) return make_error(path + ": tokenizer.ggml.token_type must hold integers");
            t.token_types.push_back(int32_t(*n));
        }
    } else {
        t.token_types.assign(t.tokens.size(), int32_t(token_type::normal));
    }
    if (t.token_types.size() != t.tokens.size())
        return make_error(path + ": tokenizer.ggml.token_type has " + std::to_string(t.token_types.size()) +
                          " entries for " + std::to_string(t.tokens.size()) + " tokens");
    MS_READ(t.bos_id, f.get_i64("tokenizer.ggml.bos_token_id"));
    MS_READ(t.eos_id, f.get_i64("tokenizer.ggml.eos_token_id"));
    if (auto pad = f.get_i64("tokenizer.ggml.padding_token_id")) t.pad_id = int32_t(*pad);
    if (auto b = f.get_bool("tokenizer.ggml.add_bos_token")) t.add_bos = *b;
    if (auto e = f.get_bool("tokenizer.ggml.add_eos_token")) t.add_eos = *e;
    if (auto c = f.get_string("tokenizer.chat_template")) t.chat_template = *c;
    return t;
}

result<tokenizer> load_tokenizer(const std::string& model_path) {
    auto f = gguf::model_file::open(model_path);
    if (!f) return f.err();
    auto data = read_tokenizer_data(*f);
    if (!data) return data.err();
    auto tok = tokenizer::create(std::move(*data));
    if (!tok) return make_error(model_path + ": " + tok.message());
    return tok;
}

}  // namespace moestream
