// moestream bench spec: greedy speculative decoding against plain decoding in the same run, on
// the content kinds of the published table (verbatim repetition, code with its explanation,
// prose in another language, a reasoning puzzle), each on new content (the tiers emptied before
// the run: every expert comes from disk) and on repeated content (the same prompt decoded again
// at once: the tiers hold what it needs), kept apart. Per drafter (the DSpark head with --draft,
// prompt lookup, the oracle at acceptance 0.5 / 0.8 / 0.97) it runs draft lengths 1..5 and the
// per-step policy beside plain decoding. The experts stream through the tiers as under `serve`.
// Every configuration runs once per round, the rounds interleaved, and the figures are medians
// over the rounds with their range (hosts and disks drift). The auto policy of a (kind, phase,
// drafter) keeps what it learnt from round to round, as a server's does. The summary verdict
// checks the targets: the policy >= 0.97x plain decoding on every kind, phase and
// drafter, and >= the best fixed k there.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "scheduler/model_gguf.h"
#include "spec/dspark_drafter.h"
#include "spec/expert_union.h"
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

// The content kinds (the published table's): what each prompt is for is in its name. The
// verbatim one ends inside the second copy of its paragraph, so the text to come is in the
// context (what prompt lookup and a trained draft head accept best).
struct content_kind {
    const char* name;
    const char* text;
};

const content_kind kKinds[] = {
    {"verbatim",
     "Copy the following paragraph exactly, word for word.\n\n"
     "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, polished the great "
     "lens and wrote the weather in a small leather book: wind from the north-west, a swell of two metres, three "
     "fishing boats returning before the rain.\n\n"
     "Copy:\n\n"
     "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick,"},
    {"code",
     "Explain what this function does and how fast it is.\n\n"
     "```python\n"
     "def merge_sorted(a, b):\n"
     "    out, i, j = [], 0, 0\n"
     "    while i < len(a) and j < len(b):\n"
     "        if a[i] <= b[j]:\n"
     "            out.append(a[i]); i += 1\n"
     "        else:\n"
     "            out.append(b[j]); j += 1\n"
     "    out.extend(a[i:]); out.extend(b[j:])\n"
     "    return out\n"
     "```\n\n"
     "The function"},
    {"prose",
     "Escreva um parágrafo sobre a história de Lisboa.\n\n"
     "Lisboa é uma das cidades mais antigas da Europa ocidental. Depois do grande terramoto de 1755, o Marquês "
     "de Pombal mandou reconstruir a Baixa com ruas largas e direitas, e"},
    {"puzzle",
     "Solve the puzzle step by step.\n\n"
     "Three boxes are labelled apples, oranges and mixed, and every label is wrong. You may take one fruit from "
     "one box without looking inside. Which box do you pick from, and how do you then label all three boxes?\n\n"
     "Step 1:"},
};

struct drafter_spec {
    std::string name;   // dspark, ngram, oracle
    double acceptance;  // the oracle's: the probability it proposes the recorded token
    std::string label() const {
        if (name != "oracle") return name;
        char buf[32];
        std::snprintf(buf, sizeof buf, "oracle a=%.2f", acceptance);
        return buf;
    }
};

// One configuration's figures over the rounds.
struct figures {
    std::vector<double> tps;
    int64_t steps = 0, drafted = 0, accepted = 0, tokens = 0;
    std::array<spec::union_totals, spec::kMaxDraft + 1> unions{};
};

void add_unions(figures& f, const spec::step_recorder& r) {
    for (int k = 0; k <= spec::kMaxDraft; ++k) {
        const auto& t = r.by_k()[size_t(k)];
        auto& u = f.unions[size_t(k)];
        u.steps += t.steps, u.counted += t.counted, u.experts += t.experts, u.device += t.device;
        u.host += t.host, u.in_flight += t.in_flight, u.missing += t.missing, u.accepted += t.accepted;
        u.bytes_read += t.bytes_read, u.seconds += t.seconds;
    }
}

// "6.0" experts per layer at k (or "-" when no step of that k saw its routing), with the share
// not resident when announced.
std::string union_text(const figures& f, int k, int n_layers) {
    const auto& u = f.unions[size_t(k)];
    if (u.counted == 0) return "-";
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f/%.0f%%", double(u.experts) / double(u.counted) / double(n_layers),
                  u.experts > 0 ? 100.0 * double(u.in_flight + u.missing) / double(u.experts) : 0.0);
    return buf;
}

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) out.push_back(item);
    return out;
}

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    if (cfg->model.path.empty()) return usage_error(kName, "missing required option --model");
    auto n = a.get_int("n-predict", 32);
    if (!n) return usage_error(kName, n.message());
    auto plen = a.get_int("prompt-tokens", 0);
    if (!plen) return usage_error(kName, plen.message());
    auto rounds = a.get_int("rounds", 3);
    if (!rounds) return usage_error(kName, rounds.message());
    if (*n < 2 || *plen < 0 || *rounds < 1)
        return usage_error(kName, "-n must be >= 2, --rounds >= 1, --prompt-tokens >= 0");
    const bool with_draft = !cfg->model.draft_path.empty();
    // Which kinds and drafters (for the runtime on slow machines).
    std::vector<const content_kind*> kinds;
    for (const auto& name : split_list(a.get_or("kinds", "verbatim,code,prose,puzzle"))) {
        const auto* k = std::find_if(std::begin(kKinds), std::end(kKinds), [&](const auto& c) { return name == c.name; });
        if (k == std::end(kKinds)) return usage_error(kName, "--kinds: unknown kind '" + name + "' (verbatim, code, prose, puzzle)");
        kinds.push_back(k);
    }
    std::vector<drafter_spec> drafters;
    for (const auto& name : split_list(a.get_or("drafters", with_draft ? "dspark,ngram,oracle" : "ngram,oracle"))) {
        if (name == "oracle") {
            for (double acc : {0.5, 0.8, 0.97}) drafters.push_back({"oracle", acc});
        } else if (name == "ngram" || name == "dspark") {
            if (name == "dspark" && !with_draft) return usage_error(kName, "--drafters dspark needs --draft FILE.gguf");
            drafters.push_back({name, 0});
        } else {
            return usage_error(kName, "--drafters: unknown drafter '" + name + "' (dspark, ngram, oracle)");
        }
    }
    if (kinds.empty() || drafters.empty()) return usage_error(kName, "--kinds and --drafters need at least one entry");
    // A model without a tokenizer (the reference fixtures' conversions) still runs: each byte
    // of a prompt becomes a token id, which keeps what matters here (text that repeats, repeats).
    auto tok = load_tokenizer(cfg->model.path);
    if (!tok) std::printf("note: %s; the prompts' bytes are their token ids\n", tok.message().c_str());
    auto session = open_model_session(*cfg, with_draft, true);
    if (!session) return fail(kName, session.message());
    auto& s = **session;
    const auto& hp = s.hp();
    const int64_t vocab = hp.vocab;
    std::printf("bench spec: %s%s%s on %s | tiers: %u device, %u host, %u draft slots | %lld tokens decoded, %lld "
                "rounds, greedy\n",
                cfg->model.path.c_str(), with_draft ? " + draft " : "", with_draft ? cfg->model.draft_path.c_str() : "",
                s.backend_line().c_str(), s.device_slot_count(),
                s.streamed ? s.streamed->host_slots() : 0u, s.streamed ? s.streamed->draft_slots() : 0u,
                static_cast<long long>(*n), static_cast<long long>(*rounds));
    std::printf("new: the tiers emptied before the run (every expert from disk); repeated: the same prompt again at "
                "once (the tiers warm). experts = distinct experts per layer a step / share not resident when "
                "announced, by tokens drafted\n");

    // Configurations of a (kind, phase): plain, then per drafter k = 1..5 and auto (-1).
    struct config {
        int drafter = -1;  // index into drafters; -1: plain
        int k = 0;
    };
    std::vector<config> configs{{-1, 0}};
    for (int d = 0; d < int(drafters.size()); ++d)
        for (int k : {1, 2, 3, 4, 5, -1}) configs.push_back({d, k});
    const char* phases[] = {"new", "repeated"};

    struct verdict_case {
        std::string what;
        double ratio, best_fixed_ratio;
        int best_k;
    };
    std::vector<verdict_case> cases;
    std::vector<double> plain_spread;  // (max - min) / median of plain decoding's rounds, per kind and phase
    for (const content_kind* kind : kinds) {
        std::vector<int32_t> prompt;
        if (tok) {
            prompt = tok->encode(kind->text, false);
            if (tok->data().add_bos) prompt.insert(prompt.begin(), tok->data().bos_id);
        } else {
            for (const char* c = kind->text; *c; ++c) prompt.push_back(int32_t(uint8_t(*c)) % int32_t(vocab));
        }
        if (*plen > 0 && int64_t(prompt.size()) > *plen) prompt.resize(size_t(*plen));
        const int64_t capacity = int64_t(prompt.size()) + *n + spec::draft_policy::kMaxK;
        // [phase][config]
        std::vector<std::vector<figures>> fig(2, std::vector<figures>(configs.size()));
        // One policy per (phase, configuration) for the whole run (a server keeps its own).
        std::vector<std::vector<spec::draft_policy>> policies(
            2, std::vector<spec::draft_policy>(configs.size(), spec::draft_policy(spec::draft_policy::kMaxK, spec::shape_of(hp))));
        std::vector<int32_t> plain_out;
        for (int64_t r = 0; r < *rounds; ++r)
            for (size_t ci = 0; ci < configs.size(); ++ci)
                for (int phase = 0; phase < 2; ++phase) {
                    const config& c = configs[ci];
                    // New content: nothing resident; repeated: right after the same run.
                    if (phase == 0 && s.streamed) s.streamed->forget_resident();
                    auto seq = s.new_sequence(capacity, spec::draft_policy::kMaxK + 1);
                    std::vector<float> logits;
                    dsv41::forward_item item{seq.get(), prompt, false};
                    if (auto st = s.model->forward({&item, 1}, logits); !st) return fail(kName, st.message());
                    const int32_t first = spec::greedy_token(logits);
                    std::unique_ptr<spec::drafter> d;
                    if (c.drafter < 0) {
                        d = std::make_unique<spec::ngram_drafter>();  // unused: k = 0
                    } else if (drafters[size_t(c.drafter)].name == "oracle") {
                        d = std::make_unique<spec::oracle_drafter>(plain_out, int64_t(prompt.size()),
                                                                   drafters[size_t(c.drafter)].acceptance,
                                                                   int32_t(vocab), 11 + uint64_t(r));
                    } else if (drafters[size_t(c.drafter)].name == "dspark") {
                        d = std::make_unique<spec::dspark_drafter>(*s.model, *seq);
                    } else {
                        d = std::make_unique<spec::ngram_drafter>();
                    }
                    spec::step_recorder recorder(hp.n_layers, s.tally_probe());
                    spec::greedy_options o;
                    o.k = c.drafter < 0 ? 0 : (c.k < 0 ? spec::draft_policy::kMaxK : c.k);
                    o.recorder = &recorder;
                    if (c.drafter >= 0 && c.k < 0) o.policy = &policies[size_t(phase)][ci];
                    std::vector<int32_t> out;
                    const auto t0 = clock_type::now();
                    auto st = spec::decode_greedy(*s.model, *seq, first, *n, *d, o, out);
                    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
                    if (!st) return fail(kName, st.message());
                    if (c.drafter < 0 && plain_out.empty()) plain_out = out;
                    if (out != plain_out)
                        return fail(kName, std::string(kind->name) + " " + phases[phase] + ": " +
                                               (c.drafter < 0 ? std::string("plain") : drafters[size_t(c.drafter)].label()) +
                                               " k " + std::to_string(c.k) +
                                               ": the output differs from plain greedy decoding (a bug)");
                    auto& f = fig[size_t(phase)][ci];
                    f.tps.push_back(double(out.size()) / secs);
                    f.steps += st->target_steps, f.drafted += st->drafted, f.accepted += st->accepted;
                    f.tokens += int64_t(out.size());
                    add_unions(f, recorder);
                }
        for (int phase = 0; phase < 2; ++phase) {
            std::printf("\n%s, %s content (%zu-token prompt): tokens/s median (min-max) over rounds; ratio = median / "
                        "plain's median\n",
                        kind->name, phases[phase], prompt.size());
            std::printf("%-14s %-5s %9s %17s %7s %9s %10s  %s\n", "drafter", "k", "tok/s", "range", "ratio", "accepted",
                        "steps/tok", "experts per layer / not resident, by k drafted");
            const double base = median(fig[size_t(phase)][0].tps);
            {
                const auto& p = fig[size_t(phase)][0].tps;
                const auto [lo, hi] = std::minmax_element(p.begin(), p.end());
                if (base > 0) plain_spread.push_back((*hi - *lo) / base);
            }
            for (size_t ci = 0; ci < configs.size(); ++ci) {
                const auto& f = fig[size_t(phase)][ci];
                const config& c = configs[ci];
                const double med = median(f.tps);
                auto [lo, hi] = std::minmax_element(f.tps.begin(), f.tps.end());
                const std::string k = c.drafter < 0 ? "0" : c.k < 0 ? "auto" : std::to_string(c.k);
                char acc[32] = "-";
                if (f.drafted) std::snprintf(acc, sizeof acc, "%.2f", double(f.accepted) / double(f.drafted));
                std::string unions;
                for (int kk = 0; kk <= spec::kMaxDraft; ++kk) {
                    if (f.unions[size_t(kk)].counted == 0) continue;
                    unions += (unions.empty() ? "" : " ") + std::to_string(kk) + ":" + union_text(f, kk, hp.n_layers);
                }
                std::printf("%-14s %-5s %9.2f %8.2f-%-8.2f %7.3f %9s %10.3f  %s\n",
                            c.drafter < 0 ? "plain" : drafters[size_t(c.drafter)].label().c_str(), k.c_str(), med, *lo,
                            *hi, base > 0 ? med / base : 0.0, acc, double(f.steps) / double(std::max<int64_t>(1, f.tokens)),
                            unions.c_str());
            }
            // The targets, per drafter: auto against plain and against the best fixed k.
            for (int d = 0; d < int(drafters.size()); ++d) {
                double auto_tps = 0, best_tps = 0;
                int best_k = 0;
                for (size_t ci = 0; ci < configs.size(); ++ci) {
                    if (configs[ci].drafter != d) continue;
                    const double med = median(fig[size_t(phase)][ci].tps);
                    if (configs[ci].k < 0) auto_tps = med;
                    else if (med > best_tps) best_tps = med, best_k = configs[ci].k;
                }
                cases.push_back({std::string(kind->name) + "/" + phases[phase] + "/" + drafters[size_t(d)].label(),
                                 base > 0 ? auto_tps / base : 0, base > 0 ? best_tps / base : 0, best_k});
            }
        }
    }
    // Summary: how many cases meet each target, and the worst of each.
    std::printf("\n%-40s %10s %14s %7s\n", "kind/content/drafter", "auto/plain", "best fixed k", "auto/best");
    int plain_ok = 0, best_ok = 0;
    const verdict_case* worst_plain = nullptr;
    const verdict_case* worst_best = nullptr;
    // (Both ratios are to the same plain median, so auto/best compares their tokens/s.)
    const auto of_best = [](const verdict_case& c) { return c.best_fixed_ratio > 0 ? c.ratio / c.best_fixed_ratio : 0.0; };
    for (const auto& c : cases) {
        std::printf("%-40s %10.3f %9.3f (k %d) %7.3f\n", c.what.c_str(), c.ratio, c.best_fixed_ratio, c.best_k,
                    of_best(c));
        plain_ok += c.ratio >= 0.97;
        best_ok += c.ratio >= c.best_fixed_ratio;
        if (!worst_plain || c.ratio < worst_plain->ratio) worst_plain = &c;
        if (!worst_best || of_best(c) < of_best(*worst_best)) worst_best = &c;
    }
    const bool pass = plain_ok == int(cases.size()) && best_ok == int(cases.size());
    // How far the same work moves from round to round here: read the ratios against it (the best
    // of five fixed lengths is also the largest of five noisy medians).
    std::printf("noise: plain decoding's own range over the rounds is %.0f%% of its median (median over the %zu "
                "kind/content pairs)\n",
                100.0 * median(plain_spread), plain_spread.size());
    std::printf("bench spec verdict: %s | adaptive >= 0.97x plain in %d of %zu cases (worst %.3f, %s) | adaptive >= "
                "the best fixed k in %d of %zu (worst %.3f of it, %s)\n",
                pass ? "PASS" : "FAIL", plain_ok, cases.size(), worst_plain ? worst_plain->ratio : 0.0,
                worst_plain ? worst_plain->what.c_str() : "-", best_ok, cases.size(),
                worst_best ? of_best(*worst_best) : 0.0, worst_best ? worst_best->what.c_str() : "-");
    s.print_streaming_stats();
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file (with its tokenizer)"},
        {"draft", "FILE.gguf", "DSpark draft head: adds the dspark drafter"},
        {"n-predict", "N", "tokens decoded per run (default 32)", 'n'},
        {"rounds", "N", "rounds, every configuration once in each (default 3)"},
        {"kinds", "LIST", "content kinds, comma-separated (default verbatim,code,prose,puzzle)"},
        {"drafters", "LIST", "dspark, ngram, oracle (acceptance 0.5, 0.8, 0.97), comma-separated (default: all, "
                             "dspark with --draft)"},
        {"prompt-tokens", "N", "at most N tokens of each prompt (default 0: all)"},
    });
    return specs;
}

const command kCommand{kName,
                       "--model FILE.gguf [--draft FILE.gguf] [-n N] [--rounds N] [--kinds LIST] [--drafters LIST]",
                       "Greedy speculative decoding against plain decoding in the same run, on verbatim repetition, "
                       "code with explanation, prose in another language and a reasoning puzzle, each on new content "
                       "(tiers emptied) and repeated content (tiers warm): the DSpark head (with --draft), prompt "
                       "lookup and the oracle drafter at acceptance 0.5, 0.8 and 0.97, each at draft lengths 1..5 "
                       "and auto, experts streamed through the tiers. Prints tokens/s (median and range over rounds), "
                       "the ratio to plain decoding, acceptance, target steps per token, experts per layer a step "
                       "by k, and a verdict line against the targets (auto >= 0.97x plain and >= the best fixed k "
                       "everywhere); fails if any output differs from plain.",
                       options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
