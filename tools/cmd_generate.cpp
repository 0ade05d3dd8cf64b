// moestream generate: one prompt, prefilled in one forward, then decoded one token per step with
// the sampler, streaming the text as it is produced. The smallest end-to-end use of the model;
// the server runs the same loop for many sequences at once.
//
// Two prompt forms: --prompt TEXT (tokenized with the model file's tokenizer, optionally wrapped
// in the chat format) prints text; --prompt-tokens 1,2,3 bypasses the tokenizer and prints token
// ids, so converted checkpoints (synthetic vocabulary, no tokenizer) can generate too.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "spec/dspark_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/oracle_drafter.h"
#include "spec/speculative.h"
#include "tools/command.h"
#include "tools/model_session.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "generate";
constexpr int64_t kDefaultTokens = 128;

using clock_type = std::chrono::steady_clock;

// Concatenation by appending: GCC 12's -Wrestrict misfires on `"literal" + std::string`.
template <class... Parts>
std::string cat(const Parts&... parts) {
    std::string s;
    (s += ... += parts);
    return s;
}

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// --temp/--top-k/--top-p/--min-p/--seed -> validated sampling parameters (greedy unless --temp).
// Errors are usage errors: the message names the flag.
result<sampling_params> parse_sampling(const cli::args& a) {
    sampling_params p;
    auto temp = a.get_double("temp", 0.0);
    if (!temp) return temp.err();
    // The sampler reads any temperature <= 0 as greedy; a negative one on the command line is a
    // typo far more often than a request for greedy decoding, so it is refused.
    if (*temp < 0) return make_error(cat("--temp must be >= 0 (0: greedy), got ", a.get_or("temp", "")));
    p.temperature = float(*temp);
    auto top_k = a.get_int("top-k", 0);
    if (!top_k) return top_k.err();
    if (*top_k < 0 || *top_k > std::numeric_limits<int32_t>::max())
        return make_error(cat("--top-k must be >= 0 (0: off), got ", a.get_or("top-k", "")));
    p.top_k = int32_t(*top_k);
    auto top_p = a.get_double("top-p", 1.0);
    if (!top_p) return top_p.err();
    p.top_p = float(*top_p);
    auto min_p = a.get_double("min-p", 0.0);
    if (!min_p) return min_p.err();
    p.min_p = float(*min_p);
    if (a.has("seed")) {
        auto seed = a.get_int("seed", 0);
        if (!seed) return seed.err();
        if (*seed < 0) return make_error(cat("--seed must be >= 0, got ", a.get_or("seed", "")));
        p.seed = uint64_t(*seed);
    } else {
        // Reproducible on request only; the seed is printed with the statistics either way.
        std::random_device rd;
        p.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
    }
    // The vocabulary is not known before the model is open; it only bounds logit_bias, unused here.
    if (auto st = p.validate(std::numeric_limits<int32_t>::max()); !st)
        return make_error(cat("invalid sampling parameters: ", st.message(), " (--temp, --top-k, --top-p, --min-p)"));
    return p;
}

// The prompt's token ids: BOS (when the tokenizer asks for it) + the text, or the chat rendering
// of one user message with the generation prompt (its BOS is part of the rendered text).
std::vector<int32_t> prompt_ids(const tokenizer& tok, const std::string& text, bool chat, std::string& error) {
    if (!chat) {
        std::vector<int32_t> ids;
        if (tok.data().add_bos) ids.push_back(tok.data().bos_id);
        const auto body = tok.encode(text, false);
        ids.insert(ids.end(), body.begin(), body.end());
        return ids;
    }
    chat_special_tokens special;
    special.bos = tok.token_bytes(tok.data().bos_id);
    special.eos = tok.token_bytes(tok.data().eos_id);
    std::vector<chat_message> messages(1);
    messages[0].role = "user";
    messages[0].content = text;
    auto rendered = render_chat(messages, true, special);
    if (!rendered) {
        error = rendered.message();
        return {};
    }
    return tok.encode(*rendered, true);
}

// Where the output goes: text through the UTF-8 stream decoder (a character split across tokens is
// held back, never printed broken), or ids separated by spaces. Flushed per token.
class token_printer {
  public:
    explicit token_printer(const tokenizer* tok) : tok_(tok) {}
    void emit(int32_t id) {
        std::string s;
        if (tok_) {
            s = dec_.push(tok_->token_bytes(id));
        } else {
            if (!first_) s += ' ';
            s += std::to_string(id);
        }
        first_ = false;
        write(s);
    }
    void finish() {
        std::string s = tok_ ? dec_.finish() : std::string();
        s += '\n';
        write(s);
    }

  private:
    static void write(const std::string& s) {
        if (!s.empty()) std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
    }
    const tokenizer* tok_;
    utf8_stream_decoder dec_;
    bool first_ = true;
};

// How often the DSpark head's drafts would have been accepted: after each sampled token t the
// head drafts the block after it; its leading drafts that the target then produced count.
struct draft_tally {
    struct pending {
        size_t after;  // index in `generated` of the token the draft follows
        std::vector<int32_t> tokens;
    };
    std::vector<pending> drafts;

    // Mean accepted prefix per draft (cut short where generation ended).
    double mean_accepted(const std::vector<int32_t>& generated) const {
        if (drafts.empty()) return 0.0;
        int64_t total = 0;
        for (const auto& d : drafts)
            for (size_t j = 0; j < d.tokens.size() && d.after + 1 + j < generated.size(); ++j) {
                if (d.tokens[j] != generated[d.after + 1 + j]) break;
                ++total;
            }
        return double(total) / double(drafts.size());
    }
};

// --drafter / --spec-k: which drafter speculative decoding uses and how many tokens it drafts.
struct spec_choice {
    std::string drafter;  // empty: plain decoding
    double oracle_rate = 0;
    int k = 0;            // the most drafted a step
    bool adaptive = false;  // --spec-k auto: the per-step policy (spec/draft_policy.h) chooses up to k
};

result<spec_choice> parse_spec(const cli::args& a) {
    spec_choice c;
    if (!a.has("drafter")) {
        if (a.has("spec-k")) return make_error("--spec-k needs --drafter");
        return c;
    }
    const std::string d = a.get_or("drafter", "");
    if (d == "ngram") {
        c.drafter = d;
    } else if (d.rfind("oracle:", 0) == 0) {
        char* end = nullptr;
        const std::string rate = d.substr(7);
        c.oracle_rate = std::strtod(rate.c_str(), &end);
        if (rate.empty() || *end != '\0' || !(c.oracle_rate >= 0 && c.oracle_rate <= 1))
            return make_error(cat("--drafter oracle:RATE needs a rate in [0, 1], got '", rate, "'"));
        c.drafter = "oracle";
    } else if (d == "dspark") {
        if (!a.has("draft")) return make_error("--drafter dspark needs the draft head: --draft FILE.gguf");
        c.drafter = d;
    } else {
        return make_error(cat("--drafter must be ngram, oracle:RATE or dspark, got '", d, "'"));
    }
    const std::string k = a.get_or("spec-k", "auto");
    if (k == "auto") {
        c.adaptive = true;
        c.k = spec::draft_policy::kMaxK;
        return c;
    }
    auto v = a.get_int("spec-k", 0);
    if (!v) return v.err();
    if (*v < 0 || *v > 5) return make_error(cat("--spec-k must be 0..5, got ", k));
    c.k = int(*v);
    return c;
}

int run(const cli::args& a) {
    // ---- usage checks, before anything is opened ----
    auto cfg = load_config(a);
    if (!cfg) return usage_error(kName, cfg.message());
    if (!a.positional().empty()) return usage_error(kName, cat("unexpected argument '", a.positional()[0], "'"));
    if (cfg->model.path.empty()) return usage_error(kName, "missing required option --model");
    const bool ids_mode = a.has("prompt-tokens");
    if (ids_mode == a.has("prompt")) return usage_error(kName, "give exactly one of --prompt or --prompt-tokens");
    std::vector<int32_t> prompt;
    if (ids_mode) {
        if (a.flag("chat")) return usage_error(kName, "--chat needs --prompt (text); --prompt-tokens are used as given");
        auto ids = parse_token_list("prompt-tokens", a.get_or("prompt-tokens", ""));
        if (!ids) return usage_error(kName, ids.message());
        prompt = std::move(*ids);
        if (prompt.empty()) return usage_error(kName, "--prompt-tokens is empty");
    } else if (a.get_or("prompt", "").empty()) {
        return usage_error(kName, "--prompt is empty");
    }
    auto n_predict = a.get_int("n-predict", kDefaultTokens);
    if (!n_predict) return usage_error(kName, n_predict.message());
    if (*n_predict <= 0) return usage_error(kName, cat("-n/--n-predict must be > 0, got ", a.get_or("n-predict", "")));
    auto params = parse_sampling(a);
    if (!params) return usage_error(kName, params.message());
    auto spec_opts = parse_spec(a);
    if (!spec_opts) return usage_error(kName, spec_opts.message());

    // ---- model, tokenizer, prompt ----
    auto session = open_model_session(*cfg, !cfg->model.draft_path.empty());
    if (!session) return fail(kName, session.message());
    auto& s = **session;
    const int64_t vocab = s.hp().vocab;
    // The tokenizer is read from the already open model file. In --prompt-tokens mode it is only
    // used, when present, to know the end-of-sequence id.
    std::optional<tokenizer> tok;
    auto tok_data = read_tokenizer_data(s.files->target);
    const bool has_tokenizer = s.files->target.find("tokenizer.ggml.tokens") != nullptr;
    if (!ids_mode) {
        if (!has_tokenizer)
            return fail(kName, cat(cfg->model.path,
                                   " has no tokenizer (a converted checkpoint's synthetic vocabulary): give the "
                                   "prompt as ids with --prompt-tokens 1,2,3 (ids are printed instead of text)"));
        if (!tok_data) return fail(kName, tok_data.message());
        auto t = tokenizer::create(*tok_data);
        if (!t) return fail(kName, cat(cfg->model.path, ": ", t.message()));
        tok.emplace(std::move(*t));
        std::string error;
        prompt = prompt_ids(*tok, a.get_or("prompt", ""), a.flag("chat"), error);
        if (!error.empty()) return fail(kName, error);
        if (prompt.empty()) return usage_error(kName, "--prompt gives no tokens");
    }
    const int32_t eos = tok_data ? tok_data->eos_id : -1;  // -1: no end-of-sequence stop

    // Checked here, not left to the forward: the sampler's history takes the prompt first.
    for (int32_t id : prompt)
        if (id >= vocab)
            return fail(kName, cat("token id ", std::to_string(id), " is outside the vocabulary of ",
                                   std::to_string(vocab), " (--prompt-tokens)"));
    const int64_t ctx = cfg->runtime.context_tokens;
    if (int64_t(prompt.size()) >= ctx)
        return fail(kName, cat("the prompt has ", std::to_string(prompt.size()), " tokens and the context holds ",
                               std::to_string(ctx), " (runtime.context_tokens, --ctx-size): no room to generate"));
    // Room for the prompt and every generated token but the last (which is never fed back).
    // (With a drafter, room for the rows of one more verification block.)
    const int64_t capacity = std::min(ctx, int64_t(prompt.size()) + *n_predict + spec_opts->k);
    auto seq = s.new_sequence(capacity);
    sampler smp(*params, vocab);
    smp.reset(prompt);
    token_printer out(ids_mode ? nullptr : &*tok);
    draft_tally tally;
    std::vector<int32_t> generated;
    std::vector<float> logits;
    dsv41::draft_output draft;

    // ---- prefill ----
    const auto t_prefill = clock_type::now();
    dsv41::forward_item prefill{seq.get(), prompt, false};
    if (auto st = s.model->forward({&prefill, 1}, logits); !st) return fail(kName, st.message());
    const double prefill_s = seconds_since(t_prefill);

    // ---- speculative decoding: drafts verified k + 1 rows at a time (greedy, or speculative
    // sampling, which keeps the sampler's distribution) ----
    if (!spec_opts->drafter.empty()) {
        const bool sampled = params->temperature > 0;
        int32_t first = spec::greedy_token(logits);
        if (sampled) {
            auto r = smp.sample(logits);
            if (!r) return fail(kName, r.message());
            first = r->token;
        }
        std::unique_ptr<spec::drafter> drafter;
        if (spec_opts->drafter == "ngram") {
            drafter = std::make_unique<spec::ngram_drafter>();
        } else if (spec_opts->drafter == "dspark") {
            drafter = std::make_unique<spec::dspark_drafter>(*s.model, *seq);
        } else {
            // The oracle proposes the target's own greedy continuation, recorded first on a copy.
            auto rec = s.new_sequence(capacity);
            rec->copy_from(*seq);
            std::vector<int32_t> continuation;
            spec::ngram_drafter none;
            spec::greedy_options plain;
            plain.stop_token = eos;
            if (auto r = spec::decode_greedy(*s.model, *rec, first, *n_predict, none, plain, continuation); !r)
                return fail(kName, r.message());
            drafter = std::make_unique<spec::oracle_drafter>(continuation, int64_t(prompt.size()),
                                                             spec_opts->oracle_rate, int32_t(vocab));
        }
        spec::draft_policy policy(spec::draft_policy::kMaxK, spec::shape_of(s.hp()));
        spec::step_recorder recorder(s.hp().n_layers, s.tally_probe());
        spec::greedy_options o;
        o.k = spec_opts->k;
        o.recorder = &recorder;
        if (spec_opts->adaptive) o.policy = &policy;
        o.stop_token = eos;
        o.on_token = [&](int32_t t) { out.emit(t); };
        const auto t_spec = clock_type::now();
        // The last token is never fed: n tokens need n - 1 positions after the prompt.
        const int64_t n = std::min<int64_t>(*n_predict, capacity - int64_t(prompt.size()) + 1);
        auto r = sampled ? spec::decode_sampled(*s.model, *seq, first, n, *drafter, o, smp, generated)
                         : spec::decode_greedy(*s.model, *seq, first, n, *drafter, o, generated);
        const double spec_s = seconds_since(t_spec);
        out.finish();
        if (!r) return fail(kName, r.message());
        const std::string sampling =
            sampled ? cat("temp ", std::to_string(params->temperature), " seed ", std::to_string(params->seed)) : "greedy";
        // "auto (steps by drafted tokens 12/0/1/0/0/7)" or the fixed k.
        std::string k_text = std::to_string(spec_opts->k);
        if (spec_opts->adaptive) {
            k_text = "auto (steps by tokens drafted ";
            for (size_t i = 0; i < r->steps_by_k.size(); ++i)
                k_text += (i ? "/" : "") + std::to_string(r->steps_by_k[i]);
            k_text += ")";
        }
        const std::string stop = r->stopped                              ? std::string("end of sequence")
                                 : int64_t(generated.size()) >= *n_predict ? cat("-n ", std::to_string(*n_predict), " reached")
                                                                          : cat("context limit of ", std::to_string(ctx),
                                                                                " tokens reached (runtime.context_tokens, --ctx-size)");
        std::fprintf(stderr,
                     "prompt %zu tokens, prefill %.1f tok/s (%.3f s) | generated %zu tokens, decode %.1f tok/s "
                     "(%.3f s) | stop: %s | %s | drafter %s, k %s: target steps %lld, accepted %lld of %lld "
                     "drafted\n",
                     prompt.size(), prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0, prefill_s,
                     generated.size(), spec_s > 0 ? double(generated.size()) / spec_s : 0.0, spec_s, stop.c_str(),
                     sampling.c_str(), drafter->name().c_str(), k_text.c_str(), static_cast<long long>(r->target_steps),
                     static_cast<long long>(r->accepted), static_cast<long long>(r->drafted));
        // The union a step loaded by tokens drafted: experts per layer, and the share of them
        // that were not resident when announced.
        std::string unions;
        for (int k = 0; k <= spec::draft_policy::kMaxK; ++k) {
            const auto& t = recorder.by_k()[size_t(k)];
            if (t.counted == 0) continue;
            char buf[96];
            std::snprintf(buf, sizeof buf, "%sk %d: %.1f (%.0f%% not resident)", unions.empty() ? "" : ", ", k,
                          double(t.experts) / double(t.counted) / double(s.hp().n_layers),
                          t.experts > 0 ? 100.0 * double(t.in_flight + t.missing) / double(t.experts) : 0.0);
            unions += buf;
        }
        if (!unions.empty()) std::fprintf(stderr, "experts per layer a step: %s\n", unions.c_str());
        s.print_streaming_stats();
        return 0;
    }

    // ---- decode: sample, print, feed back ----
    const auto t_decode = clock_type::now();
    int64_t steps = 0;
    std::string stop;
    sample_result picked;
    for (;;) {
        if (auto st = smp.sample(logits, picked); !st) {
            out.finish();
            return fail(kName, st.message());
        }
        const int32_t id = picked.token;
        if (id == eos) {
            stop = "end of sequence";
            break;
        }
        smp.accept(id);
        generated.push_back(id);
        out.emit(id);
        if (int64_t(generated.size()) >= *n_predict) {
            stop = cat("-n ", std::to_string(*n_predict), " reached");
            break;
        }
        if (seq->size() >= seq->capacity()) {
            stop = cat("context limit of ", std::to_string(ctx), " tokens reached (runtime.context_tokens, --ctx-size)");
            break;
        }
        if (s.model->has_draft()) {
            if (auto st = s.model->draft(*seq, id, draft); !st) {
                out.finish();
                return fail(kName, st.message());
            }
            tally.drafts.push_back({generated.size() - 1, draft.tokens});
        }
        dsv41::forward_item item{seq.get(), {&id, 1}, false};
        if (auto st = s.model->forward({&item, 1}, logits); !st) {
            out.finish();
            return fail(kName, st.message());
        }
        ++steps;
    }
    const double decode_s = seconds_since(t_decode);
    out.finish();

    // ---- statistics (stderr: stdout holds only the generated output) ----
    const double prefill_rate = prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0;
    const double decode_rate = decode_s > 0 && steps > 0 ? double(steps) / decode_s : 0.0;
    std::fprintf(stderr,
                 "prompt %zu tokens, prefill %.1f tok/s (%.3f s) | generated %zu tokens, decode %.1f tok/s "
                 "(%lld steps, %.3f s) | stop: %s | ",
                 prompt.size(), prefill_rate, prefill_s, generated.size(), decode_rate, static_cast<long long>(steps),
                 decode_s, stop.c_str());
    if (params->temperature > 0)
        std::fprintf(stderr, "temp %g seed %llu", double(params->temperature),
                     static_cast<unsigned long long>(params->seed));
    else
        std::fprintf(stderr, "greedy");
    if (s.model->has_draft())
        std::fprintf(stderr, " | draft: %.2f of %d drafts accepted per step (%zu steps)",
                     tally.mean_accepted(generated), s.hp().dspark_block_size, tally.drafts.size());
    std::fprintf(stderr, "\n");
    s.print_streaming_stats();
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({
        {"model", "FILE.gguf", "deepseek41 model file"},
        {"prompt", "TEXT", "prompt text, tokenized with the model file's tokenizer"},
        {"prompt-tokens", "1,2,3", "prompt as token ids (no tokenizer needed); ids are printed instead of text"},
        {"chat", "", "wrap --prompt as one user message in the model's chat format, ending with the assistant prefix"},
        {"n-predict", "N", "generate at most N tokens (default 128)", 'n'},
        {"temp", "T", "sampling temperature (default 0: greedy)"},
        {"top-k", "K", "keep the K most likely tokens (0: off, the default)"},
        {"top-p", "P", "nucleus sampling: keep the smallest set with probability >= P (1: off, the default)"},
        {"min-p", "P", "keep tokens with probability >= P times the top one (0: off, the default)"},
        {"seed", "S", "random seed of the sampler (default: a random one, printed at the end)"},
        {"draft", "FILE.gguf", "DSpark draft head (dflash); reports how many of its drafts the target agreed with"},
        {"drafter", "NAME", "speculative decoding (greedy, or speculative sampling with --temp): dspark (the --draft head), ngram (prompt lookup) or "
                            "oracle:RATE (the recorded greedy continuation, each token kept with probability RATE, "
                            "else replaced: oracle:1.0 proposes it exactly; for measurement)"},
        {"spec-k", "K", "tokens drafted a step with --drafter: auto (the default: chosen per step from measured "
                        "acceptance and step times, up to 5) or 0..5"},
    });
    return specs;
}

const command kCommand{
    kName,
    "--model FILE.gguf (--prompt TEXT [--chat] | --prompt-tokens 1,2,3) [-n N] [--temp T] [--top-p P] [--top-k K] "
    "[--min-p P] [--seed S] [--draft FILE.gguf] [--drafter dspark|ngram|oracle:RATE [--spec-k auto|K]]",
    "Generates text from a prompt: prefills it in one forward, then decodes one token per step (greedy unless "
    "--temp is given), streaming the text to stdout as it is produced. Stops at the end-of-sequence token, after "
    "-n tokens, or at the context limit (runtime.context_tokens). A statistics line (prompt and generated tokens, "
    "prefill and decode tok/s, why it stopped) goes to stderr. With --prompt-tokens the tokenizer is bypassed and "
    "the generated ids are printed, space separated, so models without a tokenizer (converted checkpoints) work too.",
    options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
