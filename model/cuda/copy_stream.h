// The CUDA backend's copy stream (model/backend.h: copy_stream): fills alternate between
// `lanes` copy streams; each fill waits on its `after` events (the compute stream's marks of the
// last kernels that read its slots), copies with cudaMemcpyAsync, records its event on the lane,
// and makes the compute stream wait on it with cudaStreamWaitEvent, so no host ever waits for a
// copy. Its completion reaches the host through cudaLaunchHostFunc on a notification stream of
// its own that waits on the same event: a host function on a copy lane would hold that lane's
// next copy until the host had run it (docs/streaming.md). A plain C++ header (no CUDA types).
#pragma once

#include <atomic>
#include <memory>

#include "config/result.h"
#include "model/backend.h"

namespace moestream::cuda {

// `compute` is the backend's cudaStream_t; `recording` is true while the backend records a step
// (no event may be marked on the compute stream then: the mark would precede the recorded
// kernels); it must outlive the stream.
result<std::unique_ptr<copy_stream>> make_copy_stream(void* compute, const std::atomic<bool>* recording,
                                                      copy_stream_options opts);

}  // namespace moestream::cuda
