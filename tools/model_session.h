// What the model-running subcommands (logits, dump, generate, bench cpu) share: the effective
// config -> loaded files, a CPU backend sized from the config, resident experts, the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/cpu_backend.h"
#include "scheduler/model_loader.h"

namespace moestream::tools {

struct model_session {
    std::unique_ptr<loaded_model> files;
    std::unique_ptr<cpu_backend> backend;
    std::unique_ptr<resident_experts> experts;
    std::unique_ptr<dsv41::model> model;

    const dsv41::hparams& hp() const { return files->hp; }
    // A fresh sequence with room for `tokens` positions.
    std::unique_ptr<dsv41::sequence_state> new_sequence(int64_t tokens, int64_t rollback = 16) const;
};

// Opens cfg.model.path (and cfg.model.draft_path when set and `with_draft`).
result<std::unique_ptr<model_session>> open_model_session(const moestream_config& cfg, bool with_draft);

// "1,2,3" -> ids; errors name the flag.
result<std::vector<int32_t>> parse_token_list(std::string_view flag, std::string_view text);

}  // namespace moestream::tools
