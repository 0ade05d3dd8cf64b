// Routed experts in slots of a backend's memory (VRAM on the CUDA backend), filled when a layer
// needs them from a fill source: the host tier of tiered_experts (O_DIRECT io_uring reads into
// pinned host slots, nothing read through the mapping) or, without one, the model's memory
// mapping. The least recently used slot that is neither held nor being filled is reused; the
// model holds an expert from its answer to release(), at most max_held() at once. With as many
// slots as experts every expert stays resident after its first use (or from the start with
// `preload`), and the layers' slot tables route the MoE on the backend. Where an expert sits
// never changes a result: its bytes are the file's wherever it lies.
//
// The fill pipeline (issue 15), no thread ever waiting for an expert or a copy:
//   async_ready() -> a slot holds it: answered at once (after one hop through the strand);
//   a miss -> the fill source's async_ready() (a miss already asked for, or being copied, is
//   joined, never asked for or copied twice) -> its answer: host slot -> VRAM slot on the
//   backend's copy stream (model/backend.h: copy_stream; CUDA: a fill's pieces in one
//   cudaMemcpyBatchAsync on a copy lane; an expert is one piece, its slot laid out as the host
//   tier's, and consecutive slots merge), after the compute stream's latest mark of the last
//   kernels that read the fill's slots' previous experts (recorded by release(); the copy lane
//   waits on it with cudaStreamWaitEvent), then the compute
//   stream waits on the copy's event (cudaStreamWaitEvent, no host round trip) -> the answer
//   (views of the VRAM slot) goes to the callback right after the copy is enqueued, so the
//   expert's kernels are enqueued behind the wait -> the copy's completion (cudaLaunchHostFunc on
//   a notification stream, posted here) releases the host slot in the fill source and makes the
//   VRAM slot reusable.
// The forward's CUDA graphs: a step is recorded only when every layer has its slot table, which
// is published once every expert sits in a slot, after which nothing is copied again; so no
// event wait or mark ever falls inside a recorded step (the copy stream asserts the marks).
//
// Threads: one Asio strand owns every piece of the tier's state (slots, the key -> slot map,
// pins, requests asked of the fill source, waiting requests, counters); there is no mutex.
// need(), hint(), async_ready() and release() only post to it (release() first marks the compute
// stream on the calling thread: the forward's, which issues the kernels). The blocking forms
// (acquire_ready(), get(), stats(), the destructor) wait for the strand: for callers outside a
// coroutine (start-up's preload, tools), counted in counters::blocking_waits; never from a thread
// running the strand's executor (the scheduler's thread, shared with the host tier's strand and
// the engine's), where the answer could never come: they assert it.
// slot_table() is the backend's thread's (the forward's): it publishes the tables there.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/backend.h"
#include "scheduler/model_loader.h"
#include "scheduler/scheduler_thread.h"

namespace moestream {

struct device_tier_options {
    // Where the tier's strand runs: the serving process's scheduler (scheduler_thread::executor(),
    // shared with the host tier's strand and the engine's; its io_context must outlive the tier);
    // empty: a scheduler thread of the tier's own.
    boost::asio::any_io_executor executor;
    // The fill source's host memory (tiered_experts::host_region()): page-locked for DMA while
    // the tier lives, so its uploads run at the bus's speed.
    std::span<std::byte> pinned_source;
    // The layers the tier serves, [first_layer, end_layer) (-1: through the last, the draft's
    // stages included). A draft tier of its own serves the draft's stages (layer_split_experts.h),
    // so drafting never evicts the target's experts, nor the reverse.
    int first_layer = 0, end_layer = -1;
    int copy_lanes = 2;  // copy streams the fills alternate between (copy_stream_options::lanes)
    bool batched_copies = true;  // copy_stream_options::batched
    // Test hook: microseconds to hold back the completion of a copy of this expert (a strand
    // timer: its host slot stays held and its VRAM slot unavailable meanwhile; timing only,
    // results must not move). Called on the strand.
    std::function<uint32_t(int layer, int32_t expert)> inject_copy_delay_us;
};

class device_experts final : public dsv41::expert_source {
  public:
    // Bytes one slot takes (the largest expert of the target and the draft, gate + up + down).
    static size_t slot_bytes(const loaded_model& m);
    // `slots` slots (at most the experts of its layers); an error names the bytes when the backend has no
    // room. With `fill_from`, the misses of need() are announced to it (its reads start at once),
    // misses are filled from its answers, and hints go to it; it must outlive this.
    static result<std::unique_ptr<device_experts>> create(backend& be, const loaded_model& m, int64_t slots,
                                                          bool preload, dsv41::expert_source* fill_from = nullptr,
                                                          device_tier_options opts = {});
    // Waits for the fills, copies and completions in flight; nobody may hold an expert.
    ~device_experts() override;

    void need(int layer, std::span<const int32_t> experts) override;
    void hint(int layer, std::span<const int32_t> experts) override;
    void async_ready(int layer, std::span<const int32_t> pending, int64_t max, dsv41::ready_callback done) override;
    // Blocking: waits for the strand's answer (counted in blocking_waits when not immediate).
    result<dsv41::ready_experts> acquire_ready(int layer, std::span<const int32_t> pending, int64_t max) override;
    result<dsv41::expert_weights> get(int layer, int32_t expert) override;
    void release(int layer, int32_t expert) override;
    int64_t max_held() const override { return int64_t(slots_.size()); }
    // Once every expert of the model sits in a slot (as many slots as experts, all filled: with
    // `preload` from the start), each layer's table for the routed MoE ops; null before.
    const expert_slot_table* slot_table(int layer) override;

    struct counters {
        // A request's first sight of each of its experts: in a slot whose copy had finished ...
        uint64_t hits = 0;
        // ... or already on its way (asked of the fill source, landed, or being copied): joined,
        // never asked for or copied again.
        uint64_t joined = 0;
        // Experts asked of the fill source, once from when a slot lacks one to when one has it
        // (an expert on its way is never asked again).
        uint64_t misses = 0;
        uint64_t copies = 0;    // experts copied host slot -> VRAM slot (at most one per miss)
        uint64_t copies_completed = 0;
        uint64_t bytes_uploaded = 0;
        // Times a thread blocked for an expert (acquire_ready()/get(): outside coroutines only;
        // the forward never does, so the streaming tests assert zero).
        uint64_t blocking_waits = 0;
        double wait_seconds = 0;  // from a request not answered at once to its answer, summed
        double copy_seconds = 0;  // from a fill's issue to its completion's handler, summed
        // From the copy stream's completion callback to the strand's handler, summed over the
        // completions: the host latency of that hop.
        double completion_post_seconds = 0;
        uint64_t fills = 0;        // copy-stream fills (a fill copies up to kFillExperts experts)
        uint64_t pieces = 0;       // their copies, adjacent parts and slots merged (add_piece)
        double issue_seconds = 0;  // host time spent issuing the fills (the strand's share of a copy)
    };
    static constexpr int kFillExperts = 8;
    counters stats() const;  // a snapshot taken on the strand (blocks briefly)
    int64_t slots() const { return int64_t(slots_.size()); }
    std::string notes() const { return copy_ ? copy_->notes() : std::string(); }

  private:
    struct slot {
        int64_t key = -1;  // (layer, expert) flattened, -1: empty
        int pins = 0;
        uint64_t used = 0;
        bool copying = false;        // a fill into it has not completed
        // Its `freed` event marks the last kernels that read it, release number freed_mark (0: never released).
        uint64_t freed_mark = 0;
        int32_t next_in_fill = -1;   // the next slot of the same fill (its first slot names it)
        dsv41::expert_weights views;
        // The fill source's expert the copy reads: released there once the copy has completed.
        int src_layer = -1;
        int32_t src_expert = -1;
        std::chrono::steady_clock::time_point issued;
    };
    // A request not answered yet: answered, in arrival order, by the handler that gives one of
    // its experts a slot (a fill's answer) or frees one (a release, a copy's completion).
    struct waiter {
        int layer;
        std::vector<int32_t> pending;
        int64_t max;
        dsv41::ready_callback done;
        bool blocking;  // a thread waits for the answer (acquire_ready)
        std::chrono::steady_clock::time_point since;
        bool waited = false;
        std::vector<uint8_t> counted;  // per pending expert: seen (a hit, a join, or asked for)
    };
    struct fetch {  // asked of the fill source, not answered yet
        int layer;
        std::vector<int32_t> experts;
        int64_t max;
    };
    struct landed {  // answered by the fill source (held there), waiting for a free slot
        int layer;
        int32_t expert;
        dsv41::expert_weights host;
    };

    device_experts(backend& be, const loaded_model& m, dsv41::expert_source* fill_from, device_tier_options opts);
    int64_t key_of(int layer, int32_t expert) const;
    static int freed_event(int32_t s) { return 2 * s; }
    static int filled_event(int32_t s) { return 2 * s + 1; }
    void run_on_strand(std::function<void()> fn) const;
    // The calling thread runs the strand's executor: nothing there may wait for the strand.
    bool on_strand_thread() const;
    status preload_all();
    // Uploads the slot of every expert and builds the layers' tables (every expert resident).
    void publish_tables();

    // ---- strand handlers and what they call (strand only) ----
    void on_need(int layer, const std::vector<int32_t>& experts, bool hint);
    void on_release(int64_t key, uint64_t mark);
    void on_fetched(uint64_t id, result<dsv41::ready_experts> r);
    void on_copied(int32_t first, std::chrono::steady_clock::time_point at);
    void finish_fill(int32_t first);
    void enqueue(waiter w);
    // Gives landed experts slots, then answers every waiter that can be answered, in order, until
    // neither changes anything; re-entrant calls are folded into the running one.
    void progress();
    bool try_serve(waiter& w);  // true when answered (with experts or an error)
    void start_fetch(int layer, std::vector<int32_t> experts, int64_t max);
    // Gives up to kFillExperts landed experts free slots and copies them as one fill (one
    // event, one compute-stream wait, one completion); false when no slot was free.
    bool place_landed();
    void add_to_fill(int32_t s, const landed& l);
    void add_piece(std::byte* dst, const std::byte* src, size_t bytes);  // merged with the last when adjacent
    int32_t victim() const;             // the LRU slot neither held nor copying, or -1
    int64_t available_slots() const;    // slots neither held nor copying

    backend& be_;
    const loaded_model& m_;
    dsv41::expert_source* fill_from_;
    std::unique_ptr<dsv41::expert_source> mapping_;  // the fill source when none was given
    device_tier_options opts_;
    backend_array<std::byte> memory_;
    size_t slot_bytes_ = 0;
    std::vector<int64_t> layer_base_;                // first key of each layer
    std::vector<std::array<slot_matrix, 3>> parts_;  // per layer: gate, up, down in a slot
    int64_t total_ = 0;                              // experts of the model (keys)
    int64_t served_ = 0;                             // experts of the layers this tier serves
    int first_layer_ = 0, end_layer_ = 0;            // those layers: [first_layer_, end_layer_)
    std::vector<slot> slots_;
    // Per key: the slot of a held expert, written here when it is handed out, read by release()
    // on the holder's thread (the slot cannot change while it is held).
    std::unique_ptr<std::atomic<int32_t>[]> held_slot_;
    std::atomic<uint64_t> marks_{0};  // release() marks, numbered on the backend's thread
    std::atomic<bool> all_resident_{false};  // every key has a slot: set once, never cleared
    backend_array<int32_t> slot_of_device_;  // slot_of_, once every expert is resident (backend thread)
    std::vector<expert_slot_table> tables_;  // per layer, once every expert is resident (backend thread)

    // The strand and what it runs on (before the copy stream, whose completions post to it):
    // device_tier_options::executor, or a scheduler thread of the tier's own.
    std::unique_ptr<scheduler_thread> own_;
    boost::asio::strand<boost::asio::any_io_executor> strand_;
    std::unique_ptr<copy_stream> copy_;

    // ---- strand-owned ----
    std::vector<int32_t> slot_of_;  // per key: its slot, or -1
    std::vector<uint8_t> fetching_;  // per key: on its way (asked of the fill source, or landed), no slot yet
    std::vector<uint8_t> missed_;    // per key: counted as a miss, no slot since
    int64_t loaded_ = 0;             // slots holding an expert
    std::map<uint64_t, fetch> fetches_;
    uint64_t next_fetch_ = 0;
    int64_t reserved_ = 0;  // slots the outstanding fetches may fill (their max)
    std::deque<landed> landed_;
    std::vector<waiter> waiters_;
    bool progressing_ = false, progress_again_ = false;
    int64_t in_progress_ = 0;  // fetches, copies and held-back completions whose handler has not run
    bool stopping_ = false;
    uint64_t clock_ = 0;
    counters stats_;
    std::vector<copy_piece> fill_pieces_;  // the fill being put together (room made at start-up)
    std::vector<weight_view> fill_tiles_;  // its MXFP4 parts to tile once copied (room made at start-up)
    int fill_after_ = -1;  // the event the fill's copies wait for (the latest release mark of its slots), or -1
    uint64_t fill_after_mark_ = 0;
};

}  // namespace moestream
