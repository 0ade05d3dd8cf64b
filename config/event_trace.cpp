#include "config/event_trace.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace moestream::trace {
namespace {

using clock_type = std::chrono::steady_clock;

struct entry {
    int64_t ns;  // since the log's start
    int32_t layer;
    int32_t value;
    uint16_t thread;
    ev kind;
};

constexpr std::array<const char*, 16> kNames = {"picks_wait", "need",      "hint",        "wait_begin", "wait_end",
                                               "moe_end",    "read_demand", "read_hint", "read_done",  "host_answer",
                                               "dev_ask",    "dev_answer", "copy_issue", "copy_done", "layer_begin",
                                               "attn_end"};
static_assert(kNames.size() == size_t(ev::attn_end) + 1, "a name for every event");

// 4 Mi events (96 MiB): a mini streaming bench (~40 layers x ~20 events x a few hundred steps)
// fits many times over.
constexpr size_t kCapacity = size_t(4) << 20;

struct event_log {
    explicit event_log(const char* p) {
        if (p && *p) {
            path = p;
            events = std::make_unique<entry[]>(kCapacity);
        }
    }

    std::string path;
    std::unique_ptr<entry[]> events;
    std::atomic<size_t> next{0};
    std::atomic<uint16_t> threads{0};
    clock_type::time_point start = clock_type::now();

    ~event_log() {
        if (path.empty()) return;
        std::FILE* f = std::fopen(path.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "moestream: MOESTREAM_TRACE: cannot write %s\n", path.c_str());
            return;
        }
        const size_t n = std::min(next.load(), kCapacity);
        std::fprintf(f, "us,thread,event,layer,value\n");
        for (size_t i = 0; i < n; ++i) {
            const entry& e = events[i];
            std::fprintf(f, "%.3f,%u,%s,%d,%d\n", double(e.ns) / 1e3, unsigned(e.thread), kNames[size_t(e.kind)],
                         e.layer, e.value);
        }
        std::fclose(f);
        if (next.load() > kCapacity)
            std::fprintf(stderr, "moestream: MOESTREAM_TRACE: %zu events past the buffer's %zu were dropped\n",
                         next.load() - kCapacity, kCapacity);
    }
};

event_log& the_log() {
    static event_log l(std::getenv("MOESTREAM_TRACE"));
    return l;
}

}  // namespace

bool enabled() {
    static const bool on = !the_log().path.empty();
    return on;
}

void record(ev e, int32_t layer, int32_t value) {
    event_log& l = the_log();
    thread_local const uint16_t thread = l.threads.fetch_add(1, std::memory_order_relaxed);
    const size_t i = l.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= kCapacity) return;
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - l.start).count();
    l.events[i] = {ns, layer, value, thread, e};
}

}  // namespace moestream::trace
