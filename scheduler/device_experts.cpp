#include "scheduler/device_experts.h"

#include <algorithm>
#include <string>

namespace moestream {
namespace {

constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
size_t view_bytes(const weight_view& w) { return size_t(w.rows) * w.row_stride; }

// Layers that have routed experts: the target's, then the draft's stages.
int expert_layers(const loaded_model& m) { return int(m.expert_index.size()); }

int64_t experts_of(const loaded_model& m, int layer) {
    return layer < m.hp.n_layers ? m.hp.n_experts : m.hp.dspark_n_experts;
}

}  // namespace

size_t device_experts::slot_bytes(const loaded_model& m) {
    size_t most = 0;
    for (int L = 0; L < expert_layers(m); ++L) {
        const auto ew = m.expert(L, 0);
        most = std::max(most, aligned(view_bytes(ew.gate)) + aligned(view_bytes(ew.up)) + aligned(view_bytes(ew.down)));
    }
    return most;
}

result<std::unique_ptr<device_experts>> device_experts::create(backend& be, const loaded_model& m, int64_t slots,
                                                                bool preload, dsv41::expert_source* fill_from) {
    const int64_t total = m.total_experts();
    if (slots < 1) return make_error("the device expert cache must hold at least one expert");
    slots = std::min(slots, total);
    std::unique_ptr<device_experts> d(new device_experts(be, m));
    d->fill_from_ = fill_from;
    d->slot_bytes_ = slot_bytes(m);
    d->memory_.bind(be);
    if (!d->memory_.try_resize(size_t(slots) * d->slot_bytes_))
        return make_error("the " + std::string(be.name()) + " backend has no room for an expert cache of " +
                          std::to_string(slots) + " experts (" + std::to_string((size_t(slots) * d->slot_bytes_) >> 20) +
                          " MiB)");
    int64_t base = 0;
    for (int L = 0; L < expert_layers(m); ++L) {
        d->layer_base_.push_back(base);
        base += experts_of(m, L);
    }
    d->slot_of_.assign(size_t(total), -1);
    d->slots_.resize(size_t(slots));
    if (preload) {
        std::vector<int32_t> ids;
        for (int L = 0; L < expert_layers(m) && d->stats_.misses < uint64_t(slots); ++L) {
            // A layer's experts announced at once: the fill source reads them all in one queue.
            ids.clear();
            for (int32_t e = 0; e < experts_of(m, L) && d->stats_.misses + ids.size() < uint64_t(slots); ++e)
                ids.push_back(e);
            d->need(L, ids);
            for (int32_t e = 0; e < experts_of(m, L) && d->stats_.misses < uint64_t(slots); ++e) {
                auto w = d->get(L, e);
                if (!w) return w.err();
                d->release(L, e);
            }
        }
        d->stats_ = {};
        be.synchronize();
    }
    return d;
}

int64_t device_experts::key_of(int layer, int32_t expert) const {
    MS_ASSERT_MSG(layer >= 0 && size_t(layer) < layer_base_.size(), "expert of a layer the model does not have");
    MS_ASSERT(expert >= 0 && expert < experts_of(m_, layer));
    return layer_base_[size_t(layer)] + expert;
}

result<dsv41::expert_weights> device_experts::get(int layer, int32_t expert) {
    const int64_t key = key_of(layer, expert);
    int32_t s = slot_of_[size_t(key)];
    if (s >= 0) {
        ++stats_.hits;
    } else {
        // The least recently used slot that is not pinned.
        int32_t victim = -1;
        for (size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].pins == 0 && (victim < 0 || slots_[i].used < slots_[size_t(victim)].used)) victim = int32_t(i);
        if (victim < 0)
            return make_error("every device expert slot is pinned (" + std::to_string(slots_.size()) +
                              "): the model held more experts than max_held()");
        slot& v = slots_[size_t(victim)];
        if (v.key >= 0) {
            slot_of_[size_t(v.key)] = -1;
            --loaded_;
        }
        // The upload is ordered after every op issued before it, so a kernel still reading the
        // victim's old weights finishes first. From the fill source (its host slot, released
        // once copied: the upload copies before it returns), else from the mapping.
        dsv41::expert_weights host;
        if (fill_from_) {
            auto got = fill_from_->get(layer, expert);
            if (!got) {
                v.key = -1;  // emptied above: nothing lives in it now
                v.used = 0;
                return got.err();
            }
            host = *got;
        } else {
            host = m_.expert(layer, expert);
        }
        std::byte* at = memory_.data() + size_t(victim) * slot_bytes_;
        const auto put = [&](const weight_view& w) {
            be_.upload(at, w.data, view_bytes(w));
            const weight_view dev{at, w.type, w.cols, w.rows, w.row_stride};
            at += aligned(view_bytes(w));
            stats_.bytes_uploaded += view_bytes(w);
            return dev;
        };
        v.views.gate = put(host.gate);
        v.views.up = put(host.up);
        v.views.down = put(host.down);
        if (fill_from_) fill_from_->release(layer, expert);
        v.key = key;
        slot_of_[size_t(key)] = victim;
        s = victim;
        ++stats_.misses;
        if (++loaded_ == m_.total_experts()) publish_tables();
    }
    slot& sl = slots_[size_t(s)];
    ++sl.pins;
    sl.used = ++clock_;
    return sl.views;
}

// The experts of `experts` that no slot holds, in misses_.
std::span<const int32_t> device_experts::misses_of(int layer, std::span<const int32_t> experts) {
    misses_.clear();
    for (int32_t e : experts)
        if (slot_of_[size_t(key_of(layer, e))] < 0) misses_.push_back(e);
    return misses_;
}

void device_experts::need(int layer, std::span<const int32_t> experts) {
    if (!fill_from_) return;
    if (auto m = misses_of(layer, experts); !m.empty()) fill_from_->need(layer, m);
}

void device_experts::hint(int layer, std::span<const int32_t> experts) {
    // Only what no slot holds: a read of a resident expert would be wasted.
    if (!fill_from_) return;
    if (auto m = misses_of(layer, experts); !m.empty()) fill_from_->hint(layer, m);
}

void device_experts::publish_tables() {
    MS_ASSERT(tables_.empty() && int64_t(slots_.size()) == m_.total_experts());
    slot_of_device_.bind(be_);
    slot_of_device_.resize(slot_of_.size());
    be_.upload(slot_of_device_.data(), slot_of_.data(), slot_of_.size() * sizeof(int32_t));
    for (int L = 0; L < expert_layers(m_); ++L) {
        const auto ew = m_.expert(L, 0);
        expert_slot_table t;
        t.slot_of = slot_of_device_.data() + layer_base_[size_t(L)];
        t.base = memory_.data();
        t.slot_bytes = slot_bytes_;
        // The slot layout of get(): gate, up, down, each aligned.
        size_t at = 0;
        const auto matrix = [&](const weight_view& w) {
            const slot_matrix sm{w.type, w.cols, w.rows, w.row_stride, at};
            at += aligned(view_bytes(w));
            return sm;
        };
        t.gate = matrix(ew.gate);
        t.up = matrix(ew.up);
        t.down = matrix(ew.down);
        tables_.push_back(t);
    }
}

const expert_slot_table* device_experts::slot_table(int layer) {
    if (tables_.empty()) return nullptr;
    MS_ASSERT(layer >= 0 && size_t(layer) < tables_.size());
    return &tables_[size_t(layer)];
}

void device_experts::release(int layer, int32_t expert) {
    const int32_t s = slot_of_[size_t(key_of(layer, expert))];
    MS_ASSERT_MSG(s >= 0 && slots_[size_t(s)].pins > 0, "release of an expert that is not held");
    --slots_[size_t(s)].pins;
}

}  // namespace moestream
