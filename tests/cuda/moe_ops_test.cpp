// The slot-table MoE ops (order_picks, moe_gate_up, moe_down) on the GPU against the CPU
// backend: the order exact; every assignment's values with the matmuls' bound against the CPU,
// and bit for bit the GPU's own matmul of the same expert and row (where an expert sits and which
// rows route with it never change a value).
#include <boost/test/unit_test.hpp>
#include <numeric>
#include <random>

#include "gpu_support.h"
#include "model/quant.h"

namespace moestream::test {
namespace {

// `experts` experts of one shape in shuffled slots of both backends' memory.
struct slot_model {
    int64_t experts = 0, dim = 0, inter = 0, slots = 0;
    size_t slot_bytes = 0;
    backend_array<std::byte> cpu_mem, gpu_mem;
    backend_array<int32_t> cpu_slot_of, gpu_slot_of;
    expert_slot_table on_cpu, on_gpu;
};

slot_model make_slots(ggml_type type, int64_t experts, int64_t dim, int64_t inter, uint32_t seed) {
    slot_model m;
    m.experts = experts, m.dim = dim, m.inter = inter, m.slots = experts + 3;  // some slots empty
    const auto rb = [&](int64_t cols) { return size_t(row_bytes(dtype_info(type), cols)); };
    const auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t gate_bytes = size_t(inter) * rb(dim), down_bytes = size_t(dim) * rb(inter);
    m.slot_bytes = 2 * aligned(gate_bytes) + aligned(down_bytes);
    std::vector<std::byte> mem(m.slot_bytes * size_t(m.slots));
    std::vector<int32_t> slot_of(static_cast<size_t>(experts));
    std::iota(slot_of.begin(), slot_of.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(slot_of.begin(), slot_of.end(), rng);
    for (auto& s : slot_of) s = int32_t(m.slots - 1 - s);
    const auto fill = [&](std::byte* at, int64_t rows, int64_t cols, uint32_t s) {
        const auto v = float_values(size_t(rows * cols), s, 0.5f);
        for (int64_t r = 0; r < rows; ++r)
            quant::quantize_row(type, v.data() + r * cols, reinterpret_cast<uint8_t*>(at) + size_t(r) * rb(cols), cols);
    };
    for (int64_t e = 0; e < experts; ++e) {
        std::byte* at = mem.data() + size_t(slot_of[size_t(e)]) * m.slot_bytes;
        fill(at, inter, dim, seed + 3 * uint32_t(e));
        fill(at + aligned(gate_bytes), inter, dim, seed + 3 * uint32_t(e) + 1);
        fill(at + 2 * aligned(gate_bytes), dim, inter, seed + 3 * uint32_t(e) + 2);
    }
    m.cpu_mem = put(cpu(), mem);
    m.gpu_mem = put(gpu(), mem);
    m.cpu_slot_of = put(cpu(), slot_of);
    m.gpu_slot_of = put(gpu(), slot_of);
    expert_slot_table t;
    t.slot_bytes = m.slot_bytes;
    t.gate = {type, dim, inter, rb(dim), 0};
    t.up = {type, dim, inter, rb(dim), aligned(gate_bytes)};
    t.down = {type, inter, dim, rb(inter), 2 * aligned(gate_bytes)};
    m.on_cpu = m.on_gpu = t;
    m.on_cpu.slot_of = m.cpu_slot_of.data();
    m.on_cpu.base = m.cpu_mem.data();
    m.on_gpu.slot_of = m.gpu_slot_of.data();
    m.on_gpu.base = m.gpu_mem.data();
    return m;
}

// n rows of k distinct picks of `experts`, in a router's (unsorted) order, and their weights.
void random_picks(int64_t n, int k, int64_t experts, uint32_t seed, std::vector<int32_t>& picks,
                  std::vector<float>& weights) {
    std::mt19937 rng(seed);
    picks.clear();
    std::vector<int32_t> ids(static_cast<size_t>(experts));
    for (int64_t r = 0; r < n; ++r) {
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        picks.insert(picks.end(), ids.begin(), ids.begin() + k);
    }
    weights = float_values(picks.size(), seed + 1, 0.3f);
}

// One routed MoE of n rows through table t on backend be: the picks ordered, gate/up (with or
// without SwiGLU), the downs; the device arrays (for further ops) and their contents.
struct moe_run {
    backend_array<int32_t> sp;
    backend_array<float> sw, gs, us, ys;
    std::vector<float> g, u, y;
};
moe_run run_slot_moe(backend& be, const expert_slot_table& t, const std::vector<int32_t>& picks,
                     const std::vector<float>& w, const std::vector<float>& x, int64_t n, int k, int64_t dim,
                     int64_t inter, bool swiglu) {
    auto p = put(be, picks);
    auto wt = put(be, w);
    auto xs = put(be, x);
    moe_run m{backend_array<int32_t>(be, picks.size()),   backend_array<float>(be, picks.size()),
              backend_array<float>(be, size_t(n * k * inter)), backend_array<float>(be, size_t(n * k * inter)),
              backend_array<float>(be, size_t(n * k * dim)),   {}, {}, {}};
    be.order_picks(p.data(), wt.data(), n, k, m.sp.data(), m.sw.data());
    be.moe_gate_up(t, xs.data(), n, k, m.sp.data(), m.sw.data(), m.gs.data(), m.us.data(), swiglu, 7.0f);
    be.moe_down(t, m.gs.data(), n, k, m.sp.data(), m.ys.data());
    m.g = get(be, m.gs), m.u = get(be, m.us), m.y = get(be, m.ys);
    return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_moe_ops)

BOOST_AUTO_TEST_CASE(order_picks_is_exact) {
    for (auto [n, k] : {std::pair<int64_t, int>{1, 6}, {5, 8}, {8, 1}, {3, 16}}) {
        std::vector<int32_t> picks;
        std::vector<float> w;
        random_picks(n, k, 64, uint32_t(n * 31 + k), picks, w);
        std::vector<int32_t> sp[2];
        std::vector<float> sw[2];
        for (int b = 0; b < 2; ++b) {
            backend& be = b ? gpu() : cpu();
            auto p = put(be, picks);
            auto wt = put(be, w);
            backend_array<int32_t> op(be, picks.size());
            backend_array<float> ow(be, picks.size());
            be.order_picks(p.data(), wt.data(), n, k, op.data(), ow.data());
            sp[b] = get(be, op);
            sw[b] = get(be, ow);
        }
        BOOST_TEST(sp[0] == sp[1]);
        REQUIRE_BITS_EQUAL(sw[0], sw[1]);
        for (int64_t r = 0; r < n; ++r)
            for (int j = 1; j < k; ++j) BOOST_TEST(sp[0][size_t(j * n + r)] > sp[0][size_t((j - 1) * n + r)]);
    }
}

BOOST_AUTO_TEST_CASE(gate_up_and_down_through_the_slot_table) {
    uint32_t seed = 900;
    for (ggml_type type : {ggml_type::mxfp4, ggml_type::q8_0, ggml_type::bf16}) {
        const int64_t experts = 12, dim = 256, inter = 96;
        auto m = make_slots(type, experts, dim, inter, ++seed);
        for (auto [n, k] : {std::pair<int64_t, int>{1, 6}, {3, 4}, {8, 2}}) {
            std::vector<int32_t> picks;
            std::vector<float> w;
            random_picks(n, k, experts, ++seed, picks, w);
            const auto x = bf16_values(size_t(n * dim), ++seed);
            for (bool swiglu : {true, false}) {
                std::vector<float> g[2], u[2], y[2];
                std::vector<int32_t> sorted;
                for (int b = 0; b < 2; ++b) {
                    backend& be = b ? gpu() : cpu();
                    const expert_slot_table& t = b ? m.on_gpu : m.on_cpu;
                    moe_run run = run_slot_moe(be, t, picks, w, x, n, k, dim, inter, swiglu);
                    g[b] = run.g, u[b] = run.u, y[b] = run.y;
                    const auto& gs = run.gs;
                    if (b) {
                        sorted = get(be, run.sp);
                        // Assignment a's down projection is the GPU's own matmul of that expert's
                        // slot and row, bit for bit.
                        const int64_t a = n * k - 1;
                        const int32_t slot = [&] {
                            std::vector<int32_t> so(static_cast<size_t>(experts));
                            be.download(so.data(), m.gpu_slot_of.data(), so.size() * sizeof(int32_t));
                            return so[size_t(sorted[size_t(a)])];
                        }();
                        backend_array<float> one(be, size_t(dim));
                        be.matmul(t.down.in(t.base, t.slot_bytes, slot), gs.data() + a * inter, inter, 1, one.data(),
                                  dim, true);
                        const auto alone = get(be, one);
                        REQUIRE_BITS_EQUAL(alone, std::vector<float>(y[1].begin() + a * dim, y[1].end()));
                    }
                }
                const std::string what = std::string(dtype_name(type)) + " n " + std::to_string(n) + " k " +
                                         std::to_string(k) + (swiglu ? " swiglu" : " plain");
                BOOST_TEST(rel_error(g[1], g[0]) <= 1e-2, what << ": g rel error " << rel_error(g[1], g[0]));
                if (!swiglu) BOOST_TEST(rel_error(u[1], u[0]) <= 1e-2, what << ": u rel error " << rel_error(u[1], u[0]));
                // The down projections of the CPU's g on the CPU, of the GPU's g on the GPU: g's
                // bf16 rounding may differ in a last bit, so y is held to the same bound.
                BOOST_TEST(rel_error(y[1], y[0]) <= 1e-2, what << ": y rel error " << rel_error(y[1], y[0]));
            }
        }
    }
}

// The same ops over MXFP4 experts tiled in their slots (as the device tier holds them): the
// bits of the untiled slots, every assignment.
BOOST_AUTO_TEST_CASE(tiled_slots_give_the_untiled_bits) {
    const int64_t experts = 12, dim = 256, inter = 128;
    auto m = make_slots(ggml_type::mxfp4, experts, dim, inter, 41);
    backend_array<std::byte> tiled_mem(gpu(), m.gpu_mem.size());
    gpu().copy(tiled_mem.data(), m.gpu_mem.data(), m.gpu_mem.bytes());
    expert_slot_table tiled = m.on_gpu;
    tiled.base = tiled_mem.data();
    std::vector<weight_view> parts;
    for (int64_t s = 0; s < m.slots; ++s)
        for (const slot_matrix* p : {&tiled.gate, &tiled.up, &tiled.down}) parts.push_back(p->in(tiled.base, tiled.slot_bytes, s));
    gpu().tile_mxfp4(parts);
    for (slot_matrix* p : {&tiled.gate, &tiled.up, &tiled.down}) p->layout = weight_layout::mxfp4_tiles;
    uint32_t seed = 1300;
    for (auto [n, k] : {std::pair<int64_t, int>{1, 6}, {3, 4}, {8, 2}}) {
        std::vector<int32_t> picks;
        std::vector<float> w;
        random_picks(n, k, experts, ++seed, picks, w);
        const auto x = bf16_values(size_t(n * dim), ++seed);
        for (bool swiglu : {true, false}) {
            std::vector<float> g[2], u[2], y[2];
            for (int b = 0; b < 2; ++b) {
                const moe_run run = run_slot_moe(gpu(), b ? tiled : m.on_gpu, picks, w, x, n, k, dim, inter, swiglu);
                g[b] = run.g, u[b] = run.u, y[b] = run.y;
            }
            REQUIRE_BITS_EQUAL(g[1], g[0]);
            if (!swiglu) REQUIRE_BITS_EQUAL(u[1], u[0]);
            REQUIRE_BITS_EQUAL(y[1], y[0]);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
