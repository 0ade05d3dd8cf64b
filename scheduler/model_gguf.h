// Binding between the deepseek41 / dflash GGUF files and the model: metadata keys <-> hparams
// (dsv41-architecture.md §4.1, §5.5), tensor inventory checks, and the tokenizer keys. It lives in
// scheduler/ because that is the first module that sees both storage/ and model/.
#pragma once

#include <string>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41_hparams.h"
#include "model/tokenizer.h"
#include "storage/gguf.h"

namespace moestream {

inline constexpr const char* kTargetArch = "deepseek41";
inline constexpr const char* kDraftArch = "dflash";

// Metadata of the target file (general.*, deepseek41.*) and of the DSpark file (dflash.*).
std::vector<gguf::kv> target_metadata(const dsv41::hparams& hp);
std::vector<gguf::kv> draft_metadata(const dsv41::hparams& hp);

// Reads the hyper-parameters of a deepseek41 or dflash file; errors name the file and the key.
result<dsv41::hparams> read_hparams(const gguf::model_file& file);

// Every tensor of the inventory is present with the expected shape and a usable type, and no
// unexpected tensor is present. Errors name the tensor and what differs.
status check_tensors(const gguf::model_file& file, const dsv41::hparams& hp, bool draft);

void append_tokenizer_metadata(std::vector<gguf::kv>& out, const tokenizer_data& tok);
result<tokenizer_data> read_tokenizer_data(const gguf::model_file& file);
// Opens a model file and builds its tokenizer (for tokenize / detokenize / chat-template).
result<tokenizer> load_tokenizer(const std::string& model_path);

}  // namespace moestream
