// moestream bench spec: greedy speculative decoding against plain decoding in the same run, per
// drafter (the oracle at set acceptance rates, prompt lookup, the DSpark head with --draft) and
// draft length (fixed 1..5 and the per-step policy), on two kinds of content: a prompt that
// repeats itself (what prompt lookup is for) and one that does not. The experts stream through
// the tiers as under `serve`. Every configuration runs once per round, the rounds interleaved, and
// the figures are medians over the rounds with their spread (hosts and disks drift). The auto
// policy of a configuration keeps what it learnt from round to round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "spec/dspark_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/oracle_drafter.h"
#include "spec/speculative.h"
#include "tools/bench_stats.h"
#include "tools/command.h"
#include "tools/model_session.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench spec";

using clock_type = std::chrono::steady_clock;

struct config {
    std::string drafter;  // "plain", "oracle", "ngram", "dspark"
    double rate = 0;      // oracle replacement rate
    int k = 0;            // -1: auto
    std::string label() const {
        char buf[64];
        if (drafter == "oracle") std::snprintf(buf, sizeof buf, "oracle:%.2f", rate);
        else std::snprintf(buf, sizeof buf, "%s", drafter.c_str());
        return buf;
    }
};

struct figures {
    std::vector<double> tps;
    int64_t steps = 0, drafted = 0, accepted = 0;
    int64_t experts = 0, counted = 0;  // distinct experts of the verification forwards (host-routed ones)
};

// Token ids of a prompt: `repeat` cycles a short phrase (prompt lookup finds it again), else a
// deterministic spread over the vocabulary.
std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, bool repeat) {
    std::vector<int32_t> p;
    uint64_t x = repeat ? 0x51ed2701u : 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; ++i) {
        if (repeat && i >= 12) {
            p.push_back(p[size_t(i - 12)]);
            continue;
        }
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p.push_back(int32_t((x >> 33) % uint64_t(vocab)));
    }
    return p;
}

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    if (cfg->model.path.empty()) return usage_error(kName, "missing required option --model");
    auto n = a.get_int("n-predict", 32);
    if (!n) return usage_error(kName, n.message());
    auto plen = a.get_int("prompt-tokens", 64);
    if (!plen) return usage_error(kName, plen.message());
    auto rounds = a.get_int("rounds", 3);
    if (!rounds) return usage_error(kName, rounds.message());
    if (*n < 2 || *plen < 1 || *rounds < 1)
        return usage_error(kName, "-n must be >= 2, --prompt-tokens and --rounds >= 1");
    const bool with_draft = !cfg->model.draft_path.empty();
    auto session = open_model_session(*cfg, with_draft, true);
    if (!session) return fail(kName, session.message());
    auto& s = **session;
    const int64_t vocab = s.hp().vocab;
    std::printf("bench spec: %s%s%s on %s | %lld-token prompts, %lld tokens decoded, %lld rounds, greedy\n",
                cfg->model.path.c_str(), with_draft ? " + draft " : "", with_draft ? cfg->model.draft_path.c_str() : "",
                s.backend_line().c_str(), static_cast<long long>(*plen), static_cast<long long>(*n),
                static_cast<long long>(*rounds));

    std::vector<config> configs{{"plain", 0, 0}};
    std::vector<std::string> drafters{"oracle:0.50", "oracle:0.20", "oracle:0.03", "ngram"};
    if (with_draft) drafters.push_back("dspark");
    for (const auto& d : drafters)
        for (int k : {1, 2, 3, 4, 5, -1}) {
            config c;
            if (d.rfind("oracle:", 0) == 0) c.drafter = "oracle", c.rate = std::stod(d.substr(7));
            else c.drafter = d;
            c.k = k;
            configs.push_back(c);
        }
    const int64_t capacity = *plen + *n + spec::draft_policy::kMaxK;
    for (bool repeat : {true, false}) {
        const auto prompt = prompt_of(*plen, vocab, repeat);
        std::vector<figures> fig(configs.size());
        // One policy per configuration for the whole run (a server keeps its own as long as it
        // serves): what it learnt in one round it uses in the next.
        std::vector<spec::draft_policy> policies(configs.size());
        std::vector<int32_t> plain_out;
        for (int64_t r = 0; r < *rounds; ++r)
            for (size_t ci = 0; ci < configs.size(); ++ci) {
                const config& c = configs[ci];
                auto seq = s.new_sequence(capacity, spec::draft_policy::kMaxK + 1);
                std::vector<float> logits;
                dsv41::forward_item item{seq.get(), prompt, false};
                if (auto st = s.model->forward({&item, 1}, logits); !st) return fail(kName, st.message());
                const int32_t first = spec::greedy_token(logits);
                std::unique_ptr<spec::drafter> d;
                if (c.drafter == "oracle")
                    d = std::make_unique<spec::oracle_drafter>(plain_out, *plen, c.rate, int32_t(vocab), 11 + uint64_t(r));
                else if (c.drafter == "dspark")
                    d = std::make_unique<spec::dspark_drafter>(*s.model, *seq);
                else
                    d = std::make_unique<spec::ngram_drafter>();
                spec::greedy_options o;
                o.k = c.k < 0 ? spec::draft_policy::kMaxK : c.k;
                if (c.k < 0) o.policy = &policies[ci];
                std::vector<int32_t> out;
                const auto t0 = clock_type::now();
                auto st = spec::decode_greedy(*s.model, *seq, first, *n, *d, o, out);
                const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
                if (!st) return fail(kName, st.message());
                if (c.drafter == "plain" && plain_out.empty()) plain_out = out;
                if (out != plain_out)
                    return fail(kName, c.label() + ": the output differs from plain greedy decoding (a bug)");
                auto& f = fig[ci];
                f.tps.push_back(double(out.size()) / secs);
                f.steps += st->target_steps, f.drafted += st->drafted, f.accepted += st->accepted;
                for (size_t k = 0; k < st->experts_by_k.size(); ++k)
                    f.experts += st->experts_by_k[k], f.counted += st->counted_by_k[k];
            }
        std::printf("\n%s prompt: tokens/s median (min-max) over rounds; ratio = median / plain's median\n",
                    repeat ? "repeating" : "non-repeating");
        std::printf("%-12s %-5s %10s %17s %7s %9s %10s %13s\n", "drafter", "k", "tok/s", "range", "ratio", "accepted",
                    "steps/tok", "experts/layer");
        const double base = median(fig[0].tps);
        for (size_t ci = 0; ci < configs.size(); ++ci) {
            const auto& f = fig[ci];
            const double med = median(f.tps);
            auto [lo, hi] = std::minmax_element(f.tps.begin(), f.tps.end());
            const std::string k = configs[ci].k < 0 ? "auto" : std::to_string(configs[ci].k);
            char acc[32];
            std::snprintf(acc, sizeof acc, "%.2f", f.drafted ? double(f.accepted) / double(f.drafted) : 0.0);
            // The union a step loads: distinct experts over the layers (per layer: / n_layers).
            char ex[32] = "-";
            if (f.counted) std::snprintf(ex, sizeof ex, "%.1f", double(f.experts) / double(f.counted) / double(s.hp().n_layers));
            std::printf("%-12s %-5s %10.2f %8.2f-%-8.2f %7.3f %9s %10.3f %13s\n", configs[ci].label().c_str(), k.c_str(),
                        med, *lo, *hi, base > 0 ? med / base : 0.0, f.drafted ? acc : "-",
                        double(f.steps) / double(*rounds * *n), ex);
        }
    }
    s.print_streaming_stats();
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"draft", "FILE.gguf", "DSpark draft head: adds the dspark drafter"},
        {"n-predict", "N", "tokens decoded per run (default 32)", 'n'},
        {"prompt-tokens", "N", "prompt length (default 64)"},
        {"rounds", "N", "rounds, every configuration once in each (default 3)"},
    });
    return specs;
}

const command kCommand{kName, "--model FILE.gguf [--draft FILE.gguf] [-n N] [--prompt-tokens N] [--rounds N]",
                       "Greedy speculative decoding against plain decoding in the same run: the oracle drafter at "
                       "acceptance 0.5, 0.8 and 0.97, prompt lookup and the DSpark head (with --draft), each at "
                       "draft lengths 1..5 and auto, on a repeating and a non-repeating prompt, experts streamed "
                       "through the tiers. Prints tokens/s (median and range over rounds), the ratio to plain "
                       "decoding, acceptance and target steps per token; fails if any output differs from plain.",
                       options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
