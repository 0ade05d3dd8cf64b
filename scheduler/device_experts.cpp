#include "scheduler/device_experts.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <string>
#include <utility>

#include "config/event_trace.h"
#include "model/mxfp4_tiles.h"
#include "scheduler/expert_slot_layout.h"

namespace moestream {
namespace asio = boost::asio;
namespace {

using clock_type = std::chrono::steady_clock;

constexpr size_t kAlign = 256;

size_t view_bytes(const weight_view& w) { return size_t(w.rows) * w.row_stride; }
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Layers that have routed experts: the target's, then the draft's stages.
int expert_layers(const loaded_model& m) { return int(m.expert_index.size()); }

int64_t experts_of(const loaded_model& m, int layer) {
    return layer < m.hp.n_layers ? m.hp.n_experts : m.hp.dspark_n_experts;
}

bool same_shape(const weight_view& w, const slot_matrix& p) {
    return w.type == p.type && w.cols == p.cols && w.rows == p.rows && w.row_stride == p.row_stride;
}

// The host tier's layout (scheduler/expert_slot_layout.h), so an upload copies a slot's span.
expert_slot_layout layout_of(const loaded_model& m) {
    std::array<uint64_t, 3> most{};
    for (int L = 0; L < expert_layers(m); ++L) {
        const auto ew = m.expert(L, 0);
        most[0] = std::max<uint64_t>(most[0], view_bytes(ew.gate));
        most[1] = std::max<uint64_t>(most[1], view_bytes(ew.up));
        most[2] = std::max<uint64_t>(most[2], view_bytes(ew.down));
    }
    return slot_layout_for(most);
}

}  // namespace

size_t device_experts::slot_bytes(const loaded_model& m) { return size_t(layout_of(m).slot_bytes); }

device_experts::device_experts(backend& be, const loaded_model& m, dsv41::expert_source* fill_from,
                               device_tier_options opts)
    : be_(be),
      m_(m),
      fill_from_(fill_from),
      opts_(std::move(opts)),
      own_(opts_.executor ? nullptr : std::make_unique<scheduler_thread>()),
      strand_(asio::make_strand(opts_.executor ? opts_.executor : own_->executor())) {}

result<std::unique_ptr<device_experts>> device_experts::create(backend& be, const loaded_model& m, int64_t slots,
                                                                bool preload, dsv41::expert_source* fill_from,
                                                                device_tier_options opts) {
    const int64_t total = m.total_experts();
    if (slots < 1) return make_error("the device expert cache must hold at least one expert");
    if (opts.copy_lanes < 1) return make_error("the device expert cache needs at least one copy lane");
    const int first_layer = opts.first_layer, end_layer = opts.end_layer < 0 ? expert_layers(m) : opts.end_layer;
    if (first_layer < 0 || first_layer >= end_layer || end_layer > expert_layers(m))
        return make_error("the device expert cache's layers [" + std::to_string(first_layer) + ", " +
                          std::to_string(end_layer) + ") are not layers of the model (it has " +
                          std::to_string(expert_layers(m)) + " with experts)");
    int64_t served = 0;
    for (int L = first_layer; L < end_layer; ++L) served += experts_of(m, L);
    slots = std::min(slots, served);
    std::unique_ptr<device_experts> d(new device_experts(be, m, fill_from, std::move(opts)));
    if (!d->fill_from_) {  // the mapping: answers at once, holds nothing
        d->mapping_ = std::make_unique<resident_experts>(m);
        d->fill_from_ = d->mapping_.get();
    }
    d->slot_bytes_ = slot_bytes(m);
    d->memory_.bind(be);
    if (!d->memory_.try_resize(size_t(slots) * d->slot_bytes_))
        return make_error("the " + std::string(be.name()) + " backend has no room for an expert cache of " +
                          std::to_string(slots) + " experts (" + std::to_string((size_t(slots) * d->slot_bytes_) >> 20) +
                          " MiB)");
    // The allocation is zero-filled on the compute stream; the copy lanes must not race it (a
    // slot's first fill waits for no mark).
    be.synchronize();
    int64_t base = 0;
    const expert_slot_layout layout = layout_of(m);
    for (int L = 0; L < expert_layers(m); ++L) {
        d->layer_base_.push_back(base);
        base += experts_of(m, L);
        // The slot layout: gate, up, down where the host tier puts them (the slot tables' and the fills').
        const auto ew = m.expert(L, 0);
        const auto matrix = [&](const weight_view& w, int p) {
            const size_t at = size_t(layout.part_offset[size_t(p)]);
            MS_ASSERT(at % kAlign == 0 && at + view_bytes(w) <= d->slot_bytes_);
            // MXFP4 parts the backend reads faster tiled are tiled as they are copied in (the
            // fills' last step): a slot's views then say so.
            const bool tiled = be.tiles_mxfp4() && w.type == ggml_type::mxfp4 &&
                               mxfp4_tiles::tileable(w.rows, w.cols, int64_t(w.row_stride));
            return slot_matrix{w.type, w.cols, w.rows, w.row_stride, at,
                               tiled ? weight_layout::mxfp4_tiles : weight_layout::rows};
        };
        d->parts_.push_back({matrix(ew.gate, 0), matrix(ew.up, 1), matrix(ew.down, 2)});
    }
    MS_ASSERT(base == total);
    d->total_ = total;
    d->served_ = served;
    d->first_layer_ = first_layer;
    d->end_layer_ = end_layer;
    d->slot_of_.assign(size_t(total), -1);
    d->fetching_.assign(size_t(total), 0);
    d->missed_.assign(size_t(total), 0);
    d->held_slot_ = std::make_unique<std::atomic<int32_t>[]>(size_t(total));
    for (int64_t k = 0; k < total; ++k) d->held_slot_[size_t(k)].store(-1, std::memory_order_relaxed);
    d->slots_.resize(size_t(slots));
    d->fill_pieces_.reserve(3 * kFillExperts);
    d->fill_tiles_.reserve(3 * kFillExperts);
    // Two events a slot, made now: `freed` (the compute stream's mark at its last release) and
    // `filled` (the end of its copy).
    copy_stream_options co;
    co.events = int(2 * slots);
    co.lanes = d->opts_.copy_lanes;
    co.batched = d->opts_.batched_copies;
    co.source = d->opts_.pinned_source;
    co.copied = [self = d.get()](int e) {
        // The copy stream's thread (CUDA's callback thread): only hand over to the strand. A
        // fill's event is its first slot's `filled`.
        MS_ASSERT(e % 2 == 1);
        asio::post(self->strand_, [self, e, at = clock_type::now()] { self->on_copied(int32_t(e / 2), at); });
    };
    auto cs = be.make_copy_stream(std::move(co));
    if (!cs) return cs.err();
    d->copy_ = std::move(*cs);
    if (preload)
        if (auto st = d->preload_all(); !st) return st.err();
    return d;
}

device_experts::~device_experts() {
    // Nothing new is asked for or copied; then every fill, copy and held-back completion still
    // out ends, each through its strand handler, before the copy stream and the slots go. On a
    // shared scheduler thread that thread goes on after this (its owner stops it once the tiers
    // are gone), so the tier waits for its own work here rather than for the thread's end.
    run_on_strand([this] {
        stopping_ = true;
        progress();  // waiting requests get an error, landed experts go back to the fill source
    });
    for (bool done = false; !done;) {
        run_on_strand([&] { done = in_progress_ == 0; });
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    run_on_strand([this] {
        MS_ASSERT_MSG(waiters_.empty() && landed_.empty() && fetches_.empty(),
                      "device_experts destroyed while a request was in flight");
    });
    copy_.reset();  // waits for its streams
    if (own_) own_->stop();  // its io_context lives on until the strand is gone
}

bool device_experts::on_strand_thread() const { return runs_in_this_thread(strand_.get_inner_executor()); }

void device_experts::run_on_strand(std::function<void()> fn) const {
    MS_ASSERT_MSG(!on_strand_thread(),
                  "a blocking device_experts call on the thread of its strand's executor (the scheduler's): "
                  "it would wait for itself");
    std::promise<void> done;
    auto f = done.get_future();
    asio::post(strand_, [&] {
        fn();
        done.set_value();
    });
    f.wait();
}

status device_experts::preload_all() {
    int64_t left = slots();
    std::vector<int32_t> pending;
    for (int L = first_layer_; L < end_layer_ && left > 0; ++L) {
        pending.clear();
        for (int32_t e = 0; e < experts_of(m_, L) && int64_t(pending.size()) < left; ++e) pending.push_back(e);
        left -= int64_t(pending.size());
        need(L, pending);  // a layer's experts announced at once: the fill source reads them in one queue
        while (!pending.empty()) {
            auto got = acquire_ready(L, pending, int64_t(pending.size()));
            if (!got) return got.err();
            for (const auto& [id, unused] : *got) {
                release(L, id);
                pending.erase(std::find(pending.begin(), pending.end(), id));
            }
        }
    }
    for (bool done = false; !done;) {  // every copy completed, so the counters start from a quiet tier
        run_on_strand([&] {
            done = in_progress_ == 0;
            if (done) stats_ = {};
        });
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    be_.synchronize();
    return {};
}

int64_t device_experts::key_of(int layer, int32_t expert) const {
    MS_ASSERT_MSG(layer >= 0 && size_t(layer) < layer_base_.size(), "expert of a layer the model does not have");
    MS_ASSERT_MSG(layer >= first_layer_ && layer < end_layer_, "expert of a layer this device tier does not serve");
    MS_ASSERT(expert >= 0 && expert < experts_of(m_, layer));
    return layer_base_[size_t(layer)] + expert;
}

// ---- the model's calls ----

void device_experts::need(int layer, std::span<const int32_t> experts) {
    asio::post(strand_, [this, layer, ids = std::vector<int32_t>(experts.begin(), experts.end())] {
        on_need(layer, ids, false);
    });
}

void device_experts::hint(int layer, std::span<const int32_t> experts) {
    asio::post(strand_, [this, layer, ids = std::vector<int32_t>(experts.begin(), experts.end())] {
        on_need(layer, ids, true);
    });
}

void device_experts::async_ready(int layer, std::span<const int32_t> pending, int64_t max,
                                 dsv41::ready_callback done) {
    MS_ASSERT(!pending.empty() && max >= 1);
    waiter w{layer, {pending.begin(), pending.end()}, max, std::move(done), false, clock_type::now(), false,
             std::vector<uint8_t>(pending.size(), 0)};
    asio::post(strand_, [this, w = std::move(w)]() mutable { enqueue(std::move(w)); });
}

result<dsv41::ready_experts> device_experts::acquire_ready(int layer, std::span<const int32_t> pending, int64_t max) {
    MS_ASSERT(!pending.empty() && max >= 1);
    MS_ASSERT_MSG(!on_strand_thread(),
                  "device_experts::acquire_ready() on the thread of its strand's executor (the scheduler's): "
                  "it would wait for itself; coroutines use async_ready()");
    std::promise<result<dsv41::ready_experts>> answer;
    auto f = answer.get_future();
    waiter w{layer,
             {pending.begin(), pending.end()},
             max,
             [&answer](result<dsv41::ready_experts> r) { answer.set_value(std::move(r)); },
             true,
             clock_type::now(),
             false,
             std::vector<uint8_t>(pending.size(), 0)};
    asio::post(strand_, [this, w = std::move(w)]() mutable { enqueue(std::move(w)); });
    return f.get();
}

result<dsv41::expert_weights> device_experts::get(int layer, int32_t expert) {
    auto r = acquire_ready(layer, std::span<const int32_t>(&expert, 1), 1);
    if (!r) return r.err();
    return r->front().second;
}

void device_experts::release(int layer, int32_t expert) {
    const int64_t key = key_of(layer, expert);
    const int32_t s = held_slot_[size_t(key)].load(std::memory_order_relaxed);
    MS_ASSERT_MSG(s >= 0, "release of an expert that is not held");
    // Here, on the thread that issued the kernels reading the slot: the mark covers exactly
    // those, and a later copy into the slot waits for it.
    copy_->mark_ops(freed_event(s));
    const uint64_t mark = marks_.fetch_add(1, std::memory_order_relaxed) + 1;  // this thread's marks are in order
    asio::post(strand_, [this, key, mark] { on_release(key, mark); });
}

const expert_slot_table* device_experts::slot_table(int layer) {
    if (tables_.empty()) {
        if (!all_resident_.load(std::memory_order_acquire)) return nullptr;
        publish_tables();
    }
    MS_ASSERT(layer >= first_layer_ && layer < end_layer_ && size_t(layer) < tables_.size());
    return &tables_[size_t(layer)];
}

// On the backend's thread, once every key has a slot: slot_of_ no longer changes (no expert
// misses, so none is placed or evicted), and every copy's compute-stream wait was issued before
// all_resident_ was set, so the kernels reading the tables come after every copy.
void device_experts::publish_tables() {
    MS_ASSERT(tables_.empty() && int64_t(slots_.size()) == served_);
    slot_of_device_.bind(be_);
    slot_of_device_.resize(slot_of_.size());
    be_.upload(slot_of_device_.data(), slot_of_.data(), slot_of_.size() * sizeof(int32_t));
    for (int L = 0; L < expert_layers(m_); ++L) {
        expert_slot_table t;
        t.slot_of = slot_of_device_.data() + layer_base_[size_t(L)];
        t.base = memory_.data();
        t.slot_bytes = slot_bytes_;
        t.gate = parts_[size_t(L)][0];
        t.up = parts_[size_t(L)][1];
        t.down = parts_[size_t(L)][2];
        tables_.push_back(t);
    }
}

device_experts::counters device_experts::stats() const {
    counters c;
    run_on_strand([&] { c = stats_; });
    return c;
}

// ---- strand handlers ----

void device_experts::on_need(int layer, const std::vector<int32_t>& experts, bool hint) {
    // Only what no slot holds: a read of a resident expert would be wasted.
    std::vector<int32_t> misses;
    for (int32_t e : experts)
        if (slot_of_[size_t(key_of(layer, e))] < 0) misses.push_back(e);
    if (misses.empty() || stopping_) return;
    if (hint) fill_from_->hint(layer, misses);
    else fill_from_->need(layer, misses);
}

void device_experts::on_release(int64_t key, uint64_t mark) {
    const int32_t s = slot_of_[size_t(key)];
    MS_ASSERT_MSG(s >= 0 && slots_[size_t(s)].pins > 0, "release of an expert that is not held");
    slot& sl = slots_[size_t(s)];
    sl.freed_mark = std::max(sl.freed_mark, mark);  // release() marked `freed` before posting this
    if (--sl.pins == 0) held_slot_[size_t(key)].store(-1, std::memory_order_relaxed);
    progress();  // a slot may be free for a landed expert now
}

void device_experts::enqueue(waiter w) {
    waiters_.push_back(std::move(w));
    progress();
}

void device_experts::progress() {
    if (progressing_) {
        progress_again_ = true;
        return;
    }
    progressing_ = true;
    do {
        progress_again_ = false;
        // Landed experts take free slots first (their requests are among the waiters below).
        while (stopping_ && !landed_.empty()) {
            fetching_[size_t(key_of(landed_.front().layer, landed_.front().expert))] = 0;
            fill_from_->release(landed_.front().layer, landed_.front().expert);
            landed_.pop_front();
        }
        while (!landed_.empty() && place_landed()) {
        }
        for (size_t i = 0; i < waiters_.size();) {
            if (try_serve(waiters_[i])) waiters_.erase(waiters_.begin() + std::ptrdiff_t(i));
            else ++i;
        }
    } while (progress_again_);
    progressing_ = false;
}

bool device_experts::try_serve(waiter& w) {
    const auto answer = [&](result<dsv41::ready_experts> r) {
        if (w.waited) stats_.wait_seconds += seconds_since(w.since);
        auto done = std::move(w.done);
        done(std::move(r));  // here, on the strand: the forward's callback only posts its resumption
        return true;
    };
    if (stopping_) return answer(make_error("the device expert tier is shutting down"));
    dsv41::ready_experts out;
    std::vector<int32_t> ask;
    bool full = false;  // resident experts left untaken (max reached): nothing may evict them now
    for (size_t i = 0; i < w.pending.size(); ++i) {
        const int32_t e = w.pending[i];
        const int64_t key = key_of(w.layer, e);
        if (const int32_t s = slot_of_[size_t(key)]; s >= 0) {
            if (int64_t(out.size()) == w.max) {
                full = true;
                continue;
            }
            slot& sl = slots_[size_t(s)];
            if (!w.counted[i]) {
                w.counted[i] = 1;
                ++(sl.copying ? stats_.joined : stats_.hits);
            }
            // Being copied is resident for the compute stream: it waits for the copy's event.
            ++sl.pins;
            sl.used = ++clock_;
            held_slot_[size_t(key)].store(s, std::memory_order_relaxed);
            out.emplace_back(e, sl.views);
            continue;
        }
        if (fetching_[size_t(key)]) {  // asked of the fill source already: joined
            if (!w.counted[i]) {
                w.counted[i] = 1;
                ++stats_.joined;
            }
            continue;
        }
        w.counted[i] = 1;  // its miss is counted when it is asked for
        ask.push_back(e);
    }
    // The misses are asked for now, also when some experts are answered (their copies then
    // overlap those experts' kernels), as many as the free slots can take.
    if (!ask.empty() && !full) {
        const int64_t room = available_slots() - int64_t(landed_.size()) - reserved_;
        const int64_t n = std::min<int64_t>(room, int64_t(ask.size()));
        if (n > 0) start_fetch(w.layer, std::move(ask), n);
    }
    if (!out.empty()) return answer(std::move(out));
    if (!w.waited && w.blocking) ++stats_.blocking_waits;
    w.waited = true;
    return false;
}

int32_t device_experts::victim() const {
    int32_t best = -1;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& sl = slots_[i];
        if (sl.pins > 0 || sl.copying) continue;  // held, or its source is still being read
        if (best < 0 || sl.used < slots_[size_t(best)].used) best = int32_t(i);
    }
    return best;
}

int64_t device_experts::available_slots() const {
    int64_t n = 0;
    for (const slot& sl : slots_) n += sl.pins == 0 && !sl.copying;
    return n;
}

void device_experts::start_fetch(int layer, std::vector<int32_t> experts, int64_t max) {
    MS_ASSERT(!experts.empty() && max >= 1 && max <= int64_t(experts.size()));
    const uint64_t id = next_fetch_++;
    for (int32_t e : experts) {
        const size_t key = size_t(key_of(layer, e));
        fetching_[key] = 1;
        if (!missed_[key]) {  // one miss until it has a slot, however often it is asked for
            missed_[key] = 1;
            ++stats_.misses;
        }
    }
    reserved_ += max;
    ++in_progress_;
    trace::mark(trace::ev::dev_ask, layer, int32_t(max));
    const auto& f = fetches_.emplace(id, fetch{layer, std::move(experts), max}).first->second;
    // The fill source answers from its own strand (the host tier's, on the same scheduler thread
    // when they share one) or inside this call (the mapping): the answer is posted here either way.
    fill_from_->async_ready(layer, f.experts, max, [this, id](result<dsv41::ready_experts> r) {
        asio::post(strand_, [this, id, r = std::move(r)]() mutable { on_fetched(id, std::move(r)); });
    });
}

void device_experts::on_fetched(uint64_t id, result<dsv41::ready_experts> r) {
    auto it = fetches_.find(id);
    MS_ASSERT(it != fetches_.end());
    const fetch f = std::move(it->second);
    fetches_.erase(it);
    trace::mark(trace::ev::dev_answer, f.layer, r ? int32_t(r->size()) : -1);
    reserved_ -= f.max;
    --in_progress_;
    // What the answer holds stays on its way (landed) until it has a slot.
    for (int32_t e : f.experts)
        if (!r || std::none_of(r->begin(), r->end(), [&](const auto& got) { return got.first == e; }))
            fetching_[size_t(key_of(f.layer, e))] = 0;
    if (!r) {
        // Every request waiting for one of these experts gets the error (it names the expert);
        // nothing was placed, so the next demand asks again.
        for (size_t i = 0; i < waiters_.size();) {
            waiter& w = waiters_[i];
            const bool affected = w.layer == f.layer && std::any_of(w.pending.begin(), w.pending.end(), [&](int32_t e) {
                                      return std::find(f.experts.begin(), f.experts.end(), e) != f.experts.end();
                                  });
            if (!affected) {
                ++i;
                continue;
            }
            if (w.waited) stats_.wait_seconds += seconds_since(w.since);
            auto done = std::move(w.done);
            waiters_.erase(waiters_.begin() + std::ptrdiff_t(i));
            done(r.err());
        }
        progress();
        return;
    }
    MS_ASSERT(int64_t(r->size()) <= f.max);
    for (const auto& [e, host] : *r) {
        MS_ASSERT_MSG(std::find(f.experts.begin(), f.experts.end(), e) != f.experts.end(),
                      "the fill source answered with an expert it was not asked for");
        MS_ASSERT_MSG(slot_of_[size_t(key_of(f.layer, e))] < 0, "an expert filled twice");
        landed_.push_back({f.layer, e, host});
    }
    progress();
}

bool device_experts::place_landed() {
    fill_pieces_.clear();
    fill_tiles_.clear();
    fill_after_mark_ = 0;
    fill_after_ = -1;
    int32_t first = -1, last = -1;
    for (int n = 0; n < kFillExperts && !landed_.empty(); ++n) {
        const int32_t s = victim();
        if (s < 0) break;  // every slot held or copying: a release or a completion comes back here
        add_to_fill(s, landed_.front());
        landed_.pop_front();
        if (first < 0) first = s;
        else slots_[size_t(last)].next_in_fill = s;
        last = s;
    }
    if (first < 0) return false;
    ++stats_.fills;
    stats_.pieces += fill_pieces_.size();
    ++in_progress_;
    const auto t0 = clock_type::now();
    // After the kernels that read the slots' previous experts (marked at their releases); the
    // compute stream then waits for these copies before any kernel issued after this call.
    const int after[1] = {fill_after_};
    copy_->fill(filled_event(first), std::span<const int>(after, fill_after_ >= 0 ? 1 : 0), fill_pieces_, fill_tiles_);
    stats_.issue_seconds += seconds_since(t0);
    if (loaded_ == served_) all_resident_.store(true, std::memory_order_release);  // after the last fill's wait
    return true;
}

// One expert into the fill being put together (fill_pieces_, fill_after_).
//
// Its parts sit at the same offsets in its host slot and its VRAM slot when the file's parts are
// 4 KiB-aligned (the converter's), so they merge into one copy of the slot's span, and so does
// the next expert when both its slots follow these. The gaps copied with them (up to kMergeGap)
// cost less bus time than a copy's own (about 2 us each on the H200's bus, ~100 KB of transfer).
void device_experts::add_piece(std::byte* dst, const std::byte* src, size_t bytes) {
    constexpr uintptr_t kMergeGap = 16 << 10;
    if (!fill_pieces_.empty()) {
        copy_piece& b = fill_pieces_.back();
        const uintptr_t dst_end = reinterpret_cast<uintptr_t>(b.dst) + b.bytes;
        const uintptr_t src_end = reinterpret_cast<uintptr_t>(b.src) + b.bytes;
        const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
        if (d >= dst_end && s >= src_end && d - dst_end == s - src_end && d - dst_end <= kMergeGap) {
            b.bytes += size_t(d - dst_end) + bytes;
            return;
        }
    }
    fill_pieces_.push_back({dst, src, bytes});
}

void device_experts::add_to_fill(int32_t s, const landed& l) {
    slot& sl = slots_[size_t(s)];
    MS_ASSERT(sl.pins == 0 && !sl.copying);
    const int64_t key = key_of(l.layer, l.expert);
    MS_ASSERT_MSG(slot_of_[size_t(key)] < 0 && fetching_[size_t(key)], "an expert copied twice");
    fetching_[size_t(key)] = 0;
    missed_[size_t(key)] = 0;
    if (sl.key >= 0) {
        slot_of_[size_t(sl.key)] = -1;
        --loaded_;
    }
    // The compute stream's marks are in order: the copies wait for the fill's latest one only.
    if (sl.freed_mark > fill_after_mark_) {
        fill_after_mark_ = sl.freed_mark;
        fill_after_ = freed_event(s);
    }
    const auto& parts = parts_[size_t(l.layer)];
    const weight_view* host[3] = {&l.host.gate, &l.host.up, &l.host.down};
    weight_view dev[3];
    for (int p = 0; p < 3; ++p) {
        MS_ASSERT_MSG(same_shape(*host[p], parts[size_t(p)]), "an expert's shape differs from its layer's");
        dev[p] = parts[size_t(p)].in(memory_.data(), slot_bytes_, s);
        std::byte* at = memory_.data() + size_t(s) * slot_bytes_ + parts[size_t(p)].offset;
        add_piece(at, static_cast<const std::byte*>(host[p]->data), view_bytes(*host[p]));
        if (dev[p].layout == weight_layout::mxfp4_tiles) {
            weight_view copied = dev[p];
            copied.layout = weight_layout::rows;  // as the copy leaves it; the fill tiles it
            fill_tiles_.push_back(copied);
        }
        stats_.bytes_uploaded += view_bytes(*host[p]);
    }
    sl.views = {dev[0], dev[1], dev[2]};
    sl.key = key;
    slot_of_[size_t(key)] = s;
    sl.copying = true;
    sl.next_in_fill = -1;
    sl.src_layer = l.layer;
    sl.src_expert = l.expert;
    sl.issued = clock_type::now();
    trace::mark(trace::ev::copy_issue, l.layer, l.expert);
    sl.used = ++clock_;
    ++stats_.copies;
    ++loaded_;
}

void device_experts::on_copied(int32_t first, clock_type::time_point at) {
    stats_.completion_post_seconds += seconds_since(at);
    MS_ASSERT(first >= 0 && size_t(first) < slots_.size() && slots_[size_t(first)].copying);
    const slot& sl = slots_[size_t(first)];
    if (opts_.inject_copy_delay_us && !stopping_)
        if (const uint32_t us = opts_.inject_copy_delay_us(sl.src_layer, sl.src_expert)) {
            auto timer = std::make_shared<asio::steady_timer>(strand_, std::chrono::microseconds(us));
            timer->async_wait([this, timer, first](const boost::system::error_code&) { finish_fill(first); });
            return;
        }
    finish_fill(first);
}

void device_experts::finish_fill(int32_t first) {
    for (int32_t s = first; s >= 0;) {
        slot& sl = slots_[size_t(s)];
        MS_ASSERT(sl.copying);
        sl.copying = false;
        trace::mark(trace::ev::copy_done, sl.src_layer, sl.src_expert);
        fill_from_->release(sl.src_layer, sl.src_expert);  // its host slot may be reused now
        sl.src_layer = -1;
        sl.src_expert = -1;
        ++stats_.copies_completed;
        stats_.copy_seconds += seconds_since(sl.issued);
        s = std::exchange(sl.next_in_fill, -1);
    }
    --in_progress_;
    progress();  // the slots may take landed experts now
}

}  // namespace moestream
