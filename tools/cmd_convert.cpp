// moestream convert: a DeepSeek-V4.1 release checkpoint folder -> deepseek41 GGUF (+ dflash).
#include <cstdio>

#include "tools/command.h"
#include "tools/convert_checkpoint.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "convert";

const cli::option_spec kOptions[] = {
    {"checkpoint", "DIR", "folder with config.json, model.safetensors and engram_tables.safetensors"},
    {"out", "FILE.gguf", "target model file to write (arch deepseek41)"},
    {"draft-out", "FILE.gguf", "also write the DSpark draft head (arch dflash) from the mtp.* tensors"},
    {"shards", "N", "split the target into N files (name-0000K-of-0000N.gguf)"},
    {"lossless", "", "store fp8 weights as BF16 (exact, twice the size) instead of Q8_0"},
    {"quantize-float", "", "quantize bf16/fp32 weights to Q8_0 (dense) and MXFP4 (experts); default keeps them exact"},
};

int run(const cli::args& a) {
    auto dir = a.require("checkpoint");
    if (!dir) return usage_error(kName, dir.message());
    auto out = a.require("out");
    if (!out) return usage_error(kName, out.message());
    auto shards = a.get_int("shards", 1);
    if (!shards) return usage_error(kName, shards.message());
    if (*shards < 1 || *shards > 999) return usage_error(kName, "--shards must be between 1 and 999");
    convert::options opts{*dir, *out, a.get_or("draft-out", ""), uint32_t(*shards)};
    opts.lossless = a.flag("lossless");
    opts.quantize_float = a.flag("quantize-float");
    auto st = convert::convert_checkpoint(opts, [](std::string_view line) {
        std::printf("%.*s\n", int(line.size()), line.data());
        std::fflush(stdout);
    });
    if (!st) return fail(kName, st.message());
    return 0;
}

const command kCommand{
    kName,
    "--checkpoint DIR --out FILE.gguf [--draft-out DRAFT.gguf] [--shards N] [--lossless] [--quantize-float]",
    "Converts a DeepSeek-V4.1 release checkpoint (reference parameter names, bf16/fp8/fp4 storage) into a "
    "deepseek41 GGUF: fp8 linears become Q8_0, fp4 experts are repacked losslessly into MXFP4 (verified "
    "block by block), engram tables are copied as raw bytes. With --draft-out the DSpark stages become a "
    "dflash file. Both files are checked against the tensor inventory after writing.",
    kOptions,
    run,
};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
