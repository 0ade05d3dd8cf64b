#include "model/cuda/step_graph.h"

#include <cstdlib>
#include <cstring>

namespace moestream::cuda {
namespace {

cudaKernelNodeParams kernel_params(const step_op& op, const std::byte* args, const uint32_t* arg_at,
                                   std::vector<void*>& pointers) {
    pointers.resize(op.n_args);
    for (uint32_t i = 0; i < op.n_args; ++i) pointers[i] = const_cast<std::byte*>(args + arg_at[op.first_arg + i]);
    cudaKernelNodeParams p{};
    p.func = const_cast<void*>(op.func);
    p.gridDim = op.grid;
    p.blockDim = op.block;
    p.sharedMemBytes = unsigned(op.shared);
    p.kernelParams = op.n_args ? pointers.data() : nullptr;
    p.extra = nullptr;
    return p;
}

cudaMemsetParams fill_params(const step_op& op) {
    cudaMemsetParams p{};
    p.dst = op.dst;
    p.value = op.value;
    p.elementSize = 1;
    p.width = op.bytes;
    p.height = 1;
    p.pitch = 0;
    return p;
}

bool same_dims(dim3 a, dim3 b) { return a.x == b.x && a.y == b.y && a.z == b.z; }

// The bytes of op's parameters in a recording of arg offsets `at` and `size` bytes in all.
std::pair<size_t, size_t> arg_range(const step_op& op, const std::vector<uint32_t>& at, size_t size) {
    if (op.n_args == 0) return {0, 0};
    const uint32_t next = op.first_arg + op.n_args;
    return {at[op.first_arg], next < at.size() ? at[next] : size};
}

}  // namespace

bool programmatic_edges() {
    static const bool on = [] {
        const char* v = std::getenv("MOESTREAM_PDL");
        return !(v && v[0] == '0');
    }();
    return on;
}

step_graph::~step_graph() {
    for (auto& e : cache_) release(e);
}

void step_graph::clear() {
    for (auto& e : cache_) release(e);
}

void step_graph::release(entry& e) {
    if (e.exec) cudaGraphExecDestroy(e.exec);
    if (e.graph) cudaGraphDestroy(e.graph);
    e = entry{};
}

bool step_graph::same_shape(const entry& e, const step_recorder& rec, bool staged, int segment) {
    if (!e.exec || e.segment != segment || e.ops.size() != rec.ops().size() || (e.stage_bytes > 0) != staged)
        return false;
    for (size_t i = 0; i < e.ops.size(); ++i) {
        const step_op &a = e.ops[i], &b = rec.ops()[i];
        if (a.what != b.what || a.func != b.func || a.n_args != b.n_args || a.direction != b.direction) return false;
    }
    return true;
}

cudaError_t step_graph::build(entry& e, const step_recorder& rec, const void* stage_host, void* stage_dev,
                              size_t stage_bytes) {
    release(e);
    if (cudaError_t err = cudaGraphCreate(&e.graph, 0); err != cudaSuccess) return err;
    cudaGraphNode_t prev = nullptr;
    const auto add = [&](cudaGraphNode_t n) {
        e.nodes.push_back(n);
        prev = n;
    };
    if (stage_bytes > 0) {
        cudaGraphNode_t n = nullptr;
        if (cudaError_t err = cudaGraphAddMemcpyNode1D(&n, e.graph, nullptr, 0, stage_dev, stage_host, stage_bytes,
                                                       cudaMemcpyHostToDevice);
            err != cudaSuccess)
            return err;
        add(n);
    }
    std::vector<void*> pointers;
    bool prev_kernel = false;
    for (const step_op& op : rec.ops()) {
        cudaGraphNode_t n = nullptr;
        const size_t deps = prev ? 1 : 0;
        cudaError_t err = cudaSuccess;
        switch (op.what) {
            case step_op::kind::kernel: {
                const cudaKernelNodeParams p = kernel_params(op, rec.args(), rec.arg_offsets().data(), pointers);
                if (prev_kernel && programmatic_edges()) {
                    // Kernel after kernel: a programmatic edge (device_common.cuh's
                    // grid_dependency_prologue waits for the predecessor inside the kernel).
                    err = cudaGraphAddKernelNode(&n, e.graph, nullptr, 0, &p);
                    if (err == cudaSuccess) {
                        cudaGraphEdgeData edge{};
                        edge.from_port = cudaGraphKernelNodePortProgrammatic;
                        edge.type = cudaGraphDependencyTypeProgrammatic;
                        err = cudaGraphAddDependencies(e.graph, &prev, &n, &edge, 1);
                    }
                } else {
                    err = cudaGraphAddKernelNode(&n, e.graph, &prev, deps, &p);
                }
                break;
            }
            case step_op::kind::copy:
                err = cudaGraphAddMemcpyNode1D(&n, e.graph, &prev, deps, op.dst, op.src, op.bytes, op.direction);
                break;
            case step_op::kind::fill: {
                const cudaMemsetParams p = fill_params(op);
                err = cudaGraphAddMemsetNode(&n, e.graph, &prev, deps, &p);
                break;
            }
        }
        if (err != cudaSuccess) return err;
        add(n);
        prev_kernel = op.what == step_op::kind::kernel;
    }
    if (cudaError_t err = cudaGraphInstantiate(&e.exec, e.graph, 0); err != cudaSuccess) return err;
    e.ops = rec.ops();
    e.stage_bytes = stage_bytes;
    e.stage_host = stage_host;
    e.stage_dev = stage_dev;
    ++stats_.instantiations;
    return cudaSuccess;
}

cudaError_t step_graph::update(entry& e, const step_recorder& rec, const void* stage_host, void* stage_dev,
                               size_t stage_bytes) {
    size_t node = 0;
    if (e.nodes.size() != e.ops.size() + (e.stage_bytes > 0 ? 1 : 0)) return cudaErrorInvalidValue;
    if (e.stage_bytes > 0) {
        if (stage_bytes != e.stage_bytes || stage_host != e.stage_host || stage_dev != e.stage_dev) {
            if (cudaError_t err = cudaGraphExecMemcpyNodeSetParams1D(e.exec, e.nodes[0], stage_dev, stage_host,
                                                                     stage_bytes, cudaMemcpyHostToDevice);
                err != cudaSuccess)
                return err;
            e.stage_bytes = stage_bytes;
            e.stage_host = stage_host;
            e.stage_dev = stage_dev;
            ++stats_.nodes_set;
        }
        node = 1;
    }
    std::vector<void*> pointers;
    // The previous recording of this shape is e.args / e.arg_at (kept from its last launch).
    for (size_t i = 0; i < rec.ops().size(); ++i, ++node) {
        const step_op &op = rec.ops()[i], &was = e.ops[i];
        cudaError_t err = cudaSuccess;
        switch (op.what) {
            case step_op::kind::kernel: {
                const auto [lo, hi] = arg_range(op, rec.arg_offsets(), rec.args_size());
                const auto [wlo, whi] = arg_range(was, e.arg_at, e.args.size());
                const bool same = same_dims(op.grid, was.grid) && same_dims(op.block, was.block) &&
                                  op.shared == was.shared && hi - lo == whi - wlo &&
                                  std::memcmp(rec.args() + lo, e.args.data() + wlo, hi - lo) == 0;
                if (same) continue;
                const cudaKernelNodeParams p = kernel_params(op, rec.args(), rec.arg_offsets().data(), pointers);
                err = cudaGraphExecKernelNodeSetParams(e.exec, e.nodes[node], &p);
                break;
            }
            case step_op::kind::copy:
                if (op.dst == was.dst && op.src == was.src && op.bytes == was.bytes) continue;
                err = cudaGraphExecMemcpyNodeSetParams1D(e.exec, e.nodes[node], op.dst, op.src, op.bytes, op.direction);
                break;
            case step_op::kind::fill: {
                if (op.dst == was.dst && op.value == was.value && op.bytes == was.bytes) continue;
                const cudaMemsetParams p = fill_params(op);
                err = cudaGraphExecMemsetNodeSetParams(e.exec, e.nodes[node], &p);
                break;
            }
        }
        if (err != cudaSuccess) return err;
        ++stats_.nodes_set;
    }
    e.ops = rec.ops();
    ++stats_.updates;
    return cudaSuccess;
}

cudaError_t step_graph::launch(const step_recorder& rec, const void* stage_host, void* stage_dev, size_t stage_bytes,
                               cudaStream_t s, int segment) {
    if (rec.ops().empty()) return cudaSuccess;
    entry* e = nullptr;
    for (auto& c : cache_)
        if (same_shape(c, rec, stage_bytes > 0, segment)) e = &c;
    cudaError_t err = cudaSuccess;
    if (e) {
        err = update(*e, rec, stage_host, stage_dev, stage_bytes);
        if (err != cudaSuccess) {
            // An update the driver refuses (it may, for some parameter changes): a fresh graph.
            (void)cudaGetLastError();
            err = build(*e, rec, stage_host, stage_dev, stage_bytes);
        }
    } else {
        e = &cache_[0];
        for (auto& c : cache_)
            if (!c.exec || c.used < e->used) e = &c;
        err = build(*e, rec, stage_host, stage_dev, stage_bytes);
    }
    if (err != cudaSuccess) {
        release(*e);
        return err;
    }
    // This recording's parameters, for the next comparison.
    e->args.assign(rec.args(), rec.args() + rec.args_size());
    e->arg_at = rec.arg_offsets();
    e->used = ++clock_;
    e->segment = segment;
    if (cudaError_t le = cudaGraphLaunch(e->exec, s); le != cudaSuccess) return le;
    ++stats_.launches;
    return cudaSuccess;
}

}  // namespace moestream::cuda
