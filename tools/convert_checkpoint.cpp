#include "tools/convert_checkpoint.h"

#include <simdjson.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "model/engram_tables.h"
#include "model/quant.h"
#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "storage/gguf.h"
#include "storage/safetensors.h"

namespace moestream::convert {
namespace {

namespace fs = std::filesystem;
using safetensors::dtype;

// ---- config.json ------------------------------------------------------------------------------
struct config_reader {
    std::string file;
    simdjson::dom::object root;

    error bad(std::string_view key, std::string_view what) const {
        return make_error(file + ": field '" + std::string(key) + "' " + std::string(what));
    }
    template <class T>
    status integer(std::string_view key, T& out) const {
        int64_t v = 0;
        auto el = root[key];
        if (el.error() == simdjson::NO_SUCH_FIELD) return bad(key, "is missing");
        if (el.get(v) != simdjson::SUCCESS) return bad(key, "must be an integer");
        out = T(v);
        return {};
    }
    status real(std::string_view key, double& out) const {
        auto el = root[key];
        if (el.error() == simdjson::NO_SUCH_FIELD) return bad(key, "is missing");
        double d = 0;
        int64_t i = 0;
        if (el.get(d) == simdjson::SUCCESS) out = d;
        else if (el.get(i) == simdjson::SUCCESS) out = double(i);
        else return bad(key, "must be a number");
        return {};
    }
    status boolean(std::string_view key, bool& out) const {
        auto el = root[key];
        if (el.error() == simdjson::NO_SUCH_FIELD) return bad(key, "is missing");
        if (el.get(out) != simdjson::SUCCESS) return bad(key, "must be a boolean");
        return {};
    }
    status ints(std::string_view key, std::vector<int>& out) const {
        simdjson::dom::array arr;
        auto el = root[key];
        if (el.error() == simdjson::NO_SUCH_FIELD) return bad(key, "is missing");
        if (el.get(arr) != simdjson::SUCCESS) return bad(key, "must be an array of integers");
        out.clear();
        for (auto v : arr) {
            int64_t i = 0;
            if (v.get(i) != simdjson::SUCCESS) return bad(key, "must be an array of integers");
            out.push_back(int(i));
        }
        return {};
    }
};

result<dsv41::hparams> parse_config(const config_reader& r) {
    dsv41::hparams hp;
    MS_TRY(r.integer("vocab_size", hp.vocab));
    MS_TRY(r.integer("dim", hp.dim));
    MS_TRY(r.integer("n_layers", hp.n_layers));
    MS_TRY(r.integer("n_mtp_layers", hp.n_mtp));
    MS_TRY(r.integer("n_heads", hp.n_heads));
    MS_TRY(r.integer("head_dim", hp.head_dim));
    MS_TRY(r.integer("rope_head_dim", hp.rope_dim));
    MS_TRY(r.integer("q_lora_rank", hp.q_lora_rank));
    MS_TRY(r.integer("o_groups", hp.o_groups));
    MS_TRY(r.integer("o_lora_rank", hp.o_lora_rank));
    MS_TRY(r.integer("window_size", hp.window));
    MS_TRY(r.ints("compress_ratios", hp.compress_ratios));
    MS_TRY(r.ints("kv_source_layers", hp.kv_source_layers));
    MS_TRY(r.ints("index_source_layers", hp.index_source_layers));
    MS_TRY(r.integer("candidate_source_layer", hp.candidate_source_layer));
    MS_TRY(r.integer("candidate_topk_blocks", hp.candidate_topk_blocks));
    MS_TRY(r.integer("candidate_block_size", hp.candidate_block_size));
    MS_TRY(r.integer("index_n_heads", hp.index_n_heads));
    MS_TRY(r.integer("index_head_dim", hp.index_head_dim));
    MS_TRY(r.integer("index_topk", hp.index_topk));
    MS_TRY(r.real("rope_theta", hp.rope_theta));
    MS_TRY(r.real("compress_rope_theta", hp.compress_rope_theta));
    MS_TRY(r.real("rope_factor", hp.rope_factor));
    MS_TRY(r.integer("original_seq_len", hp.original_seq_len));
    MS_TRY(r.real("beta_fast", hp.beta_fast));
    MS_TRY(r.real("beta_slow", hp.beta_slow));
    MS_TRY(r.real("norm_eps", hp.norm_eps));
    MS_TRY(r.integer("hc_mult", hp.hc_mult));
    MS_TRY(r.integer("hc_sinkhorn_iters", hp.hc_sinkhorn_iters));
    MS_TRY(r.real("hc_eps", hp.hc_eps));
    MS_TRY(r.integer("n_routed_experts", hp.n_experts));
    MS_TRY(r.integer("n_activated_experts", hp.n_active));
    MS_TRY(r.integer("n_shared_experts", hp.n_shared));
    MS_TRY(r.integer("moe_inter_dim", hp.moe_inter));
    MS_TRY(r.real("route_scale", hp.route_scale));
    MS_TRY(r.boolean("norm_topk_prob", hp.norm_topk));
    MS_TRY(r.real("swiglu_limit", hp.swiglu_limit));
    MS_TRY(r.ints("engram_layer_ids", hp.engram_layers));
    MS_TRY(r.integer("engram_max_ngram_size", hp.engram_max_ngram));
    MS_TRY(r.integer("engram_n_heads", hp.engram_n_heads));
    MS_TRY(r.integer("engram_head_dim", hp.engram_head_dim));
    MS_TRY(r.integer("engram_vocab_size", hp.engram_prime_start));
    MS_TRY(r.integer("engram_pad_id", hp.engram_pad_id));
    MS_TRY(r.integer("dspark_n_routed_experts", hp.dspark_n_experts));
    MS_TRY(r.integer("dspark_n_activated_experts", hp.dspark_n_active));
    MS_TRY(r.integer("dspark_markov_rank", hp.dspark_markov_rank));
    MS_TRY(r.integer("dspark_block_size", hp.dspark_block_size));
    MS_TRY(r.integer("dspark_noise_token_id", hp.dspark_noise_token));
    MS_TRY(r.ints("dspark_target_layer_ids", hp.dspark_target_layers));
    // The reference's max_seq_len is a batch-buffer size, not the model's context: keep the
    // released context length (hparams default).
    if (auto v = dsv41::validate(hp); !v) return make_error(r.file + ": " + v.message());
    std::vector<int> rows;
    if (r.ints("engram_num_embeddings", rows)) {
        for (size_t e = 0; e < rows.size() && e < hp.engram_layers.size(); ++e)
            if (rows[e] != dsv41::engram_rows(hp, e))
                return r.bad("engram_num_embeddings", "disagrees with the primes from engram_vocab_size (" +
                                                          std::to_string(rows[e]) + " vs " +
                                                          std::to_string(dsv41::engram_rows(hp, e)) + ")");
    }
    return hp;
}

// ---- tensor sources -----------------------------------------------------------------------------
// One reference tensor (and its e8m0 `.scale` sibling for fp8/fp4 storage).
struct source {
    const safetensors::tensor* w = nullptr;
    const safetensors::tensor* scale = nullptr;
};

struct stats {
    int64_t mxfp4_blocks = 0;
    int64_t mxfp4_identical = 0;
    int64_t fp8_tensors = 0;
};

std::string shape_str(const std::vector<int64_t>& s, bool braces) {
    std::string o = braces ? "{" : "[";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + (braces ? "}" : "]");
}

// Reference [out, in, ...] is ggml {in, out}: reversed.
std::vector<int64_t> reversed(std::vector<int64_t> s) { return {s.rbegin(), s.rend()}; }

bool is_float(dtype t) { return t == dtype::f32 || t == dtype::bf16 || t == dtype::f16; }

// Finds `name`, checks its shape against the ggml shape `ne`, and attaches the scale sibling when
// the storage is quantized. Errors name the reference and the GGUF tensor.
result<source> resolve(const safetensors::file& f, const std::string& name, const std::vector<int64_t>& ne,
                       const std::string& gguf_name) {
    auto bad = [&](const std::string& what) {
        return make_error(f.path() + ": tensor '" + name + "' (for " + gguf_name + "): " + what);
    };
    source s;
    s.w = f.find(name);
    if (!s.w) return bad("missing from the checkpoint");
    if (reversed(s.w->shape) != ne)
        return bad("shape " + shape_str(s.w->shape, false) + " does not match the inventory " + shape_str(ne, true) +
                   " (reference order [out, in])");
    if (is_float(s.w->type)) return s;
    if (s.w->type != dtype::f8_e4m3 && s.w->type != dtype::f4)
        return bad("unsupported dtype " + std::string(safetensors::dtype_name(s.w->type)));
    std::string sname = name.ends_with(".weight") ? name.substr(0, name.size() - 7) + ".scale" : name + ".scale";
    s.scale = f.find(sname);
    if (!s.scale) return bad("quantized weight without its scale tensor '" + sname + "'");
    if (s.scale->type != dtype::f8_e8m0 && s.scale->type != dtype::u8)
        return bad("scale '" + sname + "' has dtype " + std::string(safetensors::dtype_name(s.scale->type)) +
                   " (expected F8_E8M0 or U8)");
    const int64_t rows = s.w->shape.empty() ? 1 : s.w->shape[0];
    const int64_t cols = s.w->elements() / std::max<int64_t>(rows, 1);
    std::vector<int64_t> want = s.w->type == dtype::f4 ? std::vector<int64_t>{rows, cols / 32}
                                                       : std::vector<int64_t>{(rows + 31) / 32, (cols + 31) / 32};
    if (s.w->shape.size() != 2 || s.scale->shape != want)
        return bad("scale '" + sname + "' has shape " + shape_str(s.scale->shape, false) + ", expected " +
                   shape_str(want, false));
    return s;
}

const uint8_t* u8(std::span<const std::byte> b) { return reinterpret_cast<const uint8_t*>(b.data()); }

// The source as fp32 [rows, cols].
std::vector<float> load_f32(const safetensors::file& f, const source& s, int64_t rows, int64_t cols) {
    std::vector<float> out(size_t(rows * cols));
    const auto bytes = f.data(*s.w);
    switch (s.w->type) {
        case dtype::f32: std::memcpy(out.data(), bytes.data(), out.size() * 4); break;
        case dtype::bf16:
        case dtype::f16:
            for (size_t i = 0; i < out.size(); ++i) {
                uint16_t h;
                std::memcpy(&h, bytes.data() + 2 * i, 2);
                out[i] = s.w->type == dtype::bf16 ? quant::bf16_to_f32(h) : quant::f16_to_f32(h);
            }
            break;
        case dtype::f8_e4m3:
            // 32x32 tiles: the release's block size (128x128 silently mis-scales, §4.3).
            quant::dequantize_fp8_tiled(u8(bytes), u8(f.data(*s.scale)), rows, cols, 32, out.data());
            break;
        case dtype::f4: quant::dequantize_fp4_checkpoint(u8(bytes), u8(f.data(*s.scale)), rows, cols, out.data()); break;
        default: MS_ASSERT_MSG(false, "resolve() let an unsupported dtype through");
    }
    return out;
}

// rows of `cols` fp32 values -> rows of the GGUF type.
void encode(ggml_type type, const std::vector<float>& src, int64_t rows, int64_t cols, std::byte* dst) {
    const int64_t rb = row_bytes(dtype_info(type), cols);
    for (int64_t r = 0; r < rows; ++r) {
        const float* in = src.data() + r * cols;
        std::byte* out = dst + r * rb;
        if (type == ggml_type::f32) {
            std::memcpy(out, in, size_t(cols) * 4);
        } else if (type == ggml_type::bf16) {
            for (int64_t i = 0; i < cols; ++i) {
                uint16_t h = quant::f32_to_bf16(in[i]);
                std::memcpy(out + 2 * i, &h, 2);
            }
        } else {
            quant::quantize_row(type, in, out, cols);
        }
    }
}

// One matrix [rows, cols] into `dst`, losslessly repacking fp4 into MXFP4 when possible.
void convert_matrix(const safetensors::file& f, const source& s, ggml_type type, int64_t rows, int64_t cols,
                    std::byte* dst, stats& st) {
    if (s.w->type == dtype::f4 && type == ggml_type::mxfp4) {
        const auto w = f.data(*s.w);
        const auto sc = f.data(*s.scale);
        quant::repack_fp4_to_mxfp4(u8(w), u8(sc), rows, cols, dst);
        // Verify by unpacking: a block counts as identical when its 16 value bytes and its scale
        // come back unchanged.
        std::vector<uint8_t> w2(w.size()), s2(sc.size());
        quant::unpack_mxfp4_to_fp4(dst, rows, cols, w2.data(), s2.data());
        for (int64_t b = 0; b < rows * cols / 32; ++b) {
            ++st.mxfp4_blocks;
            if (std::memcmp(w2.data() + b * 16, u8(w) + b * 16, 16) == 0 && s2[size_t(b)] == u8(sc)[b])
                ++st.mxfp4_identical;
        }
        return;
    }
    if (s.w->type == dtype::f8_e4m3) ++st.fp8_tensors;
    encode(type, load_f32(f, s, rows, cols), rows, cols, dst);
}

// ---- name mapping ---------------------------------------------------------------------------------
struct name_map_entry {
    std::string_view gguf;
    std::string_view ref;
};
constexpr name_map_entry kBlockNames[] = {
    {"attn_norm.weight", "attn_norm.weight"},
    {"attn_sinks.weight", "attn.attn_sink"},
    {"attn_q_a.weight", "attn.wq_a.weight"},
    {"attn_q_a_norm.weight", "attn.q_norm.weight"},
    {"attn_q_b.weight", "attn.wq_b.weight"},
    {"attn_kv.weight", "attn.wkv.weight"},
    {"attn_kv_a_norm.weight", "attn.kv_norm.weight"},
    {"attn_output_a.weight", "attn.wo_a.weight"},
    {"attn_output_b.weight", "attn.wo_b.weight"},
    {"hc_attn_fn.weight", "hc_attn_fn"},
    {"hc_attn_base.weight", "hc_attn_base"},
    {"hc_attn_scale.weight", "hc_attn_scale"},
    {"hc_ffn_fn.weight", "hc_ffn_fn"},
    {"hc_ffn_base.weight", "hc_ffn_base"},
    {"hc_ffn_scale.weight", "hc_ffn_scale"},
    {"ffn_norm.weight", "ffn_norm.weight"},
    {"ffn_gate_inp.weight", "ffn.gate.weight"},
    {"exp_probs_b.bias", "ffn.gate.bias"},
    {"ffn_gate_shexp.weight", "ffn.shared_experts.w1.weight"},
    {"ffn_up_shexp.weight", "ffn.shared_experts.w3.weight"},
    {"ffn_down_shexp.weight", "ffn.shared_experts.w2.weight"},
    {"attn_compressor_kv.weight", "attn.compressor.wkv.weight"},
    {"attn_compressor_gate.weight", "attn.compressor.wgate.weight"},
    {"attn_compressor_norm.weight", "attn.compressor.norm.weight"},
    {"indexer.attn_k.weight", "attn.indexer.wk.weight"},
    {"indexer.k_norm.weight", "attn.indexer.k_norm.weight"},
    {"indexer.attn_q_b.weight", "attn.indexer.wq_b.weight"},
    {"indexer.proj.weight", "attn.indexer.weights_proj.weight"},
    {"engram_wkv.weight", "engram.wkv.weight"},
    {"engram_q.weight", "engram.q_weight"},
    {"engram_k.weight", "engram.k_weight"},
    {"engram_embd.weight", "engram.embed.weight"},
    {"engram_embd_scale.weight", "engram.embed.scale"},
    {"ffn_gate_exps.weight", "ffn.experts.{}.w1.weight"},
    {"ffn_up_exps.weight", "ffn.experts.{}.w3.weight"},
    {"ffn_down_exps.weight", "ffn.experts.{}.w2.weight"},
};

// GGUF name -> reference name ("{}" stands for the expert index), or nullopt if unknown.
std::optional<std::string> reference_name(const std::string& gguf, bool draft, int n_mtp) {
    const std::string last = "mtp." + std::to_string(n_mtp - 1) + ".";
    if (!draft) {
        if (gguf == "token_embd.weight") return "embed.weight";
        if (gguf == "output.weight") return "head.weight";
        if (gguf == "output_norm.weight") return "norm.weight";
    } else {
        if (gguf == "fc.weight") return "mtp.0.main_proj.weight";
        if (gguf == "enc.output_norm.weight") return "mtp.0.main_norm.weight";
        if (gguf == "output_norm.weight") return last + "norm.weight";
        if (gguf == "markov_w1.weight") return last + "markov_head.embed.weight";
        if (gguf == "markov_w2.weight") return last + "markov_head.head.weight";
        if (gguf == "conf_proj.weight") return last + "confidence_head.proj.weight";
    }
    if (!gguf.starts_with("blk.")) return std::nullopt;
    const size_t dot = gguf.find('.', 4);
    if (dot == std::string::npos) return std::nullopt;
    const std::string layer = gguf.substr(4, dot - 4), rest = gguf.substr(dot + 1);
    for (const auto& e : kBlockNames)
        if (e.gguf == rest) return (draft ? "mtp." : "layers.") + layer + "." + std::string(e.ref);
    return std::nullopt;
}

std::string expert_name(const std::string& pattern, int64_t e) {
    std::string s = pattern;
    s.replace(s.find("{}"), 2, std::to_string(e));
    return s;
}

// ---- engram side tables -------------------------------------------------------------------------
struct side_tables {
    std::vector<int32_t> token_map;
    std::vector<int64_t> primes, offsets, multipliers;
};

result<std::vector<int64_t>> read_i64(const safetensors::file& f, std::string_view name, int64_t count) {
    const auto* t = f.find(name);
    if (!t) return make_error(f.path() + ": tensor '" + std::string(name) + "' is missing");
    if (t->type != dtype::i64 || t->elements() != count)
        return make_error(f.path() + ": tensor '" + std::string(name) + "' must be I64 with " +
                          std::to_string(count) + " elements (got " + std::string(safetensors::dtype_name(t->type)) +
                          " " + shape_str(t->shape, false) + ")");
    std::vector<int64_t> v(static_cast<size_t>(count));
    std::memcpy(v.data(), f.data(*t).data(), v.size() * 8);
    return v;
}

// The release ships no engram tables: compute them as the reference does at load, the token map
// from the checkpoint's tokenizer.json and the multipliers from numpy's stream.
result<side_tables> compute_side_tables(const std::string& dir, const dsv41::hparams& hp, side_tables st,
                                        const log_fn& log) {
    const std::string tok_json = dir + "/tokenizer.json";
    if (!fs::exists(tok_json))
        return make_error(dir + ": neither engram_tables.safetensors nor tokenizer.json: the engram token map "
                                "cannot be built");
    auto data = load_hf_tokenizer(tok_json, hp.vocab);
    if (!data) return data.err();
    auto tok = tokenizer::create(std::move(*data));
    if (!tok) return make_error(tok_json + ": " + tok.message());
    auto map = engram::token_map_from_tokenizer(*tok, hp.engram_pad_id);
    if (!map) return make_error(tok_json + ": " + map.message());
    st.token_map = map->map;
    for (int l : hp.engram_layers) {
        auto m = engram::hash_multipliers(l, hp.engram_max_ngram, map->compressed_vocab);
        st.multipliers.insert(st.multipliers.end(), m.begin(), m.end());
    }
    log("engram tables: computed from " + tok_json + " (compressed vocabulary " +
        std::to_string(map->compressed_vocab) + ")");
    return st;
}

result<side_tables> load_side_tables(const std::string& dir, const dsv41::hparams& hp, const log_fn& log) {
    const auto computed = engram::compute_primes(hp.engram_layers, hp.engram_max_ngram, hp.engram_n_heads,
                                                 hp.engram_prime_start);
    side_tables st;
    for (const auto& l : computed) {
        st.primes.insert(st.primes.end(), l.primes.begin(), l.primes.end());
        st.offsets.insert(st.offsets.end(), l.offsets.begin(), l.offsets.end());
    }
    const std::string path = dir + "/engram_tables.safetensors";
    if (!fs::exists(path)) return compute_side_tables(dir, hp, std::move(st), log);
    auto f = safetensors::file::open(path);
    if (!f) return f.err();
    const int64_t n_eng = int64_t(hp.engram_layers.size());
    auto primes = read_i64(*f, "primes", n_eng * hp.engram_columns());
    if (!primes) return primes.err();
    auto offsets = read_i64(*f, "offsets", n_eng * hp.engram_columns());
    if (!offsets) return offsets.err();
    if (*primes != st.primes) return make_error(path + ": primes differ from the ones computed from config.json");
    if (*offsets != st.offsets) return make_error(path + ": offsets differ from the ones computed from config.json");
    auto mult = read_i64(*f, "multipliers", n_eng * hp.engram_max_ngram);
    if (!mult) return mult.err();
    st.multipliers = *mult;
    auto map = read_i64(*f, "token_map", hp.vocab);
    if (!map) return map.err();
    for (int64_t v : *map) st.token_map.push_back(int32_t(v));
    // The stored multipliers must be the reference's for this compressed vocabulary.
    const int64_t compressed = int64_t(std::set<int64_t>(map->begin(), map->end()).size());
    std::vector<int64_t> expected;
    for (int l : hp.engram_layers) {
        auto m = engram::hash_multipliers(l, hp.engram_max_ngram, compressed);
        expected.insert(expected.end(), m.begin(), m.end());
    }
    if (expected != st.multipliers)
        return make_error(path + ": multipliers differ from numpy's default_rng(10007*layer) values for a compressed "
                                 "vocabulary of " + std::to_string(compressed));
    log("engram tables: " + path + " (primes and offsets match the computed ones; token map of " +
        std::to_string(map->size()) + " = vocab entries)");
    return st;
}

// ---- planning and writing -----------------------------------------------------------------------
struct plan_item {
    dsv41::tensor_spec spec;
    std::vector<source> src;        // one per expert for expert tensors, else one
    const std::vector<int64_t>* side = nullptr;  // side tables: i64 values
    const std::vector<int32_t>* side32 = nullptr;
};

// The storage type of one tensor: the inventory's, except that float sources are never made
// lossier than they are unless asked (a bf16 checkpoint stays exact, an fp32 tensor stays fp32),
// and --lossless keeps fp8 weights as BF16 (e4m3 x 2^k is exact in bf16) instead of Q8_0.
ggml_type storage_type(const dsv41::tensor_spec& spec, const source& s, const options& opts) {
    const bool quantized = spec.type == ggml_type::q8_0 || spec.type == ggml_type::mxfp4;
    switch (s.w->type) {
        case dtype::f32:
            if (opts.quantize_float && quantized) return spec.type;
            return ggml_type::f32;
        case dtype::bf16:
        case dtype::f16:
            if (opts.quantize_float && quantized) return spec.type;
            if (spec.type == ggml_type::f32) return ggml_type::f32;
            return s.w->type == dtype::bf16 ? ggml_type::bf16 : ggml_type::f16;
        case dtype::f8_e4m3: return opts.lossless && spec.type == ggml_type::q8_0 ? ggml_type::bf16 : spec.type;
        default: return spec.type;
    }
}

result<std::vector<plan_item>> make_plan(const safetensors::file& f, const dsv41::hparams& hp, bool draft,
                                         const side_tables* side, const options& opts) {
    std::vector<plan_item> plan;
    const auto specs = draft ? dsv41::draft_tensors(hp) : dsv41::target_tensors(hp);
    for (const auto& spec : specs) {
        plan_item it{spec, {}};
        if (spec.kind == dsv41::tensor_spec::role::side_table) {
            MS_ASSERT(side != nullptr);
            if (spec.name == "engram_token_map.weight") it.side32 = &side->token_map;
            else if (spec.name == "engram_primes.weight") it.side = &side->primes;
            else if (spec.name == "engram_offsets.weight") it.side = &side->offsets;
            else if (spec.name == "engram_multipliers.weight") it.side = &side->multipliers;
            else return make_error("inventory side table '" + spec.name + "' has no source in the converter");
            plan.push_back(std::move(it));
            continue;
        }
        auto ref = reference_name(spec.name, draft, hp.n_mtp);
        if (!ref) return make_error("inventory tensor '" + spec.name + "' has no reference name mapping");
        if (spec.kind == dsv41::tensor_spec::role::expert) {
            const std::vector<int64_t> ne{spec.shape[0], spec.shape[1]};
            for (int64_t e = 0; e < spec.shape[2]; ++e) {
                auto s = resolve(f, expert_name(*ref, e), ne, spec.name);
                if (!s) return s.err();
                it.src.push_back(*s);
            }
            it.spec.type = storage_type(spec, it.src.front(), opts);
        } else if (spec.kind == dsv41::tensor_spec::role::engram_table) {
            // Raw e4m3 / e8m0 bytes stored as I8: no scale sibling, exact byte copy.
            const auto* t = f.find(*ref);
            const dtype want = spec.name.ends_with("_scale.weight") ? dtype::f8_e8m0 : dtype::f8_e4m3;
            if (!t) return make_error(f.path() + ": tensor '" + *ref + "' (for " + spec.name + ") missing");
            if (t->type != want && !(want == dtype::f8_e8m0 && t->type == dtype::u8))
                return make_error(f.path() + ": tensor '" + *ref + "' (for " + spec.name + ") has dtype " +
                                  std::string(safetensors::dtype_name(t->type)) + ", expected " +
                                  std::string(safetensors::dtype_name(want)));
            if (reversed(t->shape) != spec.shape)
                return make_error(f.path() + ": tensor '" + *ref + "' shape " + shape_str(t->shape, false) +
                                  " does not match the inventory " + shape_str(spec.shape, true) + " of " + spec.name);
            it.src.push_back({t, nullptr});
        } else {
            auto s = resolve(f, *ref, spec.shape, spec.name);
            if (!s) return s.err();
            it.src.push_back(*s);
            it.spec.type = storage_type(spec, *s, opts);
        }
        plan.push_back(std::move(it));
    }
    return plan;
}

void fill(const safetensors::file& f, const plan_item& it, std::span<std::byte> out, stats& st) {
    const auto& s = it.spec;
    if (it.side) return (void)std::memcpy(out.data(), it.side->data(), out.size());
    if (it.side32) return (void)std::memcpy(out.data(), it.side32->data(), out.size());
    if (s.kind == dsv41::tensor_spec::role::engram_table) {
        MS_ASSERT(f.data(*it.src[0].w).size() == out.size());
        std::memcpy(out.data(), f.data(*it.src[0].w).data(), out.size());
        return;
    }
    const int64_t cols = s.shape[0];
    const int64_t rows = s.shape.size() > 1 ? s.shape[1] : 1;
    const int64_t per = rows * row_bytes(dtype_info(s.type), cols);
    MS_ASSERT(int64_t(it.src.size()) * per == int64_t(out.size()));
    for (size_t e = 0; e < it.src.size(); ++e)
        convert_matrix(f, it.src[e], s.type, rows, cols, out.data() + int64_t(e) * per, st);
}

// Reference tensors no inventory tensor reads (printed so a missing mapping is visible).
std::vector<std::string> unused(const safetensors::file& f, const std::vector<plan_item>& a,
                                const std::vector<plan_item>& b, bool with_draft) {
    std::set<const safetensors::tensor*> used;
    for (const auto* plan : {&a, &b})
        for (const auto& it : *plan)
            for (const auto& s : it.src) used.insert(s.w), used.insert(s.scale);
    std::vector<std::string> out;
    for (const auto& t : f.tensors()) {
        if (used.count(&t) || t.name.ends_with(".bias_vl")) continue;  // bias_vl: not used by V4.1 inference
        if (!with_draft && t.name.starts_with("mtp.")) continue;
        out.push_back(t.name);
    }
    return out;
}

result<std::vector<std::string>> write_file(const safetensors::file& f, const std::vector<plan_item>& plan,
                                            std::vector<gguf::kv> md, const std::string& path, uint32_t shards,
                                            stats& st) {
    gguf::writer w(gguf::writer_options{.alignment = 4096, .shards = shards});
    for (auto& kv : md) w.set(kv.key, std::move(kv.val));
    for (const auto& it : plan) {
        const plan_item* p = &it;
        w.add_tensor(it.spec.name, it.spec.type, it.spec.shape,
                     [&f, p, &st](std::span<std::byte> out) { fill(f, *p, out, st); });
    }
    return w.write(path);
}

status verify(const std::string& path, const dsv41::hparams& hp, bool draft) {
    auto mf = gguf::model_file::open(path);
    if (!mf) return mf.err();
    // Inventory first (with the config's hparams), then the loader's own reading of the metadata.
    MS_TRY(check_tensors(*mf, hp, draft));
    auto back = read_hparams(*mf);
    if (!back) return make_error("tensors match the inventory, but read_hparams rejects the file: " + back.message());
    return {};
}

}  // namespace

result<dsv41::hparams> read_config(const std::string& config_path) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (!fs::exists(config_path)) return make_error(config_path + ": no such file");
    if (parser.load(config_path).get(doc) != simdjson::SUCCESS) return make_error(config_path + ": not valid JSON");
    config_reader r{config_path, {}};
    if (doc.get(r.root) != simdjson::SUCCESS) return make_error(config_path + ": not a JSON object");
    return parse_config(r);
}

// An optional integer field of config.json (nullopt when absent or not an integer).
std::optional<int64_t> optional_config_int(const std::string& path, const char* key) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (parser.load(path).get(root) != simdjson::SUCCESS) return std::nullopt;
    int64_t v = 0;
    if (root[key].get(v) != simdjson::SUCCESS) return std::nullopt;
    return v;
}

status convert_checkpoint(const options& opts, const log_fn& log) {
    const std::string& dir = opts.checkpoint_dir;
    if (!fs::is_directory(dir)) return make_error(dir + ": not a checkpoint folder");
    auto hp = read_config(dir + "/config.json");
    if (!hp) return hp.err();
    auto f = safetensors::file::open(dir + "/model.safetensors");
    if (!f) return f.err();
    log("checkpoint: " + dir + " (" + std::to_string(f->tensors().size()) + " reference tensors, vocab " +
        std::to_string(hp->vocab) + ")");
    auto side = load_side_tables(dir, *hp, log);
    if (!side) return side.err();

    // Plan both files first: every presence/dtype/shape problem is reported before writing.
    auto target = make_plan(*f, *hp, false, &*side, opts);
    if (!target) return target.err();
    std::vector<plan_item> draft;
    if (!opts.draft_out.empty()) {
        auto d = make_plan(*f, *hp, true, nullptr, opts);
        if (!d) return d.err();
        draft = std::move(*d);
    }
    for (const auto& n : unused(*f, *target, draft, !opts.draft_out.empty()))
        log("note: reference tensor '" + n + "' is not part of the inventory (not converted)");

    std::vector<gguf::kv> md = target_metadata(*hp);
    md.push_back({"general.name", gguf::value::str("deepseek41 converted from " + fs::path(dir).filename().string())});
    int64_t compressed = 0;
    {
        std::set<int32_t> keys(side->token_map.begin(), side->token_map.end());
        compressed = int64_t(keys.size());
    }
    // A token map built from another tokenizer than the checkpoint's would hash every n-gram to
    // other rows, silently: the config's count is the check.
    if (auto want = optional_config_int(dir + "/config.json", "engram_compressed_vocab_size"); want && *want != compressed)
        return make_error(dir + "/config.json: engram_compressed_vocab_size is " + std::to_string(*want) +
                          " but the engram token map has " + std::to_string(compressed) + " distinct keys (" +
                          (fs::exists(dir + "/engram_tables.safetensors") ? "engram_tables.safetensors"
                                                                          : "computed from tokenizer.json") +
                          "): is it the checkpoint's own tokenizer?");
    md.push_back({"deepseek41.engram_compressed_vocab_size", gguf::value::u32(uint32_t(compressed))});
    const std::string tok_json = dir + "/tokenizer.json";
    if (fs::exists(tok_json)) {
        auto tok = load_hf_tokenizer(tok_json, hp->vocab);
        if (!tok) return tok.err();
        append_tokenizer_metadata(md, *tok);
        log("tokenizer: " + tok_json);
    } else {
        log("tokenizer: none (no tokenizer.json in the checkpoint folder): written without tokenizer.* keys");
    }

    stats st;
    auto written = write_file(*f, *target, std::move(md), opts.out, opts.shards, st);
    if (!written) return written.err();
    if (!opts.draft_out.empty()) {
        auto dw = write_file(*f, draft, draft_metadata(*hp), opts.draft_out, 1, st);
        if (!dw) return dw.err();
    }
    if (st.mxfp4_blocks)
        log("mxfp4 repack: " + std::to_string(st.mxfp4_identical) + "/" + std::to_string(st.mxfp4_blocks) +
            " blocks bit-identical");
    else
        log("mxfp4: experts quantized from floating point (no fp4 in the checkpoint)");
    if (st.mxfp4_identical != st.mxfp4_blocks) return make_error("mxfp4 repack is not lossless");
    if (st.fp8_tensors) log("fp8 -> Q8_0: " + std::to_string(st.fp8_tensors) + " matrices (32x32 e8m0 tiles)");

    MS_TRY(verify(written->front(), *hp, false));
    log("wrote " + opts.out + " (" + std::to_string(target->size()) + " tensors): checked");
    if (!opts.draft_out.empty()) {
        MS_TRY(verify(opts.draft_out, *hp, true));
        log("wrote " + opts.draft_out + " (" + std::to_string(draft.size()) + " tensors): checked");
    }
    return {};
}

}  // namespace moestream::convert
