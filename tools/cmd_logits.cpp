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

    auto checks = read_check_options(a, s.hp(), *tokens);
    if (auto* e = std::get_if<check_options_error>(&checks)) return e->usage ? usage_error(kName, e->message) : fail(kName, e->message);
    auto& check = std::get<check_options>(checks);
    check.apply(s);

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
    std::printf("%zu rows x %lld logits (float32, row-major) -> %s in %.3f s%s\n", all.size() / size_t(s.hp().vocab),
                static_cast<long long>(s.hp().vocab), out_path->c_str(), secs, check.summary().c_str());
    check.print_unmatched();
    s.print_streaming_stats();
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_check_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"tokens", "1,2,3", "prompt token ids, prefilled in one forward"},
        {"decode", "4,5,6", "token ids fed one per single-token step after the prefill"},
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
