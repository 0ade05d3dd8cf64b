#include "spec/expert_union.h"

#include <algorithm>

namespace moestream::spec {

layer_tally& layer_tally::operator-=(const layer_tally& o) {
    needs -= o.needs, experts -= o.experts, device -= o.device, host -= o.host;
    in_flight -= o.in_flight, missing -= o.missing, bytes_read -= o.bytes_read;
    return *this;
}

layer_tally& layer_tally::operator+=(const layer_tally& o) {
    needs += o.needs, experts += o.experts, device += o.device, host += o.host;
    in_flight += o.in_flight, missing += o.missing, bytes_read += o.bytes_read;
    return *this;
}

union_shape shape_of(const dsv41::hparams& hp) {
    return {double(hp.n_active) * double(hp.n_layers), double(hp.n_experts) * double(hp.n_layers)};
}

step_sample sample_of(const union_record& r, int drafting) {
    step_sample s;
    s.drafted = r.drafted;
    s.rows = r.rows;
    s.drafting = drafting;
    s.experts = double(r.experts);
    s.not_resident = double(r.not_resident());
    s.seconds = r.seconds;
    return s;
}

void union_totals::add(const union_record& r) {
    ++steps;
    accepted += r.accepted;
    seconds += r.seconds;
    bytes_read += r.bytes_read;
    if (r.experts < 0) return;
    ++counted;
    experts += r.experts, device += r.device, host += r.host, in_flight += r.in_flight, missing += r.missing;
}

step_recorder::step_recorder(int n_layers, tally_probe probe)
    : n_layers_(std::max(0, n_layers)),
      probe_(std::move(probe)),
      before_(size_t(n_layers_)),
      after_(size_t(n_layers_)),
      step_(size_t(n_layers_)),
      layer_experts_(size_t(kMaxDraft + 1) * size_t(n_layers_), 0) {}

void step_recorder::begin() { have_before_ = probe_ && probe_(before_); }

std::span<const int64_t> step_recorder::layer_experts(int k) const {
    if (k < 0 || k > kMaxDraft) return {};
    return std::span<const int64_t>(layer_experts_).subspan(size_t(k) * size_t(n_layers_), size_t(n_layers_));
}

const union_record& step_recorder::end(const dsv41::model& target, int drafted, int accepted, int rows,
                                       double seconds) {
    union_record r;
    r.drafted = std::clamp(drafted, 0, kMaxDraft);
    r.accepted = accepted;
    r.rows = rows;
    r.seconds = seconds;
    bool from_tallies = false;
    if (have_before_ && probe_(after_)) {
        uint64_t needs = 0;
        for (int L = 0; L < n_layers_; ++L) {
            step_[size_t(L)] = after_[size_t(L)];
            step_[size_t(L)] -= before_[size_t(L)];
            needs += step_[size_t(L)].needs;
        }
        // The tiers saw this forward's layers only when it routed on the host (with device
        // slots for everything the source is not asked).
        from_tallies = needs > 0;
    }
    if (from_tallies) {
        r.experts = 0;
        r.residency_known = true;
        for (const layer_tally& t : step_) {
            r.experts += int64_t(t.experts), r.device += int64_t(t.device), r.host += int64_t(t.host);
            r.in_flight += int64_t(t.in_flight), r.missing += int64_t(t.missing), r.bytes_read += t.bytes_read;
        }
    } else {
        // Every expert resident (the mapping) or routed on the device (unknown: -1).
        r.experts = target.last_forward_experts();
        for (int L = 0; L < n_layers_; ++L) {
            step_[size_t(L)] = layer_tally{};
            const int64_t u = target.last_forward_layer_experts(L);
            step_[size_t(L)].needs = u >= 0 ? 1 : 0;
            step_[size_t(L)].experts = uint64_t(std::max<int64_t>(0, u));
        }
    }
    if (r.experts >= 0)
        for (int L = 0; L < n_layers_; ++L)
            layer_experts_[size_t(r.drafted) * size_t(n_layers_) + size_t(L)] += int64_t(step_[size_t(L)].experts);
    by_k_[size_t(r.drafted)].add(r);
    last_ = r;
    have_before_ = false;
    return last_;
}

}  // namespace moestream::spec
