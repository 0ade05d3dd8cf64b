// `moestream bench constraint`: what schema-following decoding costs per token. For each tool
// schema of real agents (tools/agent_schemas.h, or --schema files), a random "model" (uniform
// random logits through the real sampler, masked as the engine masks them) writes outputs under
// the constraint: as response_format json_schema, and as a forced call to that tool. The time of
// each mask (output_constraint::allowed over the whole vocabulary) is measured in this thread's
// CPU time and summarised per schema; plain JSON and lazy free text are the baselines.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "model/sampler.h"
#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "server/output_constraint.h"
#include "tools/agent_schemas.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench constraint";

const cli::option_spec kOptions[] = {
    {"tokenizer-json", "PATH", "use an HF tokenizer.json (the DeepSeek one of .deps/)"},
    {"model", "FILE.gguf", "use the tokenizer stored in a model file"},
    {"schema", "FILE.json", "a schema to measure instead of the agent corpus (repeatable)"},
    {"outputs", "N", "outputs per schema and shape (default 6)"},
    {"max-tokens", "N", "token limit of each output (default 300)"},
};

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct measured {
    std::vector<double> us;  // one entry per mask
    int64_t outputs = 0, finished = 0;
};

// Random outputs under `make()`'s constraints; every mask is timed.
template <class Make>
measured run_outputs(Make make, const tokenizer& tok, int64_t outputs, int64_t max_tokens) {
    measured m;
    const int32_t vocab = tok.vocab_size();
    std::vector<uint8_t> mask(static_cast<size_t>(vocab));
    std::vector<float> row(static_cast<size_t>(vocab));
    for (int64_t k = 0; k < outputs; ++k) {
        auto c = make();
        sampling_params p;
        p.temperature = 1.0f;
        p.seed = uint64_t(k) * 7919 + 3;
        sampler s(p, vocab);
        sampler_rng noise(uint64_t(k) * 104729 + 1);
        sample_result r;
        for (int64_t n = 0; n < max_tokens && !c->done(); ++n) {
            const double t0 = thread_cpu_seconds();
            c->allowed(mask);
            m.us.push_back((thread_cpu_seconds() - t0) * 1e6);
            for (size_t v = 0; v < row.size(); ++v)
                row[v] = mask[v] ? float(noise.uniform() * 8.0) : -std::numeric_limits<float>::infinity();
            row[size_t(tok.data().eos_id)] = -std::numeric_limits<float>::infinity();  // it writes on
            if (!s.sample(row, r)) break;
            c->accept(r.token);
        }
        ++m.outputs;
        m.finished += c->done() ? 1 : 0;
    }
    return m;
}

void print_row(std::string_view schema, std::string_view shape, measured m) {
    if (m.us.empty()) return;
    std::sort(m.us.begin(), m.us.end());
    double sum = 0;
    for (double x : m.us) sum += x;
    auto at = [&](double q) { return m.us[std::min(m.us.size() - 1, size_t(q * double(m.us.size())))]; };
    std::printf("%-14.*s %-16.*s %4lld/%-4lld %7zu %9.1f %8.1f %8.1f %9.1f\n", int(schema.size()),
                schema.data(), int(shape.size()), shape.data(), (long long)m.finished, (long long)m.outputs,
                m.us.size(), sum / double(m.us.size()), at(0.5), at(0.99), m.us.back());
}

result<std::string> read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error("cannot read '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

int run(const cli::args& a) {
    if (a.has("model") == a.has("tokenizer-json"))
        return usage_error(kName, "give exactly one of --model or --tokenizer-json");
    const auto outputs = a.get_int("outputs", 6);
    if (!outputs) return usage_error(kName, outputs.message());
    const auto max_tokens = a.get_int("max-tokens", 300);
    if (!max_tokens) return usage_error(kName, max_tokens.message());
    if (*outputs <= 0 || *outputs > 1000) return usage_error(kName, "--outputs must be between 1 and 1000");
    if (*max_tokens <= 0 || *max_tokens > 100000)
        return usage_error(kName, "--max-tokens must be between 1 and 100000");
    auto tok = [&]() -> result<tokenizer> {
        if (auto m = a.get("model")) return load_tokenizer(*m);
        auto data = load_hf_tokenizer(*a.get("tokenizer-json"), 129280);
        MS_TRY(data);
        return tokenizer::create(std::move(*data));
    }();
    if (!tok) return fail(kName, tok.message());

    struct named_schema {
        std::string name, text;
    };
    std::vector<named_schema> schemas;
    for (const auto& path : a.values("schema")) {
        auto text = read_text(path);
        if (!text) return fail(kName, text.message());
        schemas.push_back({std::filesystem::path(path).stem().string(), std::move(*text)});
    }
    if (schemas.empty())
        for (const auto& s : k_agent_schemas) schemas.push_back({std::string(s.name), std::string(s.schema)});

    const double t0 = thread_cpu_seconds();
    auto table = server::token_table::of(*tok);
    std::printf("token table of %d tokens: %.1f ms; masks over the whole vocabulary, 1 thread (CPU time)\n",
                tok->vocab_size(), (thread_cpu_seconds() - t0) * 1e3);
    std::printf("%-14s %-16s %9s %7s %9s %8s %8s %9s\n", "schema", "shape", "finished", "masks", "mean us",
                "p50 us", "p99 us", "max us");
    server::constraint_limits limits;
    limits.max_tokens = *max_tokens;
    for (const auto& s : schemas) {
        const double c0 = thread_cpu_seconds();
        auto compiled = server::json_schema::compile(s.text, s.name, server::schema_mode::exact);
        const double compile_us = (thread_cpu_seconds() - c0) * 1e6;
        if (!compiled) return fail(kName, s.name + ": " + compiled.error().message);
        auto schema = *compiled;
        print_row(s.name, "json_schema",
                  run_outputs([&] { return server::json_object_constraint(table, limits, schema); }, *tok,
                              *outputs, *max_tokens));
        const std::string tool = std::all_of(s.name.begin(), s.name.end(),
                                             [](char c) { return std::isalnum(uint8_t(c)) || c == '_'; })
                                     ? s.name
                                     : std::string("tool");
        print_row(s.name, "forced call",
                  run_outputs(
                      [&] {
                          return server::tool_call_constraint(table, *tok, {{tool, schema}}, limits, {});
                      },
                      *tok, *outputs, *max_tokens));
        std::printf("%-14s compiled in %.0f us\n", "", compile_us);
    }
    print_row("(none)", "json_object",
              run_outputs([&] { return server::json_object_constraint(table, limits); }, *tok, *outputs,
                          *max_tokens));
    server::tool_call_options lazy;
    lazy.lazy = true;
    lazy.reasoning = server::output_constraint::reasoning_start::may_open;
    print_row("(none)", "free text",
              run_outputs(
                  [&] {
                      return server::tool_call_constraint(table, *tok, {{"tool", nullptr}}, limits, lazy);
                  },
                  *tok, 2, *max_tokens));
    std::printf("finished: outputs complete within --max-tokens (free text never ends by itself)\n");
    return 0;
}

const command kCommand{
    kName,
    "(--tokenizer-json PATH | --model FILE.gguf) [--schema FILE.json]... [--outputs N] [--max-tokens N]",
    "Measures the per-token cost of schema-following decoding: the microseconds one mask over the "
    "vocabulary takes, for the tool schemas of real coding agents (or --schema files), as "
    "response_format json_schema and as a forced tool call, with random outputs.",
    kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
