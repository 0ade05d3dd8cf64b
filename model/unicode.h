// UTF-8 decoding/encoding and the Unicode character classes the DeepSeek-V3 pre-tokenizer needs.
// Classes come from libutf8proc general categories, cached in a table for the BMP so the hot
// loop of the tokenizer does one array load per code point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moestream::unicode {

inline constexpr char32_t replacement_char = 0xFFFD;

struct decoded {
    char32_t cp;   // replacement_char when invalid
    uint32_t len;  // bytes consumed (>= 1 unless at end of input)
    bool valid;
};

// Decodes one code point at text[pos]. Invalid input consumes the maximal subpart of an
// ill-formed sequence (Unicode 3.9 / WHATWG practice), so one U+FFFD replaces it. Rejects
// overlongs, surrogates and values above U+10FFFF.
decoded decode_utf8(std::string_view text, size_t pos);

// Number of bytes a lead byte announces (1..4), or 0 for a continuation or invalid lead byte.
int utf8_sequence_length(uint8_t lead);

// Length of the longest prefix of `text` that ends on a code point boundary where the rest is an
// incomplete (but so far valid) sequence; i.e. text.size() minus the bytes to hold back.
size_t complete_prefix_length(std::string_view text);

void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(char32_t cp);

// Character classes as bit flags.
enum char_class : uint16_t {
    cls_letter = 1u << 0,      // \p{L}
    cls_mark = 1u << 1,        // \p{M}
    cls_number = 1u << 2,      // \p{N}
    cls_punct = 1u << 3,       // \p{P}
    cls_symbol = 1u << 4,      // \p{S}
    cls_space = 1u << 5,       // \s: Unicode White_Space
    cls_newline = 1u << 6,     // \r or \n
    cls_ascii_space = 1u << 7, // U+0020
    cls_ascii_punct = 1u << 8, // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
    cls_ascii_alpha = 1u << 9, // [A-Za-z]
    cls_cjk = 1u << 10,        // [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]
};

uint16_t char_classes(char32_t cp);
bool is_white_space(char32_t cp);

}  // namespace moestream::unicode
