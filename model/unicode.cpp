#include "model/unicode.h"

#include <array>
#include <memory>

#include <utf8proc.h>

#include "config/assert.h"

namespace moestream::unicode {

namespace {

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

// Allowed range of the second byte for each lead byte (the later bytes are always 80..BF).
// This is what rules out overlongs (E0 80.., F0 80..), surrogates (ED A0..) and > U+10FFFF.
struct second_range {
    uint8_t lo, hi;
};

second_range second_byte_range(uint8_t lead) {
    switch (lead) {
        case 0xE0: return {0xA0, 0xBF};
        case 0xED: return {0x80, 0x9F};
        case 0xF0: return {0x90, 0xBF};
        case 0xF4: return {0x80, 0x8F};
        default: return {0x80, 0xBF};
    }
}

uint16_t classes_from_utf8proc(char32_t cp) {
    uint16_t f = 0;
    switch (utf8proc_category(utf8proc_int32_t(cp))) {
        case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
            f |= cls_letter; break;
        case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
            f |= cls_mark; break;
        case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
            f |= cls_number; break;
        case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
        case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
        case UTF8PROC_CATEGORY_PO:
            f |= cls_punct; break;
        case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
        case UTF8PROC_CATEGORY_SO:
            f |= cls_symbol; break;
        default: break;
    }
    if (is_white_space(cp)) f |= cls_space;
    if (cp == '\r' || cp == '\n') f |= cls_newline;
    if (cp == ' ') f |= cls_ascii_space;
    if (cp < 0x80 && (f & (cls_punct | cls_symbol))) f |= cls_ascii_punct;
    if ((cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z')) f |= cls_ascii_alpha;
    if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF)) f |= cls_cjk;
    return f;
}

// The BMP table is built once (thread-safe static init) and is 128 KiB.
const std::array<uint16_t, 0x10000>& bmp_table() {
    static const auto table = [] {
        auto t = std::make_unique<std::array<uint16_t, 0x10000>>();
        for (char32_t cp = 0; cp < 0x10000; ++cp) (*t)[cp] = classes_from_utf8proc(cp);
        return t;
    }();
    return *table;
}

}  // namespace

int utf8_sequence_length(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

decoded decode_utf8(std::string_view text, size_t pos) {
    MS_ASSERT(pos < text.size());
    const auto* s = reinterpret_cast<const uint8_t*>(text.data()) + pos;
    const size_t avail = text.size() - pos;
    const uint8_t b0 = s[0];
    if (b0 < 0x80) return {b0, 1, true};
    const int n = utf8_sequence_length(b0);
    if (n == 0) return {replacement_char, 1, false};
    const auto r = second_byte_range(b0);
    if (avail < 2 || s[1] < r.lo || s[1] > r.hi) return {replacement_char, 1, false};
    char32_t cp = b0 & (0xFF >> (n + 1));
    cp = (cp << 6) | (s[1] & 0x3F);
    for (int i = 2; i < n; ++i) {
        if (size_t(i) >= avail || !is_cont(s[i])) return {replacement_char, uint32_t(i), false};
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    return {cp, uint32_t(n), true};
}

size_t complete_prefix_length(std::string_view text) {
    const size_t n = text.size();
    for (size_t k = 1; k <= 3 && k <= n; ++k) {
        const auto b = uint8_t(text[n - k]);
        if (is_cont(b)) continue;
        // A lead byte k bytes from the end: hold the tail back only if it is a valid start of a
        // longer sequence that simply has not arrived yet.
        const int len = utf8_sequence_length(b);
        if (len > int(k)) {
            const auto d = decode_utf8(text, n - k);
            if (!d.valid && d.len == k) return n - k;
        }
        return n;
    }
    return n;
}

void append_utf8(std::string& out, char32_t cp) {
    MS_ASSERT(cp <= 0x10FFFF);
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::string to_utf8(char32_t cp) {
    std::string s;
    append_utf8(s, cp);
    return s;
}

bool is_white_space(char32_t cp) {
    // The Unicode White_Space property (what Rust's regex and Oniguruma use for \s).
    switch (cp) {
        case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
        case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
            return true;
        default:
            return cp >= 0x2000 && cp <= 0x200A;
    }
}

uint16_t char_classes(char32_t cp) {
    if (cp < 0x10000) return bmp_table()[cp];
    return classes_from_utf8proc(cp);
}

}  // namespace moestream::unicode
