// The whole forward on the GPU: DeepSeek's reference fixtures with the CPU suite's bounds
// (reference_checks.h), and the determinism contract: logits bit-identical over runs, over batch
// compositions, and with a one-slot expert cache against every expert resident.
#include <boost/test/unit_test.hpp>

#include "../common/test_support.h"
#include "../exact/fixture_model.h"
#include "../exact/reference_checks.h"
#include "gpu_support.h"

namespace moestream::test {
namespace {

auto needs(const std::string& fx) { return requires_path(fixtures_dir() / fx / "model.safetensors"); }

std::unique_ptr<backend> new_gpu() {
    auto b = cuda::make_backend({});
    if (!b) BOOST_FAIL("cuda backend: " << b.message());
    return std::move(*b);
}

// The fixture on the GPU, one per (name, lossless, slots) and process.
fixture_model& on_gpu(const std::string& fx, bool lossless = false, int64_t slots = 0) {
    static std::map<std::tuple<std::string, bool, int64_t>, std::unique_ptr<fixture_model>> cache;
    auto& m = cache[{fx, lossless, slots}];
    if (!m) m = fixture_on(new_gpu(), fx, lossless, slots);
    return *m;
}

const char* kFx = "dsv41-tiny-bf16";

// Prefill of the 40-token prompt, 4 decode steps and a draft, every logit concatenated.
std::vector<float> run(fixture_model& m) {
    auto seq = m.sequence();
    const auto tokens = prompt_ids(kFx, 40);
    std::vector<float> all, part;
    dsv41::forward_item item{seq.get(), tokens, true};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, all).ok());
    for (int32_t t : {5, 77, 300, 12}) {
        dsv41::forward_item step{seq.get(), {&t, 1}, true};
        BOOST_TEST_REQUIRE(m.model->forward({&step, 1}, part).ok());
        all.insert(all.end(), part.begin(), part.end());
    }
    dsv41::draft_output d;
    BOOST_TEST_REQUIRE(m.model->draft(*seq, 9, d).ok());
    all.insert(all.end(), d.logits.begin(), d.logits.end());
    return all;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_forward)

BOOST_AUTO_TEST_CASE(bf16_forced_picks, *needs("dsv41-tiny-bf16")) {
    check_forced(on_gpu("dsv41-tiny-bf16"), "dsv41-tiny-bf16", 0.999);
}
BOOST_AUTO_TEST_CASE(bf16_margin_forced_picks, *needs("dsv41-tiny-bf16-margin")) {
    check_forced(on_gpu("dsv41-tiny-bf16-margin"), "dsv41-tiny-bf16-margin", 0.999);
}
BOOST_AUTO_TEST_CASE(fp8_forced_picks, *needs("dsv41-tiny-fp8")) {
    check_forced(on_gpu("dsv41-tiny-fp8"), "dsv41-tiny-fp8", 0.98);
}
BOOST_AUTO_TEST_CASE(fp8_act_quant_forced_picks, *needs("dsv41-tiny-fp8")) {
    check_forced(on_gpu("dsv41-tiny-fp8", true), "dsv41-tiny-fp8", 0.98, true);
}
BOOST_AUTO_TEST_CASE(bf16_free_picks, *needs("dsv41-tiny-bf16")) { check_free(on_gpu("dsv41-tiny-bf16"), "dsv41-tiny-bf16"); }
BOOST_AUTO_TEST_CASE(bf16_margin_free_picks, *needs("dsv41-tiny-bf16-margin")) {
    check_free(on_gpu("dsv41-tiny-bf16-margin"), "dsv41-tiny-bf16-margin");
}
BOOST_AUTO_TEST_CASE(layer_streams, *needs("dsv41-tiny-bf16")) {
    for (const std::string fx : {"dsv41-tiny-bf16", "dsv41-tiny-fp8"})
        check_layer_streams(on_gpu(fx), fx, fx == "dsv41-tiny-fp8" ? 0.98 : 0.999);
}

BOOST_AUTO_TEST_CASE(logits_are_identical_over_runs_and_slot_counts, *needs(kFx)) {
    const auto first = run(on_gpu(kFx));
    for (int i = 0; i < 2; ++i) REQUIRE_BITS_EQUAL(run(on_gpu(kFx)), first);
    // One slot: every expert of every layer is uploaded in turn into the same slot.
    REQUIRE_BITS_EQUAL(run(on_gpu(kFx, false, 1)), first);
    REQUIRE_BITS_EQUAL(run(on_gpu(kFx, false, 7)), first);
}

// A sequence's logits do not depend on the others in its forward: alone, or batched with other
// sequences (one in prefill, one decoding) in either order.
BOOST_AUTO_TEST_CASE(logits_do_not_depend_on_the_batch, *needs(kFx)) {
    auto& m = on_gpu(kFx);
    const auto a_tokens = prompt_ids(kFx, 40), b_tokens = prompt_ids(kFx, 7);
    auto alone = [&] {
        auto s = m.sequence();
        std::vector<float> l1, l2;
        dsv41::forward_item p{s.get(), a_tokens, true};
        BOOST_TEST_REQUIRE(m.model->forward({&p, 1}, l1).ok());
        const int32_t t = 42;
        dsv41::forward_item d{s.get(), {&t, 1}, false};
        BOOST_TEST_REQUIRE(m.model->forward({&d, 1}, l2).ok());
        l1.insert(l1.end(), l2.begin(), l2.end());
        return l1;
    }();
    for (bool a_first : {true, false}) {
        auto sa = m.sequence(), sb = m.sequence(), sc = m.sequence();
        std::vector<float> warm;
        dsv41::forward_item c0{sc.get(), b_tokens, false};
        BOOST_TEST_REQUIRE(m.model->forward({&c0, 1}, warm).ok());  // c is decoding when a prefills
        const int32_t tc = 3;
        std::vector<dsv41::forward_item> batch{{sa.get(), a_tokens, true}, {sb.get(), b_tokens, false}, {sc.get(), {&tc, 1}, false}};
        if (!a_first) std::swap(batch[0], batch[2]);
        std::vector<float> out;
        BOOST_TEST_REQUIRE(m.model->forward(batch, out).ok());
        const int64_t V = m.hp().vocab;
        const int64_t at = a_first ? 0 : 2;  // rows before a's: c's one (when c comes first), then b's one
        std::vector<float> got(out.begin() + at * V, out.begin() + (at + int64_t(a_tokens.size())) * V);
        const int32_t t = 42;
        std::vector<dsv41::forward_item> step{{sb.get(), {&tc, 1}, false}, {sa.get(), {&t, 1}, false}};
        std::vector<float> out2;
        BOOST_TEST_REQUIRE(m.model->forward(step, out2).ok());
        got.insert(got.end(), out2.begin() + V, out2.begin() + 2 * V);
        REQUIRE_BITS_EQUAL(got, alone);
    }
}

// Steps replayed as CUDA graphs (the default once every expert is resident: the MoE routes
// through the slot table) give the bits of the same steps launched kernel by kernel, and later
// decode steps update an instantiated graph in place.
BOOST_AUTO_TEST_CASE(graph_steps_give_the_launched_bits, *needs(kFx)) {
    auto& m = on_gpu(kFx);
    const auto before = cuda::stats(*m.backend);
    const auto with_graphs = run(m);
    const auto after = cuda::stats(*m.backend);
    BOOST_TEST(after.graph_launches - before.graph_launches >= 4u);  // the decode steps at least
    BOOST_TEST(after.graph_updates - before.graph_updates >= 1u);
    BOOST_TEST_REQUIRE(cuda::set_graphs(*m.backend, false));
    const auto launched = run(m);
    cuda::set_graphs(*m.backend, true);
    BOOST_TEST(cuda::stats(*m.backend).graph_launches == after.graph_launches);
    REQUIRE_BITS_EQUAL(with_graphs, launched);
    // A one-slot cache routes on the host (picks read back): no graph.
    auto& one = on_gpu(kFx, false, 1);
    const auto g0 = cuda::stats(*one.backend).graph_launches;
    REQUIRE_BITS_EQUAL(run(one), with_graphs);
    BOOST_TEST(cuda::stats(*one.backend).graph_launches == g0);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
