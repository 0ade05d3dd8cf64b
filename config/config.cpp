#include "config/config.h"

#include <simdjson.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace moestream {
namespace {

constexpr cli::option_spec kConfigOptions[] = {
    {"config", "FILE.json", "configuration file (CLI flags override it)"},
    {"device-cache", "GiB", "device expert cache budget (VRAM, or RAM on the CPU backend)"},
    {"host-cache", "GiB", "host expert cache budget, or auto (default: --host-cache-share of the available memory)"},
    {"host-cache-share", "F", "share of the available memory an auto host cache takes (default 0.75)"},
    {"draft-cache", "GiB", "the DSpark draft's own expert slots: GiB, all (default: every draft expert) or 0 (share the "
                           "target's tiers)"},
    {"cache-policy", "NAME", "which expert a full tier evicts: lru (default), lfu or layered (early layers kept longer)"},
    {"io-depth", "N", "io_uring reads in flight at most"},
    {"io-chunk", "KiB", "expert read chunk size"},
    {"io-mode", "MODE", "coroutine (default) or remap-sync (the published port's design, for comparison)"},
    {"lookahead", "N", "layers a streamed forward predicts ahead: 0 to 6 (default 2)"},
    {"threads", "N", "compute threads (0 = one per core)"},
    {"ctx-size", "N", "context length per sequence, in tokens"},
    {"backend", "NAME", "auto, cpu or cuda"},
    {"log-level", "LEVEL", "trace, debug, info, warn, error or off"},
};

using simdjson::dom::element;
using simdjson::dom::object;

std::string field_path(std::string_view origin, std::string_view section, std::string_view key) {
    std::string p = std::string(origin) + ": ";
    if (!section.empty()) p += std::string(section) + ".";
    return p + std::string(key);
}

status read_number(element v, const std::string& where, double& out) {
    double d;
    if (v.get(d) != simdjson::SUCCESS) {
        int64_t i;
        if (v.get(i) != simdjson::SUCCESS) return make_error(where + " must be a number");
        d = double(i);
    }
    out = d;
    return {};
}

status read_int(element v, const std::string& where, int64_t& out) {
    int64_t i;
    if (v.get(i) != simdjson::SUCCESS) return make_error(where + " must be an integer");
    out = i;
    return {};
}

status read_string(element v, const std::string& where, std::string& out) {
    std::string_view s;
    if (v.get(s) != simdjson::SUCCESS) return make_error(where + " must be a string");
    out = std::string(s);
    return {};
}

status read_strings(element v, const std::string& where, std::vector<std::string>& out) {
    simdjson::dom::array arr;
    if (v.get(arr) != simdjson::SUCCESS) return make_error(where + " must be an array of strings");
    out.clear();
    for (element item : arr) {
        std::string s;
        MS_TRY(read_string(item, where + "[]", s));
        out.push_back(std::move(s));
    }
    return {};
}

result<io_mode> parse_io_mode(std::string_view s, const std::string& where) {
    if (s == "coroutine") return io_mode::coroutine;
    if (s == "remap-sync") return io_mode::remap_sync;
    return make_error(where + ": '" + std::string(s) + "' is not an io mode (coroutine, remap-sync)");
}

// Each section is a JSON object whose keys map onto one settings struct.
status apply_section(moestream_config& c, std::string_view section, object obj, std::string_view origin) {
    for (auto [key, v] : obj) {
        std::string where = field_path(origin, section, key);
        if (section == "model") {
            if (key == "path") MS_TRY(read_string(v, where, c.model.path));
            else if (key == "draft_path") MS_TRY(read_string(v, where, c.model.draft_path));
            else return make_error(where + " is not a known field (path, draft_path)");
        } else if (section == "cache") {
            if (key == "device_cache_gib") MS_TRY(read_number(v, where, c.cache.device_cache_gib));
            else if (key == "host_cache_gib") {
                std::string_view text;
                if (v.get(text) == simdjson::SUCCESS) {
                    if (text != "auto") return make_error(where + " must be a number of GiB or \"auto\"");
                    c.cache.host_cache_gib = cache_settings::k_auto;
                } else {
                    MS_TRY(read_number(v, where, c.cache.host_cache_gib));
                    if (c.cache.host_cache_gib < 0) return make_error(where + " must be a number of GiB or \"auto\"");
                }
            } else if (key == "host_cache_share") MS_TRY(read_number(v, where, c.cache.host_cache_share));
            else if (key == "draft_cache_gib") {
                std::string_view text;
                if (v.get(text) == simdjson::SUCCESS) {
                    if (text != "all") return make_error(where + " must be a number of GiB or \"all\"");
                    c.cache.draft_cache_gib = cache_settings::k_all;
                } else {
                    MS_TRY(read_number(v, where, c.cache.draft_cache_gib));
                    if (c.cache.draft_cache_gib < 0) return make_error(where + " must be a number of GiB or \"all\"");
                }
            } else if (key == "policy") MS_TRY(read_string(v, where, c.cache.policy));
            else
                return make_error(where + " is not a known field (device_cache_gib, host_cache_gib, host_cache_share, "
                                          "draft_cache_gib, policy)");
        } else if (section == "io") {
            if (key == "depth") MS_TRY(read_int(v, where, c.io.depth));
            else if (key == "chunk_kib") MS_TRY(read_int(v, where, c.io.chunk_kib));
            else if (key == "lookahead_layers") MS_TRY(read_int(v, where, c.io.lookahead_layers));
            else if (key == "mode") {
                std::string s;
                MS_TRY(read_string(v, where, s));
                auto m = parse_io_mode(s, where);
                if (!m) return m.err();
                c.io.mode = *m;
            } else return make_error(where + " is not a known field (depth, chunk_kib, lookahead_layers, mode)");
        } else if (section == "runtime") {
            if (key == "threads") MS_TRY(read_int(v, where, c.runtime.threads));
            else if (key == "context_tokens") MS_TRY(read_int(v, where, c.runtime.context_tokens));
            else if (key == "sequences_max") MS_TRY(read_int(v, where, c.runtime.sequences_max));
            else if (key == "backend") MS_TRY(read_string(v, where, c.runtime.backend));
            else return make_error(where + " is not a known field (threads, context_tokens, sequences_max, backend)");
        } else if (section == "server") {
            if (key == "host") MS_TRY(read_string(v, where, c.server.host));
            else if (key == "port") MS_TRY(read_int(v, where, c.server.port));
            else if (key == "api_keys") MS_TRY(read_strings(v, where, c.server.api_keys));
            else if (key == "cors_origins") MS_TRY(read_strings(v, where, c.server.cors_origins));
            else if (key == "body_bytes_max") MS_TRY(read_int(v, where, c.server.body_bytes_max));
            else if (key == "wait_queue_max") MS_TRY(read_int(v, where, c.server.wait_queue_max));
            else if (key == "request_timeout_s") MS_TRY(read_int(v, where, c.server.request_timeout_s));
            else if (key == "response_store_max") MS_TRY(read_int(v, where, c.server.response_store_max));
            else return make_error(where + " is not a known field");
        } else if (section == "speculative") {
            if (key == "drafter") MS_TRY(read_string(v, where, c.speculative.drafter));
            else if (key == "k") {
                std::string_view text;
                if (v.get(text) == simdjson::SUCCESS) {
                    if (text != "auto") return make_error(where + " must be \"auto\" or 0..5");
                    c.speculative.k = spec_settings::k_auto;
                } else {
                    MS_TRY(read_int(v, where, c.speculative.k));
                    if (c.speculative.k < 0) return make_error(where + " must be \"auto\" or 0..5");
                }
            } else return make_error(where + " is not a known field (drafter, k)");
        } else if (section == "log") {
            if (key == "level") MS_TRY(read_string(v, where, c.log.level));
            else return make_error(where + " is not a known field (level)");
        } else if (section == "paths") {
            if (key == "deps_dir") MS_TRY(read_string(v, where, c.paths.deps_dir));
            else return make_error(where + " is not a known field (deps_dir)");
        }
    }
    return {};
}

template <class T>
status set_from_flag(const cli::args& a, std::string_view flag, T& out) {
    auto v = a.get(flag);
    if (!v) return {};
    if constexpr (std::is_same_v<T, double>) {
        auto d = cli::parse_double(*v, "--" + std::string(flag));
        if (!d) return d.err();
        out = *d;
    } else if constexpr (std::is_same_v<T, int64_t>) {
        auto i = cli::parse_int(*v, "--" + std::string(flag));
        if (!i) return i.err();
        out = *i;
    } else {
        out = *v;
    }
    return {};
}

std::string json_escape(std::string_view s) {
    std::string o = "\"";
    for (char ch : s) {
        if (ch == '"' || ch == '\\') o += '\\', o += ch;
        else if (static_cast<unsigned char>(ch) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", ch);
            o += buf;
        } else o += ch;
    }
    return o + "\"";
}

std::string json_strings(const std::vector<std::string>& v, bool redact) {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + json_escape(redact ? "<redacted>" : v[i]);
    return o + "]";
}

}  // namespace

std::span<const cli::option_spec> config_option_specs() { return kConfigOptions; }

std::vector<cli::option_spec> with_config_options(std::initializer_list<cli::option_spec> specs) {
    std::vector<cli::option_spec> out(specs);
    out.insert(out.end(), std::begin(kConfigOptions), std::end(kConfigOptions));
    return out;
}

const char* io_mode_name(io_mode m) { return m == io_mode::coroutine ? "coroutine" : "remap-sync"; }

std::string default_config_dir() { return MOESTREAM_DEFAULT_CONFIG_DIR; }

result<moestream_config> apply_json(moestream_config c, std::string_view json, std::string_view origin) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json);
    element root;
    if (auto err = parser.parse(padded).get(root); err)
        return make_error(std::string(origin) + ": not valid JSON (" + simdjson::error_message(err) + ")");
    object top;
    if (root.get(top) != simdjson::SUCCESS) return make_error(std::string(origin) + ": must be a JSON object");
    static constexpr std::string_view kSections[] = {"model", "cache", "io", "runtime", "server", "speculative", "log", "paths"};
    for (auto [key, v] : top) {
        if (key == "$comment" || key == "description") continue;
        bool known = false;
        for (auto s : kSections) known |= (s == key);
        if (!known)
            return make_error(std::string(origin) + ": '" + std::string(key) +
                              "' is not a known section (model, cache, io, runtime, server, speculative, log, paths)");
        object obj;
        if (v.get(obj) != simdjson::SUCCESS)
            return make_error(std::string(origin) + ": section '" + std::string(key) + "' must be an object");
        MS_TRY(apply_section(c, key, obj, origin));
    }
    return c;
}

uint64_t host_tier_bytes(const cache_settings& c, uint64_t available_bytes) {
    if (c.host_cache_gib != cache_settings::k_auto) return uint64_t(c.host_cache_gib * double(uint64_t(1) << 30));
    return uint64_t(c.host_cache_share * double(available_bytes));
}

status validate(const moestream_config& c) {
    auto bad = [](std::string field, std::string why) { return make_error(field + " " + why); };
    if (!(c.cache.device_cache_gib >= 0 && c.cache.device_cache_gib <= 4096))
        return bad("cache.device_cache_gib (--device-cache)", "must be between 0 and 4096 GiB");
    if (!(c.cache.host_cache_gib == cache_settings::k_auto ||
          (c.cache.host_cache_gib >= 0 && c.cache.host_cache_gib <= 65536)))
        return bad("cache.host_cache_gib (--host-cache)", "must be auto or between 0 and 65536 GiB");
    if (!(c.cache.host_cache_share > 0 && c.cache.host_cache_share <= 1))
        return bad("cache.host_cache_share (--host-cache-share)", "must be above 0 and at most 1");
    if (!(c.cache.draft_cache_gib == cache_settings::k_all ||
          (c.cache.draft_cache_gib >= 0 && c.cache.draft_cache_gib <= 65536)))
        return bad("cache.draft_cache_gib (--draft-cache)", "must be all or between 0 and 65536 GiB");
    if (c.cache.policy != "lru" && c.cache.policy != "lfu" && c.cache.policy != "layered")
        return bad("cache.policy (--cache-policy)", "must be lru, lfu or layered, got '" + c.cache.policy + "'");
    if (c.io.depth < 1 || c.io.depth > 4096) return bad("io.depth (--io-depth)", "must be between 1 and 4096");
    if (c.io.lookahead_layers < 0 || c.io.lookahead_layers > kMaxLookaheadLayers)
        return bad("io.lookahead_layers (--lookahead)",
                   "must be between 0 and " + std::to_string(kMaxLookaheadLayers) + " layers");
    if (c.io.chunk_kib < 4 || c.io.chunk_kib > 65536 || c.io.chunk_kib % 4 != 0)
        return bad("io.chunk_kib (--io-chunk)", "must be a multiple of 4 between 4 and 65536 KiB (O_DIRECT alignment)");
    if (c.runtime.threads < 0 || c.runtime.threads > 1024)
        return bad("runtime.threads (--threads)", "must be between 0 (one per core) and 1024");
    if (c.runtime.context_tokens < 16 || c.runtime.context_tokens > (1 << 20))
        return bad("runtime.context_tokens (--ctx-size)", "must be between 16 and 1048576");
    if (c.runtime.sequences_max < 1 || c.runtime.sequences_max > 1024)
        return bad("runtime.sequences_max", "must be between 1 and 1024");
    if (c.runtime.backend != "auto" && c.runtime.backend != "cpu" && c.runtime.backend != "cuda")
        return bad("runtime.backend (--backend)", "must be auto, cpu or cuda, not '" + c.runtime.backend + "'");
    if (c.server.port < 0 || c.server.port > 65535) return bad("server.port (--port)", "must be between 0 and 65535");
    if (c.server.host.empty()) return bad("server.host (--host)", "must not be empty");
    if (c.server.body_bytes_max < 1024) return bad("server.body_bytes_max", "must be at least 1024");
    if (c.server.wait_queue_max < 0) return bad("server.wait_queue_max", "must not be negative");
    if (c.server.request_timeout_s < 1) return bad("server.request_timeout_s", "must be at least 1 second");
    if (c.server.response_store_max < 0 || c.server.response_store_max > 1000000)
        return bad("server.response_store_max", "must be between 0 (keep none) and 1000000");
    for (const auto& k : c.server.api_keys)
        if (k.empty()) return bad("server.api_keys", "must not contain an empty key");
    const auto& d = c.speculative.drafter;
    if (d != "auto" && d != "dspark" && d != "ngram" && d != "none")
        return bad("speculative.drafter (--drafter)", "must be auto, dspark, ngram or none, not '" + d + "'");
    if (c.speculative.k != spec_settings::k_auto && (c.speculative.k < 0 || c.speculative.k > 5))
        return bad("speculative.k (--spec-k)", "must be auto or 0..5");
    static constexpr std::string_view kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
    bool level_ok = false;
    for (auto l : kLevels) level_ok |= (l == c.log.level);
    if (!level_ok) return bad("log.level (--log-level)", "must be one of trace, debug, info, warn, error, off");
    return {};
}

result<moestream_config> load_config(const cli::args& a) {
    moestream_config c;
    if (const char* deps = std::getenv("MOESTREAM_DEPS_DIR"); deps && *deps) c.paths.deps_dir = deps;
    else c.paths.deps_dir = MOESTREAM_DEFAULT_DEPS_DIR;
    if (const char* lvl = std::getenv("MOESTREAM_LOG"); lvl && *lvl) c.log.level = lvl;

    if (auto path = a.get("config")) {
        std::ifstream in(*path, std::ios::binary);
        if (!in) return make_error("--config: cannot read '" + *path + "'");
        std::stringstream ss;
        ss << in.rdbuf();
        auto applied = apply_json(std::move(c), ss.str(), *path);
        if (!applied) return applied.err();
        c = std::move(applied.value());
    }
    MS_TRY(set_from_flag(a, "device-cache", c.cache.device_cache_gib));
    if (auto h = a.get("host-cache"); h && *h == "auto") c.cache.host_cache_gib = cache_settings::k_auto;
    else if (h) {
        MS_TRY(set_from_flag(a, "host-cache", c.cache.host_cache_gib));
        if (c.cache.host_cache_gib < 0) return make_error("--host-cache must be a number of GiB or auto, got '" + *h + "'");
    }
    MS_TRY(set_from_flag(a, "host-cache-share", c.cache.host_cache_share));
    if (auto d = a.get("draft-cache"); d && *d == "all") c.cache.draft_cache_gib = cache_settings::k_all;
    else if (d) {
        MS_TRY(set_from_flag(a, "draft-cache", c.cache.draft_cache_gib));
        if (c.cache.draft_cache_gib < 0) return make_error("--draft-cache must be a number of GiB or all, got '" + *d + "'");
    }
    MS_TRY(set_from_flag(a, "cache-policy", c.cache.policy));
    MS_TRY(set_from_flag(a, "io-depth", c.io.depth));
    MS_TRY(set_from_flag(a, "io-chunk", c.io.chunk_kib));
    MS_TRY(set_from_flag(a, "lookahead", c.io.lookahead_layers));
    if (auto m = a.get("io-mode")) {
        auto mode = parse_io_mode(*m, "--io-mode");
        if (!mode) return mode.err();
        c.io.mode = *mode;
    }
    MS_TRY(set_from_flag(a, "threads", c.runtime.threads));
    MS_TRY(set_from_flag(a, "ctx-size", c.runtime.context_tokens));
    MS_TRY(set_from_flag(a, "backend", c.runtime.backend));
    MS_TRY(set_from_flag(a, "log-level", c.log.level));
    if (a.has("model")) c.model.path = *a.get("model");
    if (a.has("draft")) c.model.draft_path = *a.get("draft");
    if (a.has("host")) c.server.host = *a.get("host");
    MS_TRY(set_from_flag(a, "port", c.server.port));
    if (a.has("api-key")) c.server.api_keys = a.values("api-key");
    MS_TRY(validate(c));
    return c;
}

status apply_spec_flags(const cli::args& a, spec_settings& s) {
    spec_settings out = s;
    if (auto d = a.get("drafter")) out.drafter = *d;
    if (auto k = a.get("spec-k")) {
        if (*k == "auto") {
            out.k = spec_settings::k_auto;
        } else {
            auto v = cli::parse_int(*k, "--spec-k");
            if (!v) return v.err();
            out.k = *v;
        }
    }
    moestream_config probe;
    probe.speculative = out;
    MS_TRY(validate(probe));
    s = out;
    return {};
}

std::string to_json(const moestream_config& c) {
    std::ostringstream o;
    o << "{\n  \"model\": {\"path\": " << json_escape(c.model.path)
      << ", \"draft_path\": " << json_escape(c.model.draft_path) << "},\n"
      << "  \"cache\": {\"device_cache_gib\": " << c.cache.device_cache_gib
      << ", \"host_cache_gib\": ";
    if (c.cache.host_cache_gib == cache_settings::k_auto) o << "\"auto\"";
    else o << c.cache.host_cache_gib;
    o << ", \"host_cache_share\": " << c.cache.host_cache_share << ", \"draft_cache_gib\": ";
    if (c.cache.draft_cache_gib == cache_settings::k_all) o << "\"all\"";
    else o << c.cache.draft_cache_gib;
    o << ", \"policy\": " << json_escape(c.cache.policy) << "},\n"
      << "  \"io\": {\"depth\": " << c.io.depth << ", \"chunk_kib\": " << c.io.chunk_kib
      << ", \"lookahead_layers\": " << c.io.lookahead_layers
      << ", \"mode\": \"" << io_mode_name(c.io.mode) << "\"},\n"
      << "  \"runtime\": {\"threads\": " << c.runtime.threads << ", \"context_tokens\": " << c.runtime.context_tokens
      << ", \"sequences_max\": " << c.runtime.sequences_max << ", \"backend\": " << json_escape(c.runtime.backend)
      << "},\n"
      << "  \"server\": {\"host\": " << json_escape(c.server.host) << ", \"port\": " << c.server.port
      << ", \"api_keys\": " << json_strings(c.server.api_keys, true)
      << ", \"cors_origins\": " << json_strings(c.server.cors_origins, false)
      << ", \"body_bytes_max\": " << c.server.body_bytes_max << ", \"wait_queue_max\": " << c.server.wait_queue_max
      << ", \"request_timeout_s\": " << c.server.request_timeout_s
      << ", \"response_store_max\": " << c.server.response_store_max << "},\n"
      << "  \"speculative\": {\"drafter\": " << json_escape(c.speculative.drafter) << ", \"k\": ";
    if (c.speculative.k == spec_settings::k_auto) o << "\"auto\"";
    else o << c.speculative.k;
    o << "},\n"
      << "  \"log\": {\"level\": " << json_escape(c.log.level) << "},\n"
      << "  \"paths\": {\"deps_dir\": " << json_escape(c.paths.deps_dir) << "}\n}\n";
    return o.str();
}

}  // namespace moestream
