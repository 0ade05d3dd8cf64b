#include "reference_checks.h"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "scheduler/recorded_picks.h"

namespace moestream::test {

double min_of(const std::vector<double>& v) { return v.empty() ? 1.0 : *std::min_element(v.begin(), v.end()); }

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

run_result run_prompt(fixture_model& m, const std::string& fx, int len, bool forced, bool ref_compat, bool act_quant) {
    const auto path = fixture_path(fx) + "/prompt_len" + std::to_string(len) + ".safetensors";
    const int64_t V = m.hp().vocab;
    auto picks = recorded_picks::load(path, m.hp());
    if (!picks.ok()) BOOST_FAIL(picks.message());
    m.model->set_options({ref_compat, forced ? &*picks : nullptr, nullptr, act_quant});
    auto seq = m.sequence();
    const auto& ids = picks->input_ids();
    const auto& gen = picks->generated_ids();
    const auto ref_prefill = read_f32(path, "prefill_logits");
    const auto ref_decode = read_f32(path, "decode_logits");
    const auto draft_ids = read_i64(path, "dspark_draft_ids");
    const auto ref_draft = read_f32(path, "dspark_draft_logits");
    const auto ref_hidden = read_f32(path, "dspark_main_hidden_decode");

    run_result r;
    r.ref_confidence = read_f32(path, "dspark_confidence");
    std::vector<float> logits, all_ours, all_ref;
    dsv41::forward_item item{seq.get(), ids, true};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    for (int t = 0; t < len; ++t) r.prefill_corr.push_back(correlation(logits.data() + t * V, ref_prefill.data() + t * V, V));
    all_ours = logits;
    all_ref.assign(ref_prefill.begin(), ref_prefill.end());
    const int steps = int(ref_decode.size() / size_t(V));
    for (int k = 0; k < steps; ++k) {
        const int32_t tok = gen[size_t(k)];
        dsv41::forward_item step{seq.get(), {&tok, 1}, true};
        BOOST_TEST_REQUIRE(m.model->forward({&step, 1}, logits).ok());
        r.decode_corr.push_back(correlation(logits.data(), ref_decode.data() + k * V, V));
        all_ours.insert(all_ours.end(), logits.begin(), logits.end());
        all_ref.insert(all_ref.end(), ref_decode.begin() + k * V, ref_decode.begin() + (k + 1) * V);
        const auto hidden = seq->last_main_hidden();
        r.main_hidden_min = std::min(r.main_hidden_min, correlation(hidden.data(), ref_hidden.data() + k * hidden.size(),
                                                                    int64_t(hidden.size())));
        // The draft that follows this step, with the recorded draft ids and router picks forced.
        if (forced) {
            const int B = m.hp().dspark_block_size;
            const int64_t* row = draft_ids.data() + k * (B + 1);
            std::vector<int32_t> drafts(row + 1, row + 1 + B);
            picks->set_draft_step(k);
            dsv41::draft_output out;
            BOOST_TEST_REQUIRE(m.model->draft(*seq, int32_t(row[0]), out, drafts).ok());
            r.confidence.insert(r.confidence.end(), out.confidence.begin(), out.confidence.end());
            for (int i = 0; i < B; ++i)
                r.draft_corr.push_back(correlation(out.logits.data() + i * V, ref_draft.data() + (k * B + i) * V, V));
        }
    }
    std::vector<double> per_pos(r.prefill_corr);
    per_pos.insert(per_pos.end(), r.decode_corr.begin(), r.decode_corr.end());
    r.whole = correlation(all_ours.data(), all_ref.data(), int64_t(all_ours.size()));
    r.median = median(per_pos);
    r.min = *std::min_element(per_pos.begin(), per_pos.end());
    m.model->set_options({});
    return r;
}


void check_forced(fixture_model& m, const std::string& fx, double bound, bool act_quant) {
    for (int len : {1, 7, 40}) {
        const auto r = run_prompt(m, fx, len, true, false, act_quant);
        // Confidence logits (one scalar per draft row): correlated over all rows of the prompt.
        const double cc = correlation(r.confidence.data(), r.ref_confidence.data(), int64_t(r.confidence.size()));
        BOOST_TEST_MESSAGE(fx << " len " << len << " DSpark confidence corr " << cc);
        BOOST_TEST(cc >= bound, fx << " len " << len << " DSpark confidence corr " << cc);
        BOOST_TEST_MESSAGE(fx << " len " << len << " forced picks: prefill min " << min_of(r.prefill_corr)
                              << ", decode min " << min_of(r.decode_corr) << ", DSpark draft min " << min_of(r.draft_corr)
                              << ", taps min " << r.main_hidden_min << ", median " << r.median);
        BOOST_TEST(min_of(r.prefill_corr) >= bound, fx << " len " << len << " prefill min corr " << min_of(r.prefill_corr));
        BOOST_TEST(min_of(r.decode_corr) >= bound, fx << " len " << len << " decode min corr " << min_of(r.decode_corr));
        BOOST_TEST(min_of(r.draft_corr) >= bound, fx << " len " << len << " DSpark min corr " << min_of(r.draft_corr));
        BOOST_TEST(r.main_hidden_min >= bound, fx << " len " << len << " DSpark taps min corr " << r.main_hidden_min);
    }
}

void check_free(fixture_model& m, const std::string& fx) {
    for (int len : {1, 7, 40}) {
        const auto r = run_prompt(m, fx, len, false, true, false);
        BOOST_TEST_MESSAGE(fx << " len " << len << " free picks (ref-compat): whole " << r.whole << ", median "
                              << r.median << ", min " << r.min);
        BOOST_TEST(r.whole >= 0.98, fx << " len " << len << " whole-prompt corr " << r.whole);
        BOOST_TEST(r.median >= 0.98, fx << " len " << len << " median per-position corr " << r.median);
    }
}

void check_layer_streams(fixture_model& m, const std::string& fx, double bound) {
    const auto lpath = fixture_path(fx) + "/layers_len40.safetensors";
    const auto ppath = fixture_path(fx) + "/prompt_len40.safetensors";
    std::vector<int64_t> shape;
    const auto want = read_f32(lpath, "layer_in_streams", &shape);  // [layers, T, hc, dim]
    const auto want_final = read_f32(ppath, "final_hidden");
    struct collect final : dsv41::tensor_observer {
        std::vector<std::vector<float>> layer_in;
        std::vector<float> final_hidden;
        void tensor(std::string_view name, int layer, const float* data, std::span<const int64_t> s) override {
            int64_t n = 1;
            for (auto d : s) n *= d;
            if (name == "layer_in") layer_in.emplace_back(data, data + n);
            if (name == "final_hidden") final_hidden.assign(data, data + n);
            (void)layer;
        }
    } obs;
    auto picks = recorded_picks::load(ppath, m.hp());
    BOOST_TEST_REQUIRE(picks.ok());
    m.model->set_options({false, &*picks, &obs});
    auto seq = m.sequence();
    std::vector<float> logits;
    dsv41::forward_item item{seq.get(), picks->input_ids(), false};
    BOOST_TEST_REQUIRE(m.model->forward({&item, 1}, logits).ok());
    m.model->set_options({});
    BOOST_TEST_REQUIRE(int64_t(obs.layer_in.size()) == shape[0]);
    const int64_t per_layer = shape[1] * shape[2] * shape[3];
    for (int64_t L = 0; L < shape[0]; ++L) {
        const double c = correlation(obs.layer_in[size_t(L)].data(), want.data() + L * per_layer, per_layer);
        BOOST_TEST_MESSAGE(fx << " layer " << L << " input streams corr " << c);
        BOOST_TEST_REQUIRE(c >= bound, fx << ": first divergence at the input of layer " << L << " (corr " << c << ")");
    }
    const double cf = correlation(obs.final_hidden.data(), want_final.data(), int64_t(want_final.size()));
    BOOST_TEST(cf >= bound, fx << " final hidden corr " << cf);
}

}  // namespace moestream::test
