#include "scheduler/engram_stream.h"

#include <algorithm>
#include <chrono>

#include "storage/system_memory.h"

namespace moestream {
namespace {

uint64_t row_key(int engram_index, int64_t row) { return uint64_t(engram_index) << 48 | uint64_t(row); }

}  // namespace

engram_stream::~engram_stream() {
    reader_.reset();
    if (held_thread_.joinable()) {
        {
            std::lock_guard lock(held_mu_);
            held_stop_ = true;
        }
        held_cv_.notify_all();
        held_thread_.join();
    }
}

void engram_stream::hold(uint64_t tag, const status& st, uint32_t us) {
    {
        std::lock_guard lock(held_mu_);
        held_.push_back({std::chrono::steady_clock::now() + std::chrono::microseconds(us), tag, st});
    }
    held_cv_.notify_all();
}

void engram_stream::deliver_held() {
    std::unique_lock lock(held_mu_);
    while (!held_stop_ || !held_.empty()) {
        if (held_.empty()) {
            held_cv_.wait(lock);
            continue;
        }
        auto next = std::min_element(held_.begin(), held_.end(), [](const auto& a, const auto& b) { return a.at < b.at; });
        if (!held_stop_ && std::chrono::steady_clock::now() < next->at) {
            held_cv_.wait_until(lock, next->at);
            continue;
        }
        const held_completion c = *next;
        held_.erase(next);
        lock.unlock();
        on_read(c.tag, c.outcome);
        lock.lock();
    }
}

status engram_stream::load_resident() {
    // Each table's values and scales as one read each, into their own 4 KiB-aligned spans.
    std::vector<io::read_request> reads;
    uint64_t total = 0;
    for (const auto& t : tables_)
        for (const io::read_request* part : {&t.values, &t.scales})
            total += io::uring_reader::staging_bytes(part->offset, t.rows * part->bytes);
    auto buf = io::aligned_buffer::allocate(size_t(total));
    if (!buf) return make_error("engram tables in RAM (" + std::to_string(total >> 20) + " MiB): " + buf.message());
    resident_ = std::move(*buf);
    uint64_t at = 0;
    for (auto& t : tables_)
        for (int k = 0; k < 2; ++k) {
            const io::read_request& part = k == 0 ? t.values : t.scales;
            const uint64_t bytes = t.rows * part.bytes;
            std::byte* dst = resident_.data() + at;
            reads.push_back({part.file, part.offset, bytes, dst, uint64_t(reads.size())});
            (k == 0 ? t.resident_values : t.resident_scales) = io::uring_reader::data_pointer(dst, part.offset);
            at += io::uring_reader::staging_bytes(part.offset, bytes);
        }
    // The reads complete on the reader's thread (on_read with tags 0..): extents_ holds one a read.
    extents_.assign(reads.size(), extent_state{});
    in_flight_parts_ = reads.size();
    reader_->submit(reads);
    std::unique_lock lock(mu_);
    arrived_.wait(lock, [&] { return in_flight_parts_ == 0; });
    for (const auto& x : extents_)
        if (x.failed) return make_error("engram tables: " + x.error);
    counters_.disk_reads += reads.size();
    counters_.resident_bytes = total;
    return {};
}

result<std::unique_ptr<engram_stream>> engram_stream::create(const loaded_model& m, engram_stream_options opts) {
    std::unique_ptr<engram_stream> s(new engram_stream(opts));
    if (s->opts_.inject_delay_us) s->held_thread_ = std::thread([self = s.get()] { self->deliver_held(); });
    const auto& hp = m.hp;
    if (opts.slots == 0) return make_error("engram staging: the arena needs at least one slot");
    if (hp.engram_head_dim + 4096 > int64_t(kWindow))
        return make_error("engram head_dim " + std::to_string(hp.engram_head_dim) + " does not fit the staging window");
    for (int L : hp.engram_layers) {
        const std::string prefix = "blk." + std::to_string(L) + ".";
        const auto* v = m.target.tensor(prefix + "engram_embd.weight");
        const auto* sc = m.target.tensor(prefix + "engram_embd_scale.weight");
        if (!v || !sc) return make_error(m.target.shard_path(0) + ": engram tables of layer " + std::to_string(L) + " missing");
        table t;
        t.values = {v->shard, v->file_offset, uint64_t(v->ne[0]), nullptr, 0};
        t.scales = {sc->shard, sc->file_offset, uint64_t(sc->ne[0]), nullptr, 0};
        t.rows = uint64_t(v->ne[1]);
        s->tables_.push_back(t);
    }
    uint64_t table_bytes = 0;
    for (const auto& t : s->tables_) table_bytes += t.rows * (t.values.bytes + t.scales.bytes);
    const bool resident = table_bytes > 0 && table_bytes <= opts.resident_max_bytes &&
                          table_bytes <= storage::available_memory_bytes() / 8;
    if (resident) s->opts_.slots = opts.slots = 1;  // the arena is then never read into
    // One more slot than rows announced: the reserved slot. A window's coalesced reads never take
    // more than its parts would alone (two windows a slot).
    auto arena = io::aligned_buffer::allocate((size_t(opts.slots) + 1) * 2 * kWindow);
    if (!arena) return make_error("engram staging: " + arena.message());
    s->arena_ = std::move(*arena);
    s->places_.resize(size_t(opts.slots) + 1);
    s->extents_.resize(2 * size_t(opts.slots) + 2);
    s->announced_.resize(s->tables_.size());
    s->assigned_.assign(s->tables_.size(), 0);
    s->consumed_.assign(s->tables_.size(), 0);
    std::vector<std::string> paths;
    for (size_t i = 0; i < m.target.shard_count(); ++i) paths.push_back(m.target.shard_path(uint32_t(i)));
    engram_stream* self = s.get();
    auto reader = io::uring_reader::open(paths, opts.io, [self](uint64_t tag, const status& st) {
        if (self->opts_.inject_delay_us)
            if (const uint32_t us = self->opts_.inject_delay_us()) return self->hold(tag, st, us);
        self->on_read(tag, st);
    });
    if (!reader) return reader.err();
    s->reader_ = std::move(*reader);
    if (resident) {
        if (auto st = s->load_resident(); !st) return st.err();
        return s;
    }
    const std::span<std::byte> regions[] = {s->arena_.span()};
    (void)s->reader_->register_buffers(regions);
    return s;
}

void engram_stream::prefetch(int engram_index, std::span<const int64_t> rows) {
    MS_ASSERT(engram_index >= 0 && size_t(engram_index) < tables_.size());
    if (resident_.data()) return;  // every row is in RAM
    std::vector<io::read_request> batch;
    {
        std::lock_guard lock(mu_);
        auto& ann = announced_[size_t(engram_index)];
        ann.insert(ann.end(), rows.begin(), rows.end());
        std::vector<part> parts;
        assign(engram_index, parts);
        plan_reads(parts, batch);
    }
    if (!batch.empty()) reader_->submit(batch);
}

void engram_stream::assign(int e, std::vector<part>& parts) {
    const table& t = tables_[size_t(e)];
    const auto& ann = announced_[size_t(e)];
    size_t& next = assigned_[size_t(e)];
    for (; next < ann.size(); ++next) {
        const uint64_t key = row_key(e, ann[next]);
        if (slot_of_.count(key)) continue;  // repeated n-grams are read once a window
        if (used_ == opts_.slots) break;    // full: the next refill reads it
        const uint32_t slot = used_++;
        slot_of_[key] = slot;
        add_parts(t, ann[next], slot, parts);
    }
}

void engram_stream::add_parts(const table& t, int64_t row, uint32_t slot, std::vector<part>& parts) const {
    parts.push_back({t.values.file, t.values.offset + uint64_t(row) * t.values.bytes, t.values.bytes, slot, false});
    parts.push_back({t.scales.file, t.scales.offset + uint64_t(row) * t.scales.bytes, t.scales.bytes, slot, true});
}

void engram_stream::plan_reads(std::vector<part>& parts, std::vector<io::read_request>& batch) {
    constexpr uint64_t kPage = 4096;
    const auto page_of = [](uint64_t offset) { return offset / kPage * kPage; };
    const auto end_of = [](const part& p) { return (p.offset + p.bytes + kPage - 1) / kPage * kPage; };
    std::sort(parts.begin(), parts.end(), [&](const part& a, const part& b) {
        return a.file != b.file ? a.file < b.file : a.offset < b.offset;
    });
    for (size_t i = 0; i < parts.size();) {
        // A run of parts whose pages overlap or touch: one read of the pages from the first's to
        // the furthest end (no more bytes than the parts' own pages).
        // (The read itself ends at the last part's last byte: a page past it may be past the file.)
        const uint64_t start = page_of(parts[i].offset);
        uint64_t end = end_of(parts[i]), data_end = parts[i].offset + parts[i].bytes;
        size_t j = i + 1;
        for (; j < parts.size() && parts[j].file == parts[i].file && page_of(parts[j].offset) <= end; ++j) {
            end = std::max(end, end_of(parts[j]));
            data_end = std::max(data_end, parts[j].offset + parts[j].bytes);
        }
        const uint32_t x = extents_used_++;
        MS_ASSERT(x < 2 * opts_.slots);
        MS_ASSERT(arena_used_ + (end - start) <= uint64_t(opts_.slots) * 2 * kWindow);
        extents_[x] = extent_state{};
        for (size_t k = i; k < j; ++k) {
            row_place& pl = places_[parts[k].slot];
            const uint64_t at = arena_used_ + (parts[k].offset - start);
            if (parts[k].scales) pl.scale_extent = x, pl.scale_at = at;
            else pl.value_extent = x, pl.value_at = at;
        }
        batch.push_back({parts[i].file, start, data_end - start, arena_.data() + arena_used_, x});
        arena_used_ += end - start;
        i = j;
    }
    in_flight_parts_ += batch.size();
    counters_.disk_reads += batch.size();
}

void engram_stream::retire_window() {
    MS_ASSERT(in_flight_parts_ == 0);
    for (uint32_t i = 0; i < used_; ++i) {
        const row_place& pl = places_[i];
        if (extents_[pl.value_extent].failed || extents_[pl.scale_extent].failed) continue;
        ++counters_.rows_read;
    }
    counters_.bytes_read += uint64_t(used_) * (tables_.empty() ? 0 : tables_[0].values.bytes + tables_[0].scales.bytes);
    slot_of_.clear();
    used_ = 0;
    extents_used_ = 0;
    arena_used_ = 0;
}

void engram_stream::on_read(uint64_t tag, const status& st) {
    std::vector<std::function<void()>> wake;
    {
        std::lock_guard lock(mu_);
        extent_state& x = extents_[size_t(tag)];
        if (!st.ok() && !x.failed) {
            x.failed = true;
            x.error = st.message();
        }
        x.done = true;
        --in_flight_parts_;
        for (size_t i = 0; i < wakers_.size();) {
            const int64_t slot = wakers_[i].slot;
            if (slot < 0 ? in_flight_parts_ == 0 : landed(uint32_t(slot))) {
                wake.push_back(std::move(wakers_[i].wake));
                wakers_.erase(wakers_.begin() + std::ptrdiff_t(i));
            } else {
                ++i;
            }
        }
    }
    arrived_.notify_all();
    for (auto& w : wake) w();
}

int64_t engram_stream::place(std::unique_lock<std::mutex>& lock, int engram_index, int64_t row, bool may_wait) {
    const table& t = tables_[size_t(engram_index)];
    const size_t e = size_t(engram_index);
    const size_t at = consumed_[e];
    const bool in_order = at < announced_[e].size() && announced_[e][at] == row;
    auto it = slot_of_.find(row_key(engram_index, row));
    if (it == slot_of_.end() && in_order && in_flight_parts_ > 0 && !may_wait) return -1;
    ++consumed_[e];
    uint32_t slot = 0;
    if (it != slot_of_.end()) {
        slot = it->second;
    } else if (in_order) {
        // Past the window: once its reads landed, the arena takes the announced rows from this
        // one on (of this engram layer; the others' rows past their reading point come back to
        // the arena when the forward reaches them).
        ++counters_.refills;
        arrived_.wait(lock, [&] { return in_flight_parts_ == 0; });
        retire_window();
        for (size_t o = 0; o < tables_.size(); ++o) assigned_[o] = std::min(assigned_[o], consumed_[o]);
        assigned_[e] = at;
        std::vector<part> parts;
        assign(engram_index, parts);
        // Room left: the later engram layers' next rows, read ahead as prefetch() does.
        for (size_t o = e + 1; o < tables_.size(); ++o) assign(int(o), parts);
        counters_.overflow += uint64_t(used_);
        std::vector<io::read_request> batch;
        plan_reads(parts, batch);
        lock.unlock();
        reader_->submit(batch);
        lock.lock();
        slot = slot_of_.at(row_key(engram_index, row));
    } else {
        // Not announced (or not in the announced order): read it now into the reserved slot,
        // whose previous row the forward has copied already (the interface's contract).
        ++counters_.overflow;
        slot = reserved_slot();
        std::byte* const area = arena_.data() + uint64_t(slot) * 2 * kWindow;
        const uint32_t xv = 2 * opts_.slots, xs = xv + 1;
        extents_[xv] = extents_[xs] = extent_state{};
        const uint64_t v_off = t.values.offset + uint64_t(row) * t.values.bytes;
        const uint64_t s_off = t.scales.offset + uint64_t(row) * t.scales.bytes;
        row_place& pl = places_[slot];
        pl = {xv, xs, uint64_t(area - arena_.data()) + v_off % 4096, uint64_t(area - arena_.data()) + kWindow + s_off % 4096};
        const io::read_request batch[] = {{t.values.file, v_off, t.values.bytes, area, xv},
                                          {t.scales.file, s_off, t.scales.bytes, area + kWindow, xs}};
        in_flight_parts_ += 2;
        counters_.disk_reads += 2;
        lock.unlock();
        reader_->submit(batch);
        lock.lock();
    }
    return slot;
}

bool engram_stream::row_ready(int engram_index, int64_t row, std::function<void()> wake) {
    if (tables_[size_t(engram_index)].resident_values) return true;
    std::unique_lock lock(mu_);
    if (!placed_) {
        const int64_t slot = place(lock, engram_index, row, false);
        if (slot < 0) {  // a refill, once the window's reads have landed
            wakers_.push_back({-1, std::move(wake)});
            return false;
        }
        placed_ = placed_row{engram_index, row, uint32_t(slot), false, std::chrono::steady_clock::now()};
    }
    MS_ASSERT_MSG(placed_->engram_index == engram_index && placed_->row == row,
                  "row_ready() for another row than the one it placed, before its row()");
    if (landed(placed_->slot)) return true;
    if (!placed_->waited) ++counters_.waits;
    placed_->waited = true;
    wakers_.push_back({int64_t(placed_->slot), std::move(wake)});
    return false;
}

result<dsv41::engram_row> engram_stream::row(int engram_index, int64_t row) {
    const table& t = tables_[size_t(engram_index)];
    if (t.resident_values) {
        MS_ASSERT(row >= 0 && uint64_t(row) < t.rows);
        std::lock_guard lock(mu_);
        ++counters_.rows_requested;
        return dsv41::engram_row{reinterpret_cast<const uint8_t*>(t.resident_values + uint64_t(row) * t.values.bytes),
                                 reinterpret_cast<const uint8_t*>(t.resident_scales + uint64_t(row) * t.scales.bytes)};
    }
    std::unique_lock lock(mu_);
    ++counters_.rows_requested;
    uint32_t slot = 0;
    if (placed_) {  // row_ready() placed it (and woke the forward once it landed)
        MS_ASSERT_MSG(placed_->engram_index == engram_index && placed_->row == row,
                      "row() of another row than row_ready() placed");
        slot = placed_->slot;
        if (placed_->waited)
            counters_.wait_seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - placed_->since).count();
        placed_.reset();
    } else {
        slot = uint32_t(place(lock, engram_index, row, true));
    }
    const row_place& pl = places_[slot];
    const extent_state &xv = extents_[pl.value_extent], &xs = extents_[pl.scale_extent];
    if (!xv.done || !xs.done) {
        ++counters_.waits;
        const auto t0 = std::chrono::steady_clock::now();
        arrived_.wait(lock, [&] { return xv.done && xs.done; });
        counters_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (xv.failed || xs.failed)
        return make_error("engram row " + std::to_string(row) + " of engram layer " + std::to_string(engram_index) +
                          " could not be read: " + (xv.failed ? xv.error : xs.error));
    return dsv41::engram_row{reinterpret_cast<const uint8_t*>(arena_.data() + pl.value_at),
                             reinterpret_cast<const uint8_t*>(arena_.data() + pl.scale_at)};
}

void engram_stream::end_forward() {
    std::unique_lock lock(mu_);
    // The arena is reused by the next forward: every read into it must have landed.
    arrived_.wait(lock, [&] { return in_flight_parts_ == 0; });
    MS_ASSERT_MSG(wakers_.empty(), "a forward ended while it waited for an engram row");
    placed_.reset();  // a forward that failed after row_ready()
    retire_window();
    for (size_t e = 0; e < tables_.size(); ++e) {
        announced_[e].clear();
        assigned_[e] = consumed_[e] = 0;
    }
}

engram_counters engram_stream::counters() const {
    std::lock_guard lock(mu_);
    return counters_;
}

}  // namespace moestream
