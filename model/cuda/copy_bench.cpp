#include "model/cuda/copy_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

namespace moestream::cuda {
namespace {

using clock_type = std::chrono::steady_clock;

timing summary(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

std::string failed(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

// Page-locked host memory, device memory, two streams and two events, released on every path.
struct resources {
    void* host = nullptr;
    void* dev = nullptr;
    cudaStream_t copy = nullptr, notify = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    ~resources() {
        if (copy) cudaStreamSynchronize(copy);
        if (notify) cudaStreamSynchronize(notify);
        if (start) cudaEventDestroy(start);
        if (stop) cudaEventDestroy(stop);
        if (notify) cudaStreamDestroy(notify);
        if (copy) cudaStreamDestroy(copy);
        if (dev) cudaFree(dev);
        if (host) cudaFreeHost(host);
    }
    result<bool> make(size_t bytes, bool timed) {
        if (auto e = cudaMallocHost(&host, bytes); e != cudaSuccess) return make_error(failed("cudaMallocHost", e));
        std::fill_n(static_cast<unsigned char*>(host), bytes, 0x5a);  // the pages exist before the copies
        if (auto e = cudaMalloc(&dev, bytes); e != cudaSuccess) return make_error(failed("cudaMalloc", e));
        if (auto e = cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking); e != cudaSuccess)
            return make_error(failed("cudaStreamCreate", e));
        if (auto e = cudaStreamCreateWithFlags(&notify, cudaStreamNonBlocking); e != cudaSuccess)
            return make_error(failed("cudaStreamCreate", e));
        const unsigned flags = timed ? cudaEventDefault : cudaEventDisableTiming;
        if (auto e = cudaEventCreateWithFlags(&start, flags); e != cudaSuccess) return make_error(failed("cudaEventCreate", e));
        if (auto e = cudaEventCreateWithFlags(&stop, flags); e != cudaSuccess) return make_error(failed("cudaEventCreate", e));
        return true;
    }
};

}  // namespace

result<timing> pinned_h2d_seconds(backend& be, size_t bytes, int rounds) {
    (void)be;  // the backend's device is current on this thread
    resources r;
    if (auto ok = r.make(bytes, true); !ok) return ok.err();
    std::vector<double> t;
    for (int i = 0; i <= rounds; ++i) {
        cudaEventRecord(r.start, r.copy);
        cudaMemcpyAsync(r.dev, r.host, bytes, cudaMemcpyHostToDevice, r.copy);
        cudaEventRecord(r.stop, r.copy);
        if (auto e = cudaEventSynchronize(r.stop); e != cudaSuccess) return make_error(failed("the pinned copy", e));
        float ms = 0;
        cudaEventElapsedTime(&ms, r.start, r.stop);
        if (i > 0) t.push_back(double(ms) / 1e3);  // the first is a warm-up
    }
    return summary(t);
}

namespace {

struct host_func_clock {
    std::atomic<int64_t> at_ns{0};
};

void CUDART_CB read_clock(void* p) {
    static_cast<host_func_clock*>(p)->at_ns.store(clock_type::now().time_since_epoch().count(), std::memory_order_release);
}

}  // namespace

result<notify_latency> completion_latency(backend& be, int rounds) {
    (void)be;
    constexpr size_t kBytes = size_t(64) << 10;
    resources r;
    if (auto ok = r.make(kBytes, false); !ok) return ok.err();
    host_func_clock clock;
    std::vector<double> after_poll, after_issue;
    for (int i = 0; i <= rounds; ++i) {
        clock.at_ns.store(0, std::memory_order_relaxed);
        const auto issued = clock_type::now();
        cudaMemcpyAsync(r.dev, r.host, kBytes, cudaMemcpyHostToDevice, r.copy);
        cudaEventRecord(r.stop, r.copy);
        cudaStreamWaitEvent(r.notify, r.stop, 0);
        if (auto e = cudaLaunchHostFunc(r.notify, &read_clock, &clock); e != cudaSuccess)
            return make_error(failed("cudaLaunchHostFunc", e));
        cudaError_t q;
        while ((q = cudaEventQuery(r.stop)) == cudaErrorNotReady) {
        }
        const auto seen = clock_type::now();
        if (q != cudaSuccess) return make_error(failed("cudaEventQuery", q));
        int64_t at = 0;
        while ((at = clock.at_ns.load(std::memory_order_acquire)) == 0) {
        }
        if (i == 0) continue;  // warm-up
        after_poll.push_back(std::chrono::duration<double>(clock_type::duration(at) - seen.time_since_epoch()).count());
        after_issue.push_back(std::chrono::duration<double>(seen - issued).count());
    }
    return notify_latency{summary(after_poll), summary(after_issue)};
}

}  // namespace moestream::cuda
