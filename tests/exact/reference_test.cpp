// Exactness against DeepSeek's reference implementation (../shared/fixtures, README there):
// logits of every prefill position and every teacher-forced decode step, DSpark drafts, per-layer
// streams and the engram hash rows. Bounds are the (measured by perturbing the reference).
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>

#include "../common/test_support.h"
#include "fixture_model.h"
#include "reference_checks.h"

namespace moestream::test {
namespace {

auto needs(const std::string& fx) { return requires_path(fixtures_dir() / fx / "model.safetensors"); }

}  // namespace

BOOST_AUTO_TEST_SUITE(reference)

BOOST_AUTO_TEST_CASE(bf16_forced_picks, *needs("dsv41-tiny-bf16")) {
    check_forced(fixture("dsv41-tiny-bf16"), "dsv41-tiny-bf16", 0.999);
}
BOOST_AUTO_TEST_CASE(bf16_margin_forced_picks, *needs("dsv41-tiny-bf16-margin")) {
    check_forced(fixture("dsv41-tiny-bf16-margin"), "dsv41-tiny-bf16-margin", 0.999);
}
BOOST_AUTO_TEST_CASE(fp8_forced_picks, *needs("dsv41-tiny-fp8")) {
    check_forced(fixture("dsv41-tiny-fp8"), "dsv41-tiny-fp8", 0.98);
}
// Simulating the reference's fp8/fp4 activation round trips (§3.8) on exact (BF16-stored) fp8
// weights. The issue hopes for >= 0.999 here; measured: prefill min 0.989-0.993, median 0.995-0.996
// (vs 0.993 without), the streams agree to 0.99999 through layer 3 and drift from the layer-4
// engram/block on (an open question, see docs/model.md). Held to the fp8 contract meanwhile.
BOOST_AUTO_TEST_CASE(fp8_act_quant_forced_picks, *needs("dsv41-tiny-fp8")) {
    check_forced(fixture("dsv41-tiny-fp8", 2, true), "dsv41-tiny-fp8", 0.98, true);
}
BOOST_AUTO_TEST_CASE(bf16_free_picks, *needs("dsv41-tiny-bf16")) { check_free(fixture("dsv41-tiny-bf16"), "dsv41-tiny-bf16"); }
BOOST_AUTO_TEST_CASE(bf16_margin_free_picks, *needs("dsv41-tiny-bf16-margin")) {
    check_free(fixture("dsv41-tiny-bf16-margin"), "dsv41-tiny-bf16-margin");
}

// The hash rows depend on token ids only and must be exact.
BOOST_AUTO_TEST_CASE(engram_hash_rows, *needs("dsv41-tiny-bf16")) {
    auto& m = fixture("dsv41-tiny-bf16");
    for (int len : {1, 7, 40}) {
        const auto path = fixture_path("dsv41-tiny-bf16") + "/prompt_len" + std::to_string(len) + ".safetensors";
        auto ids = read_i64(path, "input_ids");
        auto gen = read_i64(path, "generated_ids");
        const auto pre = read_i64(path, "engram_hash_prefill");
        const auto dec = read_i64(path, "engram_hash_decode");
        std::vector<int32_t> hist(ids.begin(), ids.end());
        for (int k = 0; k < 8; ++k) hist.push_back(int32_t(gen[size_t(k)]));
        const int64_t per = m.hp().engram_columns() * int64_t(m.hp().engram_layers.size());
        std::vector<int64_t> rows(static_cast<size_t>(per));
        for (int64_t p = 0; p < int64_t(hist.size()); ++p) {
            dsv41::engram_hash(m.hp(), m.files->weights.engram, hist, p, rows);
            const int64_t* want = p < len ? pre.data() + p * per : dec.data() + (p - len) * per;
            for (int64_t c = 0; c < per; ++c) BOOST_TEST_REQUIRE(rows[size_t(c)] == want[c], "len " << len << " pos " << p << " col " << c);
        }
    }
}

BOOST_AUTO_TEST_CASE(rope_frequencies, *needs("dsv41-tiny-bf16")) {
    auto& m = fixture("dsv41-tiny-bf16");
    const auto path = fixture_path("dsv41-tiny-bf16") + "/layers_len40.safetensors";
    for (bool compressed : {false, true}) {
        const auto want = read_f32(path, compressed ? "rope_freqs_compressed" : "rope_freqs_ratio0");
        const auto& got = m.model->rope_freqs(compressed);
        BOOST_TEST_REQUIRE(got.size() == want.size());
        // Within one ulp: torch's vectorised pow is not correctly rounded (pair 1 of base 10000 is
        // 0x1.43d138p-2 there, the correctly rounded value is 0x1.43d136p-2); every other pair is exact.
        for (size_t i = 0; i < got.size(); ++i)
            BOOST_TEST(std::fabs(got[i] - want[i]) <= std::ldexp(std::fabs(want[i]), -23),
                       "pair " << i << " compressed " << compressed << ": " << got[i] << " vs " << want[i]);
    }
}

// The streams entering every layer (forced picks, 40-token prompt): a failure names the first
// layer that diverges.
BOOST_AUTO_TEST_CASE(layer_streams, *needs("dsv41-tiny-bf16")) {
    for (const std::string fx : {"dsv41-tiny-bf16", "dsv41-tiny-fp8"})
        check_layer_streams(fixture(fx), fx, fx == "dsv41-tiny-fp8" ? 0.98 : 0.999);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
