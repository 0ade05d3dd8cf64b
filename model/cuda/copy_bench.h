// Measurements behind `moestream bench copy`: the pinned host-to-device bandwidth of the machine
// (one cudaMemcpyAsync of a large page-locked buffer: the limit the expert uploads are compared
// with), and the host latency of learning that a copy has finished, by cudaLaunchHostFunc on a
// notification stream (how the copy stream reports, model/cuda/copy_stream.h) against a thread
// polling the copy's event. A plain C++ header.
#pragma once

#include <cstddef>

#include "config/result.h"
#include "model/backend.h"
#include "model/cuda/kernel_bench.h"

namespace moestream::cuda {

// Seconds of one cudaMemcpyAsync of `bytes` from page-locked host memory into VRAM (its own
// stream, events around it), over `rounds` rounds after a warm-up.
result<timing> pinned_h2d_seconds(backend& be, size_t bytes, int rounds);

// Per round: a 64 KiB page-locked copy on a copy stream, its event recorded, a notification
// stream waiting on the event and running a host function that reads the clock, while this
// thread polls the event (cudaEventQuery) and reads the clock when it completes.
struct notify_latency {
    timing host_func_after_poll;  // seconds from the poller's sight of completion to the host function
    timing poll_after_issue;      // seconds from issuing the copy to the poller's sight of completion
};
result<notify_latency> completion_latency(backend& be, int rounds);

}  // namespace moestream::cuda
