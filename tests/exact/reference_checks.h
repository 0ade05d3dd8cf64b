// The checks of the reference suite (reference_test.cpp), on any backend's fixture model: the
// CUDA suite runs them on the GPU with the same bounds.
#pragma once

#include <string>
#include <vector>

#include "fixture_model.h"

namespace moestream::test {

struct run_result {
    std::vector<double> prefill_corr, decode_corr, draft_corr;
    double whole = 0, median = 0, min = 1;
    double main_hidden_min = 1;
    std::vector<float> confidence, ref_confidence;
};

// Prefill, teacher-forced decode steps and (forced) the DSpark drafts of prompt_len{len}.
run_result run_prompt(fixture_model& m, const std::string& fx, int len, bool forced, bool ref_compat, bool act_quant);
double min_of(const std::vector<double>& v);
// Picks forced, prompts of 1, 7 and 40 tokens: every position's logits, the drafts, the taps and
// the confidence correlate with the reference to at least `bound`.
void check_forced(fixture_model& m, const std::string& fx, double bound, bool act_quant = false);
// Free picks with the reference's quirks: whole-prompt and median correlation >= 0.98.
void check_free(fixture_model& m, const std::string& fx);
// The streams entering every layer of the 40-token prompt (picks forced) and the final hidden
// state correlate with the reference's to `bound`; a failure names the first layer that diverges.
void check_layer_streams(fixture_model& m, const std::string& fx, double bound);

}  // namespace moestream::test
