// expert_cache and its eviction policies: hand-computed hit/miss/evict sequences per policy,
// Belady's optimality (exhaustive optimum on small traces, never worse than LRU/LFU on Zipf
// traces), the slot-state rules (pinned and loading slots are never victims, "no slot", failed
// loads, erase, joins), determinism, and 100k random operations compared step by step with a
// naive O(n) model of the same specification.
#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "storage/expert_cache.h"
#include "tests/common/test_support.h"

using namespace moestream;
using namespace moestream::storage;

namespace {

// splitmix64: small, and the same numbers with every standard library (the std distributions
// are implementation-defined), so the traces and their miss counts are reproducible.
struct rng64 {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return next() % n; }
    double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

// Spread over layers like real keys: 384 experts per layer.
constexpr expert_key key(uint32_t n) { return make_expert_key(n / 384, n % 384); }
// Neighbouring ids in different layers (8 of them), for the layered policy's random tests.
constexpr expert_key spread_key(uint32_t n) { return make_expert_key(n % 8, n / 8); }

enum class policy_kind { lru, lfu, belady, layered };

// The layered policy of the random tests: 8 layers, a head start of 28 steps (4 a layer).
constexpr uint32_t kLayeredLayers = 8;
constexpr uint64_t kLayeredHeadStart = 28;
uint64_t layered_bonus(expert_key k) {
    const uint32_t l = key_layer(k);
    return l >= kLayeredLayers ? 0 : kLayeredHeadStart * (kLayeredLayers - 1 - l) / (kLayeredLayers - 1);
}

std::unique_ptr<eviction_policy> make(policy_kind kind, const std::vector<expert_key>& trace) {
    switch (kind) {
    case policy_kind::lru: return make_lru_policy();
    case policy_kind::lfu: return make_lfu_policy();
    case policy_kind::belady: return make_belady_policy(trace);
    case policy_kind::layered: return make_layered_policy(kLayeredLayers, kLayeredHeadStart);
    }
    return nullptr;
}

const char* kind_name(policy_kind kind) {
    switch (kind) {
    case policy_kind::lru: return "lru";
    case policy_kind::lfu: return "lfu";
    case policy_kind::belady: return "belady";
    case policy_kind::layered: return "layered";
    }
    return "?";
}

// Offline replay: every access is a demand and a load completes before the next access.
struct replay_out {
    uint64_t misses = 0;
    std::vector<expert_key> victims;
};

replay_out replay(const std::vector<expert_key>& trace, uint32_t n_slots, policy_kind kind) {
    expert_cache c(n_slots, make(kind, trace));
    replay_out out;
    for (size_t i = 0; i < trace.size(); ++i) {
        demand_result d = c.demand(trace[i], i);
        BOOST_REQUIRE(d.action != demand_action::wait);
        if (d.action == demand_action::load) {
            if (d.evicted) out.victims.push_back(*d.evicted);
            c.finish_load(trace[i], true);
        }
    }
    out.misses = c.counters().misses;
    BOOST_REQUIRE_EQUAL(c.counters().hits + c.counters().misses, trace.size());
    return out;
}

void expect_demand(expert_cache& c, expert_key k, uint64_t step, demand_action action, slot_id slot,
                   std::optional<expert_key> evicted = std::nullopt) {
    demand_result d = c.demand(k, step);
    BOOST_TEST_CONTEXT("demand of key " << k << " at step " << step) {
        BOOST_TEST(static_cast<int>(d.action) == static_cast<int>(action));
        BOOST_TEST(d.slot == slot);
        BOOST_TEST((d.evicted == evicted));
    }
    if (d.action == demand_action::load) c.finish_load(k, true);
}

std::vector<expert_key> keys_of(std::initializer_list<uint32_t> ids) {
    std::vector<expert_key> out;
    for (uint32_t id : ids) out.push_back(key(id));
    return out;
}

// Zipf(s) over n_keys keys, popularity ranks shuffled onto key ids so that hot keys are not
// also the lowest ids (which would line popularity up with the slot/key tie-breaks).
std::vector<expert_key> zipf_trace(uint64_t seed, size_t length, uint32_t n_keys, double s,
                                   expert_key (*to_key)(uint32_t) = key) {
    rng64 rng{seed};
    std::vector<double> cdf(static_cast<size_t>(n_keys));
    double total = 0;
    for (uint32_t r = 0; r < n_keys; ++r) cdf[r] = total += 1.0 / std::pow(r + 1.0, s);
    std::vector<uint32_t> id(static_cast<size_t>(n_keys));
    std::iota(id.begin(), id.end(), 0u);
    for (size_t i = id.size(); i > 1; --i) std::swap(id[i - 1], id[rng.below(i)]);
    std::vector<expert_key> trace;
    trace.reserve(length);
    for (size_t i = 0; i < length; ++i) {
        auto r = static_cast<size_t>(std::upper_bound(cdf.begin(), cdf.end(), rng.unit() * total) -
                                     cdf.begin());
        trace.push_back(to_key(id[std::min(r, id.size() - 1)]));
    }
    return trace;
}

// The true optimum by exhaustive search over resident sets (keys < 32, as bitmasks).
uint64_t optimal_misses(const std::vector<uint32_t>& trace, uint32_t n_slots) {
    std::map<uint32_t, uint64_t> best{{0u, 0}};  // resident set -> fewest misses so far
    for (uint32_t x : trace) {
        std::map<uint32_t, uint64_t> next;
        auto relax = [&](uint32_t mask, uint64_t cost) {
            auto [it, fresh] = next.try_emplace(mask, cost);
            if (!fresh) it->second = std::min(it->second, cost);
        };
        const uint32_t bit = 1u << x;
        for (auto [mask, cost] : best) {
            if (mask & bit) {
                relax(mask, cost);
            } else if (static_cast<uint32_t>(std::popcount(mask)) < n_slots) {
                relax(mask | bit, cost + 1);
            } else {
                for (uint32_t rest = mask; rest; rest &= rest - 1)
                    relax((mask & ~(1u << std::countr_zero(rest))) | bit, cost + 1);
            }
        }
        best = std::move(next);
    }
    uint64_t m = UINT64_MAX;
    for (auto [mask, cost] : best) m = std::min(m, cost);
    return m;
}

// ---- the reference model ----

// The same specification written the obvious way: every question is a linear scan over the
// slots, and Belady's next use is a search of the key's occurrence list. Independent of the
// ordered sets and next-pointer chains of the real implementation.
class naive_cache {
public:
    naive_cache(uint32_t n_slots, policy_kind kind, const std::vector<expert_key>& trace)
        : slots_(static_cast<size_t>(n_slots)), kind_(kind) {
        for (size_t i = 0; i < trace.size(); ++i) occurrences_[trace[i]].push_back(i);
    }

    struct slot {
        bool used = false;
        bool loading = false;
        expert_key key = 0;
        uint32_t pins = 0;
        uint64_t last = 0;
        uint64_t freq = 0;
    };
    std::vector<slot> slots_;
    cache_counters counters;

    int find(expert_key k) const {
        for (size_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].used && slots_[i].key == k) return static_cast<int>(i);
        return -1;
    }
    lookup_result lookup(expert_key k) const {
        int i = find(k);
        if (i < 0) return {};
        return {slots_[i].loading ? residency::loading : residency::resident, static_cast<slot_id>(i)};
    }
    uint64_t next_use(expert_key k) const {
        auto it = occurrences_.find(k);
        if (it == occurrences_.end()) return UINT64_MAX;
        auto at = std::lower_bound(it->second.begin(), it->second.end(), pos_);
        return at == it->second.end() ? UINT64_MAX : *at;
    }
    // Whether slot a goes before slot b (a < b in id, so ties keep the lower id).
    bool before(size_t a, size_t b) const {
        const slot &x = slots_[a], &y = slots_[b];
        switch (kind_) {
        case policy_kind::lru: return x.last < y.last;
        case policy_kind::lfu: return x.freq < y.freq || (x.freq == y.freq && x.last < y.last);
        case policy_kind::belady: return next_use(x.key) > next_use(y.key);
        case policy_kind::layered: return x.last + layered_bonus(x.key) < y.last + layered_bonus(y.key);
        }
        return false;
    }
    std::optional<load_grant> begin_load(expert_key k) {
        BOOST_REQUIRE(find(k) < 0);
        std::optional<size_t> chosen;
        for (size_t i = 0; i < slots_.size() && !chosen; ++i)
            if (!slots_[i].used) chosen = i;
        load_grant g;
        if (!chosen) {
            for (size_t i = 0; i < slots_.size(); ++i) {
                const slot& s = slots_[i];
                if (s.loading || s.pins > 0) continue;
                if (!chosen || before(i, *chosen)) chosen = i;
            }
            if (!chosen) return std::nullopt;
            g.evicted = slots_[*chosen].key;
            ++counters.evictions;
        }
        g.slot = static_cast<slot_id>(*chosen);
        slots_[*chosen] = slot{true, true, k, 0, now_, 0};
        ++counters.loads_started;
        return g;
    }
    void touch(expert_key k, uint64_t step) {
        now_ = step;
        if (kind_ == policy_kind::belady) advance();
        if (int i = find(k); i >= 0) {
            slots_[i].last = step;
            ++slots_[i].freq;
        }
    }
    void advance() { ++pos_; }
    demand_result demand(expert_key k, uint64_t step) {
        lookup_result f = lookup(k);
        demand_result out;
        if (f.state == residency::resident) {
            ++counters.hits;
            out = {demand_action::hit, f.slot, std::nullopt};
        } else if (f.state == residency::loading) {
            ++counters.joins;
            out = {demand_action::join, f.slot, std::nullopt};
        } else {
            auto g = begin_load(k);
            if (!g) {
                ++counters.stalls;
                return {};
            }
            ++counters.misses;
            out = {demand_action::load, g->slot, g->evicted};
        }
        touch(k, step);
        return out;
    }
    void finish_load(expert_key k, bool ok) {
        slot& s = slots_[find(k)];
        if (ok) {
            s.loading = false;
        } else {
            ++counters.loads_failed;
            s = slot{};
        }
    }
    erase_outcome erase(expert_key k) {
        int i = find(k);
        if (i < 0) return erase_outcome::absent;
        if (slots_[i].loading || slots_[i].pins > 0) return erase_outcome::busy;
        slots_[i] = slot{};
        ++counters.erased;
        return erase_outcome::erased;
    }
    std::vector<expert_key> resident_keys() const {
        std::vector<expert_key> out;
        for (const slot& s : slots_)
            if (s.used && !s.loading) out.push_back(s.key);
        std::sort(out.begin(), out.end());
        return out;
    }
    uint32_t count(bool loading) const {
        uint32_t n = 0;
        for (const slot& s : slots_) n += s.used && s.loading == loading;
        return n;
    }

private:
    policy_kind kind_;
    std::map<expert_key, std::vector<uint64_t>> occurrences_;
    uint64_t now_ = 0;
    uint64_t pos_ = 0;
};

bool same(const cache_counters& a, const cache_counters& b) {
    return a.hits == b.hits && a.joins == b.joins && a.misses == b.misses && a.stalls == b.stalls &&
           a.evictions == b.evictions && a.loads_started == b.loads_started &&
           a.loads_failed == b.loads_failed && a.erased == b.erased;
}

// Random operations (demands, prefetches, completions and failures, pins, unpins, erases,
// touches, Belady advances, lookups) on a real cache, mirrored on the naive model and compared
// after every operation (the model also says which keys are loading or pinned, to pick from).
// Accesses follow one pre-drawn Zipf trace, which Belady needs.
struct drive_out {
    std::vector<expert_key> victims;
    std::vector<slot_id> load_slots;
    cache_counters counters;
};

drive_out drive(policy_kind kind, uint64_t seed, size_t n_ops) {
    constexpr uint32_t n_slots = 24, n_keys = 64;
    // The layered policy's keys span its layers (the others' all sit in layer 0).
    expert_key (*const to_key)(uint32_t) = kind == policy_kind::layered ? spread_key : key;
    const std::vector<expert_key> trace = zipf_trace(seed, n_ops, n_keys, 0.8, to_key);
    expert_cache real(n_slots, make(kind, trace));
    naive_cache ref(n_slots, kind, trace);
    rng64 rng{seed * 7919 + 1};
    drive_out out;
    size_t at = 0;  // next trace position
    uint64_t step = 0;
    // Prefetches and erases draw from a slightly larger key space: keys the trace never uses
    // are Belady's never-used-again case.
    auto any_key = [&] { return to_key(static_cast<uint32_t>(rng.below(n_keys + 4)) * 5 % (n_keys + 4)); };
    auto fail = [&](size_t op, const char* what) {
        BOOST_FAIL(kind_name(kind) << ": mismatch with the reference at operation " << op << ": " << what);
    };
    auto held = [&](bool want_loading, bool want_pinned) {
        std::vector<expert_key> keys;
        for (const auto& s : ref.slots_)
            if (s.used && (!want_loading || s.loading) && (!want_pinned || s.pins > 0)) keys.push_back(s.key);
        return keys;
    };

    for (size_t op = 0; op < n_ops; ++op) {
        const uint64_t r = rng.below(100);
        if (r < 40) {
            if (at == trace.size()) continue;
            step += rng.below(2);  // equal steps happen (one layer's picks): ties by slot id
            demand_result d = real.demand(trace[at], step);
            demand_result e = ref.demand(trace[at], step);
            if (d.action != e.action || d.slot != e.slot || d.evicted != e.evicted) fail(op, "demand");
            if (d.action != demand_action::wait) ++at;
            if (d.action == demand_action::load) {
                out.load_slots.push_back(d.slot);
                if (d.evicted) out.victims.push_back(*d.evicted);
            }
        } else if (r < 60) {
            auto loading = held(true, false);
            if (loading.empty()) continue;
            expert_key k = loading[rng.below(loading.size())];
            bool ok = rng.below(6) != 0;
            real.finish_load(k, ok);
            ref.finish_load(k, ok);
        } else if (r < 68) {
            auto keys = held(false, false);
            if (keys.empty()) continue;
            expert_key k = keys[rng.below(keys.size())];
            real.pin(k);
            ++ref.slots_[ref.find(k)].pins;
        } else if (r < 78) {
            auto pinned = held(false, true);
            if (pinned.empty()) continue;
            expert_key k = pinned[rng.below(pinned.size())];
            real.unpin(k);
            --ref.slots_[ref.find(k)].pins;
        } else if (r < 82) {
            expert_key k = any_key();
            if (real.erase(k) != ref.erase(k)) fail(op, "erase");
        } else if (r < 88) {
            expert_key k = any_key();
            if (real.lookup(k).state != residency::absent) continue;
            auto g = real.begin_load(k);
            auto e = ref.begin_load(k);
            if (g.ok() != e.has_value()) fail(op, "begin_load availability");
            if (g.ok()) {
                if (g->slot != e->slot || g->evicted != e->evicted) fail(op, "begin_load");
                out.load_slots.push_back(g->slot);
                if (g->evicted) out.victims.push_back(*g->evicted);
            } else if (g.message().find("no slot available") == std::string::npos) {
                fail(op, "begin_load error message");
            }
        } else if (r < 93) {
            if (at == trace.size()) continue;
            step += rng.below(2);
            real.touch(trace[at], step);
            ref.touch(trace[at], step);
            ++at;
        } else if (r < 96) {
            if (kind != policy_kind::belady || at == trace.size()) continue;
            static_cast<belady_policy&>(real.policy()).advance();
            ref.advance();
            ++at;
        } else {
            expert_key k = any_key();
            lookup_result a = real.lookup(k), b = ref.lookup(k);
            if (a.state != b.state || (a.state != residency::absent && a.slot != b.slot)) fail(op, "lookup");
            if (real.pins(k) != (b.state == residency::absent ? 0 : ref.slots_[b.slot].pins)) fail(op, "pins");
        }
        if (real.resident_count() != ref.count(false) || real.loading_count() != ref.count(true))
            fail(op, "resident/loading counts");
        if (op % 997 == 0 || op + 1 == n_ops) {
            if (real.resident_keys() != ref.resident_keys()) fail(op, "resident keys");
            if (!same(real.counters(), ref.counters)) fail(op, "counters");
            for (slot_id s = 0; s < n_slots; ++s) {
                const auto& want = ref.slots_[s];
                std::optional<expert_key> got = real.key_in(s);
                if (got.has_value() != want.used || (got && *got != want.key)) fail(op, "slot contents");
            }
        }
    }
    out.counters = real.counters();
    return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(expert_cache_suite)

BOOST_AUTO_TEST_CASE(key_packing_round_trips) {
    constexpr expert_key k = make_expert_key(39, 383);
    static_assert(key_layer(k) == 39 && key_expert(k) == 383);
    BOOST_TEST(make_expert_key(1, 0) > make_expert_key(0, 383));  // layer-major order
    BOOST_TEST(key_layer(make_expert_key(UINT32_MAX, 7)) == UINT32_MAX);
}

BOOST_AUTO_TEST_CASE(lru_hit_miss_evict_sequence) {
    // 3 slots, A B C A D B E A. Last-use steps in brackets at each eviction:
    // D: A[3] B[1] C[2] -> B;  B: A[3] C[2] D[4] -> C;  E: A[3] D[4] B[5] -> A;  A: D[4] B[5] E[6] -> D.
    const expert_key A = key(1), B = key(2), C = key(3), D = key(4), E = key(5);
    expert_cache c(3);
    BOOST_TEST((c.policy().name() == "lru"));
    expect_demand(c, A, 0, demand_action::load, 0);
    expect_demand(c, B, 1, demand_action::load, 1);
    expect_demand(c, C, 2, demand_action::load, 2);
    expect_demand(c, A, 3, demand_action::hit, 0);
    expect_demand(c, D, 4, demand_action::load, 1, B);
    expect_demand(c, B, 5, demand_action::load, 2, C);
    expect_demand(c, E, 6, demand_action::load, 0, A);
    expect_demand(c, A, 7, demand_action::load, 1, D);
    BOOST_TEST(c.counters().hits == 1u);
    BOOST_TEST(c.counters().misses == 7u);
    BOOST_TEST(c.counters().evictions == 4u);
    BOOST_TEST(c.resident_keys() == (std::vector<expert_key>{A, B, E}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(layered_keeps_early_layers_longer) {
    // 4 layers, head start 6: an access ranks as step + 6 (layer 0), + 4, + 2, + 0 (layer 3).
    // 3 slots, a0 b1 c3 d3 e2 c3 b1 d3 at steps 0..7 (letter, layer). Ranks at each eviction:
    // d3: a0 6, b1 5, c3 2 -> c3;  e2: a0 6, b1 5, d3 3 -> d3;  c3: a0 6, b1 5, e2 6 -> b1;
    // b1: a0 6, c3 5, e2 6 -> c3;  d3: a0 6, b1 10, e2 6 -> a0 (tie with e2: the lower slot).
    const expert_key a0 = make_expert_key(0, 1), b1 = make_expert_key(1, 1), c3 = make_expert_key(3, 1),
                     d3 = make_expert_key(3, 2), e2 = make_expert_key(2, 1);
    expert_cache c(3, make_layered_policy(4, 6));
    BOOST_TEST((c.policy().name() == "layered"));
    expect_demand(c, a0, 0, demand_action::load, 0);
    expect_demand(c, b1, 1, demand_action::load, 1);
    expect_demand(c, c3, 2, demand_action::load, 2);
    expect_demand(c, d3, 3, demand_action::load, 2, c3);
    expect_demand(c, e2, 4, demand_action::load, 2, d3);
    expect_demand(c, c3, 5, demand_action::load, 1, b1);
    expect_demand(c, b1, 6, demand_action::load, 1, c3);
    expect_demand(c, d3, 7, demand_action::load, 0, a0);
    BOOST_TEST(c.counters().misses == 8u);
    BOOST_TEST(c.counters().evictions == 5u);
    // Plain LRU evicts the first layer's expert first (the oldest access).
    expert_cache lru(3);
    expect_demand(lru, a0, 0, demand_action::load, 0);
    expect_demand(lru, b1, 1, demand_action::load, 1);
    expect_demand(lru, c3, 2, demand_action::load, 2);
    expect_demand(lru, d3, 3, demand_action::load, 0, a0);
    // Layers past the model's (the draft's) get no head start; a one-layer model gives its
    // layer the whole one.
    layered_lru_policy p(4, 6);
    BOOST_TEST(p.bonus(0) == 6u);
    BOOST_TEST(p.bonus(2) == 2u);
    BOOST_TEST(p.bonus(3) == 0u);
    BOOST_TEST(p.bonus(4) == 0u);
    BOOST_TEST(layered_lru_policy(1, 6).bonus(0) == 6u);
}

BOOST_AUTO_TEST_CASE(lfu_evicts_least_frequent_then_least_recent) {
    // 3 slots, A A B C B D C E E F. (count, last step) at each eviction:
    // D: A(2,1) B(2,4) C(1,3) -> C;  C: A(2,1) B(2,4) D(1,5) -> D;  E: ... C(1,6) -> C;
    // F: A(2,1) B(2,4) E(2,8), all count 2 -> the least recent, A.
    const expert_key A = key(1), B = key(2), C = key(3), D = key(4), E = key(5), F = key(6);
    const std::vector<expert_key> trace{A, A, B, C, B, D, C, E, E, F};
    replay_out lfu = replay(trace, 3, policy_kind::lfu);
    BOOST_TEST(lfu.misses == 7u);
    BOOST_TEST(lfu.victims == (std::vector<expert_key>{C, D, C, A}), boost::test_tools::per_element());
    // The trace tells the policies apart: LRU's first victim is A (last used at step 1).
    BOOST_TEST(replay(trace, 3, policy_kind::lru).victims.front() == A);
    BOOST_TEST((make_lfu_policy()->name() == "lfu"));
}

BOOST_AUTO_TEST_CASE(belady_textbook_example) {
    // The classic reference string with 3 frames: OPT 9 faults, LRU 12. OPT's victims by hand
    // (next uses): 2: 7@17 0@4 1@13 -> 7;  3: 2@8 0@6 1@13 -> 1;  4: 2@8 0@10 3@9 -> 0;
    // 0: 4 never -> 4;  1: 3 never -> 3;  7: 2 never -> 2.
    const auto trace = keys_of({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1});
    replay_out opt = replay(trace, 3, policy_kind::belady);
    BOOST_TEST(opt.misses == 9u);
    BOOST_TEST(opt.victims == keys_of({7, 1, 0, 4, 3, 2}), boost::test_tools::per_element());
    BOOST_TEST(replay(trace, 3, policy_kind::lru).misses == 12u);
    BOOST_TEST(opt.misses <= replay(trace, 3, policy_kind::lfu).misses);
}

BOOST_AUTO_TEST_CASE(belady_matches_exhaustive_optimum_on_small_traces) {
    rng64 rng{42};
    for (int t = 0; t < 300; ++t) {
        const uint32_t n_keys = 4 + static_cast<uint32_t>(rng.below(3));
        const uint32_t n_slots = 1 + static_cast<uint32_t>(rng.below(3));
        std::vector<uint32_t> ids(static_cast<size_t>(8 + rng.below(10)));
        for (auto& id : ids) id = static_cast<uint32_t>(rng.below(n_keys));
        std::vector<expert_key> trace;
        for (uint32_t id : ids) trace.push_back(key(id));
        BOOST_TEST_CONTEXT("trace " << t << ", " << n_slots << " slots") {
            BOOST_TEST(replay(trace, n_slots, policy_kind::belady).misses == optimal_misses(ids, n_slots));
        }
    }
}

BOOST_AUTO_TEST_CASE(belady_no_worse_than_lru_and_lfu_on_zipf_traces) {
    // 20 Zipf(0.9) traces of 5000 accesses over 500 keys, 50 slots.
    uint64_t sum[3] = {0, 0, 0};
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const auto trace = zipf_trace(seed, 5000, 500, 0.9);
        const uint64_t lru = replay(trace, 50, policy_kind::lru).misses;
        const uint64_t lfu = replay(trace, 50, policy_kind::lfu).misses;
        const uint64_t opt = replay(trace, 50, policy_kind::belady).misses;
        BOOST_TEST_MESSAGE("zipf trace " << seed << ": misses lru " << lru << ", lfu " << lfu
                                         << ", belady " << opt);
        BOOST_TEST(opt <= lru);
        BOOST_TEST(opt <= lfu);
        sum[0] += lru;
        sum[1] += lfu;
        sum[2] += opt;
    }
    BOOST_TEST_MESSAGE("zipf total misses over 100000 accesses: lru " << sum[0] << ", lfu " << sum[1]
                                                                      << ", belady " << sum[2]);
}

BOOST_AUTO_TEST_CASE(belady_position_and_advance) {
    const expert_key X = key(1), Y = key(2), Z = key(3);
    auto owned = std::make_unique<belady_policy>(std::vector<expert_key>{X, Y, X, Z, Y, X});
    belady_policy& oracle = *owned;
    expert_cache c(2, std::move(owned));
    BOOST_TEST(oracle.position() == 0u);
    BOOST_TEST(oracle.next_use(X) == 0u);
    expect_demand(c, X, 0, demand_action::load, 0);
    expect_demand(c, Y, 1, demand_action::load, 1);
    BOOST_TEST(oracle.position() == 2u);
    BOOST_TEST(oracle.next_use(X) == 2u);
    oracle.advance();  // position 2 (X) served elsewhere: X's next use moves to 5
    BOOST_TEST(oracle.position() == 3u);
    BOOST_TEST(oracle.next_use(X) == 5u);
    // Z at 3: X next at 5, Y next at 4 -> X goes (without the advance Y would have gone).
    expect_demand(c, Z, 3, demand_action::load, 0, X);
    BOOST_TEST(oracle.next_use(Z) == belady_policy::never_used);
    BOOST_TEST(oracle.next_use(key(99)) == belady_policy::never_used);
}

BOOST_AUTO_TEST_CASE(ties_break_by_lowest_slot_id) {
    // LRU with one step for a whole layer's picks: equal stamps, the lowest slot goes first.
    const expert_key A = key(1), B = key(2), C = key(3), D = key(4);
    expert_cache lru(3);
    expect_demand(lru, C, 5, demand_action::load, 0);
    expect_demand(lru, A, 5, demand_action::load, 1);
    expect_demand(lru, B, 5, demand_action::load, 2);
    expect_demand(lru, D, 5, demand_action::load, 0, C);
    // Belady: keys never used again tie at "never"; the lowest slot goes first.
    const std::vector<expert_key> trace{A, B, C, D, key(5)};
    replay_out opt = replay(trace, 3, policy_kind::belady);
    BOOST_TEST(opt.victims == (std::vector<expert_key>{A, D}), boost::test_tools::per_element());
    // LFU: equal counts and steps -> lowest slot.
    expert_cache lfu(2, make_lfu_policy());
    expect_demand(lfu, B, 0, demand_action::load, 0);
    expect_demand(lfu, A, 0, demand_action::load, 1);
    expect_demand(lfu, C, 0, demand_action::load, 0, B);
}

BOOST_AUTO_TEST_CASE(loading_slots_are_joined_and_never_victims) {
    const expert_key A = key(1), B = key(2), C = key(3), D = key(4);
    expert_cache c(2);
    // A's load is in flight (slot 0); B is resident and more recent than A.
    BOOST_TEST((c.demand(A, 0).action == demand_action::load));
    expect_demand(c, B, 1, demand_action::load, 1);
    // A second demand for A joins: same slot, no second load.
    demand_result again = c.demand(A, 2);
    BOOST_TEST((again.action == demand_action::join));
    BOOST_TEST(again.slot == 0u);
    BOOST_TEST(c.counters().loads_started == 2u);
    BOOST_TEST(c.counters().joins == 1u);
    BOOST_TEST((c.lookup(A).state == residency::loading));
    // C must take B's slot: A is older but loading.
    demand_result dc = c.demand(C, 3);
    BOOST_TEST((dc.action == demand_action::load));
    BOOST_TEST(dc.slot == 1u);
    BOOST_TEST((dc.evicted == B));
    // Both slots loading: D waits, and nothing was recorded.
    BOOST_TEST((c.demand(D, 4).action == demand_action::wait));
    BOOST_TEST(c.counters().stalls == 1u);
    BOOST_TEST(c.counters().misses == 3u);
    c.finish_load(A, true);
    c.finish_load(C, true);
    BOOST_TEST((c.lookup(A).state == residency::resident));
    BOOST_TEST(c.resident_keys() == (std::vector<expert_key>{A, C}), boost::test_tools::per_element());
    // A was touched at step 2 (the join), C at 3: A is the LRU victim now.
    expect_demand(c, D, 4, demand_action::load, 0, A);
}

BOOST_AUTO_TEST_CASE(pinned_slots_are_never_evicted) {
    const expert_key A = key(1), B = key(2), C = key(3), D = key(4);
    for (policy_kind kind : {policy_kind::lru, policy_kind::lfu}) {
        BOOST_TEST_CONTEXT(kind_name(kind)) {
            expert_cache c(2, make(kind, {}));
            expect_demand(c, A, 0, demand_action::load, 0);
            expect_demand(c, B, 1, demand_action::load, 1);
            c.pin(A);  // A is the natural victim for both policies
            c.pin(A);
            BOOST_TEST(c.pins(A) == 2u);
            expect_demand(c, C, 2, demand_action::load, 1, B);
            c.unpin(A);
            c.pin(C);
            // Both pinned (A still once): no slot.
            BOOST_TEST((c.demand(D, 3).action == demand_action::wait));
            c.unpin(A);
            BOOST_TEST(c.pins(A) == 0u);
            expect_demand(c, D, 4, demand_action::load, 0, A);
            BOOST_TEST(c.pins(C) == 1u);
        }
    }
}

BOOST_AUTO_TEST_CASE(no_slot_available_is_an_error_value) {
    const expert_key A = key(1), B = key(2), C = key(3);
    expert_cache c(2);
    BOOST_REQUIRE(c.begin_load(A).ok());
    expect_demand(c, B, 0, demand_action::load, 1);
    c.pin(B);
    result<load_grant> r = c.begin_load(C);
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.message().find("no slot available") != std::string::npos);
    BOOST_TEST(c.counters().loads_started == 2u);
    BOOST_TEST((c.lookup(C).state == residency::absent));
    // Pins taken while loading carry over: A stays unevictable once resident.
    c.pin(A);
    c.finish_load(A, true);
    BOOST_TEST(!c.begin_load(C).ok());
    c.unpin(B);
    auto g = c.begin_load(C);
    BOOST_REQUIRE(g.ok());
    BOOST_TEST((g->evicted == B));
}

BOOST_AUTO_TEST_CASE(failed_load_frees_the_slot) {
    const expert_key A = key(1), B = key(2);
    expert_cache c(2);
    BOOST_TEST((c.demand(A, 0).action == demand_action::load));
    c.pin(A);
    c.finish_load(A, false);
    BOOST_TEST((c.lookup(A).state == residency::absent));
    BOOST_TEST(c.pins(A) == 0u);  // dropped with the slot
    BOOST_TEST(!c.key_in(0).has_value());
    BOOST_TEST(c.counters().loads_failed == 1u);
    BOOST_TEST(c.resident_count() == 0u);
    BOOST_TEST(c.loading_count() == 0u);
    // A later demand retries, into the freed (lowest) slot.
    expect_demand(c, A, 1, demand_action::load, 0);
    expect_demand(c, B, 2, demand_action::load, 1);
    BOOST_TEST(c.counters().evictions == 0u);
}

BOOST_AUTO_TEST_CASE(erase_outcomes) {
    const expert_key A = key(1), B = key(2), C = key(3);
    expert_cache c(2);
    BOOST_TEST((c.erase(A) == erase_outcome::absent));
    BOOST_TEST((c.demand(A, 0).action == demand_action::load));
    BOOST_TEST((c.erase(A) == erase_outcome::busy));  // I/O still writes the slot
    c.finish_load(A, true);
    c.pin(A);
    BOOST_TEST((c.erase(A) == erase_outcome::busy));  // a computation reads it
    c.unpin(A);
    BOOST_TEST((c.erase(A) == erase_outcome::erased));
    BOOST_TEST((c.lookup(A).state == residency::absent));
    BOOST_TEST(c.counters().erased == 1u);
    BOOST_TEST(c.counters().evictions == 0u);
    // The slot is free again and the policy forgot it: two loads fit without an eviction.
    expect_demand(c, B, 1, demand_action::load, 0);
    expect_demand(c, C, 2, demand_action::load, 1);
    BOOST_TEST(c.counters().evictions == 0u);
}

BOOST_AUTO_TEST_CASE(prefetch_is_a_load_without_an_access) {
    const expert_key A = key(1), B = key(2), C = key(3);
    expert_cache c(2);
    expect_demand(c, A, 10, demand_action::load, 0);
    auto g = c.begin_load(B);  // prefetch: stamped with the latest step (10), not 0
    BOOST_REQUIRE(g.ok());
    c.finish_load(B, true);
    BOOST_TEST(c.counters().misses == 1u);
    BOOST_TEST(c.counters().loads_started == 2u);
    // A and B tie at step 10: slot 0 (A) goes.
    expect_demand(c, C, 10, demand_action::load, 0, A);
    expect_demand(c, B, 11, demand_action::hit, 1);
}

BOOST_AUTO_TEST_CASE(policy_by_name) {
    auto lru = make_policy("lru");
    BOOST_REQUIRE(lru.ok());
    BOOST_TEST(((*lru)->name() == "lru"));
    BOOST_TEST(make_policy("lfu").ok());
    auto layered = make_policy("layered", {40, 160});
    BOOST_REQUIRE(layered.ok());
    BOOST_TEST(((*layered)->name() == "layered"));
    auto no_layers = make_policy("layered");
    BOOST_REQUIRE(!no_layers.ok());
    BOOST_TEST(no_layers.message().find("layer count") != std::string::npos);
    auto bad = make_policy("belady");
    BOOST_REQUIRE(!bad.ok());
    BOOST_TEST(bad.message().find("unknown eviction policy 'belady'") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(same_sequence_same_victims) {
    for (policy_kind kind : {policy_kind::lru, policy_kind::lfu, policy_kind::belady, policy_kind::layered}) {
        BOOST_TEST_CONTEXT(kind_name(kind)) {
            drive_out a = drive(kind, 7, 20000), b = drive(kind, 7, 20000);
            BOOST_TEST(a.victims.size() > 1000u);
            BOOST_TEST(a.victims == b.victims);
            BOOST_TEST(a.load_slots == b.load_slots);
            BOOST_TEST(same(a.counters, b.counters));
        }
    }
}

BOOST_AUTO_TEST_CASE(stress_matches_naive_reference) {
    for (policy_kind kind : {policy_kind::lru, policy_kind::lfu, policy_kind::belady, policy_kind::layered}) {
        drive_out out = drive(kind, 1234, 100000);
        const cache_counters& n = out.counters;
        BOOST_TEST_MESSAGE("stress " << kind_name(kind) << ": hits " << n.hits << ", joins " << n.joins
                                     << ", misses " << n.misses << ", stalls " << n.stalls << ", evictions "
                                     << n.evictions << ", failed " << n.loads_failed << ", erased "
                                     << n.erased);
        // The mix reaches every path.
        BOOST_TEST(n.hits > 0u);
        BOOST_TEST(n.joins > 0u);
        BOOST_TEST(n.stalls > 0u);
        BOOST_TEST(n.evictions > 1000u);
        BOOST_TEST(n.loads_failed > 0u);
        BOOST_TEST(n.erased > 0u);
    }
}

BOOST_AUTO_TEST_CASE(full_model_scale) {
    // 40 layers x 384 experts, 4096 slots, 200k accesses: per-access cost must not grow with the
    // slot count (a linear victim scan here would be ~10^9 steps).
    const auto trace = zipf_trace(3, 200000, 40 * 384, 0.9);
    for (policy_kind kind : {policy_kind::lru, policy_kind::lfu, policy_kind::belady}) {
        replay_out r = replay(trace, 4096, kind);
        BOOST_TEST_MESSAGE("scale " << kind_name(kind) << ": misses " << r.misses);
        BOOST_TEST(r.victims.size() == r.misses - 4096);
    }
}

BOOST_AUTO_TEST_SUITE_END()
