// moestream inspect FILE.gguf: metadata, tensor table, expert layout and a validation verdict.
#include <cstdio>
#include <map>

#include "scheduler/model_gguf.h"
#include "storage/gguf.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "inspect";

const cli::option_spec kOptions[] = {
    {"no-metadata", "", "omit the metadata listing"},
    {"no-tensors", "", "omit the tensor table"},
};

std::string shape_text(const gguf::tensor_info& t) {
    std::string s = "{";
    for (int k = 0; k < t.n_dims; ++k) s += (k ? ", " : "") + std::to_string(t.ne[k]);
    return s + "}";
}

void print_metadata(const gguf::model_file& f) {
    std::printf("metadata (%zu keys):\n", f.metadata().size());
    for (const auto& kv : f.metadata()) {
        std::string type(gguf::value_type_name(kv.val.type));
        if (kv.val.type == gguf::value_type::array) {
            type += '<';
            type += gguf::value_type_name(kv.val.array_type);
            type += ">[";
            type += std::to_string(kv.val.as_array()->size());
            type += ']';
        }
        std::printf("  %-52s %-16s %s\n", kv.key.c_str(), type.c_str(), kv.val.to_display(8).c_str());
    }
}

void print_tensors(const gguf::model_file& f) {
    std::printf("tensors (%zu):\n  %-44s %-6s %-26s %5s %14s %14s\n", f.tensors().size(), "name", "type", "shape",
                "shard", "offset", "bytes");
    for (const auto& t : f.tensors())
        std::printf("  %-44s %-6s %-26s %5u %14llu %14llu\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(),
                    shape_text(t).c_str(), t.shard, (unsigned long long)t.file_offset, (unsigned long long)t.bytes);
}

// Per-expert slices of the 3-D expert tensors: bytes per expert (gate+up+down) and how many
// slices start on a 4 KiB boundary (O_DIRECT reads need no bounce for those).
void print_expert_layout(const gguf::model_file& f) {
    uint64_t tensors = 0, slices = 0, aligned = 0, total = 0;
    std::map<int64_t, uint64_t> bytes_per_expert_by_count;  // n_experts -> bytes of one expert (all 3)
    std::map<std::string, uint64_t> per_layer;
    for (const auto& t : f.tensors()) {
        if (t.n_dims != 3 || t.name.find("_exps.") == std::string::npos) continue;
        ++tensors;
        total += t.bytes;
        for (int64_t e = 0; e < t.ne[2]; ++e) {
            auto x = f.expert_slice(t, e);
            ++slices;
            aligned += (x.offset % 4096 == 0);
        }
        bytes_per_expert_by_count[t.ne[2]] += f.expert_slice(t, 0).bytes;
    }
    if (!tensors) {
        std::printf("experts: none (no 3-D *_exps tensors)\n");
        return;
    }
    // GiB, as the cache budgets (--device-cache, --host-cache) and README are written; the exact
    // count beside it.
    std::printf("experts: %llu tensors, %llu slices, %.2f GiB (%llu bytes) in all; slices on 4 KiB boundaries: %llu of %llu\n",
                (unsigned long long)tensors, (unsigned long long)slices, double(total) / (1ull << 30),
                (unsigned long long)total, (unsigned long long)aligned, (unsigned long long)slices);
    for (auto [count, sum] : bytes_per_expert_by_count) {
        uint64_t layers = 0;
        for (const auto& t : f.tensors())
            if (t.n_dims == 3 && t.ne[2] == count && t.name.find("ffn_gate_exps") != std::string::npos) ++layers;
        std::printf("  %lld experts per layer x %llu layers: %llu bytes per expert (gate+up+down)\n", (long long)count,
                    (unsigned long long)layers, (unsigned long long)(layers ? sum / layers : sum));
    }
    std::printf("  alignment: general.alignment = %llu\n", (unsigned long long)f.alignment());
}

int run(const cli::args& a) {
    if (a.positional().size() != 1) return usage_error(kName, "expected exactly one FILE.gguf");
    const std::string path = a.positional()[0];
    auto f = gguf::model_file::open(path);
    if (!f) {
        std::printf("verdict: INVALID: %s\n", f.message().c_str());
        return 1;
    }
    std::printf("file: %s (GGUF v%u, %zu shard%s, alignment %llu)\n", path.c_str(), f->version(), f->shard_count(),
                f->shard_count() == 1 ? "" : "s", (unsigned long long)f->alignment());
    for (uint32_t s = 0; s < f->shard_count(); ++s)
        std::printf("  shard %u: %s (%llu bytes)\n", s, f->shard_path(s).c_str(), (unsigned long long)f->shard_size(s));
    if (!a.flag("no-metadata")) print_metadata(*f);
    if (!a.flag("no-tensors")) print_tensors(*f);
    print_expert_layout(*f);

    auto arch = f->get_string("general.architecture");
    if (!arch) {
        std::printf("verdict: INVALID: %s\n", arch.message().c_str());
        return 1;
    }
    if (*arch != kTargetArch && *arch != kDraftArch) {
        std::printf("verdict: valid GGUF; architecture '%s' is not one moestream runs\n", arch->c_str());
        return 0;
    }
    auto hp = read_hparams(*f);
    if (!hp) {
        std::printf("verdict: INVALID: %s\n", hp.message().c_str());
        return 1;
    }
    if (auto st = check_tensors(*f, *hp, *arch == kDraftArch); !st) {
        std::printf("verdict: INVALID: %s\n", st.message().c_str());
        return 1;
    }
    if (*arch == kTargetArch && !f->find("tokenizer.ggml.model")) {
        std::printf("note: no tokenizer in this file (converted from a checkpoint without tokenizer.json): "
                    "logits and dumps work, text commands need one\n");
    } else if (*arch == kTargetArch) {
        auto tok = read_tokenizer_data(*f);
        if (!tok) {
            std::printf("verdict: INVALID: %s\n", tok.message().c_str());
            return 1;
        }
        if (int64_t(tok->tokens.size()) != hp->vocab) {
            std::printf("verdict: INVALID: %s: the tokenizer has %zu tokens, the model %lld\n", path.c_str(),
                        tok->tokens.size(), (long long)hp->vocab);
            return 1;
        }
    }
    std::printf("verdict: valid %s model (%d layers, dim %lld, %d experts top-%d)\n", arch->c_str(),
                *arch == kTargetArch ? hp->n_layers : hp->n_mtp, (long long)hp->dim,
                *arch == kTargetArch ? hp->n_experts : hp->dspark_n_experts,
                *arch == kTargetArch ? hp->n_active : hp->dspark_n_active);
    return 0;
}

const command kCommand{kName, "FILE.gguf",
                       "Prints a GGUF file's metadata, tensor table (name, type, shape, offset, bytes) and expert "
                       "layout, then a validation verdict (exit 1 when invalid).",
                       kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
