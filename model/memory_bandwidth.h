// Multi-threaded streaming read bandwidth of this machine: the ceiling for decode, whose matmuls
// read every weight byte once per token. Benchmarks report GEMV throughput as a fraction of it.
#pragma once

#include <cstddef>

#include "model/thread_pool.h"

namespace moestream {

// Bytes per second of a read of a `bytes` buffer (rounded down to 64-byte lines, at least one)
// split over the pool's threads; the buffer is allocated and touched first; best of `repeats`.
double measure_read_bandwidth(thread_pool& pool, size_t bytes, int repeats);

}  // namespace moestream
