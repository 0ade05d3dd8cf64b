// moestream dump: one prefill of --tokens with a tensor observer, written as DIR/dump.safetensors
// (F32). It holds every node the model reports, per layer (`blk.{L}.{name}`, in computation order),
// and the reference fixtures' names (layer_in_streams, layer_in_mean, final_*, prefill_logits,
// dspark_main_hidden_prefill), so that `moestream compare DIR <fixture>` shows layer by layer where
// the port departs from the reference.
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/recorded_picks.h"
#include "storage/safetensors_writer.h"
#include "tools/command.h"
#include "tools/model_session.h"

namespace moestream::tools {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kName = "dump";
constexpr const char* kFileName = "dump.safetensors";

// The model's name for the mean of the tap layers' streams, and the fixtures' name for its prefill rows.
constexpr std::string_view kTapsNode = "dspark_main_hidden";
constexpr std::string_view kTapsFixtureName = "dspark_main_hidden_prefill";

// Concatenation by appending: GCC 12's -Wrestrict misfires on `"literal" + std::string`.
template <class... Parts>
std::string cat(const Parts&... parts) {
    std::string s;
    (s += ... += parts);
    return s;
}

// Copies every tensor the forward reports, in the order it arrives (= computation order). The
// pointers the model passes are only valid during the call.
class recording_observer final : public dsv41::tensor_observer {
  public:
    struct node {
        std::string name;
        int layer;
        std::vector<int64_t> shape;
        std::vector<float> data;
    };
    std::vector<node> nodes;

    void tensor(std::string_view name, int layer, const float* data, std::span<const int64_t> shape) override {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        nodes.push_back({std::string(name), layer, {shape.begin(), shape.end()}, {data, data + n}});
    }
};

// The file name of a node: blk.{L}.{name} per layer, the bare name for model-level ones (layer -1).
// A name reported twice in one forward (not the case today) gets a suffix rather than being lost.
std::string node_name(const recording_observer::node& n, std::map<std::string, int>& seen) {
    std::string name;
    if (n.layer >= 0) {
        name = "blk.";
        name += std::to_string(n.layer);
        name += '.';
        name += n.name;
    } else {
        name = n.name == kTapsNode ? std::string(kTapsFixtureName) : n.name;
    }
    const int k = seen[name]++;
    if (k > 0) {
        name += '.';
        name += std::to_string(k);
    }
    return name;
}

// layer_in_streams [layers, T, hc, dim] and layer_in_mean [layers, T, dim] (mean over the streams,
// summed in fp32 in stream order) from the per-layer layer_in nodes. Empty when a layer is missing
// or the shapes differ (then only the per-layer nodes are written).
struct stacked_streams {
    std::vector<int64_t> shape;  // [layers, T, hc, dim]
    std::vector<float> streams, mean;
};

stacked_streams stack_layer_in(const std::vector<recording_observer::node>& nodes, int n_layers) {
    std::vector<const recording_observer::node*> by_layer(static_cast<size_t>(n_layers), nullptr);
    for (const auto& n : nodes)
        if (n.name == "layer_in" && n.layer >= 0 && n.layer < n_layers && !by_layer[size_t(n.layer)])
            by_layer[size_t(n.layer)] = &n;
    stacked_streams out;
    for (const auto* n : by_layer)
        if (!n || n->shape.size() != 3 || n->shape != by_layer[0]->shape) return out;
    const int64_t T = by_layer[0]->shape[0], hc = by_layer[0]->shape[1], dim = by_layer[0]->shape[2];
    out.shape = {n_layers, T, hc, dim};
    out.streams.reserve(static_cast<size_t>(n_layers * T * hc * dim));
    out.mean.reserve(static_cast<size_t>(n_layers * T * dim));
    for (const auto* n : by_layer) {
        out.streams.insert(out.streams.end(), n->data.begin(), n->data.end());
        for (int64_t t = 0; t < T; ++t)
            for (int64_t d = 0; d < dim; ++d) {
                float s = 0.0f;
                for (int64_t k = 0; k < hc; ++k) s += n->data[size_t((t * hc + k) * dim + d)];
                out.mean.push_back(s / float(hc));
            }
    }
    return out;
}

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(ids[i]);
    }
    return s;
}

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    if (!a.positional().empty()) return usage_error(kName, cat("unexpected argument '", a.positional()[0], "'"));
    if (cfg->model.path.empty()) return usage_error(kName, "missing required option --model");
    auto tok_text = a.require("tokens");
    if (!tok_text) return usage_error(kName, tok_text.message());
    auto out_dir = a.require("out");
    if (!out_dir) return usage_error(kName, out_dir.message());
    auto tokens = parse_token_list("tokens", *tok_text);
    if (!tokens) return usage_error(kName, tokens.message());
    if (tokens->empty()) return usage_error(kName, "--tokens is empty");

    auto session = open_model_session(*cfg, !cfg->model.draft_path.empty());
    if (!session) return fail(kName, session.message());
    auto& s = **session;

    auto checks = read_check_options(a, s.hp(), *tokens);
    if (auto* e = std::get_if<check_options_error>(&checks)) return e->usage ? usage_error(kName, e->message) : fail(kName, e->message);
    auto& check = std::get<check_options>(checks);
    recording_observer observer;
    check.apply(s, &observer);

    auto seq = s.new_sequence(int64_t(tokens->size()));
    std::vector<float> logits;
    dsv41::forward_item prefill{seq.get(), *tokens, true};
    if (auto st = s.model->forward({&prefill, 1}, logits); !st) return fail(kName, st.message());

    // ---- the file: per-layer nodes, then the fixtures' names in computation order ----
    // Stacked layer rows come before the model-level ones so that `compare`, which follows this
    // file's order, names the earliest diverging layer rather than a final tensor.
    safetensors::writer w;
    auto add = [&](std::string name, std::vector<int64_t> shape, std::span<const float> data) -> status {
        return w.add_view<float>(std::move(name), std::move(shape), data);
    };
    std::map<std::string, int> seen;
    std::vector<const recording_observer::node*> model_level;
    int64_t per_layer = 0;
    for (const auto& n : observer.nodes) {
        if (n.layer < 0) {
            model_level.push_back(&n);
            continue;
        }
        if (auto st = add(node_name(n, seen), n.shape, n.data); !st) return fail(kName, st.message());
        ++per_layer;
    }
    const stacked_streams stacked = stack_layer_in(observer.nodes, s.hp().n_layers);
    if (!stacked.shape.empty()) {
        const auto& sh = stacked.shape;
        if (auto st = add("layer_in_streams", sh, stacked.streams); !st) return fail(kName, st.message());
        if (auto st = add("layer_in_mean", {sh[0], sh[1], sh[3]}, stacked.mean); !st) return fail(kName, st.message());
        if (auto st = w.mark_stacked("layer_in_streams"); !st) return fail(kName, st.message());
        if (auto st = w.mark_stacked("layer_in_mean"); !st) return fail(kName, st.message());
    } else {
        std::fprintf(stderr, "moestream dump: note: layer_in was not reported for every layer; "
                             "layer_in_streams/layer_in_mean are left out\n");
    }
    // Model-level nodes up to the LM head (final_streams, final_hidden, final_normed), the logits,
    // then what comes after the head (the DSpark taps).
    bool logits_added = false;
    auto add_logits = [&]() -> status {
        logits_added = true;
        return add("prefill_logits", {int64_t(tokens->size()), s.hp().vocab}, logits);
    };
    for (const auto* n : model_level) {
        if (!logits_added && n->name == kTapsNode)
            if (auto st = add_logits(); !st) return fail(kName, st.message());
        if (auto st = add(node_name(*n, seen), n->shape, n->data); !st) return fail(kName, st.message());
    }
    if (!logits_added)
        if (auto st = add_logits(); !st) return fail(kName, st.message());

    if (auto st = w.set_metadata("model", cfg->model.path); !st) return fail(kName, st.message());
    if (auto st = w.set_metadata("tokens", join_ids(*tokens)); !st) return fail(kName, st.message());
    if (auto st = w.set_metadata("picks", check.picks ? cat("forced from ", check.picks_path) : std::string("computed")); !st)
        return fail(kName, st.message());
    if (auto st = w.set_metadata("ref_compat", a.flag("ref-compat") ? "1" : "0"); !st) return fail(kName, st.message());

    std::error_code ec;
    fs::create_directories(*out_dir, ec);
    if (ec) return fail(kName, cat("cannot create ", *out_dir, ": ", ec.message()));
    const std::string path = (fs::path(*out_dir) / kFileName).string();
    if (auto st = w.write(path); !st) return fail(kName, st.message());
    const auto bytes = fs::file_size(path, ec);
    std::printf("%zu tensors (%lld per-layer nodes over %d layers, %zu tokens), %.2f MiB -> %s%s\n", w.size(),
                static_cast<long long>(per_layer), s.hp().n_layers, tokens->size(),
                ec ? 0.0 : double(bytes) / (1024.0 * 1024.0), path.c_str(), check.summary().c_str());
    check.print_unmatched();
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_check_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"draft", "FILE.gguf", "DSpark draft head (dflash): adds dspark_main_hidden_prefill"},
        {"tokens", "1,2,3", "token ids, prefilled in one forward"},
        {"out", "DIR", "folder to write dump.safetensors into (created if needed)"},
    });
    return specs;
}

const command kCommand{
    kName, "--model FILE.gguf --tokens 1,2,3 --out DIR [--force-picks P.safetensors] [--ref-compat] [--act-quant reference] [--draft D.gguf]",
    "Runs one prefill of the tokens and writes every intermediate tensor the model reports to DIR/dump.safetensors "
    "(F32): per layer as blk.{L}.{name} (layer_in, engram_out, q, kv, lid_score, router_scores, attn_out, "
    "ffn_moe_out, in computation order), plus the reference fixtures' names: layer_in_streams [layers, T, hc, dim] "
    "and layer_in_mean [layers, T, dim] (stacked: one compare row per layer), final_streams, final_hidden, "
    "final_normed, prefill_logits [T, vocab] and, with --draft, dspark_main_hidden_prefill. "
    "`moestream compare DIR FIXTURE_DIR` then shows per-layer agreement and names the first divergence.",
    options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
