// Recorded steps (step_recorder.h) run as CUDA graphs. A step whose ops are those of an earlier
// one (the same kernels, copies and fills in the same order) reuses that one's executable graph:
// only the nodes whose parameters changed (a position, a count, a grid) are set anew, then the
// graph is launched; other steps build and instantiate a graph of their own (a few shapes recur
// in decode: the compressors' steps, the draft's). The step's staged descriptors reach the
// device through one copy at the head of the graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "model/cuda/step_recorder.h"

namespace moestream::cuda {

// Whether consecutive kernel nodes are joined by programmatic edges (programmatic dependent
// launch: the next kernel is scheduled while the one before finishes; every kernel waits for its
// predecessor first thing), and stream launches carry the same permission (launch_kernel). On
// unless MOESTREAM_PDL=0 (to measure the difference); values never depend on it.
bool programmatic_edges();

class step_graph {
  public:
    struct counters {
        uint64_t launches = 0, instantiations = 0, updates = 0, nodes_set = 0;
    };

    step_graph() = default;
    step_graph(const step_graph&) = delete;
    step_graph& operator=(const step_graph&) = delete;
    ~step_graph();

    // Runs `rec`'s ops on `s` as a graph, after a copy of the staged bytes [host, host + bytes)
    // to dev (none when bytes is 0). `segment`: which part of its step the recording is (a step
    // is launched in parts as it is recorded); a part reuses only graphs of the same part. Errors
    // are the CUDA call's that failed.
    cudaError_t launch(const step_recorder& rec, const void* stage_host, void* stage_dev, size_t stage_bytes,
                       cudaStream_t s, int segment = 0);
    const counters& stats() const { return stats_; }
    // Forgets every graph: their nodes may name memory that is about to be freed (the driver
    // resolves a copy's or a fill's memory when its node is set anew).
    void clear();

  private:
    struct entry {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        std::vector<cudaGraphNode_t> nodes;  // the stage copy (when any), then one per op
        std::vector<step_op> ops;
        std::vector<std::byte> args;        // the kernels' parameters as set
        std::vector<uint32_t> arg_at;
        size_t stage_bytes = 0;
        const void* stage_host = nullptr;
        void* stage_dev = nullptr;
        uint64_t used = 0;
        int segment = 0;
    };
    static bool same_shape(const entry& e, const step_recorder& rec, bool staged, int segment);
    cudaError_t build(entry& e, const step_recorder& rec, const void* stage_host, void* stage_dev, size_t stage_bytes);
    cudaError_t update(entry& e, const step_recorder& rec, const void* stage_host, void* stage_dev, size_t stage_bytes);
    static void release(entry& e);

    entry cache_[48];  // a few step shapes (decode, compressor steps, the draft) x their parts
    uint64_t clock_ = 0;
    counters stats_;
};

}  // namespace moestream::cuda
