// The CUDA backend: every backend op of model/backend.h on one GPU, activations and sequence
// state in VRAM, one stream per backend so ops are ordered as issued. A plain C++ header (no
// CUDA types), built only where nvcc exists (MOESTREAM_HAVE_CUDA); kernels live in the .cu files
// of this folder behind model/cuda/kernels.h, the host side in cuda_backend.cpp.
//
// Determinism: every kernel reduces in a fixed order that depends only on the op's shape (never
// on the batch's other rows, the grid, or timing), so logits are bit-identical across runs,
// batch compositions and expert slot placement. They are not bit-identical to the CPU backend's
// (other reduction orders, other libm): the fixtures' correlation bounds hold instead.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/result.h"
#include "model/backend.h"

namespace moestream::cuda {

struct device_info {
    int index = 0;
    std::string name;
    int sm_major = 0, sm_minor = 0;
    int multiprocessors = 0;
    size_t total_bytes = 0, free_bytes = 0;
    size_t l2_bytes = 0;
    std::string describe() const;  // "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB"
};

// The GPU `index`, or an error that says why it cannot run this build's kernels (no driver, no
// device, a compute capability other than 9.x: the kernels are built for sm_90a + compute_90 PTX).
result<device_info> probe(int index = 0);

struct backend_options {
    int device = 0;
    // Pinned host staging for uploads, downloads and op descriptors (a ring; also its device twin).
    size_t staging_bytes = size_t(64) << 20;
    // Capture each step (backend::step_begin .. step_end) as a CUDA graph and replay it.
    bool graphs = true;
};

// A backend on the probed device; errors name the CUDA call that failed.
result<std::unique_ptr<backend>> make_backend(const backend_options& opts);

// Counters of a CUDA backend, for bench and /metrics.
struct backend_stats {
    uint64_t launches = 0;       // kernels launched or captured (memcpy/memset calls not counted)
    uint64_t graph_launches = 0;  // steps replayed as a graph
    uint64_t graph_instantiations = 0, graph_updates = 0;  // steps that built a graph / reused one
    uint64_t graph_nodes_set = 0;                          // nodes of reused graphs set anew
    // Host time from step_begin to step_end (the forward's host code and the recording), and
    // from step_end to the end of the next wait (the graph running), in nanoseconds.
    uint64_t step_host_ns = 0, step_wait_ns = 0;
    // The device's span of a step's graphs (events before the first part's launch and after
    // the last's): the device time of the step when it is one graph (MOESTREAM_STEP_SEGMENT_OPS=0);
    // with parts it holds any time the device waited for the host's next part.
    uint64_t step_device_ns = 0, steps_timed = 0;
    uint64_t uploads = 0, downloads = 0;  // downloads: the blocking ones (download())
    // download_begin()'s awaited downloads, and how many of them were not there when first
    // asked (the forward suspended until they landed).
    uint64_t async_downloads = 0, async_download_waits = 0;
    uint64_t host_waits = 0;  // synchronize() calls: the host thread blocked until the stream drained
    uint64_t bytes_allocated = 0;
};
// The counters of `be` when it is a CUDA backend (else all zero).
backend_stats stats(const backend& be);

// Turns the capture of steps as CUDA graphs on or off (bench: both in one run); false when `be`
// is not a CUDA backend.
bool set_graphs(backend& be, bool on);

// Device time per op while profiling (stream launches only: an event after every op, read at
// each wait): an op's time runs from the end of the op before it to its own end, so it holds
// any gap the host left before it too.
struct op_time {
    std::string op;       // the launcher ("matmul", "attention"...), "upload", "copy", "fill"
    uint64_t count = 0;
    double seconds = 0;
};
// Turns profiling on or off (false when `be` is not a CUDA backend); take_profile returns what
// was gathered since the last take, the largest first, and clears it.
bool set_profile(backend& be, bool on);
std::vector<op_time> take_profile(backend& be);

// The device time per kernel of a CUDA graph of `nodes` one-element kernels (the floor of a
// step replayed as a graph), measured over `rounds` replays (median).
result<double> graph_node_seconds(backend& be, int nodes, int rounds);
// Whether step graphs join consecutive kernels by programmatic edges (step_graph.h).
bool graph_programmatic_edges();

// Seconds the device spent on `work` (ops issued on a CUDA backend `be`), timed with events on
// the backend's stream; waits for it. An error when `be` is not a CUDA backend.
result<double> device_seconds(backend& be, const std::function<void()>& work);
// The cudaStream_t of a CUDA backend (for libraries that enqueue on it: cuBLAS in the benches).
result<void*> stream_of(backend& be);

}  // namespace moestream::cuda
