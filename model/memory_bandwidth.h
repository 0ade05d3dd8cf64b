// Multi-threaded streaming read bandwidth of this machine: the ceiling for decode, whose matmuls
// read every weight byte once per token. Benchmarks report GEMV throughput as a fraction of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/thread_pool.h"

namespace moestream {

// A buffer allocated and touched once, for measurements repeated through a benchmark (on a
// shared machine the bandwidth drifts, so benchmarks measure it around each timed part).
class read_bandwidth_probe {
  public:
    // `bytes` rounded down to 64-byte lines, at least one; touched by the pool's threads.
    read_bandwidth_probe(thread_pool& pool, size_t bytes);
    ~read_bandwidth_probe();
    read_bandwidth_probe(const read_bandwidth_probe&) = delete;
    read_bandwidth_probe& operator=(const read_bandwidth_probe&) = delete;
    // Bytes per second of a read of the whole buffer split over the pool's threads, best of
    // `repeats`.
    double measure(int repeats);

  private:
    thread_pool& pool_;
    size_t lines_ = 0;
    uint64_t* words_ = nullptr;
};

// Bytes per second of a read of a `bytes` buffer (rounded down to 64-byte lines, at least one)
// split over the pool's threads; the buffer is allocated and touched first; best of `repeats`.
double measure_read_bandwidth(thread_pool& pool, size_t bytes, int repeats);

}  // namespace moestream
