// A run's timeline, for finding where streaming waits (docs/streaming.md, "Tracing a run"). With
// MOESTREAM_TRACE=<file> in the environment, threads append fixed-size events to one buffer
// allocated on the first event (bounded: events past its capacity are counted, not kept), and the
// process writes them out at exit as CSV: microseconds since the first event, the thread's
// number, the event, the layer, and an expert id or a count. Unset, an event costs one load.
#pragma once

#include <cstdint>

namespace moestream::trace {

enum class ev : uint8_t {
    picks_wait,   // the forward starts waiting for the router's picks (value: rows)
    need,         // a layer's distinct experts are known and announced (value: how many)
    hint,         // a look-ahead layer's predicted experts go out (value: how many)
    wait_begin,   // the forward suspends for experts (value: how many are still pending)
    wait_end,     // ... and resumes (value: how many it got)
    moe_end,      // the layer's MoE kernels are all issued
    read_demand,  // the host tier starts reading an expert that a layer needs (value: expert)
    read_hint,    // ... that a prediction names (value: expert)
    read_done,    // ... and its last part landed (value: expert)
    host_answer,  // the host tier answers a request (value: how many experts)
    dev_ask,      // the device tier asks the host tier for experts (value: how many)
    dev_answer,   // the host tier's answer reaches the device tier (value: how many)
    copy_issue,   // an expert's upload into a VRAM slot is enqueued (value: expert)
    copy_done,    // ... and completed (value: expert)
    layer_begin,  // the forward starts a layer (its engram rows, attention) (value: rows)
    attn_end,     // the layer's attention and output projection are issued (value: rows)
};

bool enabled();
void record(ev e, int32_t layer, int32_t value);

inline void mark(ev e, int32_t layer, int32_t value) {
    if (enabled()) record(e, layer, value);
}

}  // namespace moestream::trace
