#pragma once
// The disk's own limit, measured in the same run as a streaming benchmark (its ceiling).

#include "config/config.h"
#include "scheduler/model_loader.h"

namespace moestream::tools {

// Raw O_DIRECT read bandwidth of the model file (bytes/s) at the engine's chunk size and depth:
// chunk-sized requests over `bytes` of the expert region (the middle of the file), all queued at
// once. 0 when the file cannot be read that way (no io_uring).
double raw_disk_bandwidth(const loaded_model& m, const moestream_config& cfg, uint64_t bytes);

// The line both decode benches end a streaming run with: `tps` decoded on new content against the
// ceiling min(raw / bytes read a token, resident rate) (either unmeasured: 0) and the ratio.
// `what` says how tps was taken.
void print_disk_ceiling(const char* what, double tps, double raw, double bytes_per_token, double resident_tps);

}  // namespace moestream::tools
