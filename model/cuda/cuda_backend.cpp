// The CUDA backend's host side: device memory, the staging ring that carries uploads and op
// descriptors, and each op's launch (kernels in the .cu files of this folder, behind kernels.h).
// Compiled by the host compiler: no kernel code and no Asio here.
#include "model/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "config/assert.h"
#include "model/cuda/cuda_check.h"
#include "model/cuda/copy_stream.h"
#include "model/cuda/kernels.h"
#include "model/cuda/moe_kernels.h"
#include "model/cuda/step_graph.h"
#include "model/cuda/step_recorder.h"

namespace moestream::cuda {
namespace {

// A stream launch of at most kInlineJobs matmul jobs passes them in the kernel's parameters
// instead of copying them to the device before it (one driver call an op instead of two): resident
// decode with stream launches (as streamed steps run) 10.18 -> 8.17 ms a token on mini-lite (H100).
// MOESTREAM_INLINE_JOBS=0 copies them, for A/B runs; values never depend on it.
bool inline_jobs_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("MOESTREAM_INLINE_JOBS");
        return !(v && v[0] == '0');
    }();
    return on;
}

// MOESTREAM_MXFP4_TILES=0 keeps MXFP4 experts in the file's rows (the rows kernel), for A/B runs
// and the check that both layouts give the same bits.
bool mxfp4_tiles_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("MOESTREAM_MXFP4_TILES");
        return !(v && v[0] == '0');
    }();
    return on;
}

// MOESTREAM_Q8_TILES=0 uploads dense Q8_0 matrices in the file's rows (the CUDA-core kernel), for
// A/B runs; the two layouts are different kernels and do not give the same bits.
bool q8_0_tiles_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("MOESTREAM_Q8_TILES");
        return !(v && v[0] == '0');
    }();
    return on;
}

// MOESTREAM_ATTENTION_TILE=N: every attention launch takes N heads a block (1 = the layout of
// the kernels before head tiles), for A/B runs; values never depend on it. 0 or unset: planned.
int attention_tile_override() {
    static const int tile = [] {
        const char* v = std::getenv("MOESTREAM_ATTENTION_TILE");
        const int t = v ? std::atoi(v) : 0;
        return t >= 1 && t <= 16 ? t : 0;
    }();
    return tile;
}

std::string gib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(size_t(1) << 30));
    return buf;
}

constexpr size_t kAlign = 256;
// Every allocation has this much slack after its end: the matmul kernels read quantized blocks
// with aligned words, which may reach a few bytes past a row's last byte.
constexpr size_t kPad = 64;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

class cuda_backend final : public backend {
  public:
    cuda_backend(device_info info, cudaStream_t stream, uint8_t* host_stage, uint8_t* dev_stage, size_t stage_bytes,
                 unsigned int* bad_keys, bool graphs)
        : graphs_(graphs),
          info_(std::move(info)),
          stream_(stream),
          host_stage_(host_stage),
          dev_stage_(dev_stage),
          stage_bytes_(stage_bytes),
          bad_keys_(bad_keys) {
        check(cudaStreamCreateWithFlags(&notify_stream_, cudaStreamNonBlocking), "cudaStreamCreate (downloads)");
        for (auto& d : downloads_) check(cudaEventCreateWithFlags(&d.copied, cudaEventDisableTiming), "cudaEventCreate");
        if (const char* b = std::getenv("MOESTREAM_BLOCKING_DOWNLOADS"); b && std::string_view(b) == "1")
            blocking_downloads_ = true;
    }

    ~cuda_backend() override {
        if (capturing_) step_end();
        cudaStreamSynchronize(stream_);
        cudaStreamSynchronize(notify_stream_);  // no host function left to run
        for (auto& d : downloads_) cudaEventDestroy(d.copied);
        cudaStreamDestroy(notify_stream_);
        for (void* p : pending_free_) cudaFree(p);
        for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
        for (cudaEvent_t ev : step_events_)
            if (ev) cudaEventDestroy(ev);
        for (auto& s : scratch_)
            if (s.p) cudaFree(s.p);
        cudaFree(dev_stage_);
        cudaFreeHost(host_stage_);
        cudaFree(bad_keys_);
        cudaStreamDestroy(stream_);
    }

    const char* name() const override { return "cuda"; }
    cudaStream_t stream() const { return stream_; }
    std::string device_description() const override { return info_.describe(); }
    int threads() const override { return info_.multiprocessors; }
    backend_stats stats() const {
        backend_stats s = stats_;
        s.graph_launches = graph_.stats().launches;
        s.graph_instantiations = graph_.stats().instantiations;
        s.graph_updates = graph_.stats().updates;
        s.graph_nodes_set = graph_.stats().nodes_set;
        return s;
    }

    // ---- memory ----
    void* allocate(size_t bytes) override {
        void* p = nullptr;
        const size_t size = round_up(bytes + kPad, kAlign);
        if (cudaMalloc(&p, size) != cudaSuccess) {
            (void)cudaGetLastError();  // clear the out-of-memory error: the caller sees nullptr
            return nullptr;
        }
        if (capturing_) {
            recorded_op([&] { rec_.fill(p, 0, size); });
        } else {
            check(cudaMemsetAsync(p, 0, size, stream_), "cudaMemsetAsync (allocate)");
        }
        stats_.bytes_allocated += size;
        return p;
    }
    void release(void* p) override {
        if (!p) return;
        // A step being captured may still read it when its graph runs: freed at the next wait.
        if (capturing_) {
            pending_free_.push_back(p);
            return;
        }
        // cudaFree waits for the device, so no queued op can still read the memory; no graph
        // may name it afterwards.
        graph_.clear();
        check(cudaFree(p), "cudaFree");
    }
    void upload(void* dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        ++stats_.uploads;
        if (bytes <= stage_bytes_ / 4) {
            const size_t at = take_stage(bytes);
            std::memcpy(host_stage_ + at, src, bytes);
            if (capturing_)
                recorded_op([&] { rec_.copy(dst, host_stage_ + at, bytes, cudaMemcpyHostToDevice); });
            else
                check(cudaMemcpyAsync(dst, host_stage_ + at, bytes, cudaMemcpyHostToDevice, stream_), "upload");
            mark("upload");
        } else {
            // Large (weights at load, a long prompt's rows): from pageable memory, which the
            // driver copies before returning (never inside a captured step).
            MS_ASSERT_MSG(!capturing_, "a large upload inside a captured step");
            check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
        }
    }
    void download(void* dst, const void* src, size_t bytes) override {
        MS_ASSERT_MSG(!capturing_, "download() inside a captured step");
        ++stats_.downloads;
        if (bytes <= stage_bytes_ / 4) {
            const size_t at = take_stage(bytes);
            if (bytes) check(cudaMemcpyAsync(host_stage_ + at, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
            synchronize();
            if (bytes) std::memcpy(dst, host_stage_ + at, bytes);
        } else {
            check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
            synchronize();
        }
    }
    // The copy lands in a slot of the staging ring with the store_keys counter behind it; an
    // event after it, waited on by a notification stream whose host function marks the ticket
    // landed and calls the wake if one was left (no CUDA call there). The ring is not reset, nor
    // wrapped, while a download is in flight (take_stage, synchronize).
    download_ticket download_begin(void* dst, const void* src, size_t bytes) override {
        MS_ASSERT_MSG(!capturing_, "download_begin() inside a captured step");
        constexpr size_t kCounter = sizeof(unsigned int);
        const size_t need = round_up(bytes, kCounter) + kCounter;
        if (blocking_downloads_ || need > stage_bytes_ / 4) {
            download(dst, src, bytes);
            return {};
        }
        if (downloads_in_flight_ > 0 && stage_at_ + need > stage_bytes_) {
            // The ring cannot wrap under the download in flight: a wait, straight into dst (rare:
            // the ring holds a whole step's staging).
            ++stats_.downloads;
            check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
            synchronize();
            return {};
        }
        int slot = -1;
        for (int i = 0; i < kDownloadSlots; ++i)
            if (downloads_[size_t(i)].state.load(std::memory_order_acquire) == download_slot::kFree) {
                slot = i;
                break;
            }
        MS_ASSERT_MSG(slot >= 0, "more downloads in flight than download_begin allows");
        ++stats_.async_downloads;
        download_slot& d = downloads_[size_t(slot)];
        const size_t at = take_stage(need);
        d.dst = dst;
        d.stage = host_stage_ + at;
        d.bytes = bytes;
        d.counter_at = round_up(bytes, kCounter);
        d.state.store(download_slot::kInFlight, std::memory_order_release);
        if (bytes) check(cudaMemcpyAsync(d.stage, src, bytes, cudaMemcpyDeviceToHost, stream_), "download_begin");
        check(cudaMemcpyAsync(d.stage + d.counter_at, bad_keys_, kCounter, cudaMemcpyDeviceToHost, stream_),
              "download_begin");
        check(cudaEventRecord(d.copied, stream_), "cudaEventRecord");
        check(cudaStreamWaitEvent(notify_stream_, d.copied, 0), "cudaStreamWaitEvent");
        check(cudaLaunchHostFunc(notify_stream_, &download_slot::on_copied, &d), "cudaLaunchHostFunc");
        ++downloads_in_flight_;
        return {slot};
    }
    bool download_landed(download_ticket t, std::function<void()> wake) override {
        if (t.slot < 0) return true;
        MS_ASSERT(t.slot < kDownloadSlots);
        download_slot& d = downloads_[size_t(t.slot)];
        int state = d.state.load(std::memory_order_acquire);
        MS_ASSERT_MSG(state == download_slot::kInFlight || state == download_slot::kLanded,
                      "download_landed() on a ticket not in flight");
        if (state == download_slot::kInFlight) {
            d.wake = std::move(wake);
            if (d.state.compare_exchange_strong(state, download_slot::kWaking, std::memory_order_acq_rel)) {
                ++stats_.async_download_waits;
                return false;  // the host function calls the wake
            }
            d.wake = nullptr;  // it landed meanwhile
            MS_ASSERT(state == download_slot::kLanded);
        }
        std::memcpy(d.dst, d.stage, d.bytes);
        unsigned int bad = 0;
        std::memcpy(&bad, d.stage + d.counter_at, sizeof bad);
        MS_ASSERT_MSG(bad == 0, "attention keys must be bf16 values");
        d.wake = nullptr;
        d.state.store(download_slot::kFree, std::memory_order_release);
        --downloads_in_flight_;
        // When nothing was issued behind it, this was the wait for everything: the bookkeeping
        // of synchronize() without its call (the stream is idle: a query, not a wait).
        if (downloads_in_flight_ == 0) {
            const cudaError_t idle = cudaStreamQuery(stream_);
            if (idle == cudaSuccess)
                after_wait();
            else if (idle != cudaErrorNotReady)
                check(idle, "cudaStreamQuery");
        }
        return true;
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        if (capturing_)
            recorded_op([&] { rec_.copy(dst, const_cast<void*>(src), bytes, cudaMemcpyDeviceToDevice); });
        else
            check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
        mark("copy");
    }
    void fill(void* dst, uint8_t byte, size_t bytes) override {
        if (bytes == 0) return;
        if (capturing_)
            recorded_op([&] { rec_.fill(dst, byte, bytes); });
        else
            check(cudaMemsetAsync(dst, byte, bytes, stream_), "fill");
        mark("fill");
    }
    void synchronize() override {
        MS_ASSERT_MSG(!capturing_, "synchronize() inside a captured step (a staging ring too small for one step?)");
        ++stats_.host_waits;
        // The store_keys counter of non-bf16 keys rides along with every wait.
        check(cudaMemcpyAsync(&bad_keys_seen_, bad_keys_, sizeof(unsigned int), cudaMemcpyDeviceToHost, stream_),
              "synchronize");
        check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        MS_ASSERT_MSG(bad_keys_seen_ == 0, "attention keys must be bf16 values");
        // A download in flight keeps its staged bytes until it is asked for them.
        if (downloads_in_flight_ == 0) after_wait();
    }
    // What a wait for every op issued so far settles: the step's timing and wait, the profile's
    // events, the staging ring (every staged copy has finished), memory released meanwhile.
    void after_wait() {
        MS_ASSERT(downloads_in_flight_ == 0);
        if (waiting_for_step_) {
            waiting_for_step_ = false;
            stats_.step_wait_ns += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - step_launched_)
                                                .count());
        }
        if (step_timed_) {
            step_timed_ = false;
            float ms = 0;
            check(cudaEventElapsedTime(&ms, step_events_[0], step_events_[1]), "cudaEventElapsedTime");
            stats_.step_device_ns += uint64_t(double(ms) * 1e6);
            ++stats_.steps_timed;
        }
        stage_at_ = 0;  // every staged copy has finished
        gather_profile();
        if (!pending_free_.empty()) graph_.clear();
        for (void* p : pending_free_) check(cudaFree(p), "cudaFree");
        pending_free_.clear();
    }

    // ---- steps: one CUDA graph each ----
    // A step's ops are recorded (step_recorder.h: no driver call per op) and run as a graph at
    // step_end (step_graph.h: an earlier graph of the same ops, its changed nodes set anew).
    // Staged descriptors go to the device in one copy at the graph's head; the host writes
    // nothing into the staging ring before the next wait, which resets it.
    void step_begin() override {
        if (!graphs_ || capturing_) return;
        rec_.clear();
        ops_seen_ = 0;
        segment_ = 0;
        stage_begin_ = stage_at_;
        step_recorder::active() = &rec_;
        capturing_ = true;
        recording_.store(true, std::memory_order_relaxed);
        step_began_ = std::chrono::steady_clock::now();
    }
    void step_end() override {
        if (!capturing_) return;
        step_recorder::active() = nullptr;
        capturing_ = false;
        recording_.store(false, std::memory_order_relaxed);
        launch_segment();
        check(cudaEventRecord(step_events_[1], stream_), "cudaEventRecord");
        step_timed_ = true;
        step_launched_ = std::chrono::steady_clock::now();
        stats_.step_host_ns += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(step_launched_ - step_began_).count());
        waiting_for_step_ = true;
    }
    void set_profile(bool on) {
        MS_ASSERT(!capturing_);
        synchronize();
        profiling_ = on;
    }
    std::vector<op_time> take_profile() {
        synchronize();
        std::vector<op_time> out;
        for (auto& [name, t] : profile_) out.push_back({name, t.count, t.seconds});
        profile_.clear();
        std::sort(out.begin(), out.end(), [](const op_time& a, const op_time& b) { return a.seconds > b.seconds; });
        return out;
    }
    void set_graphs(bool on) {
        MS_ASSERT(!capturing_);
        graphs_ = on;
    }
    bool host_memory() const override { return false; }

    // ---- weight layouts ----
    bool tiles_mxfp4() const override { return mxfp4_tiles_enabled(); }
    bool tiles_q8_0() const override { return q8_0_tiles_enabled(); }
    void tile_mxfp4(std::span<const weight_view> matrices) override {
        MS_ASSERT_MSG(!capturing_, "tile_mxfp4() inside a captured step");
        check(kernels::tile_mxfp4(stream_, matrices, &stats_.launches), "tile_mxfp4");
    }

    // ---- copy streams (model/cuda/copy_stream.h) ----
    result<std::unique_ptr<copy_stream>> make_copy_stream(copy_stream_options opts) override {
        return cuda::make_copy_stream(stream_, &recording_, std::move(opts));
    }

    // ---- matmuls and sums ----
    void matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride,
                bool round) override {
        const matmul_job job{w, x, x_stride, n, y, y_stride, round};
        matmul_batch({&job, 1});
    }

    void matmul_batch(std::span<const matmul_job> jobs) override {
        // One launch per weight type and layout present (a layer's MXFP4 experts, its Q8_0
        // shared expert...).
        constexpr std::pair<ggml_type, weight_layout> kKinds[] = {
            {ggml_type::f32, weight_layout::rows},   {ggml_type::f16, weight_layout::rows},
            {ggml_type::bf16, weight_layout::rows},  {ggml_type::q8_0, weight_layout::rows},
            {ggml_type::q8_0, weight_layout::q8_0_tiles}, {ggml_type::mxfp4, weight_layout::rows},
            {ggml_type::mxfp4, weight_layout::mxfp4_tiles}};
        for (const auto& [type, layout] : kKinds) {
            mm_jobs_.clear();
            for (const auto& j : jobs) {
                if (j.w.type != type || j.w.layout != layout || j.n == 0) continue;
                MS_ASSERT(!j.w.empty() && j.x && j.y);
                kernels::mm_job k;
                k.w = static_cast<const uint8_t*>(j.w.data);
                k.rows = j.w.rows;
                k.cols = j.w.cols;
                k.row_bytes = int64_t(j.w.row_stride);
                k.x = j.x;
                k.x_stride = j.x_stride;
                k.y = j.y;
                k.y_stride = j.y_stride;
                k.n = int32_t(j.n);
                k.flags = (j.round_bf16 ? kernels::kRound : 0u) | (j.router_scores ? kernels::kRouterScore : 0u) |
                          (layout == weight_layout::mxfp4_tiles ? kernels::kTiles : 0u) |
                          (layout == weight_layout::q8_0_tiles ? kernels::kQ8Tiles : 0u);
                if (!j.up.empty()) {
                    MS_ASSERT_MSG(j.up.type == j.w.type && j.up.rows == j.w.rows && j.up.cols == j.w.cols &&
                                      j.up.row_stride == j.w.row_stride && j.up.layout == j.w.layout && j.u != nullptr,
                                  "swiglu pair: gate and up differ in shape");
                    k.up = static_cast<const uint8_t*>(j.up.data);
                    k.u = j.u;
                    k.u_stride = j.u_stride;
                    k.swiglu_w = j.swiglu_w;
                    k.swiglu_limit = j.swiglu_limit;
                    k.flags |= kernels::kSwiglu;
                }
                mm_jobs_.push_back(k);
            }
            if (mm_jobs_.empty()) continue;
            const kernels::matmul_plan plan = kernels::plan_matmul(type, mm_jobs_.data(), int(mm_jobs_.size()));
            MS_ASSERT_MSG(plan.blocks >= 0, "matmul: rows too long for the kernel's shared memory");
            if (!capturing_ && inline_jobs_enabled() && mm_jobs_.size() <= size_t(kernels::kInlineJobs)) {
                kernels::inline_jobs in_params;
                std::copy(mm_jobs_.begin(), mm_jobs_.end(), in_params.j);
                launch(kernels::matmul(stream_, type, nullptr, int(mm_jobs_.size()), plan, true, &in_params), "matmul");
                continue;
            }
            const auto* dev = stage_array(mm_jobs_);
            launch(kernels::matmul(stream_, type, dev, int(mm_jobs_.size()), plan, true), "matmul");
        }
        for (const auto& j : jobs)
            MS_ASSERT_MSG(j.n == 0 || ((j.w.type == ggml_type::f32 || j.w.type == ggml_type::f16 ||
                                        j.w.type == ggml_type::bf16 || j.w.type == ggml_type::q8_0) &&
                                       j.w.layout == weight_layout::rows) ||
                              (j.w.type == ggml_type::q8_0 && j.w.layout == weight_layout::q8_0_tiles) ||
                              j.w.type == ggml_type::mxfp4,
                          "matmul: weight type without a CUDA kernel");
    }

    void output_sum(std::span<const output_term> terms, int64_t n, int64_t dim, float* f,
                    const hc_update* upd) override {
        MS_ASSERT(n >= 0 && dim > 0 && f != nullptr);
        if (n == 0) return;
        // Terms with weights: their rows y = bf16(W h) first, into scratch.
        int64_t y_rows = 0;
        for (const auto& t : terms)
            if (!t.w.empty()) y_rows += t.m;
        float* y_all = static_cast<float*>(scratch(k_scratch_terms, size_t(y_rows * dim) * sizeof(float)));
        std::vector<const float*> term_y(terms.size());
        std::vector<matmul_job> jobs;
        int64_t at = 0;
        for (size_t i = 0; i < terms.size(); ++i) {
            const auto& t = terms[i];
            MS_ASSERT(t.m >= 0 && t.m <= n);
            if (t.w.empty()) {
                MS_ASSERT_MSG(t.y != nullptr || t.m == 0, "output_sum: a term needs W or y");
                term_y[i] = t.y;
                continue;
            }
            MS_ASSERT_MSG(t.w.rows == dim && t.h != nullptr, "output_sum: a term's W must have dim rows");
            term_y[i] = y_all + at * dim;
            jobs.push_back({t.w, t.h, t.w.cols, t.m, y_all + at * dim, dim, true});
            at += t.m;
        }
        matmul_batch(jobs);
        // Each output row's contributions in the terms' order (a term adds to a row at most once).
        std::vector<std::vector<const float*>>& per_row = per_row_;
        per_row.resize(size_t(n));
        for (auto& v : per_row) v.clear();
        for (size_t i = 0; i < terms.size(); ++i)
            for (int64_t k = 0; k < terms[i].m; ++k) {
                const int64_t r = terms[i].rows ? terms[i].rows[k] : k;
                MS_ASSERT(r >= 0 && r < n);
                per_row[size_t(r)].push_back(term_y[i] + k * dim);
            }
        std::vector<const float*> src;
        std::vector<int64_t> starts(1, 0);
        for (const auto& v : per_row) {
            src.insert(src.end(), v.begin(), v.end());
            starts.push_back(int64_t(src.size()));
        }
        const auto* src_dev = stage_array(src);
        const auto* starts_dev = stage_array(starts);
        hc_update u{};
        if (upd) {
            MS_ASSERT(upd->H && upd->post && upd->comb && upd->hc >= 1 && (!upd->next || upd->pre));
            u = *upd;
        }
        launch(kernels::sum_rows(stream_, src_dev, starts_dev, n, dim, f, u), "sum_rows");
    }

    // ---- element-wise ----
    void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y, bool round) override {
        launch(kernels::rms_norm(stream_, x, n, dim, w, eps, y, round), "rms_norm");
    }
    void norm_rows(std::span<const norm_job> jobs) override {
        int64_t rows = 0;
        for (const auto& j : jobs) {
            MS_ASSERT(j.n >= 0 && j.dim > 0 && j.x && j.y);
            MS_ASSERT(j.rope_dim == 0 || (j.rope_dim % 2 == 0 && j.rope_heads > 0 && j.dim % j.rope_heads == 0 &&
                                          j.rope_dim <= j.dim / j.rope_heads && j.pos && j.freqs));
            rows += j.n;
        }
        if (rows == 0) return;
        norm_jobs_.assign(jobs.begin(), jobs.end());
        const norm_job* dev = stage_array(norm_jobs_);
        launch(kernels::norm_rows(stream_, dev, int(jobs.size()), rows), "norm_rows");
    }
    void round_bf16(float* x, int64_t count) override { launch(kernels::round_bf16(stream_, x, count), "round_bf16"); }
    void scale_round(float* x, int64_t count, float s) override {
        launch(kernels::scale_round(stream_, x, count, s), "scale_round");
    }
    void add(float* y, const float* x, int64_t count) override { launch(kernels::add(stream_, y, x, count), "add"); }
    void rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
              const int64_t* pos, const float* freqs, bool inverse) override {
        MS_ASSERT(rope_dim % 2 == 0 && rope_dim <= head_dim);
        launch(kernels::rope(stream_, x, n, row_stride, n_heads, head_dim, rope_dim, pos, freqs, inverse), "rope");
    }
    void embed(const weight_view& table, const int32_t* tokens, int64_t n, int copies, float* out) override {
        MS_ASSERT_MSG(table.layout == weight_layout::rows, "embed: a table in a matmul's tile layout");
        launch(kernels::embed(stream_, table.type, static_cast<const uint8_t*>(table.data), int64_t(table.row_stride),
                              table.cols, tokens, n, copies, out),
               "embed");
    }
    void stream_mean(const float* H, int64_t n, int hc, int64_t dim, float* out, int64_t out_stride) override {
        launch(kernels::stream_mean(stream_, H, n, hc, dim, out, out_stride), "stream_mean");
    }
    void copy_rows(std::span<const row_copy> jobs, int64_t count) override {
        if (jobs.empty()) return;
        launch(kernels::copy_rows(stream_, stage_span(jobs), int64_t(jobs.size()), count), "copy_rows");
    }
    void gather_rows(const float* src, int64_t src_stride, const int64_t* rows, int64_t m, int64_t dim,
                     float* dst) override {
        if (m == 0) return;
        const auto* rows_dev = stage_span(std::span<const int64_t>(rows, size_t(m)));
        launch(kernels::gather_rows(stream_, src, src_stride, rows_dev, m, dim, dst), "gather_rows");
    }
    void pool_pairs(std::span<const pair_pool> jobs, int64_t dim) override {
        if (jobs.empty()) return;
        launch(kernels::pool_pairs(stream_, stage_span(jobs), int64_t(jobs.size()), dim), "pool_pairs");
    }
    void store_keys(std::span<const key_store> jobs, int64_t head_dim) override {
        if (jobs.empty()) return;
        std::vector<int64_t> first(jobs.size());
        int64_t total = 0;
        for (size_t i = 0; i < jobs.size(); ++i) {
            first[i] = total;
            total += jobs[i].count;
        }
        const auto* jobs_dev = stage_span(jobs);
        const auto* first_dev = stage_array(first);
        launch(kernels::store_keys(stream_, jobs_dev, first_dev, int64_t(jobs.size()), total, head_dim, bad_keys_),
               "store_keys");
    }
    void dequant_fp8_rows(const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t n, float* out) override {
        launch(kernels::dequant_fp8_rows(stream_, values, scales, rows, n, out), "dequant_fp8_rows");
    }
    void argmax_rows(const float* x, int64_t n, int64_t cols, int32_t* out) override {
        launch(kernels::argmax_rows(stream_, x, n, cols, out), "argmax_rows");
    }

    // ---- hyper-connections ----
    void hc_mixes(const float* H, int64_t n, int hc, int64_t dim, const weight_view& fn, const float* base,
                  const float* scale, int iters, float hc_eps, float norm_eps, float* pre, float* post, float* comb,
                  const float* fn_h) override {
        const int64_t n_mix = (2 + hc) * hc;
        MS_ASSERT(fn.rows == n_mix && fn.cols == hc * dim && fn.type == ggml_type::f32);
        if (!fn_h) {
            float* mix = static_cast<float*>(scratch(k_scratch_mix, size_t(n * n_mix) * sizeof(float)));
            matmul(fn, H, hc * dim, n, mix, n_mix, false);
            fn_h = mix;
        }
        launch(kernels::hc_mixes(stream_, H, fn_h, n, hc, dim, base, scale, iters, hc_eps, norm_eps, pre, post, comb),
               "hc_mixes");
    }
    void hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) override {
        launch(kernels::hc_collapse(stream_, H, n, hc, dim, p, out), "hc_collapse");
    }
    void hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post, const float* comb,
                   float* out) override {
        launch(kernels::hc_expand(stream_, f, H, n, hc, dim, post, comb, out), "hc_expand");
    }

    // ---- attention ----
    void attention(std::span<const attention_row> rows, int n_heads, int64_t head_dim, float scale, const float* sinks,
                   bool bf16_probs) override {
        if (rows.empty()) return;
        int64_t max_keys = 0;
        for (const auto& a : rows) {
            MS_ASSERT(a.ring_count >= 0 && a.fresh_count >= 0 && (a.ring_count == 0 || a.ring_capacity > 0));
            max_keys = std::max(max_keys, a.ring_count + a.fresh_count + a.selection_len);
        }
        // Rows in groups whose work buffer stays within kAttentionWorkBytes (a long prompt's
        // prefill); a row's values never depend on its group.
        constexpr size_t kAttentionWorkBytes = size_t(64) << 20;
        const size_t per_row = kernels::attention_work_floats(1, n_heads, head_dim, max_keys) * sizeof(float);
        const int64_t group = std::max<int64_t>(1, int64_t(kAttentionWorkBytes / per_row));
        const attention_row* staged = stage_span(rows);
        const int64_t n = int64_t(rows.size());
        float* work = static_cast<float*>(scratch(k_scratch_attention, per_row * size_t(std::min(group, n))));
        for (int64_t r0 = 0; r0 < n; r0 += group) {
            const int64_t rows_now = std::min(group, n - r0);
            const int tile = attention_tile_override() > 0
                                 ? attention_tile_override()
                                 : kernels::attention_tile_heads(rows_now, n_heads, head_dim, max_keys);
            launch(kernels::attention(stream_, staged + r0, rows_now, n_heads, head_dim, scale, sinks, bf16_probs,
                                      max_keys, work, tile),
                   "attention");
        }
    }
    void indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim, const float* keys,
                        int64_t n_keys, const int64_t* n_visible, float* scores) override {
        const auto* vis = stage_span(std::span<const int64_t>(n_visible, size_t(n)));
        launch(kernels::indexer_scores(stream_, q, w, n, n_heads, head_dim, keys, n_keys, vis, scores), "indexer_scores");
    }
    void indexer_select(const indexer_pick& p) override {
        MS_ASSERT(p.n_total >= 1 && p.topk >= 1);
        indexer_pick d = p;
        d.n_visible = stage_span(std::span<const int64_t>(p.n_visible, size_t(p.rows)));
        float* block_scores = nullptr;
        if (p.cand == indexer_pick::candidates::source) {
            const int64_t n_blocks = (p.n_total + p.block_size - 1) / p.block_size;
            block_scores = static_cast<float*>(scratch(k_scratch_blocks, size_t(p.rows * n_blocks) * sizeof(float)));
        }
        launch(kernels::indexer_select(stream_, d, block_scores), "indexer_select");
    }

    // ---- MoE and the rest ----
    void route(const float* scores, const float* bias, int64_t n, int n_experts, int k, double route_scale, bool select,
               int32_t* picks, float* weights) override {
        launch(kernels::route(stream_, scores, bias, n, n_experts, k, route_scale, select, picks, weights), "route");
    }
    void route_ordered(const float* scores, const float* bias, int64_t n, int n_experts, int k, double route_scale,
                       int32_t* picks, float* weights, int32_t* sorted_picks, float* sorted_weights) override {
        launch(kernels::route(stream_, scores, bias, n, n_experts, k, route_scale, true, picks, weights, sorted_picks,
                              sorted_weights),
               "route");
    }
    void order_picks(const int32_t* picks, const float* weights, int64_t n, int k, int32_t* sorted_picks,
                     float* sorted_weights) override {
        launch(kernels::order_picks(stream_, picks, weights, n, k, sorted_picks, sorted_weights), "order_picks");
    }
    void moe_gate_up(const expert_slot_table& t, const float* x, int64_t n, int k, const int32_t* sorted_picks,
                     const float* sorted_weights, float* g, float* u, bool swiglu, float limit) override {
        MS_ASSERT(t.gate.type == t.up.type && t.gate.rows == t.up.rows && t.gate.cols == t.up.cols &&
                  t.gate.row_stride == t.up.row_stride && t.gate.layout == t.up.layout);
        const int64_t inter = t.gate.rows, dim = t.gate.cols;
        routed_.clear();
        for (int64_t a = 0; a < n * k; ++a) {
            kernels::mm_job j = slot_job(t.gate, x + (a % n) * dim, dim, g + a * inter, inter);
            if (swiglu) {
                j.up = reinterpret_cast<const uint8_t*>(uintptr_t(t.up.offset));
                j.u = u + a * inter;
                j.u_stride = inter;
                j.swiglu_w = sorted_weights + a;
                j.swiglu_limit = limit;
                j.flags |= kernels::kSwiglu;
                routed_.push_back(j);
            } else {
                routed_.push_back(j);
                routed_.push_back(slot_job(t.up, x + (a % n) * dim, dim, u + a * inter, inter));
            }
        }
        launch_routed(t, sorted_picks, swiglu ? 1 : 2);
    }
    void moe_down(const expert_slot_table& t, const float* g, int64_t n, int k, const int32_t* sorted_picks,
                  float* y) override {
        const int64_t inter = t.down.cols, dim = t.down.rows;
        routed_.clear();
        for (int64_t a = 0; a < n * k; ++a) routed_.push_back(slot_job(t.down, g + a * inter, inter, y + a * dim, dim));
        launch_routed(t, sorted_picks, 1);
    }
    void swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) override {
        launch(kernels::swiglu(stream_, g, u, n, inter, limit, w), "swiglu");
    }
    void simulate_quant(act_quant_kind kind, float* x, int64_t count) override {
        launch(kernels::simulate_quant(stream_, kind, x, count), "simulate_quant");
    }
    void engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk, float norm_eps) override {
        launch(kernels::engram_gate(stream_, H, n, hc, dim, kv, qk, norm_eps), "engram_gate");
    }

  private:
    // A rounded matmul job of one row whose weights are a slot matrix: w holds the matrix's
    // offset in the slot until expand_routed_jobs adds the slot's address on the device.
    static kernels::mm_job slot_job(const slot_matrix& m, const float* x, int64_t x_stride, float* y, int64_t y_stride) {
        kernels::mm_job j;
        j.w = reinterpret_cast<const uint8_t*>(uintptr_t(m.offset));
        j.rows = m.rows;
        j.cols = m.cols;
        j.row_bytes = int64_t(m.row_stride);
        j.x = x;
        j.x_stride = x_stride;
        j.y = y;
        j.y_stride = y_stride;
        j.n = 1;
        j.flags = kernels::kRound | (m.layout == weight_layout::mxfp4_tiles ? kernels::kTiles : 0u);
        return j;
    }
    // routed_'s templates planned as one launch, expanded through the slot table on the device
    // (into a buffer of fixed address), then the matmul kernel over them.
    void launch_routed(const expert_slot_table& t, const int32_t* sorted_picks, int per) {
        if (routed_.empty()) return;
        const ggml_type type = t.gate.type;
        const kernels::matmul_plan plan = kernels::plan_matmul(type, routed_.data(), int(routed_.size()));
        MS_ASSERT_MSG(plan.blocks >= 0, "matmul: rows too long for the kernel's shared memory");
        const auto* templates = stage_array(routed_);
        auto* jobs = static_cast<kernels::mm_job*>(scratch(k_scratch_jobs, routed_.size() * sizeof(kernels::mm_job)));
        launch(kernels::expand_routed_jobs(stream_, templates, int(routed_.size()), per, sorted_picks, t.slot_of,
                                           reinterpret_cast<const uint8_t*>(t.base), t.slot_bytes, jobs),
               "expand_routed_jobs");
        launch(kernels::matmul(stream_, type, jobs, int(routed_.size()), plan, false),
               "matmul (routed)");
    }

    void launch(cudaError_t e, const char* what) {
        ++stats_.launches;
        check(e, what);
        mark(what);
        if (capturing_) {
            // Every launcher goes through kernels::launch_kernel, which records while a step is.
            MS_ASSERT_MSG(rec_.ops().size() > ops_seen_, "a kernel launched around the step recorder");
            ops_seen_ = rec_.ops().size();
            maybe_launch_segment();
        }
    }
    // A step runs as it is recorded: every segment_ops() ops the part recorded so far is launched
    // as a graph of its own (segment_ops()), so the device starts on the first layers while the host still
    // records the last (the host's ~2 ms of a mini decode step hide behind the device's). Parts
    // cut at fixed op counts, so the parts of a recurring step recur (and are reused) too. A part
    // may end inside an op: the ops' staged descriptors all precede their kernels, and a part's
    // head copy carries every byte staged before it.
    // MOESTREAM_STEP_SEGMENT_OPS sets the part size (0: the whole step in one graph), to measure.
    static size_t segment_ops() {
        static const size_t n = [] {
            const char* v = std::getenv("MOESTREAM_STEP_SEGMENT_OPS");
            return v ? size_t(std::strtoull(v, nullptr, 10)) : size_t(192);
        }();
        return n;
    }
    void maybe_launch_segment() {
        if (segment_ops() == 0 || rec_.ops().size() < segment_ops()) return;
        launch_segment();
        rec_.clear();
        ops_seen_ = 0;
        stage_begin_ = stage_at_;
        ++segment_;
    }
    void launch_segment() {
        if (segment_ == 0) {
            ensure_step_events();
            check(cudaEventRecord(step_events_[0], stream_), "cudaEventRecord");
        }
        check(graph_.launch(rec_, host_stage_ + stage_begin_, dev_stage_ + stage_begin_, stage_at_ - stage_begin_,
                            stream_, segment_),
              "the step's CUDA graph");
    }
    // Profiling: an event after the op just issued (the first after a wait is preceded by a
    // start event); gather_profile() adds the times up at the wait.
    void mark(const char* what) {
        if (!profiling_ || capturing_) return;
        const auto record = [&](const char* name) {
            if (events_used_ == events_.size()) {
                cudaEvent_t ev = nullptr;
                check(cudaEventCreate(&ev), "cudaEventCreate");
                events_.push_back(ev);
                event_names_.push_back(nullptr);
            }
            check(cudaEventRecord(events_[events_used_], stream_), "cudaEventRecord");
            event_names_[events_used_++] = name;
        };
        if (events_used_ == 0) record(nullptr);
        record(what);
    }
    void gather_profile() {
        for (size_t i = 1; i < events_used_; ++i) {
            float ms = 0;
            check(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "cudaEventElapsedTime");
            auto& t = profile_[event_names_[i]];
            ++t.count;
            t.seconds += double(ms) / 1e3;
        }
        events_used_ = 0;
    }
    template <class F>
    void recorded_op(F&& record) {
        record();
        ops_seen_ = rec_.ops().size();
        maybe_launch_segment();
    }

    // Room for `bytes` in the staging ring (its host half and its device twin share offsets).
    // A ring that is full waits for the stream: every copy out of it has then finished.
    size_t take_stage(size_t bytes) {
        MS_ASSERT_MSG(bytes <= stage_bytes_, "staged data larger than the staging ring");
        if (stage_at_ + bytes > stage_bytes_) {
            MS_ASSERT_MSG(downloads_in_flight_ == 0, "the staging ring would wrap under a download in flight");
            synchronize();
        }
        const size_t at = stage_at_;
        stage_at_ = round_up(stage_at_ + bytes, kAlign);
        return at;
    }
    // A host array in device memory, ordered before the next op.
    template <class T>
    const T* stage_span(std::span<const T> v) {
        const size_t bytes = v.size_bytes();
        if (bytes == 0) return nullptr;
        const size_t at = take_stage(bytes);
        std::memcpy(host_stage_ + at, v.data(), bytes);
        // A recorded step copies all it staged at once, at the head of its graph.
        if (!capturing_)
            check(cudaMemcpyAsync(dev_stage_ + at, host_stage_ + at, bytes, cudaMemcpyHostToDevice, stream_), "stage");
        return reinterpret_cast<const T*>(dev_stage_ + at);
    }
    template <class T>
    const T* stage_array(const std::vector<T>& v) {
        return stage_span(std::span<const T>(v));
    }

    // Grow-only device buffers the ops use internally.
    enum scratch_slot { k_scratch_terms, k_scratch_mix, k_scratch_blocks, k_scratch_jobs, k_scratch_attention, k_scratch_count };
    void* scratch(scratch_slot slot, size_t bytes) {
        auto& s = scratch_[slot];
        if (bytes > s.bytes) {
            if (s.p) release(s.p);
            s.p = nullptr;
            s.bytes = 0;
            const size_t size = round_up(bytes + kPad, kAlign);
            check(cudaMalloc(&s.p, size), "cudaMalloc (scratch)");
            s.bytes = bytes;
        }
        return s.p;
    }

    bool graphs_;
    bool capturing_ = false;  // recording a step
    std::atomic<bool> recording_{false};  // capturing_, for copy streams' checks from other threads
    bool profiling_ = false;
    std::vector<cudaEvent_t> events_;
    // Around a step's graphs: from before its first part's launch to after its last (read at the
    // next wait into stats_.step_device_ns).
    cudaEvent_t step_events_[2] = {nullptr, nullptr};
    bool step_timed_ = false;
    void ensure_step_events() {
        for (cudaEvent_t& ev : step_events_)
            if (!ev) check(cudaEventCreate(&ev), "cudaEventCreate");
    }
    std::vector<const char*> event_names_;
    size_t events_used_ = 0;
    struct profile_entry {
        uint64_t count = 0;
        double seconds = 0;
    };
    std::map<std::string, profile_entry> profile_;
    step_recorder rec_;
    step_graph graph_;
    size_t ops_seen_ = 0;     // ops recorded by the backend's own calls so far
    int segment_ = 0;         // the part of the step being recorded
    size_t stage_begin_ = 0;  // the step's first staged byte
    std::chrono::steady_clock::time_point step_began_, step_launched_;
    bool waiting_for_step_ = false;
    std::vector<void*> pending_free_;
    // Downloads in flight (download_begin): a slot's state goes free -> in flight -> (waking,
    // when a wake was left) -> landed (the host function) -> free (download_landed's answer).
    struct download_slot {
        static constexpr int kFree = 0, kInFlight = 1, kWaking = 2, kLanded = 3;
        std::atomic<int> state{kFree};
        void* dst = nullptr;
        uint8_t* stage = nullptr;
        size_t bytes = 0, counter_at = 0;
        std::function<void()> wake;
        cudaEvent_t copied = nullptr;
        static void CUDART_CB on_copied(void* p) {
            auto* d = static_cast<download_slot*>(p);
            // A waker was left: its owner is suspended and touches the slot only once woken,
            // so the wake is taken out first (the owner may reuse the slot right after).
            if (d->state.exchange(kLanded, std::memory_order_acq_rel) == kWaking) {
                std::function<void()> wake = std::move(d->wake);
                wake();
            }
        }
    };
    static constexpr int kDownloadSlots = kMaxDownloadsInFlight;
    std::array<download_slot, kDownloadSlots> downloads_;
    int downloads_in_flight_ = 0;
    cudaStream_t notify_stream_ = nullptr;
    bool blocking_downloads_ = false;  // MOESTREAM_BLOCKING_DOWNLOADS=1: the A/B baseline
    device_info info_;
    cudaStream_t stream_;
    uint8_t* host_stage_;
    uint8_t* dev_stage_;
    size_t stage_bytes_;
    size_t stage_at_ = 0;
    unsigned int* bad_keys_;
    unsigned int bad_keys_seen_ = 0;
    backend_stats stats_;
    struct scratch_buffer {
        void* p = nullptr;
        size_t bytes = 0;
    };
    scratch_buffer scratch_[k_scratch_count];
    std::vector<kernels::mm_job> mm_jobs_;
    std::vector<norm_job> norm_jobs_;
    std::vector<kernels::mm_job> routed_;
    std::vector<std::vector<const float*>> per_row_;
};

}  // namespace

std::string device_info::describe() const {
    return name + ", sm_" + std::to_string(sm_major) + std::to_string(sm_minor) + ", " +
           std::to_string(multiprocessors) + " SMs, " + gib(total_bytes);
}

result<device_info> probe(int index) {
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorNoDevice) return make_error("no CUDA device is present");
        if (e == cudaErrorInsufficientDriver)
            return make_error("no usable CUDA device: the NVIDIA driver is missing, or older than the CUDA " +
                              std::to_string(CUDART_VERSION / 1000) + " runtime of this build");
        return make_error(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
    }
    if (count == 0) return make_error("no CUDA device is present");
    if (index < 0 || index >= count)
        return make_error("CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(count) +
                          " present)");
    cudaDeviceProp prop{};
    if (const cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess)
        return make_error(std::string("cannot read the CUDA device's properties: ") + cudaGetErrorString(e));
    device_info info;
    info.index = index;
    info.name = prop.name;
    info.sm_major = prop.major;
    info.sm_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.l2_bytes = size_t(prop.l2CacheSize);
    if (prop.major < 9)
        return make_error("unsupported GPU " + info.name + " (compute capability " + std::to_string(prop.major) + "." +
                          std::to_string(prop.minor) +
                          "): this build's kernels need 9.0 or newer (built for sm_90a and compute_90 PTX)");
    if (const cudaError_t e = cudaSetDevice(index); e != cudaSuccess)
        return make_error(std::string("cannot use the CUDA device: ") + cudaGetErrorString(e));
    if (const cudaError_t e = cudaMemGetInfo(&info.free_bytes, &info.total_bytes); e != cudaSuccess)
        return make_error(std::string("cannot read the CUDA device's memory: ") + cudaGetErrorString(e));
    return info;
}

result<std::unique_ptr<backend>> make_backend(const backend_options& opts) {
    auto info = probe(opts.device);
    if (!info) return info.err();
    cudaStream_t stream = nullptr;
    if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
        return make_error(std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
    uint8_t *host = nullptr, *dev = nullptr;
    unsigned int* bad = nullptr;
    const auto fail = [&](const char* what, cudaError_t e) -> result<std::unique_ptr<backend>> {
        if (host) cudaFreeHost(host);
        if (dev) cudaFree(dev);
        if (bad) cudaFree(bad);
        cudaStreamDestroy(stream);
        return make_error(std::string(what) + ": " + cudaGetErrorString(e));
    };
    if (const cudaError_t e = cudaMallocHost(reinterpret_cast<void**>(&host), opts.staging_bytes); e != cudaSuccess)
        return fail("cudaMallocHost (staging ring)", e);
    if (const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&dev), opts.staging_bytes); e != cudaSuccess)
        return fail("cudaMalloc (staging ring)", e);
    if (const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(unsigned int)); e != cudaSuccess)
        return fail("cudaMalloc", e);
    if (const cudaError_t e = cudaMemset(bad, 0, sizeof(unsigned int)); e != cudaSuccess) return fail("cudaMemset", e);
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, opts.device) == cudaSuccess && optin > 0)
        kernels::set_shared_memory_limit(size_t(optin));
    std::unique_ptr<backend> be =
        std::make_unique<cuda_backend>(*info, stream, host, dev, opts.staging_bytes, bad, opts.graphs);
    return be;
}

backend_stats stats(const backend& be) {
    if (const auto* c = dynamic_cast<const cuda_backend*>(&be)) return c->stats();
    return {};
}

bool set_graphs(backend& be, bool on) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    if (!c) return false;
    c->set_graphs(on);
    return true;
}

result<double> graph_node_seconds(backend& be, int nodes, int rounds) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    if (!c) return make_error("graph_node_seconds needs the CUDA backend");
    backend_array<float> one(be, 1);
    c->synchronize();
    // Recorded and launched the way a step is (step_graph: its edges, programmatic or not).
    step_recorder rec;
    step_recorder::active() = &rec;
    for (int i = 0; i < nodes; ++i) check(kernels::round_bf16(c->stream(), one.data(), 1), "round_bf16");
    step_recorder::active() = nullptr;
    step_graph graph;
    cudaEvent_t start = nullptr, stop = nullptr;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<double> t;
    for (int r = 0; r <= rounds; ++r) {
        check(cudaEventRecord(start, c->stream()), "cudaEventRecord");
        check(graph.launch(rec, nullptr, nullptr, 0, c->stream()), "the probe's CUDA graph");
        check(cudaEventRecord(stop, c->stream()), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        if (r > 0) t.push_back(double(ms) / 1e3 / nodes);  // the first replay builds and warms up
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

bool graph_programmatic_edges() { return programmatic_edges(); }

bool set_profile(backend& be, bool on) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    if (!c) return false;
    c->set_profile(on);
    return true;
}

std::vector<op_time> take_profile(backend& be) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    return c ? c->take_profile() : std::vector<op_time>{};
}

result<void*> stream_of(backend& be) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    if (!c) return make_error("stream_of needs the CUDA backend");
    return static_cast<void*>(c->stream());
}

result<double> device_seconds(backend& be, const std::function<void()>& work) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    if (!c) return make_error("device_seconds needs the CUDA backend");
    cudaEvent_t start = nullptr, stop = nullptr;
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
        return make_error("cudaEventCreate failed");
    check(cudaEventRecord(start, c->stream()), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop, c->stream()), "cudaEventRecord");
    c->synchronize();
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return double(ms) / 1e3;
}

}  // namespace moestream::cuda
