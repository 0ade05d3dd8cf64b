// The vocabulary laid out for constrained decoding (server/output_constraint.h): every token's
// bytes, ordered so that a byte automaton can judge the whole vocabulary in one pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace moestream::server {

// Every token's bytes, laid out for evaluating the whole vocabulary against a byte automaton:
// the ordinary tokens (type normal, non-empty) sorted by their bytes, each with the length of
// the prefix it shares with the one before; and apart, the "string text" tokens, which inside a
// JSON string's text leave it there, between characters (whole UTF-8 characters but controls and
// U+FF5C, complete escapes; no closing quote): from such a state they change nothing but the
// length, so they are decided together (those without a backslash and those with one, each in
// order of their length in characters). Most of a vocabulary is string text. Immutable once
// built.
class token_table {
  public:
    explicit token_table(const tokenizer& tok);
    // The table of `tok`, built on first use and then shared (thread-safe). Tables of the last
    // few tokenizers are kept.
    static std::shared_ptr<const token_table> of(const tokenizer& tok);

    int32_t vocab() const { return int32_t(offsets_.size()) - 1; }
    std::string_view bytes(int32_t id) const {
        return std::string_view(bytes_).substr(offsets_[size_t(id)],
                                               offsets_[size_t(id) + 1] - offsets_[size_t(id)]);
    }
    bool ordinary(int32_t id) const { return ordinary_[size_t(id)] != 0; }
    struct sorted_tokens {
        std::vector<int32_t> ids;      // in byte order
        std::vector<uint32_t> shared;  // [i]: bytes ids[i] shares with ids[i - 1] (0 for i = 0)
    };
    const sorted_tokens& ordinary_tokens() const { return all_; }
    const sorted_tokens& other_than_string_text() const { return not_text_; }
    // Every string-text token (those without a backslash first).
    std::span<const int32_t> string_text() const { return string_text_; }
    // The string-text tokens of at most `chars` characters, without / with a backslash.
    std::span<const int32_t> plain_text_upto(uint32_t chars) const {
        return upto(0, plain_, plain_upto_, chars);
    }
    std::span<const int32_t> escaped_text_upto(uint32_t chars) const {
        return upto(plain_, string_text_.size(), escaped_upto_, chars);
    }
    // Ordinary tokens holding a '<' (the tool-call and reasoning markers start with one).
    const sorted_tokens& with_angle() const { return with_angle_; }
    // Added tokens (not ordinary) with bytes: end of sequence, markers, reasoning tags, ...
    const sorted_tokens& added() const { return added_; }
    // [vocab]: 1 for the ordinary tokens / the string-text tokens (masks start from a copy).
    std::span<const uint8_t> ordinary_mask() const { return ordinary_; }
    std::span<const uint8_t> string_text_mask() const { return text_mask_; }
    size_t max_length() const { return max_length_; }
    // Every byte value is an ordinary token of its own (what guarantees forced endings).
    bool has_every_byte() const { return every_byte_; }
    // Same vocabulary as `tok` (checked on a sample of ids).
    bool describes(const tokenizer& tok) const;

  private:
    std::span<const int32_t> upto(size_t begin, size_t end, const std::vector<uint32_t>& counts,
                                  uint32_t chars) const {
        const size_t n = counts.empty() ? 0 : counts[std::min<size_t>(chars, counts.size() - 1)];
        return std::span<const int32_t>(string_text_).subspan(begin, std::min(n, end - begin));
    }

    std::string bytes_;
    std::vector<uint32_t> offsets_;  // [vocab + 1]
    std::vector<uint8_t> ordinary_;
    sorted_tokens all_, not_text_;
    std::vector<int32_t> string_text_;  // plain ones by characters, then escaped ones by characters
    size_t plain_ = 0;                  // how many of string_text_ have no backslash
    std::vector<uint32_t> plain_upto_, escaped_upto_;  // [k]: tokens of that kind with <= k characters
    sorted_tokens with_angle_, added_;
    std::vector<uint8_t> text_mask_;
    size_t max_length_ = 0;
    bool every_byte_ = false;
};

}  // namespace moestream::server
