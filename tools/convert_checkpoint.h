// DeepSeek-V4.1 release checkpoint (config.json + model.safetensors, reference parameter names)
// -> deepseek41 GGUF and, optionally, the DSpark dflash GGUF (dsv41-architecture.md §4, §5.5).
// The tensor inventory (model/arch/deepseek41_hparams.h) drives the conversion: every inventory
// tensor is looked up under its reference name, checked (presence, dtype, shape) before anything
// is written, then converted to the inventory's storage type one tensor at a time.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "config/result.h"
#include "model/arch/deepseek41_hparams.h"

namespace moestream::convert {

struct options {
    std::string checkpoint_dir;
    std::string out;        // target file
    std::string draft_out;  // empty: no draft file
    uint32_t shards = 1;
    bool lossless = false;        // fp8 weights -> BF16 (exact) instead of Q8_0
    bool quantize_float = false;  // bf16/fp32 weights -> the inventory's Q8_0 / MXFP4 (lossy)
};

// config.json (reference ModelArgs names) -> hparams; errors name the file and the field.
result<dsv41::hparams> read_config(const std::string& config_path);

using log_fn = std::function<void(std::string_view line)>;

// Writes the file(s); progress and the repack verification lines go to `log`.
status convert_checkpoint(const options& opts, const log_fn& log);

}  // namespace moestream::convert
