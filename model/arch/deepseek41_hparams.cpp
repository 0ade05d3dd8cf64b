#include "model/arch/deepseek41_hparams.h"

#include <algorithm>

#include "config/assert.h"
#include "model/engram_tables.h"

namespace moestream::dsv41 {
namespace {

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// V4.1's 43 compress ratios: [0,0, 2 x18, 1 x20, 0,0,0].
std::vector<int> v41_ratios() {
    std::vector<int> r{0, 0};
    r.insert(r.end(), 18, 2);
    r.insert(r.end(), 20, 1);
    r.insert(r.end(), 3, 0);
    return r;
}

hparams flash() {
    hparams hp;
    hp.compress_ratios = v41_ratios();
    hp.kv_source_layers = {2, 8, 14, 20};
    hp.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
    return hp;
}

// §7.1: keep the 40-layer topology and every role, shrink only widths.
hparams mini(int64_t moe_inter) {
    hparams hp = flash();
    hp.dim = 1024;
    hp.n_heads = 16;
    hp.head_dim = 256;
    hp.q_lora_rank = 256;
    hp.o_groups = 8;
    hp.o_lora_rank = 128;
    hp.index_n_heads = 8;
    hp.index_topk = 128;
    hp.candidate_topk_blocks = 64;
    hp.moe_inter = moe_inter;
    hp.engram_head_dim = 64;
    hp.engram_prime_start = 65536;
    hp.dspark_markov_rank = 64;
    return hp;
}

// §7.2 shapes, except the vocabulary: forge's tiny keeps the real 129,280-token DeepSeek
// tokenizer so it can tokenize, chat and serve real text in tests (the fixtures' 512-token
// synthetic vocabulary only arrives through `convert`).
hparams tiny() {
    hparams hp;
    hp.dim = 64;
    hp.n_layers = 10;
    hp.n_mtp = 3;
    hp.n_heads = 4;
    hp.head_dim = 64;
    hp.rope_dim = 16;
    hp.q_lora_rank = 32;
    hp.o_groups = 2;
    hp.o_lora_rank = 32;
    hp.window = 8;
    hp.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0};
    hp.kv_source_layers = {2, 4, 6};
    hp.index_source_layers = {2, 4, 6, 8};
    hp.candidate_source_layer = 6;
    hp.candidate_topk_blocks = 3;
    hp.candidate_block_size = 2;
    hp.index_n_heads = 2;
    hp.index_head_dim = 32;
    hp.index_topk = 4;
    hp.original_seq_len = 1024;
    hp.n_experts = 64;
    hp.moe_inter = 32;
    hp.engram_layers = {1, 4};
    hp.engram_n_heads = 2;
    hp.engram_head_dim = 32;
    hp.engram_prime_start = 97;
    hp.dspark_n_experts = 16;
    hp.dspark_markov_rank = 16;
    hp.dspark_target_layers = {7, 8, 9};
    return hp;
}

std::string blk(int layer, std::string_view rest) { return "blk." + std::to_string(layer) + "." + std::string(rest); }

// The 24 tensors every block has (§4.2); DSpark stages reuse them with their own expert count.
void add_block(std::vector<tensor_spec>& out, const hparams& hp, const storage_policy& p, int layer,
               int n_experts) {
    using role = tensor_spec::role;
    const int64_t d = hp.dim, hc = hp.hc_mult, n_mix = (2 + hc) * hc;
    auto add = [&](std::string_view n, std::vector<int64_t> shape, ggml_type t, role r = role::dense) {
        out.push_back({blk(layer, n), std::move(shape), t, r});
    };
    add("attn_norm.weight", {d}, ggml_type::f32);
    add("attn_sinks.weight", {hp.n_heads}, ggml_type::f32);
    add("attn_q_a.weight", {d, hp.q_lora_rank}, p.linear);
    add("attn_q_a_norm.weight", {hp.q_lora_rank}, ggml_type::f32);
    add("attn_q_b.weight", {hp.q_lora_rank, hp.q_dim()}, p.linear);
    add("attn_kv.weight", {d, hp.head_dim}, p.linear);
    add("attn_kv_a_norm.weight", {hp.head_dim}, ggml_type::f32);
    add("attn_output_a.weight", {hp.head_dim * hp.heads_per_group(), hp.o_lora_rank * hp.o_groups}, p.linear);
    add("attn_output_b.weight", {hp.o_lora_rank * hp.o_groups, d}, p.linear);
    for (std::string_view sub : {"attn", "ffn"}) {
        std::string s(sub);
        add("hc_" + s + "_fn.weight", {hc * d, n_mix}, ggml_type::f32);
        add("hc_" + s + "_base.weight", {n_mix}, ggml_type::f32);
        add("hc_" + s + "_scale.weight", {3}, ggml_type::f32);
    }
    add("ffn_norm.weight", {d}, ggml_type::f32);
    add("ffn_gate_inp.weight", {d, n_experts}, p.bf16_weights);
    add("exp_probs_b.bias", {n_experts}, ggml_type::f32);
    const int64_t shared_inter = hp.moe_inter * hp.n_shared;
    add("ffn_gate_shexp.weight", {d, shared_inter}, p.linear);
    add("ffn_up_shexp.weight", {d, shared_inter}, p.linear);
    add("ffn_down_shexp.weight", {shared_inter, d}, p.linear);
}

void add_experts(std::vector<tensor_spec>& out, const hparams& hp, const storage_policy& p, int layer,
                 int n_experts) {
    using role = tensor_spec::role;
    out.push_back({blk(layer, "ffn_gate_exps.weight"), {hp.dim, hp.moe_inter, n_experts}, p.expert, role::expert});
    out.push_back({blk(layer, "ffn_up_exps.weight"), {hp.dim, hp.moe_inter, n_experts}, p.expert, role::expert});
    out.push_back({blk(layer, "ffn_down_exps.weight"), {hp.moe_inter, hp.dim, n_experts}, p.expert, role::expert});
}

}  // namespace

bool hparams::is_kv_source(int layer) const { return contains(kv_source_layers, layer); }
bool hparams::is_index_source(int layer) const { return contains(index_source_layers, layer); }
bool hparams::is_engram_layer(int layer) const { return contains(engram_layers, layer); }

std::vector<std::string_view> preset_names() { return {"tiny", "mini-lite", "mini", "flash"}; }

std::optional<hparams> preset(std::string_view name) {
    if (name == "tiny") return tiny();
    if (name == "mini-lite") return mini(256);
    if (name == "mini") return mini(512);
    if (name == "flash") return flash();
    return std::nullopt;
}

status validate(const hparams& hp) {
    auto bad = [](std::string what) { return make_error("deepseek41 hyper-parameters: " + what); };
    if (hp.dim <= 0 || hp.dim % 32) return bad("dim must be a positive multiple of 32");
    if (hp.n_layers < 1 || hp.n_mtp < 0) return bad("block_count must be >= 1");
    if (int(hp.compress_ratios.size()) != hp.n_layers + hp.n_mtp)
        return bad("compress_ratios has " + std::to_string(hp.compress_ratios.size()) + " entries, expected " +
                   std::to_string(hp.n_layers + hp.n_mtp) + " (layers + DSpark stages)");
    for (int r : hp.compress_ratios)
        if (r != 0 && r != 1 && r != 2) return bad("compress ratios must be 0, 1 or 2");
    if (hp.n_heads <= 0 || hp.o_groups <= 0 || hp.n_heads % hp.o_groups)
        return bad("head_count must be a multiple of output_group_count");
    if (hp.rope_dim <= 0 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2) return bad("rope dims must be even and <= key_length");
    for (int64_t k : {hp.q_lora_rank, hp.head_dim, hp.o_lora_rank, hp.moe_inter, hp.index_head_dim, hp.engram_head_dim})
        if (k <= 0 || k % 32) return bad("every K dimension must be a positive multiple of 32 (got " + std::to_string(k) + ")");
    if (hp.n_active < 1 || hp.n_active > hp.n_experts) return bad("expert_used_count must be in [1, expert_count]");
    if (hp.dspark_n_active < 1 || hp.dspark_n_active > hp.dspark_n_experts) return bad("DSpark top-k must be in [1, experts]");
    for (int l : hp.kv_source_layers)
        if (l < 0 || l >= hp.n_layers || hp.compress_ratios[l] == 0)
            return bad("kv source layer " + std::to_string(l) + " must be a compressed backbone layer");
    for (int l : hp.index_source_layers)
        if (l < 0 || l >= hp.n_layers || hp.compress_ratios[l] == 0)
            return bad("index source layer " + std::to_string(l) + " must be a compressed backbone layer");
    if (!hp.is_kv_source(hp.candidate_source_layer)) return bad("candidate source layer must be a kv source");
    // Every compressed layer must find a kv source at or before it with the same ratio.
    for (int l = 0; l < hp.n_layers; ++l) {
        if (hp.compress_ratios[l] == 0) continue;
        int src = -1;
        for (int s : hp.kv_source_layers)
            if (s <= l) src = std::max(src, s);
        if (src < 0 || hp.compress_ratios[src] != hp.compress_ratios[l])
            return bad("layer " + std::to_string(l) + " has no preceding kv source with its ratio");
    }
    for (int l : hp.engram_layers)
        if (l < 0 || l >= hp.n_layers) return bad("engram layer " + std::to_string(l) + " out of range");
    for (int l : hp.dspark_target_layers)
        if (l < 0 || l >= hp.n_layers) return bad("DSpark target layer " + std::to_string(l) + " out of range");
    if (hp.engram_max_ngram < 2 || hp.engram_n_heads < 1) return bad("engram needs max_ngram >= 2 and heads >= 1");
    if (hp.dspark_noise_token < 0 || hp.dspark_noise_token >= hp.vocab) return bad("DSpark noise token out of the vocabulary");
    return {};
}

int64_t engram_rows(const hparams& hp, size_t engram_index) {
    MS_ASSERT(engram_index < hp.engram_layers.size());
    auto tables = engram::compute_primes(hp.engram_layers, hp.engram_max_ngram, hp.engram_n_heads,
                                         hp.engram_prime_start);
    MS_ASSERT(tables.size() == hp.engram_layers.size());
    return tables[engram_index].rows;
}

std::vector<tensor_spec> target_tensors(const hparams& hp, const storage_policy& p) {
    using role = tensor_spec::role;
    std::vector<tensor_spec> out;
    const int64_t d = hp.dim;
    out.push_back({"token_embd.weight", {d, hp.vocab}, p.embedding});
    out.push_back({"output_norm.weight", {d}, ggml_type::f32});
    out.push_back({"output.weight", {d, hp.vocab}, p.embedding});
    const int64_t n_eng = int64_t(hp.engram_layers.size());
    out.push_back({"engram_token_map.weight", {hp.vocab}, ggml_type::i32, role::side_table});
    out.push_back({"engram_primes.weight", {hp.engram_columns(), n_eng}, ggml_type::i64, role::side_table});
    out.push_back({"engram_offsets.weight", {hp.engram_columns(), n_eng}, ggml_type::i64, role::side_table});
    out.push_back({"engram_multipliers.weight", {hp.engram_max_ngram, n_eng}, ggml_type::i64, role::side_table});
    for (int l = 0; l < hp.n_layers; ++l) {
        add_block(out, hp, p, l, hp.n_experts);
        const int ratio = hp.compress_ratios[l];
        if (hp.is_kv_source(l)) {
            out.push_back({blk(l, "attn_compressor_kv.weight"), {d, hp.head_dim}, p.bf16_weights});
            if (ratio == 2) out.push_back({blk(l, "attn_compressor_gate.weight"), {d, hp.head_dim}, p.bf16_weights});
            out.push_back({blk(l, "attn_compressor_norm.weight"), {hp.head_dim}, ggml_type::f32});
            out.push_back({blk(l, "indexer.attn_k.weight"), {hp.head_dim, hp.index_head_dim}, p.bf16_weights});
            out.push_back({blk(l, "indexer.k_norm.weight"), {hp.index_head_dim}, ggml_type::f32});
        }
        if (hp.is_index_source(l)) {
            out.push_back({blk(l, "indexer.attn_q_b.weight"), {hp.q_lora_rank, hp.index_n_heads * hp.index_head_dim}, p.linear});
            out.push_back({blk(l, "indexer.proj.weight"), {d, hp.index_n_heads}, p.bf16_weights});
        }
        if (hp.is_engram_layer(l)) {
            const int64_t cols = hp.engram_columns() * hp.engram_head_dim;
            out.push_back({blk(l, "engram_wkv.weight"), {cols, (hp.hc_mult + 1) * d}, p.linear});
            out.push_back({blk(l, "engram_q.weight"), {d, hp.hc_mult}, p.bf16_weights});
            out.push_back({blk(l, "engram_k.weight"), {d, hp.hc_mult}, p.bf16_weights});
        }
    }
    for (int l = 0; l < hp.n_layers; ++l) add_experts(out, hp, p, l, hp.n_experts);
    for (size_t e = 0; e < hp.engram_layers.size(); ++e) {
        const int l = hp.engram_layers[e];
        const int64_t rows = engram_rows(hp, e);
        out.push_back({blk(l, "engram_embd.weight"), {hp.engram_head_dim, rows}, ggml_type::i8, role::engram_table});
        out.push_back({blk(l, "engram_embd_scale.weight"), {hp.engram_head_dim / 32, rows}, ggml_type::i8, role::engram_table});
    }
    return out;
}

std::vector<tensor_spec> draft_tensors(const hparams& hp, const storage_policy& p) {
    std::vector<tensor_spec> out;
    const int64_t d = hp.dim;
    out.push_back({"fc.weight", {3 * d, d}, p.linear});
    out.push_back({"enc.output_norm.weight", {d}, ggml_type::f32});
    out.push_back({"output_norm.weight", {d}, ggml_type::f32});
    out.push_back({"markov_w1.weight", {hp.dspark_markov_rank, hp.vocab}, p.embedding});
    out.push_back({"markov_w2.weight", {hp.dspark_markov_rank, hp.vocab}, p.embedding});
    out.push_back({"conf_proj.weight", {d + hp.dspark_markov_rank, 1}, ggml_type::f32});
    for (int s = 0; s < hp.n_mtp; ++s) add_block(out, hp, p, s, hp.dspark_n_experts);
    for (int s = 0; s < hp.n_mtp; ++s) add_experts(out, hp, p, s, hp.dspark_n_experts);
    return out;
}

int64_t expert_bytes(const hparams& hp, ggml_type type, bool draft) {
    (void)draft;  // same expert shape in the target and the draft (§2.3)
    const auto& t = dtype_info(type);
    return 3 * hp.moe_inter * row_bytes(t, hp.dim);  // gate and up rows of dim; down has dim rows of moe_inter
}

}  // namespace moestream::dsv41
