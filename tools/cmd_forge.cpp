// moestream forge: a deterministic synthetic deepseek41 model (and optionally its DSpark head)
// with the real DeepSeek tokenizer. Same seed, same bytes.
#include <sys/statvfs.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "config/config.h"
#include "model/engram_tables.h"
#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "storage/gguf.h"
#include "tools/command.h"
#include "tools/forge_weights.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "forge";

const cli::option_spec kOptions[] = {
    {"preset", "NAME", "tiny, mini-lite, mini or flash (flash = the real shapes, for planning)"},
    {"out", "FILE.gguf", "target model file to write"},
    {"draft-out", "FILE.gguf", "also write the matching DSpark draft head (arch dflash)"},
    {"seed", "N", "random seed (default 1); the same seed gives the same bytes"},
    {"shards", "N", "split the target into N files (name-0000K-of-0000N.gguf)"},
    {"alignment", "BYTES", "tensor data alignment (default 4096, O_DIRECT-readable)"},
    {"tokenizer-json", "PATH", "DeepSeek-V3 tokenizer.json (default: the set-up's copy in .deps/)"},
    {"topics", "N", "routing scheme: content clusters (default 4096)"},
    {"zipf", "S", "routing scheme: expert popularity exponent (default 1.0)"},
    {"bias-scale", "X", "routing scheme: router bias per ln(rank) (default 0.28)"},
    {"topic-gain", "X", "routing scheme: router gain along an expert's topic (default 0)"},
    {"router-noise", "X", "routing scheme: std of the router logits' random part (default 3.0)"},
    {"context-gain", "X", "routing scheme: weight of the recent tokens' context in the hidden state (default 8.0; 0: none)"},
    {"context-span", "TOKENS", "routing scheme: width of the context's recency kernel (default 8)"},
    {"dry-run", "", "print the plan (files, sizes) and write nothing"},
};

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
    return buf;
}

uint64_t planned_bytes(const std::vector<dsv41::tensor_spec>& specs, uint64_t alignment) {
    uint64_t total = 0;
    for (const auto& s : specs) {
        int64_t n = 1;
        for (size_t k = 1; k < s.shape.size(); ++k) n *= s.shape[k];
        uint64_t bytes = uint64_t(row_bytes(dtype_info(s.type), s.shape[0]) * n);
        total += (bytes + alignment - 1) / alignment * alignment;
    }
    return total + (32ull << 20);  // plus the tokenizer metadata (~30 MB of strings)
}

result<forge::forge_context> make_context(const dsv41::hparams& hp, uint64_t seed, const cli::args& a,
                                          const std::string& tokenizer_json, tokenizer_data& tok_data) {
    auto data = load_hf_tokenizer(tokenizer_json, hp.vocab);
    if (!data) return data.err();
    tok_data = *data;
    auto tok = tokenizer::create(*data);
    if (!tok) return tok.err();

    forge::forge_context ctx;
    ctx.hp = hp;
    ctx.seed = seed;
    auto topics = a.get_int("topics", ctx.routing.topics);
    auto zipf = a.get_double("zipf", ctx.routing.zipf_exponent);
    auto bias = a.get_double("bias-scale", ctx.routing.bias_scale);
    auto gain = a.get_double("topic-gain", ctx.routing.topic_gain);
    auto noise = a.get_double("router-noise", ctx.routing.router_noise);
    auto context_gain = a.get_double("context-gain", ctx.routing.context_gain);
    auto span = a.get_double("context-span", ctx.routing.context_span);
    for (auto* r : {&topics}) if (!*r) return r->err();
    for (auto* r : {&zipf, &bias, &gain, &noise, &context_gain, &span}) if (!*r) return r->err();
    if (*topics < 8 || *topics > 4096) return make_error("--topics must be between 8 and 4096");
    if (*noise <= 0) return make_error("--router-noise must be > 0");
    if (*context_gain < 0) return make_error("--context-gain must be >= 0");
    if (*span < 1) return make_error("--context-span must be >= 1 token");
    ctx.routing.topics = int(*topics);
    ctx.routing.zipf_exponent = *zipf;
    ctx.routing.bias_scale = *bias;
    ctx.routing.topic_gain = *gain;
    ctx.routing.router_noise = *noise;
    ctx.routing.context_gain = *context_gain;
    ctx.routing.context_span = *span;

    auto map = engram::token_map_from_tokenizer(*tok, hp.engram_pad_id);
    if (!map) return map.err();
    ctx.token_map = map->map;
    ctx.compressed_vocab = map->compressed_vocab;
    std::vector<std::string> decoded;
    for (int32_t i = 0; i < tok->vocab_size(); ++i) decoded.push_back(tok->token_bytes(i));
    ctx.topic_of_token = forge::token_topics(decoded, ctx.routing.topics);
    for (int k = 0; k < ctx.routing.topics; ++k) ctx.topic_dirs.push_back(forge::topic_direction(ctx, k));
    return ctx;
}

void add_forge_metadata(std::vector<gguf::kv>& md, std::string_view preset, const forge::forge_context& ctx,
                        bool draft) {
    using gguf::value;
    md.push_back({"general.name", value::str("moestream-forge-" + std::string(preset) + (draft ? "-dspark" : ""))});
    md.push_back({"general.description",
                  value::str("Synthetic model made by `moestream forge`: random weights, meaningless text.")});
    md.push_back({"moestream.forge.preset", value::str(std::string(preset))});
    md.push_back({"moestream.forge.seed", value::u64(ctx.seed)});
    md.push_back({"moestream.forge.routing.topics", value::u32(uint32_t(ctx.routing.topics))});
    md.push_back({"moestream.forge.routing.zipf_exponent", value::f32(float(ctx.routing.zipf_exponent))});
    md.push_back({"moestream.forge.routing.bias_scale", value::f32(float(ctx.routing.bias_scale))});
    md.push_back({"moestream.forge.routing.topic_gain", value::f32(float(ctx.routing.topic_gain))});
    md.push_back({"moestream.forge.routing.topic_share", value::f32(float(ctx.routing.topic_share))});
    md.push_back({"moestream.forge.routing.neighbour_mix", value::f32(float(ctx.routing.neighbour_mix))});
    md.push_back({"moestream.forge.routing.router_noise", value::f32(float(ctx.routing.router_noise))});
    md.push_back({"moestream.forge.routing.context_gain", value::f32(float(ctx.routing.context_gain))});
    md.push_back({"moestream.forge.routing.context_span", value::f32(float(ctx.routing.context_span))});
    if (!draft)  // the draft head has no engram
        md.push_back({"deepseek41.engram_compressed_vocab_size", value::u32(uint32_t(ctx.compressed_vocab))});
}

result<std::vector<std::string>> write_model(const forge::forge_context& ctx, std::vector<gguf::kv> md,
                                             const std::vector<dsv41::tensor_spec>& specs, const std::string& path,
                                             gguf::writer_options opts) {
    gguf::writer w(opts);
    for (auto& kv : md) w.set(kv.key, std::move(kv.val));
    for (const auto& s : specs) {
        const dsv41::tensor_spec* spec = &s;
        w.add_tensor(s.name, s.type, s.shape, [&ctx, spec](std::span<std::byte> out) { forge::fill_tensor(ctx, *spec, out); });
    }
    return w.write(path);
}

int run(const cli::args& a) {
    auto preset_name = a.require("preset");
    if (!preset_name) return usage_error(kName, preset_name.message());
    auto hp = dsv41::preset(*preset_name);
    if (!hp) return usage_error(kName, "unknown preset '" + *preset_name + "' (tiny, mini-lite, mini, flash)");
    auto out = a.require("out");
    if (!out) return usage_error(kName, out.message());
    auto seed = a.get_int("seed", 1);
    auto shards = a.get_int("shards", 1);
    auto alignment = a.get_int("alignment", 4096);
    for (auto* r : {&seed, &shards, &alignment})
        if (!*r) return usage_error(kName, r->message());
    if (*shards < 1 || *shards > 999) return usage_error(kName, "--shards must be between 1 and 999");
    if (*alignment < 32 || (*alignment & (*alignment - 1))) return usage_error(kName, "--alignment must be a power of two >= 32");
    if (auto v = dsv41::validate(*hp); !v) return fail(kName, v.message());

    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    const std::string tok_json =
        a.get_or("tokenizer-json", cfg->paths.deps_dir + "/tokenizer-deepseek_v3/models/tokenizer.json");

    const auto target_specs = dsv41::target_tensors(*hp);
    const auto draft_specs = dsv41::draft_tensors(*hp);
    const auto draft_out = a.get("draft-out");
    uint64_t need = planned_bytes(target_specs, uint64_t(*alignment));
    if (draft_out) need += planned_bytes(draft_specs, uint64_t(*alignment));
    std::filesystem::path out_dir = std::filesystem::absolute(*out).parent_path();
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    struct statvfs vfs {};
    const uint64_t free_bytes = statvfs(out_dir.c_str(), &vfs) == 0 ? uint64_t(vfs.f_bavail) * vfs.f_frsize : 0;
    std::printf("forge: preset %s, %zu target tensors (%s)%s, free space in %s: %s\n", preset_name->c_str(),
                target_specs.size(), human_bytes(double(need)).c_str(), draft_out ? " incl. DSpark head" : "",
                out_dir.c_str(), human_bytes(double(free_bytes)).c_str());
    if (a.flag("dry-run")) return 0;
    if (free_bytes < need + (need >> 5))
        return fail(kName, "not enough disk space in " + out_dir.string() + ": the " + *preset_name + " preset needs " +
                               human_bytes(double(need)) + " and " + human_bytes(double(free_bytes)) +
                               " are free. Nothing was written (use --dry-run to plan, or a smaller preset).");
    if (!std::filesystem::exists(tok_json))
        return fail(kName, "the DeepSeek tokenizer is missing at " + tok_json +
                               " (run `make deps` or scripts/setup.sh to fetch it, or pass --tokenizer-json)");

    const auto t0 = std::chrono::steady_clock::now();
    tokenizer_data tok_data;
    auto ctx = make_context(*hp, uint64_t(*seed), a, tok_json, tok_data);
    if (!ctx) return fail(kName, ctx.message());

    gguf::writer_options opts{uint64_t(*alignment), uint32_t(*shards)};
    auto md = target_metadata(*hp);
    add_forge_metadata(md, *preset_name, *ctx, false);
    append_tokenizer_metadata(md, tok_data);
    auto written = write_model(*ctx, std::move(md), target_specs, *out, opts);
    if (!written) return fail(kName, written.message());
    if (draft_out) {
        auto dmd = draft_metadata(*hp);
        add_forge_metadata(dmd, *preset_name, *ctx, true);
        ctx->draft = true;  // its blk.N are DSpark stages
        auto dw = write_model(*ctx, std::move(dmd), draft_specs, *draft_out, {uint64_t(*alignment), 1});
        if (!dw) return fail(kName, dw.message());
        written->insert(written->end(), dw->begin(), dw->end());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t total = 0;
    for (const auto& p : *written) {
        const uint64_t sz = std::filesystem::file_size(p);
        total += sz;
        std::printf("wrote %s (%s)\n", p.c_str(), human_bytes(double(sz)).c_str());
    }
    std::printf("forge: %s in %.1f s (%.0f MB/s); expert bytes %s each (MXFP4)\n", human_bytes(double(total)).c_str(),
                secs, double(total) / 1e6 / std::max(secs, 1e-9),
                human_bytes(double(dsv41::expert_bytes(*hp, ggml_type::mxfp4))).c_str());
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = [] {
        std::vector<cli::option_spec> v(std::begin(kOptions), std::end(kOptions));
        v.push_back({"config", "FILE.json", "configuration file (paths.deps_dir locates the tokenizer)"});
        return v;
    }();
    return specs;
}

const command kCommand{
    kName, "--preset NAME --out FILE.gguf [--draft-out DRAFT.gguf] [--seed N] [--shards N]",
    "Writes a deterministic synthetic deepseek41 model with the real DeepSeek-V3 tokenizer and a routing "
    "scheme that gives skewed, content-dependent expert use (docs/forge.md). The same seed gives the same bytes.",
    options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
