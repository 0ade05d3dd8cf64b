#include "scheduler/tiered_experts.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>

#include "config/event_trace.h"
#include "scheduler/expert_slot_layout.h"

namespace moestream {
namespace asio = boost::asio;
namespace {

using storage::expert_key;
using storage::make_expert_key;

constexpr uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t make_tag(int layer, int32_t expert, int p) {
    return uint64_t(layer) << 34 | uint64_t(uint32_t(expert)) << 2 | uint64_t(p);
}

}  // namespace

tiered_experts::tiered_experts(const loaded_model& m, tier_options opts)
    : m_(m),
      opts_(std::move(opts)),
      own_(opts_.executor ? nullptr : std::make_unique<scheduler_thread>()),
      strand_(asio::make_strand(opts_.executor ? opts_.executor : own_->executor())) {}

tiered_experts::~tiered_experts() {
    // Nothing new starts; then every copy, held-back completion and read still out ends, each
    // through its strand handler, before the tiers go. On a shared scheduler thread that thread
    // goes on after this (its owner stops it once the tiers are gone), so the tier waits for its
    // own work here rather than for the thread's end.
    run_on_strand([this] { stopping_ = true; });
    if (copier_) copier_->join();  // copies in progress post their completions
    reader_.reset();  // every in-flight read completes (or is cancelled) and posts its completion
    for (bool done = false; !done;) {
        run_on_strand([&] { done = in_progress_ == 0; });
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));  // held-back completions
    }
    run_on_strand([this] {
        MS_ASSERT_MSG(waiters_.empty(), "tiered_experts destroyed while a forward awaits its experts");
    });
    if (own_) own_->stop();  // its io_context lives on until the strand is gone
    for (int fd : remap_fds_) ::close(fd);
}

bool tiered_experts::on_strand_thread() const { return runs_in_this_thread(strand_.get_inner_executor()); }

void tiered_experts::run_on_strand(std::function<void()> fn) const {
    MS_ASSERT_MSG(!on_strand_thread(),
                  "a blocking tiered_experts call on the thread of its strand's executor (the scheduler's): "
                  "it would wait for itself");
    std::promise<void> done;
    auto f = done.get_future();
    asio::post(strand_, [&] {
        fn();
        done.set_value();
    });
    f.wait();
}

const tiered_experts::layout& tiered_experts::layout_of(int layer, int32_t expert) const {
    MS_ASSERT(layer >= 0 && expert >= 0 && expert < max_experts_);
    const size_t i = size_t(layer) * size_t(max_experts_) + size_t(expert);
    MS_ASSERT(i < layouts_.size());
    return layouts_[i];
}

result<std::unique_ptr<tiered_experts>> tiered_experts::create(const loaded_model& m, tier_options opts) {
    std::unique_ptr<tiered_experts> t(new tiered_experts(m, opts));
    const auto& hp = m.hp;
    const int layers = hp.n_layers + (m.draft_file ? hp.n_mtp : 0);
    t->max_experts_ = std::max(hp.n_experts, m.draft_file ? hp.dspark_n_experts : 0);
    t->layouts_.resize(size_t(layers) * size_t(t->max_experts_));
    t->demanded_.assign(t->layouts_.size(), false);
    std::vector<std::string> paths;
    for (size_t s = 0; s < m.target.shard_count(); ++s) paths.push_back(m.target.shard_path(uint32_t(s)));
    const uint32_t draft_file_index = uint32_t(paths.size());
    if (m.draft_file) paths.push_back(m.draft_file->shard_path(0));

    uint64_t part_max[3] = {};
    static const char* kParts[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    for (int L = 0; L < layers; ++L) {
        const bool draft = L >= hp.n_layers;
        const gguf::model_file& f = draft ? *m.draft_file : m.target;
        const std::string prefix = "blk." + std::to_string(draft ? L - hp.n_layers : L) + ".";
        const int n_exp = draft ? hp.dspark_n_experts : hp.n_experts;
        for (int p = 0; p < 3; ++p) {
            const auto* ti = f.tensor(prefix + kParts[p]);
            if (!ti) return make_error(f.shard_path(0) + ": tensor '" + prefix + kParts[p] + "' is missing");
            for (int e = 0; e < n_exp; ++e) {
                const auto ext = f.expert_slice(*ti, e);
                part& pt = t->layouts_[size_t(L) * size_t(t->max_experts_) + size_t(e)].parts[p];
                pt.where.file = draft ? draft_file_index : ext.shard;
                pt.where.offset = ext.offset;
                pt.where.bytes = ext.bytes;
                pt.type = ti->type;
                pt.cols = ti->ne[0];
                pt.rows = ti->ne[1];
                part_max[p] = std::max(part_max[p], ext.bytes);
            }
        }
    }
    const expert_slot_layout shared = slot_layout_for({part_max[0], part_max[1], part_max[2]});
    t->host_slot_bytes_ = shared.slot_bytes;  // the device tier's VRAM slots are laid out alike
    for (int p = 0; p < 3; ++p) {
        t->host_part_[p] = shared.part_offset[size_t(p)];
        t->device_part_[p] = t->device_slot_bytes_;
        t->device_slot_bytes_ += round_up(part_max[p], 64);
    }
    // Never more slots in a tier than experts (an "auto" budget may exceed the whole model).
    const uint64_t experts = uint64_t(m.total_experts());
    t->host_slots_ = uint32_t(std::min<uint64_t>(opts.host_bytes / t->host_slot_bytes_, experts));
    t->device_slots_ = uint32_t(std::min<uint64_t>(opts.device_bytes / t->device_slot_bytes_, experts));
    auto mib = [](uint64_t b) { return std::to_string(double(b) / (1 << 20)).substr(0, 6) + " MiB"; };
    if (t->host_slots_ == 0)
        return make_error("--host-cache is too small: one expert needs " + mib(t->host_slot_bytes_) +
                          " of host memory (with its read alignment)");
    if (opts.device_bytes > 0 && t->device_slots_ == 0)
        return make_error("--device-cache is too small: one expert needs " + mib(t->device_slot_bytes_) +
                          " (use 0 to compute from the host tier)");
    t->max_held_ = t->device_slots_ > 0 ? t->device_slots_ : t->host_slots_;
    // The draft's experts in slots of their own (so drafting never evicts the target's), host
    // memory laid out as the host tier's (reads land in place); kDraftAll: every one of them.
    t->n_layers_ = hp.n_layers;
    // Kept first-layer experts stay pinned in the host tier; with a device tier of the tier's own
    // (exclusive of the host's) they would have to move, so only without one (CUDA's slots sit
    // on top of this tier instead).
    if (opts.keep_first_layer && t->device_slots_ == 0 && uint64_t(t->host_slots_) >= 8 * uint64_t(hp.n_experts))
        t->keep_budget_ = size_t(hp.n_experts);
    if (m.draft_file && opts.draft_bytes > 0) {
        const uint64_t draft_experts = uint64_t(hp.n_mtp) * uint64_t(hp.dspark_n_experts);
        t->draft_slots_ = uint32_t(opts.draft_bytes == tier_options::kDraftAll
                                       ? draft_experts
                                       : std::min<uint64_t>(opts.draft_bytes / t->host_slot_bytes_, draft_experts));
        if (t->draft_slots_ == 0)
            return make_error("--draft-cache is too small: one draft expert needs " + mib(t->host_slot_bytes_) +
                              " (use 0 to share the target's tiers, or all)");
    }

    auto host = io::aligned_buffer::allocate(size_t(t->host_slots_) * t->host_slot_bytes_, {opts.lock_host, true});
    if (!host) return make_error("host tier: " + host.message());
    t->host_buf_ = std::move(*host);
    if (t->device_slots_ > 0) {
        auto dev = io::aligned_buffer::allocate(size_t(t->device_slots_) * t->device_slot_bytes_, {false, true});
        if (!dev) return make_error("device tier: " + dev.message());
        t->device_buf_ = std::move(*dev);
    }
    if (t->draft_slots_ > 0) {
        auto d = io::aligned_buffer::allocate(size_t(t->draft_slots_) * t->host_slot_bytes_, {opts.lock_host, true});
        if (!d) return make_error("draft tier: " + d.message());
        t->draft_buf_ = std::move(*d);
    }
    t->tallies_ = std::make_unique<atomic_tally[]>(size_t(layers));
    t->n_tallies_ = size_t(layers);
    // A forward takes one step of the tiers per MoE layer (need()), so a head start of f
    // forwards is f * n_layers steps.
    const storage::layer_profile profile{uint32_t(hp.n_layers),
                                         uint64_t(std::max(0.0, opts.head_start_forwards) * double(hp.n_layers))};
    auto policy = [&]() { return storage::make_policy(opts.policy, profile); };
    auto hp_pol = policy();
    if (!hp_pol) return hp_pol.err();
    t->host_ = std::make_unique<storage::expert_cache>(t->host_slots_, std::move(*hp_pol));
    if (t->device_slots_ > 0) {
        auto dp = policy();
        if (!dp) return dp.err();
        t->device_ = std::make_unique<storage::expert_cache>(t->device_slots_, std::move(*dp));
    }
    if (t->draft_slots_ > 0) {
        auto dp = policy();
        if (!dp) return dp.err();
        t->draft_ = std::make_unique<storage::expert_cache>(t->draft_slots_, std::move(*dp));
    }
    tiered_experts* self = t.get();
    // The reaper only posts: the completion is the strand's (docs/streaming.md: why not the eventfd).
    auto reader = io::uring_reader::open(paths, opts.io, [self](uint64_t tag, const status& st) {
        asio::post(self->strand_, [self, tag, st, at = std::chrono::steady_clock::now()] {
            ++self->counters_.completions_posted;
            self->counters_.completion_post_seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
            self->on_read(tag, st);
        });
    });
    if (!reader) return reader.err();
    t->reader_ = std::move(*reader);
    std::vector<std::span<std::byte>> regions{t->host_buf_.span()};
    if (t->draft_slots_ > 0) regions.push_back(t->draft_buf_.span());
    (void)t->reader_->register_buffers(regions);  // plain reads when refused: slower, same bytes
    if (opts.remap_sync) {
        for (const auto& p : paths) {
            const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) return make_error(p + ": " + std::strerror(errno));
            t->remap_fds_.push_back(fd);
        }
        t->remap_pool_ = std::make_unique<thread_pool>(std::max(1, opts.remap_threads));
    }
    // The baseline (remap-sync) copies on the compute path, as the published port does.
    if (t->device_ && !opts.remap_sync) t->copier_ = std::make_unique<asio::thread_pool>(1);
    return t;
}

dsv41::expert_weights tiered_experts::views(const layout& l, const std::byte* base, bool host) const {
    weight_view v[3];
    for (int p = 0; p < 3; ++p) {
        const part& pt = l.parts[p];
        const std::byte* ptr = host ? base + host_part_[p] + pt.where.offset % io::kReadAlign : base + device_part_[p];
        v[p] = weight_view::contiguous(ptr, pt.type, pt.cols, pt.rows);
    }
    return {v[0], v[1], v[2]};
}

bool tiered_experts::start_read(expert_key key, std::vector<io::read_request>& batch) {
    if (stopping_) return false;
    auto grant = home(key).begin_load(key);
    if (!grant) return false;  // every host slot pinned or loading: later
    if (grant->evicted) hint_started_.erase(*grant->evicted);  // a prediction evicted unused: wasted
    const int layer = int(storage::key_layer(key));
    const int32_t expert = int32_t(storage::key_expert(key));
    const layout& l = layout_of(layer, expert);
    loading_[key] = load_state{3, false, {}, generation_};
    for (int p = 0; p < 3; ++p) {
        io::read_request r = l.parts[p].where;
        r.dst = home_slot(key, grant->slot) + host_part_[p];
        r.tag = make_tag(layer, expert, p);
        batch.push_back(r);
    }
    return true;
}

void tiered_experts::submit(std::vector<io::read_request>& batch) {
    if (batch.empty()) return;
    if (opts_.remap_sync) remap_sync_reads(batch);  // blocks the strand: the baseline's design
    else reader_->submit(batch);                    // every chunk of every miss at once
    batch.clear();
}

void tiered_experts::need(int layer, std::span<const int32_t> experts) {
    std::vector<int32_t> ids(experts.begin(), experts.end());
    if (!opts_.remap_sync) {
        asio::post(strand_, [this, layer, ids = std::move(ids)] { on_need(layer, ids); });
        return;
    }
    // The baseline blocks here until its reads land: that time is waiting, not compute.
    if (on_strand_thread()) {
        // From the device tier's strand (CUDA's slots over this tier), which shares the
        // scheduler's thread: waiting for this strand there would wait for itself. The reads
        // block that thread instead, as they blocked the device tier's strand when it had a
        // thread of its own, and whatever the device tier asks next comes after them.
        asio::post(strand_, [this, layer, ids = std::move(ids)] {
            const auto t0 = std::chrono::steady_clock::now();
            on_need(layer, ids);
            counters_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            ++counters_.blocking_waits;
            publish_waits();
        });
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    run_on_strand([&] { on_need(layer, ids); });
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    asio::post(strand_, [this, dt] {
        counters_.wait_seconds += dt;
        ++counters_.blocking_waits;
        publish_waits();
    });
}

void tiered_experts::publish_waits() {
    wait_total_.store(counters_.wait_seconds, std::memory_order_relaxed);
    copy_total_.store(counters_.copy_seconds, std::memory_order_relaxed);
}

void tiered_experts::on_need(int layer, const std::vector<int32_t>& experts) {
    ++step_;
    need_layer_ = uint32_t(layer);
    // Predictions for this layer are now facts, older ones are stale; those of the next layers
    // (a look-ahead deeper than one layer) still stand.
    const auto ahead = [this](expert_key k) {
        const uint32_t d = lead(storage::key_layer(k));
        return d > 0 && d <= kHintLayers;
    };
    std::erase_if(hinted_, [&](expert_key k) { return !ahead(k); });
    ++generation_;
    failed_.clear();  // a new demand retries what failed before (nothing was cached from it)
    joined_.clear();
    for (auto it = hint_started_.begin(); it != hint_started_.end();)  // wasted predictions
        it = storage::key_layer(*it) == uint32_t(layer) || ahead(*it) ? std::next(it) : hint_started_.erase(it);
    // Pins of the previous need() that no take took over (a forward that stopped early).
    for (expert_key k : need_pins_)
        if (home(k).pins(k) > 0) home(k).unpin(k);
    need_pins_.clear();
    for (expert_key k : device_need_pins_)
        if (device_->pins(k) > 0) device_->unpin(k);
    device_need_pins_.clear();
    promoted_ahead_.clear();
    // Needed experts already in the host tier are pinned first, so the reads started below
    // (and device demotions) evict something else.
    // Where each was (the step accounting, spec/expert_union.h), before anything moves.
    if (size_t(layer) < n_tallies_) {
        spec::layer_tally t;
        t.needs = 1;
        t.experts = experts.size();
        for (int32_t e : experts) {
            const expert_key key = make_expert_key(uint32_t(layer), uint32_t(e));
            if (!draft_key(key) && device_ && device_->lookup(key).state != storage::residency::absent) ++t.device;
            else if (const auto st = home(key).lookup(key).state; st == storage::residency::resident) ++t.host;
            else if (st == storage::residency::loading) ++t.in_flight;
            else ++t.missing;
        }
        atomic_tally& a = tallies_[size_t(layer)];
        constexpr auto relaxed = std::memory_order_relaxed;
        a.needs.fetch_add(t.needs, relaxed), a.experts.fetch_add(t.experts, relaxed);
        a.device.fetch_add(t.device, relaxed), a.host.fetch_add(t.host, relaxed);
        a.in_flight.fetch_add(t.in_flight, relaxed), a.missing.fetch_add(t.missing, relaxed);
    }
    // The draft's experts in a budget of their own never move to the device tier: their slots
    // are where they are computed from.
    std::vector<expert_key> promote;
    for (int32_t e : experts) {
        const expert_key key = make_expert_key(uint32_t(layer), uint32_t(e));
        storage::expert_cache& c = home(key);
        if (c.lookup(key).state != storage::residency::absent) {
            c.pin(key);
            need_pins_.push_back(key);
            if (c.lookup(key).state == storage::residency::resident && !draft_key(key)) promote.push_back(key);
        }
    }
    std::vector<io::read_request> batch;
    for (int32_t e : experts) {
        const expert_key key = make_expert_key(uint32_t(layer), uint32_t(e));
        if (!draft_key(key) && device_ && device_->lookup(key).state != storage::residency::absent) continue;
        if (home(key).lookup(key).state != storage::residency::absent) continue;  // resident or joined
        if (!start_read(key, batch)) break;  // the rest are read on demand, as slots free
        trace::mark(trace::ev::read_demand, layer, e);
        home(key).pin(key);
        need_pins_.push_back(key);
    }
    // Promotions ahead of demand: the copy worker moves host hits up while the reads go out.
    if (device_ && !opts_.remap_sync)
        for (expert_key key : promote) start_promotion(key, false);
    submit(batch);
    serve_waiters();
}

void tiered_experts::remap_sync_reads(const std::vector<io::read_request>& batch) {
    std::vector<status> outcome(batch.size());
    remap_pool_->parallel_for(int64_t(batch.size()), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const auto& r = batch[size_t(i)];
            std::byte* dst = io::uring_reader::data_pointer(r.dst, r.offset);
            uint64_t done = 0;
            while (done < r.bytes) {
                const ssize_t n = ::pread(remap_fds_[r.file], dst + done, r.bytes - done, off_t(r.offset + done));
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {
                    outcome[size_t(i)] = make_error("pread at offset " + std::to_string(r.offset + done) + ": " +
                                                    (n == 0 ? std::string("end of file") : std::strerror(errno)));
                    break;
                }
                done += uint64_t(n);
            }
        }
    });
    for (size_t i = 0; i < batch.size(); ++i) on_read(batch[i].tag, outcome[i]);
}

void tiered_experts::hint(int layer, std::span<const int32_t> experts) {
    asio::post(strand_, [this, layer, ids = std::vector<int32_t>(experts.begin(), experts.end())] {
        on_hint(layer, ids);
    });
}

uint32_t tiered_experts::lead(uint32_t layer) const {
    const uint32_t n = uint32_t(n_layers_);
    if (layer >= need_layer_) return layer - need_layer_;
    if (need_layer_ >= n) return layer < n ? layer + 1 : kNotAhead;  // a draft stage: the next forward follows
    return layer + n - need_layer_;                                   // the next forward's layer
}

void tiered_experts::on_hint(int layer, const std::vector<int32_t>& experts) {
    // A layer's newest prediction replaces its older one; the nearest layer's go first.
    std::erase_if(hinted_, [layer](expert_key k) { return storage::key_layer(k) == uint32_t(layer); });
    for (int32_t e : experts) hinted_.push_back(make_expert_key(uint32_t(layer), uint32_t(e)));
    std::stable_sort(hinted_.begin(), hinted_.end(), [this](expert_key a, expert_key b) {
        return lead(storage::key_layer(a)) < lead(storage::key_layer(b));
    });
    submit_hints();
}

void tiered_experts::submit_hints() {
    if (opts_.remap_sync || stopping_) return;  // the baseline has no look-ahead; the reader may be gone
    if (hinted_.empty() || reader_->stats().queued_chunks > 0) return;  // demands first
    std::vector<io::read_request> batch;
    size_t taken = 0;  // hinted_[0, taken) are read now or need no read
    for (; taken < hinted_.size() && hint_reads_in_flight_ < kHintReadsInFlight; ++taken) {
        const expert_key key = hinted_[taken];
        if (!draft_key(key) && device_ && device_->lookup(key).state != storage::residency::absent) continue;
        storage::expert_cache& c = home(key);
        if (c.lookup(key).state != storage::residency::absent) continue;
        // A prediction may take a free slot or evict anything but an expert of the layers from
        // the one being computed up to the predicted one (they may still be demanded first) or
        // another prediction, read or not. (With layers visited in a cycle, LRU's victim is
        // usually an old expert of the predicted layer itself.)
        if (c.resident_count() + c.loading_count() == c.slot_count()) {
            const auto victim = c.policy().victim();
            if (!victim) break;
            const auto vk = c.key_in(*victim);
            if (!vk) break;
            const bool nearer = lead(storage::key_layer(*vk)) < lead(storage::key_layer(key));
            if (nearer || hint_started_.count(*vk) ||
                std::find(hinted_.begin(), hinted_.end(), *vk) != hinted_.end())
                break;
        }
        if (!start_read(key, batch)) break;
        trace::mark(trace::ev::read_hint, int32_t(storage::key_layer(key)), int32_t(storage::key_expert(key)));
        loading_[key].hinted = true;
        ++hint_reads_in_flight_;
        ++counters_.hint_reads;
        hint_started_.insert(key);
    }
    // What the window left waits for the next completion; what found no slot is dropped (the
    // next prediction or demand asks again).
    if (hint_reads_in_flight_ < kHintReadsInFlight) hinted_.clear();
    else hinted_.erase(hinted_.begin(), hinted_.begin() + std::ptrdiff_t(taken));
    submit(batch);
}

void tiered_experts::on_read(uint64_t tag, const status& st) {
    const int layer = int(tag >> 34);
    const int32_t expert = int32_t((tag >> 2) & 0xffffffffu);
    // Held back by a timer on the strand (tests): no thread sleeps meanwhile.
    if (opts_.inject_delay_us && !opts_.remap_sync && !stopping_)
        if (const uint32_t us = opts_.inject_delay_us(layer, expert)) {
            auto timer = std::make_shared<asio::steady_timer>(strand_, std::chrono::microseconds(us));
            ++in_progress_;
            timer->async_wait([this, timer, tag, st](const boost::system::error_code&) {
                --in_progress_;
                finish_read(tag, st);
            });
            return;
        }
    finish_read(tag, st);
}

void tiered_experts::finish_read(uint64_t tag, const status& st) {
    const int layer = int(tag >> 34);
    const int32_t expert = int32_t((tag >> 2) & 0xffffffffu);
    const expert_key key = make_expert_key(uint32_t(layer), uint32_t(expert));
    auto it = loading_.find(key);
    MS_ASSERT_MSG(it != loading_.end(), "read completion for an expert that is not loading");
    load_state& ls = it->second;
    if (!st.ok() && !ls.failed) {
        ls.failed = true;
        ls.error = st.message();
    }
    if (opts_.inject_read_error && !ls.failed && opts_.inject_read_error(layer, expert)) {
        ls.failed = true;
        ls.error = "injected read error";
    }
    if (--ls.parts_left > 0) return;
    trace::mark(trace::ev::read_done, layer, expert);
    if (ls.hinted) --hint_reads_in_flight_;
    home(key).finish_load(key, !ls.failed);
    const bool failed = ls.failed;
    if (failed) {
        ++counters_.read_errors;
        failed_[key] = {ls.generation, ls.error};
    } else {
        ++counters_.disk_reads;
        const layout& l = layout_of(layer, expert);
        for (const auto& p : l.parts) {
            counters_.disk_bytes += p.where.bytes;
            if (size_t(layer) < n_tallies_)
                tallies_[size_t(layer)].bytes_read.fetch_add(p.where.bytes, std::memory_order_relaxed);
        }
    }
    loading_.erase(it);
    if (!failed && layer == 0 && kept_.size() < keep_budget_ && kept_.insert(key).second) home(key).pin(key);
    if (!failed && device_ && !opts_.remap_sync && !draft_key(key) &&
        std::find(need_pins_.begin(), need_pins_.end(), key) != need_pins_.end())
        start_promotion(key, false);
    serve_waiters();
    submit_hints();  // the queue may have drained: predictions may go now
}

void tiered_experts::copy_parts(const layout& l, const std::byte* from, bool from_host, std::byte* to,
                                bool to_host) const {
    for (int p = 0; p < 3; ++p) {
        const part& pt = l.parts[p];
        const uint64_t skew = pt.where.offset % io::kReadAlign;
        const std::byte* src = from + (from_host ? host_part_[p] + skew : device_part_[p]);
        std::byte* dst = to + (to_host ? host_part_[p] + skew : device_part_[p]);
        std::memcpy(dst, src, pt.where.bytes);
    }
}

bool tiered_experts::promote(expert_key key) {
    auto grant = device_->begin_load(key);
    if (!grant) return false;  // every device slot held: wait for a release
    const auto copy_start = std::chrono::steady_clock::now();
    const auto hs = host_->lookup(key);
    MS_ASSERT(hs.state == storage::residency::resident);
    const int layer = int(storage::key_layer(key));
    const int32_t expert = int32_t(storage::key_expert(key));
    const layout& l = layout_of(layer, expert);
    uint64_t payload = 0;
    for (const auto& p : l.parts) payload += p.where.bytes;
    // Exclusive tiers: the device victim moves down into the host tier (no disk read next time),
    // when the host has room for it; otherwise it is dropped (it is still on disk).
    if (grant->evicted) {
        const expert_key v = *grant->evicted;
        const layout& vl = layout_of(int(storage::key_layer(v)), int32_t(storage::key_expert(v)));
        auto hg = host_->begin_load(v);
        if (hg && hg->evicted) hint_started_.erase(*hg->evicted);
        if (hg) {
            copy_parts(vl, device_slot(grant->slot), false, host_slot(hg->slot), true);
            host_->finish_load(v, true);
            for (const auto& p : vl.parts) counters_.demoted_bytes += p.where.bytes;
        }
    }
    // begin_load above may have evicted host slots, never `key`'s: it is pinned there.
    const auto hs2 = host_->lookup(key);
    copy_parts(l, host_slot(hs2.slot), true, device_slot(grant->slot), false);
    device_->finish_load(key, true);
    counters_.promoted_bytes += payload;
    counters_.copy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count();
    publish_waits();
    host_->unpin(key);
    (void)host_->erase(key);
    return true;
}

void tiered_experts::start_promotion(expert_key key, bool demanded) {
    MS_ASSERT(device_ && copier_);
    if (stopping_) return;
    const bool need_pinned = std::find(need_pins_.begin(), need_pins_.end(), key) != need_pins_.end();
    if (!demanded && !need_pinned) return;  // no longer wanted
    if (device_->lookup(key).state != storage::residency::absent) return;  // there or on its way
    const auto hs = host_->lookup(key);
    if (hs.state != storage::residency::resident) return;
    auto grant = device_->begin_load(key);
    if (!grant) return;  // every device slot held: a release serves the waiter again
    if (!need_pinned) {  // demanded without need()'s protection: it gets it now
        host_->pin(key);
        need_pins_.push_back(key);
    }
    const layout& l = layout_of(int(storage::key_layer(key)), int32_t(storage::key_expert(key)));
    // The device victim moves down into the host tier when there is room (as in promote()).
    promotion p{key, std::nullopt, std::nullopt, 0};
    if (grant->evicted) {
        p.victim = *grant->evicted;
        auto hg = host_->begin_load(*p.victim);
        if (hg && hg->evicted) hint_started_.erase(*hg->evicted);
        if (hg) p.victim_host_slot = hg->slot;
    }
    host_->pin(key);  // the source stays put while it is copied
    const std::byte* src = host_slot(hs.slot);
    std::byte* dst = device_slot(grant->slot);
    std::byte* victim_dst = p.victim_host_slot ? host_slot(*p.victim_host_slot) : nullptr;
    const layout* vl =
        p.victim ? &layout_of(int(storage::key_layer(*p.victim)), int32_t(storage::key_expert(*p.victim))) : nullptr;
    const uint32_t delay_us =
        opts_.inject_delay_us ? opts_.inject_delay_us(int(storage::key_layer(key)), int32_t(storage::key_expert(key)))
                              : 0;
    ++in_progress_;
    // The copy touches only the slots reserved above (loading or pinned: no handler touches them
    // until finish_promotion), so it needs no lock.
    asio::post(*copier_, [this, p, src, dst, victim_dst, vl, &l, delay_us]() mutable {
        const auto t0 = std::chrono::steady_clock::now();
        if (victim_dst) copy_parts(*vl, dst, false, victim_dst, true);  // the victim leaves first
        copy_parts(l, src, true, dst, false);
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (delay_us == 0) {
            asio::post(strand_, [this, p] { finish_promotion(p); });
            return;
        }
        auto timer = std::make_shared<asio::steady_timer>(strand_, std::chrono::microseconds(delay_us));
        timer->async_wait([this, timer, p](const boost::system::error_code&) { finish_promotion(p); });
    });
}

void tiered_experts::finish_promotion(const promotion& p) {
    --in_progress_;
    const expert_key key = p.key;
    if (p.victim_host_slot) {
        host_->finish_load(*p.victim, true);
        const layout& vl = layout_of(int(storage::key_layer(*p.victim)), int32_t(storage::key_expert(*p.victim)));
        for (const auto& part : vl.parts) counters_.demoted_bytes += part.where.bytes;
    }
    device_->finish_load(key, true);
    const layout& l = layout_of(int(storage::key_layer(key)), int32_t(storage::key_expert(key)));
    for (const auto& part : l.parts) counters_.promoted_bytes += part.where.bytes;
    counters_.async_copy_seconds += p.seconds;
    ++counters_.async_promotions;
    host_->unpin(key);
    // Exclusive tiers: the host copy goes. A demanded expert keeps its protection, now on the
    // device side, until a take takes it over.
    if (auto it = std::find(need_pins_.begin(), need_pins_.end(), key); it != need_pins_.end()) {
        need_pins_.erase(it);
        host_->unpin(key);
        device_->pin(key);
        device_need_pins_.push_back(key);
        promoted_ahead_.insert(key);
    }
    (void)host_->erase(key);
    serve_waiters();
}

result<dsv41::expert_weights> tiered_experts::get(int layer, int32_t expert) {
    auto r = acquire_ready(layer, std::span<const int32_t>(&expert, 1), 1);
    if (!r) return r.err();
    return r->front().second;
}

// Takes `key` when it is resident in either tier, pinned for the model. nullopt when it is
// loading, absent, in the host tier waiting for its promotion, or no device slot is free now.
std::optional<dsv41::expert_weights> tiered_experts::take_if_resident(expert_key key) {
    const int layer = int(storage::key_layer(key));
    const int32_t expert = int32_t(storage::key_expert(key));
    const layout& l = layout_of(layer, expert);
    if (device_) {
        const auto d = device_->lookup(key);
        if (d.state == storage::residency::loading) return std::nullopt;  // the copy worker is on it
        if (d.state == storage::residency::resident) {
            if (promoted_ahead_.erase(key) > 0) ++counters_.host_hits;  // found in the host tier
            else ++counters_.device_hits;
            device_->touch(key, step_);
            // Take over the promotion's pin when there is one, else pin now.
            if (auto it = std::find(device_need_pins_.begin(), device_need_pins_.end(), key);
                it != device_need_pins_.end())
                device_need_pins_.erase(it);
            else
                device_->pin(key);
            return views(l, device_slot(d.slot), false);
        }
    }
    storage::expert_cache& c = home(key);
    const auto h = c.lookup(key);
    if (h.state != storage::residency::resident) return std::nullopt;
    c.touch(key, step_);
    if (draft_key(key)) {  // computed from the draft's own slots
        if (auto it = std::find(need_pins_.begin(), need_pins_.end(), key); it != need_pins_.end())
            need_pins_.erase(it);
        else
            c.pin(key);
        ++counters_.host_hits;  // host memory, as the host tier's
        ++counters_.draft_hits;
        return views(l, draft_slot(h.slot), true);
    }
    if (device_ && !opts_.remap_sync) {  // the copy worker moves it up; its completion serves us
        start_promotion(key, true);
        return std::nullopt;
    }
    // Take over need()'s pin when there is one, else pin now.
    if (auto it = std::find(need_pins_.begin(), need_pins_.end(), key); it != need_pins_.end())
        need_pins_.erase(it);
    else
        host_->pin(key);
    if (!device_) {
        ++counters_.host_hits;
        return views(l, host_slot(h.slot), true);
    }
    if (!promote(key)) {  // every device slot held: keep need()'s protection, try again later
        need_pins_.push_back(key);
        return std::nullopt;
    }
    ++counters_.host_hits;
    device_->pin(key);
    device_->touch(key, step_);
    return views(l, device_slot(device_->lookup(key).slot), false);
}

void tiered_experts::async_ready(int layer, std::span<const int32_t> pending, int64_t max,
                                 dsv41::ready_callback done) {
    MS_ASSERT(!pending.empty() && max >= 1);
    waiter w{layer, {pending.begin(), pending.end()}, max, std::move(done), false, std::chrono::steady_clock::now()};
    asio::post(strand_, [this, w = std::move(w)]() mutable { enqueue(std::move(w)); });
}

result<std::vector<std::pair<int32_t, dsv41::expert_weights>>> tiered_experts::acquire_ready(
    int layer, std::span<const int32_t> pending, int64_t max) {
    MS_ASSERT(!pending.empty() && max >= 1);
    MS_ASSERT_MSG(!on_strand_thread(),
                  "tiered_experts::acquire_ready() on the thread of its strand's executor (the scheduler's): "
                  "it would wait for itself; coroutines use async_ready()");
    std::promise<result<dsv41::ready_experts>> answer;
    auto f = answer.get_future();
    waiter w{layer,
             {pending.begin(), pending.end()},
             max,
             [&answer](result<dsv41::ready_experts> r) { answer.set_value(std::move(r)); },
             true,
             std::chrono::steady_clock::now()};
    asio::post(strand_, [this, w = std::move(w)]() mutable { enqueue(std::move(w)); });
    return f.get();
}

void tiered_experts::enqueue(waiter w) {
    waiters_.push_back(std::move(w));
    serve_waiters();
}

void tiered_experts::serve_waiters() {
    if (serving_) {
        serve_again_ = true;
        return;
    }
    serving_ = true;
    do {
        serve_again_ = false;
        for (size_t i = 0; i < waiters_.size();) {
            if (try_serve(waiters_[i])) {
                waiters_.erase(waiters_.begin() + std::ptrdiff_t(i));
            } else {
                ++i;
            }
        }
    } while (serve_again_);
    serving_ = false;
}

bool tiered_experts::try_serve(waiter& w) {
    dsv41::ready_experts out;
    const int layer = w.layer;
    const auto answer = [&](result<dsv41::ready_experts> r) {
        if (w.waited) {
            counters_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - w.since).count();
            publish_waits();
        }
        // Called here, on the strand: the forward's callback only posts its resumption.
        trace::mark(trace::ev::host_answer, layer, r ? int32_t(r->size()) : -1);
        auto done = std::move(w.done);
        done(std::move(r));
        return true;
    };
    for (;;) {
        std::vector<io::read_request> batch;
        for (int32_t expert : w.pending) {
            if (int64_t(out.size()) == w.max) break;
            if (std::any_of(out.begin(), out.end(), [&](const auto& o) { return o.first == expert; })) continue;
            const expert_key key = make_expert_key(uint32_t(layer), uint32_t(expert));
            if (auto got = take_if_resident(key)) {
                ++counters_.demands;
                const size_t seen = size_t(layer) * size_t(max_experts_) + size_t(expert);
                if (!demanded_[seen]) {
                    demanded_[seen] = true;
                    ++counters_.first_demands;
                    ++counters_.working_set;
                }
                if (auto h = hint_started_.find(key); h != hint_started_.end()) {
                    ++counters_.hint_used;
                    hint_started_.erase(h);
                }
                out.emplace_back(expert, *got);
                continue;
            }
            const auto state = home(key).lookup(key).state;
            if (state == storage::residency::loading) {
                if (joined_.insert(key).second) ++counters_.joins;  // once per expert and layer
                continue;
            }
            if (state != storage::residency::absent) continue;  // resident, waiting for a device slot
            if (!draft_key(key) && device_ && device_->lookup(key).state != storage::residency::absent)
                continue;  // being promoted
            if (auto f = failed_.find(key); f != failed_.end() && f->second.first == generation_) {
                std::string msg = f->second.second;
                failed_.erase(f);
                // A file replaced under us is the likeliest cause of a read error: say so.
                if (auto changed = m_.verify_unchanged(); !changed) msg += "; " + changed.message();
                for (auto& [held, unused] : out) release_pin(layer, held);
                submit(batch);
                return answer(make_error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                                         " could not be read: " + msg));
            }
            // Pinned like need()'s reads, so nothing evicts it before it is taken. When no host slot
            // is free it is retried after the next change.
            if (start_read(key, batch)) {
                trace::mark(trace::ev::read_demand, layer, expert);
                home(key).pin(key);
                need_pins_.push_back(key);
            }
        }
        if (!batch.empty() && opts_.remap_sync) {
            submit(batch);  // landed: look again
            continue;
        }
        submit(batch);
        break;
    }
    if (!out.empty()) return answer(std::move(out));
    if (stopping_) return answer(make_error("the expert tiers are shutting down"));
    if (!w.waited && w.blocking) ++counters_.blocking_waits;
    w.waited = true;
    return false;
}

void tiered_experts::release_pin(int layer, int32_t expert) {
    const expert_key key = make_expert_key(uint32_t(layer), uint32_t(expert));
    if (draft_key(key)) draft_->unpin(key);
    else if (device_) device_->unpin(key);
    else host_->unpin(key);
}

void tiered_experts::release(int layer, int32_t expert) {
    asio::post(strand_, [this, layer, expert] { on_release(layer, expert); });
}

void tiered_experts::on_release(int layer, int32_t expert) {
    release_pin(layer, expert);
    serve_waiters();  // a slot may be free for a promotion or a read now
}

tier_counters tiered_experts::counters() const {
    tier_counters c;
    run_on_strand([&] { c = counters_; });
    return c;
}

bool tiered_experts::layer_tallies(std::span<spec::layer_tally> out) const {
    constexpr auto relaxed = std::memory_order_relaxed;
    for (size_t L = 0; L < out.size(); ++L) {
        spec::layer_tally& t = out[L];
        t = {};
        if (L >= n_tallies_) continue;
        const atomic_tally& a = tallies_[L];
        t.needs = a.needs.load(relaxed), t.experts = a.experts.load(relaxed), t.device = a.device.load(relaxed);
        t.host = a.host.load(relaxed), t.in_flight = a.in_flight.load(relaxed), t.missing = a.missing.load(relaxed);
        t.bytes_read = a.bytes_read.load(relaxed);
    }
    return true;
}

std::vector<storage::expert_key> tiered_experts::resident_keys(tier which) const {
    std::vector<storage::expert_key> keys;
    run_on_strand([&] {
        const storage::expert_cache* c = which == tier::device ? device_.get() : which == tier::host ? host_.get() : draft_.get();
        if (c) keys = c->resident_keys();
    });
    return keys;
}

void tiered_experts::forget_resident() {
    run_on_strand([this] {
        MS_ASSERT_MSG(waiters_.empty(), "forget_resident() while a forward awaits its experts");
        for (expert_key k : kept_) host_->unpin(k);
        kept_.clear();
        for (storage::expert_cache* c : {device_.get(), host_.get(), draft_.get()}) {
            if (!c) continue;
            for (expert_key k : c->resident_keys())
                if (c->pins(k) == 0) (void)c->erase(k);
        }
        hint_started_.clear();
        promoted_ahead_.clear();
    });
}

}  // namespace moestream
