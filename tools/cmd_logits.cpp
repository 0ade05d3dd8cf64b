// moestream logits: prefill --tokens, then feed each --decode id as its own single-token step,
// and write float32 logits of every row ([n_tokens + n_decode, vocab], row-major) to --out.
// The measurement tool for exactness against the reference (dsv41-architecture.md §7.4).
#include <chrono>
#include <cstdio>
#include <fstream>

#include "scheduler/recorded_picks.h"
#include "tools/command.h"
#include "tools/model_session.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "logits";

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    auto tok_text = a.require("tokens");
    if (!tok_text) return usage_error(kName, tok_text.message());
    auto out_path = a.require("out");
    if (!out_path) return usage_error(kName, out_path.message());
    auto tokens = parse_token_list("tokens", *tok_text);
    if (!tokens) return usage_error(kName, tokens.message());
    if (tokens->empty()) return usage_error(kName, "--tokens is empty");
    std::vector<int32_t> decode;
    if (a.has("decode")) {
        auto d = parse_token_list("decode", a.get_or("decode", ""));
        if (!d) return usage_error(kName, d.message());
        decode = std::move(*d);
    }
    auto session = open_model_session(*cfg, false);
    if (!session) return fail(kName, session.message());
    auto& s = **session;

    std::optional<recorded_picks> picks;
    if (a.has("force-picks")) {
        auto p = recorded_picks::load(a.get_or("force-picks", ""), s.hp());
        if (!p) return fail(kName, p.message());
        if (p->input_ids() != *tokens)
            return fail(kName, "--force-picks records a prompt of " + std::to_string(p->input_ids().size()) +
                                   " tokens that differs from --tokens: the recorded picks only apply to their own prompt");
        picks = std::move(*p);
    }
    const std::string act_quant = a.get_or("act-quant", "off");
    if (act_quant != "off" && act_quant != "reference")
        return usage_error(kName, "--act-quant must be 'off' or 'reference', got '" + act_quant + "'");
    s.model->set_options({a.flag("ref-compat"), picks ? &*picks : nullptr, nullptr, act_quant == "reference"});

    auto seq = s.new_sequence(int64_t(tokens->size() + decode.size()));
    std::vector<float> all, step;
    const auto t0 = std::chrono::steady_clock::now();
    dsv41::forward_item prefill{seq.get(), *tokens, true};
    if (auto st = s.model->forward({&prefill, 1}, all); !st) return fail(kName, st.message());
    for (int32_t id : decode) {
        dsv41::forward_item item{seq.get(), {&id, 1}, true};
        if (auto st = s.model->forward({&item, 1}, step); !st) return fail(kName, st.message());
        all.insert(all.end(), step.begin(), step.end());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::ofstream out(*out_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(all.data()), std::streamsize(all.size() * sizeof(float)));
    out.close();
    if (!out) return fail(kName, "cannot write " + *out_path);
    std::printf("%zu rows x %lld logits (float32, row-major) -> %s in %.3f s%s%s\n", all.size() / size_t(s.hp().vocab),
                static_cast<long long>(s.hp().vocab), out_path->c_str(), secs, picks ? ", picks forced" : "",
                a.flag("ref-compat") ? ", reference quirks on" : "");
    if (picks && picks->unmatched() > 0)
        std::printf("note: %lld selections had no recorded picks and were computed\n",
                    static_cast<long long>(picks->unmatched()));
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"tokens", "1,2,3", "prompt token ids, prefilled in one forward"},
        {"decode", "4,5,6", "token ids fed one per single-token step after the prefill"},
        {"ref-compat", "", "reproduce the reference's decode quirk (stale ratio-2 index keys, §3.4.6)"},
        {"act-quant", "MODE", "off (default) or reference: simulate the reference's fp8/fp4 activation round trips (§3.8)"},
        {"force-picks", "PROMPT.safetensors", "use a fixture's recorded router/indexer/candidate picks"},
        {"out", "FILE.f32", "where to write the logits"},
    });
    return specs;
}

const command kCommand{
    kName, "--model FILE.gguf --tokens 1,2,3 [--decode 4,5,6] [--ref-compat] [--act-quant reference] [--force-picks P.safetensors] --out FILE.f32",
    "Prefills the tokens in one forward, then feeds each --decode id as its own single-token step, and writes the "
    "float32 logits of every row (row-major [n_tokens + n_decode, vocab]). The output is independent of thread "
    "counts and cache budgets (bit-identical).",
    options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
