// What the model-running subcommands (logits, dump, generate, bench, serve) share: the effective
// config -> loaded files, the backend (--backend auto|cuda|cpu), the experts, the model.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <variant>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/cpu_backend.h"
#include "scheduler/device_experts.h"
#include "scheduler/device_weights.h"
#include "scheduler/model_loader.h"
#include "scheduler/recorded_picks.h"
#include "scheduler/engram_stream.h"
#include "scheduler/layer_split_experts.h"
#include "scheduler/scheduler_thread.h"
#include "scheduler/tiered_experts.h"
#include "spec/expert_union.h"

namespace moestream::tools {

struct model_session {
    // The serving process's one scheduler thread (scheduler/scheduler_thread.h): the tiers'
    // strands run on it, and an engine over the session takes its executor too
    // (engine_options::executor). Declared first, so it is stopped last: after the engine (made
    // after the session) and the tiers below are gone, each having drained its completions
    // through it.
    std::unique_ptr<scheduler_thread> scheduler = std::make_unique<scheduler_thread>();
    std::unique_ptr<loaded_model> files;
    std::unique_ptr<backend> compute;            // runs the model
    cpu_backend* cpu = nullptr;                  // compute, when it is the CPU backend (bench cpu's pool, profile)
    std::unique_ptr<device_weights> device;      // the dense weights in the backend's memory (VRAM; RAM when streaming)
    std::unique_ptr<resident_experts> experts;   // CPU: everything in the mapping (bench cpu)
    std::unique_ptr<tiered_experts> streamed;    // CPU: device <- host <- disk tiers (the product path)
    // A device backend's expert slots (VRAM), filled from `streamed` when streaming: declared
    // after it so that it goes first (its copies in flight hold host slots of it).
    std::unique_ptr<device_experts> slots;
    // With a DSpark draft on a device backend and --draft-cache not 0: the draft's stages' VRAM
    // slots of their own (drafting never evicts the target's experts), and the source the model
    // reads through, which sends each layer to its tier.
    std::unique_ptr<device_experts> draft_slots;
    std::unique_ptr<layer_split_experts> split;
    std::unique_ptr<engram_stream> engram;       // engram rows read ahead from disk (with streaming)
    std::unique_ptr<dsv41::model> model;

    const dsv41::hparams& hp() const { return files->hp; }
    // The weights the model reads: the device's copy, or the mapping.
    const dsv41::model_weights& weights() const { return device ? device->weights : files->weights; }
    const dsv41::draft_weights* draft() const {
        if (device) return device->draft ? &*device->draft : nullptr;
        return files->draft ? &*files->draft : nullptr;
    }
    // Experts the device tier holds: the VRAM slots on a device backend, the streamed tiers'
    // device slots on the CPU (where the tiered_experts' own device tier is empty on CUDA).
    uint32_t device_slot_count() const {
        if (slots) return uint32_t(slots->slots());
        return streamed ? streamed->device_slots() : 0u;
    }
    // "cuda (NVIDIA H200, sm_90, 132 SMs, 139.8 GiB)" / "cpu (16 threads, kernels avx512)".
    std::string backend_line() const;
    // One line of expert-tier accounting (to stderr), when the experts are streamed.
    void print_streaming_stats() const;
    // Where each layer's experts were when announced (spec/expert_union.h), when streamed;
    // empty otherwise (everything resident).
    spec::tally_probe tally_probe() const;
    // A fresh sequence with room for `tokens` positions.
    std::unique_ptr<dsv41::sequence_state> new_sequence(int64_t tokens, int64_t rollback = 16) const;
};

// Opens cfg.model.path (and cfg.model.draft_path when set and `with_draft`) on the backend
// cfg.runtime.backend names (auto: CUDA when a usable GPU is present, else the CPU). On the CPU,
// with `stream` the dense weights are copied out of the mapping and the experts go through the
// tiers sized by cfg.cache / cfg.io (--device-cache, --host-cache, --io-depth, --io-chunk),
// engram rows through their read-ahead, so serving never touches the mapping; otherwise
// everything is read in place from the memory mapping. On CUDA the dense weights are uploaded to VRAM and the experts live in VRAM slots
// (--device-cache of them, all when it covers them), filled from the mapping; start-up refuses,
// naming the sizes, when the card cannot hold the weights, the slots and the sequence states.
// `sequences`: the sequence states the caller will make (planning).
result<std::unique_ptr<model_session>> open_model_session(const moestream_config& cfg, bool with_draft,
                                                          bool stream = true, int64_t sequences = 1);

// The comparison switches of logits and dump: --force-picks P.safetensors, --ref-compat,
// --act-quant {off,reference}.
struct check_options {
    std::optional<recorded_picks> picks;
    std::string picks_path;
    bool ref_compat = false;
    bool act_quant = false;

    // Installs them (and an optional observer) into the session's model.
    void apply(model_session& s, dsv41::tensor_observer* observer = nullptr);
    // ", picks forced, reference quirks on" style suffix for summaries.
    std::string summary() const;
    // A note line when some selections had no record (printed to stdout), else nothing.
    void print_unmatched() const;
};
// Errors: .usage for bad flag values (exit 2), otherwise a failure message.
struct check_options_error {
    bool usage;
    std::string message;
};
std::variant<check_options, check_options_error> read_check_options(const cli::args& a, const dsv41::hparams& hp,
                                                                    std::span<const int32_t> tokens);
// with_config_options plus the three switches above.
std::vector<cli::option_spec> with_check_options(std::initializer_list<cli::option_spec> specs);

// Pages in every tensor of `f` that `keep` accepts (all of them when null): benchmarks measure
// compute and memory, not first-touch faults.
void touch_pages(const gguf::model_file& f, bool (*keep)(const gguf::tensor_info&) = nullptr);

// "1,2,3" -> ids; errors name the flag.
result<std::vector<int32_t>> parse_token_list(std::string_view flag, std::string_view text);

}  // namespace moestream::tools
