// The CUDA copy stream's host side (model/cuda/copy_stream.h). Compiled by the host compiler:
// no kernel code and no Asio here.
#include "model/cuda/copy_stream.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "config/assert.h"
#include "model/cuda/cuda_check.h"
#include "model/cuda/kernels.h"

namespace moestream::cuda {
namespace {


class cuda_copy_stream final : public copy_stream {
  public:
    cuda_copy_stream(cudaStream_t compute, const std::atomic<bool>* recording, copy_stream_options opts)
        : compute_(compute), recording_(recording), opts_(std::move(opts)), batched_(opts_.batched) {}

    // Streams, events and the page-locked source, each undone in reverse by the destructor.
    status init() {
        if (cudaGetDevice(&device_) != cudaSuccess) return make_error("cudaGetDevice failed");
        for (int i = 0; i < opts_.lanes; ++i) {
            cudaStream_t s = nullptr;
            if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
                return make_error(std::string("cudaStreamCreate (copy lane): ") + cudaGetErrorString(e));
            lanes_.push_back(s);
        }
        if (const cudaError_t e = cudaStreamCreateWithFlags(&notify_, cudaStreamNonBlocking); e != cudaSuccess)
            return make_error(std::string("cudaStreamCreate (notifications): ") + cudaGetErrorString(e));
        events_.reserve(size_t(opts_.events));
        for (int i = 0; i < opts_.events; ++i) {
            cudaEvent_t ev = nullptr;
            if (const cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
                return make_error(std::string("cudaEventCreate (") + std::to_string(opts_.events) +
                                  " copy events): " + cudaGetErrorString(e));
            events_.push_back(ev);
        }
        args_.resize(size_t(opts_.events));
        for (int i = 0; i < opts_.events; ++i) args_[size_t(i)] = {this, i};
        if (!opts_.source.empty()) {
            // Page-locked, the source is read by the copy engines directly; pageable memory would
            // be staged through the driver's buffer at a fraction of the bus's speed.
            if (const cudaError_t e = cudaHostRegister(opts_.source.data(), opts_.source.size(), cudaHostRegisterDefault);
                e == cudaSuccess) {
                registered_ = opts_.source.data();
            } else if (e == cudaErrorHostMemoryAlreadyRegistered) {
                // Another copy stream over the same host tier page-locked it (the draft's device
                // tier beside the target's: layer_split_experts.h); that one unregisters it.
                (void)cudaGetLastError();
            } else {
                (void)cudaGetLastError();
                notes_ = "the host tier (" + std::to_string(opts_.source.size() >> 20) +
                         " MiB) could not be page-locked for DMA (cudaHostRegister: " + cudaGetErrorString(e) +
                         "): its uploads are staged by the driver";
            }
        }
        return {};
    }

    ~cuda_copy_stream() override {
        for (cudaStream_t s : lanes_) cudaStreamSynchronize(s);
        if (notify_) cudaStreamSynchronize(notify_);  // every host function has run
        if (registered_) cudaHostUnregister(registered_);
        for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
        if (notify_) cudaStreamDestroy(notify_);
        for (cudaStream_t s : lanes_) cudaStreamDestroy(s);
    }

    void mark_ops(int e) override {
        // A mark issued while the backend records a step would land before the recorded kernels
        // (they are launched as a graph later), so it would not cover them.
        MS_ASSERT_MSG(!recording_->load(std::memory_order_relaxed), "a copy event marked inside a recorded step");
        check(cudaEventRecord(event(e), compute_), "cudaEventRecord (compute)");
    }

    void fill(int e, std::span<const int> after, std::span<const copy_piece> pieces,
              std::span<const weight_view> tile) override {
        check(cudaSetDevice(device_), "cudaSetDevice");  // the calling thread may be new to CUDA
        cudaStream_t lane = lanes_[next_lane_.fetch_add(1, std::memory_order_relaxed) % lanes_.size()];
        for (int a : after) check(cudaStreamWaitEvent(lane, event(a), 0), "cudaStreamWaitEvent (copy lane)");
        copy(lane, pieces);
        // The copied experts' MXFP4 parts into the tile layout, on the lane: the fill's event
        // (which the compute stream waits on) follows the tiler.
        check(kernels::tile_mxfp4(lane, tile), "tile_mxfp4 (copy lane)");
        check(cudaEventRecord(event(e), lane), "cudaEventRecord (copy lane)");
        // Issued while the backend records a step this wait would precede the step's graph: it
        // would hold more kernels than needed, never fewer (the device tier issues no fill then:
        // a step is recorded only once every expert is resident).
        check(cudaStreamWaitEvent(compute_, event(e), 0), "cudaStreamWaitEvent (compute)");
        check(cudaStreamWaitEvent(notify_, event(e), 0), "cudaStreamWaitEvent (notifications)");
        check(cudaLaunchHostFunc(notify_, &on_copied, &args_[size_t(e)]), "cudaLaunchHostFunc");
    }

    std::string notes() const override { return notes_; }

  private:
    // The pieces in as few calls as the driver takes: each call costs the host a few
    // microseconds, which is the whole copy's time for a small expert's part.
    void copy(cudaStream_t lane, std::span<const copy_piece> pieces) {
        constexpr size_t kBatch = 64;  // pieces per call: a fill has at most 3 a slot, fewer once merged
        size_t at = 0;
        while (at < pieces.size() && batched_.load(std::memory_order_relaxed)) {
            const size_t start = at;
            void* dsts[kBatch];
            const void* srcs[kBatch];
            size_t sizes[kBatch];
            size_t n = 0;
            for (; at < pieces.size() && n < kBatch; ++at)
                if (pieces[at].bytes) {
                    dsts[n] = pieces[at].dst;
                    srcs[n] = pieces[at].src;
                    sizes[n++] = pieces[at].bytes;
                }
            if (n == 0) return;
            if (n == 1) {
                check(cudaMemcpyAsync(dsts[0], srcs[0], sizes[0], cudaMemcpyHostToDevice, lane), "cudaMemcpyAsync");
                continue;
            }
            // The sources are the host tier's slots, untouched until the fill's completion.
            cudaMemcpyAttributes attr{};
            attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t first = 0;
            const cudaError_t err = cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &first, 1, lane);
            if (err == cudaSuccess) continue;
            if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue) check(err, "cudaMemcpyBatchAsync");
            // A driver without batched copies for these pointers: one call a piece from now on.
            (void)cudaGetLastError();
            if (batched_.exchange(false))
                std::fprintf(stderr, "moestream: cudaMemcpyBatchAsync: %s; copying one piece a call\n",
                             cudaGetErrorString(err));
            at = start;  // nothing of this batch was enqueued: the loop below copies it
        }
        for (; at < pieces.size(); ++at)
            if (pieces[at].bytes)
                check(cudaMemcpyAsync(pieces[at].dst, pieces[at].src, pieces[at].bytes, cudaMemcpyHostToDevice, lane),
                      "cudaMemcpyAsync");
    }

    struct callback_arg {
        cuda_copy_stream* self = nullptr;
        int e = 0;
    };
    // On CUDA's callback thread: no CUDA call is allowed here, the callback only posts.
    static void CUDART_CB on_copied(void* p) {
        const auto* a = static_cast<const callback_arg*>(p);
        a->self->opts_.copied(a->e);
    }
    cudaEvent_t event(int e) const {
        MS_ASSERT(e >= 0 && size_t(e) < events_.size());
        return events_[size_t(e)];
    }

    cudaStream_t compute_;
    const std::atomic<bool>* recording_;
    copy_stream_options opts_;
    int device_ = 0;
    std::vector<cudaStream_t> lanes_;
    cudaStream_t notify_ = nullptr;
    std::vector<cudaEvent_t> events_;
    std::vector<callback_arg> args_;  // one per event, for the host functions (made at start-up)
    std::atomic<size_t> next_lane_{0};
    std::atomic<bool> batched_{true};
    void* registered_ = nullptr;
    std::string notes_;
};

}  // namespace

result<std::unique_ptr<copy_stream>> make_copy_stream(void* compute, const std::atomic<bool>* recording,
                                                      copy_stream_options opts) {
    if (opts.events < 1) return make_error("a copy stream needs at least one event");
    if (opts.lanes < 1) return make_error("a copy stream needs at least one lane");
    if (!opts.copied) return make_error("a copy stream needs a completion callback");
    MS_ASSERT(compute != nullptr && recording != nullptr);
    auto s = std::make_unique<cuda_copy_stream>(static_cast<cudaStream_t>(compute), recording, std::move(opts));
    if (auto st = s->init(); !st) return st.err();
    return std::unique_ptr<copy_stream>(std::move(s));
}

}  // namespace moestream::cuda
