// The one typed configuration of moestream: defaults, overridden by a JSON file (--config),
// overridden by CLI flags. Validated once in load_config(); every message names the field and
// why it is wrong. Modules receive const& slices (cache_settings, io_settings, ...).
//
// This is the only place that reads the environment (MOESTREAM_DEPS_DIR, MOESTREAM_LOG).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config/cli.h"
#include "config/result.h"

namespace moestream {

struct model_settings {
    std::string path;        // target GGUF (first shard for split models)
    std::string draft_path;  // optional DSpark `dflash` GGUF
};

// Expert cache budgets. The device tier is VRAM on CUDA, a budgeted RAM region on the CPU backend.
struct cache_settings {
    static constexpr double k_auto = -1;  // host_cache_gib: "auto"
    double device_cache_gib = 0.5;
    // The host tier: GiB, or "auto" (the default): host_cache_share of the memory the system has
    // available at start-up (MemAvailable), never more than every expert takes. The model file is
    // read with O_DIRECT, so the page cache serves nothing of it while serving (dense weights
    // are copied out at load, experts and engram rows bypass it): free RAM is only useful as host
    // tier. The share leaves a quarter to the sequence states, the other processes and the OS.
    double host_cache_gib = k_auto;
    double host_cache_share = 0.75;
    // The DSpark draft's experts in slots of their own (--draft-cache), so drafting never evicts
    // the target's hot experts: GiB, "all" (the default: every draft expert stays resident once
    // read) or 0 (the draft shares the target's tiers).
    static constexpr double k_all = -1;  // draft_cache_gib: "all"
    double draft_cache_gib = k_all;
    // Which expert a full tier evicts (--cache-policy): "lru" (the default), "lfu", or "layered"
    // (LRU with a head start for the early layers, whose misses stall a streamed step; see
    // storage/eviction_policy.h).
    std::string policy = "lru";
};

// The host tier's bytes for `c`: host_cache_gib, or for "auto" host_cache_share of
// `available_bytes`.
uint64_t host_tier_bytes(const cache_settings& c, uint64_t available_bytes);

enum class io_mode { coroutine, remap_sync };

// The look-ahead's reach in layers. The model keeps one router score block per layer it predicts
// (dsv41 forward), the expert tier a hint window that deep.
inline constexpr int kMaxLookaheadLayers = 6;

struct io_settings {
    int64_t depth = 64;        // io_uring submissions in flight at most
    int64_t chunk_kib = 1024;  // expert reads are split into chunks of this size
    // Layers a streamed forward predicts ahead (their routers on the current layer's input, sent
    // as read hints): 0 = none, 1 = the next layer, 2 = the next two, and so on. Two: with predictions read a
    // few at a time, nearest layer first, it decoded streamed mini on the H200 1.18x faster than
    // one (docs/benchmarks.md, eighth session). At most kMaxLookaheadLayers.
    int64_t lookahead_layers = 2;
    io_mode mode = io_mode::coroutine;
};

struct runtime_settings {
    int64_t threads = 0;             // compute threads; 0 = one per core
    int64_t context_tokens = 8192;   // per sequence
    int64_t sequences_max = 8;       // continuous batching width
    std::string backend = "auto";    // auto, cpu, cuda
};

struct server_settings {
    std::string host = "127.0.0.1";
    int64_t port = 8080;
    std::vector<std::string> api_keys;
    std::vector<std::string> cors_origins;
    int64_t body_bytes_max = 8 << 20;
    int64_t wait_queue_max = 64;  // requests held beyond the free sequences (0: refused while all are busy)
    int64_t request_timeout_s = 600;
    int64_t response_store_max = 256;  // /v1/responses kept for previous_response_id (0: none)
};

// Speculative decoding while serving (scheduler/engine_spec.h, docs/speculative.md).
struct spec_settings {
    static constexpr int64_t k_auto = -1;
    // auto: dspark when a draft head is loaded (--draft), else none; dspark, ngram, none.
    std::string drafter = "auto";
    int64_t k = k_auto;  // tokens drafted a step: auto (chosen per step, up to 5) or 0..5
};

// --drafter / --spec-k over `s` (serve's flags; generate parses its own, with oracle:RATE).
status apply_spec_flags(const cli::args& a, spec_settings& s);

struct log_settings {
    std::string level = "info";  // trace, debug, info, warn, error, off
};

struct paths_settings {
    std::string deps_dir;  // where the set-up put fetched data (the DeepSeek tokenizer)
};

struct moestream_config {
    model_settings model;
    cache_settings cache;
    io_settings io;
    runtime_settings runtime;
    server_settings server;
    spec_settings speculative;
    log_settings log;
    paths_settings paths;
};

// The CLI flags every model-running command accepts (--config, --device-cache, --io-depth, ...).
std::span<const cli::option_spec> config_option_specs();
// specs + config_option_specs(), for a command's option table.
std::vector<cli::option_spec> with_config_options(std::initializer_list<cli::option_spec> specs);

// Defaults <- JSON file named by --config (if any) <- CLI flags; then validation.
result<moestream_config> load_config(const cli::args& args);
// Parses a JSON document over `base` (used by load_config and the tests).
result<moestream_config> apply_json(moestream_config base, std::string_view json, std::string_view origin);
status validate(const moestream_config& cfg);

// The effective configuration as JSON (logged at start-up, printed by `moestream config`).
std::string to_json(const moestream_config& cfg);

const char* io_mode_name(io_mode m);

// Folder with the shipped presets (config/*.json in the source tree).
std::string default_config_dir();

}  // namespace moestream
