#include "model/engram_tables.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "config/assert.h"
#include "model/numpy_pcg64.h"

namespace moestream::engram {

// ---------------------------------------------------------------------------------------------
// Primes

namespace {

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t pow_mod(uint64_t base, uint64_t exp, uint64_t m) {
    uint64_t r = 1;
    base %= m;
    for (; exp > 0; exp >>= 1) {
        if (exp & 1) r = mul_mod(r, base, m);
        base = mul_mod(base, base, m);
    }
    return r;
}

// Miller-Rabin with the first 12 prime bases: deterministic for every 64-bit n.
bool is_prime(uint64_t n) {
    constexpr std::array<uint64_t, 12> bases{2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (n < 2) return false;
    for (uint64_t p : bases)
        if (n % p == 0) return n == p;
    uint64_t d = n - 1;
    int s = 0;
    for (; d % 2 == 0; d /= 2) ++s;
    for (uint64_t a : bases) {
        uint64_t x = pow_mod(a, d, n);
        if (x == 1 || x == n - 1) continue;
        bool composite = true;
        for (int i = 1; i < s && composite; ++i) {
            x = mul_mod(x, x, n);
            composite = x != n - 1;
        }
        if (composite) return false;
    }
    return true;
}

// Smallest prime > cur that no head of any layer has taken yet.
int64_t next_unused_prime(int64_t cur, const std::unordered_set<int64_t>& used) {
    for (int64_t c = cur + 1;; ++c)
        if (!used.contains(c) && is_prime(static_cast<uint64_t>(c))) return c;
}

}  // namespace

std::vector<layer_tables> compute_primes(const std::vector<int>& layer_ids, int max_ngram, int n_heads,
                                         int64_t prime_start) {
    MS_ASSERT(max_ngram >= 2 && n_heads >= 1 && prime_start >= 1);
    std::unordered_set<int64_t> used;  // global: two layers never share a prime
    std::vector<layer_tables> out;
    for (int layer_id : layer_ids) {
        layer_tables t;
        t.layer_id = layer_id;
        for (int n = 2; n <= max_ngram; ++n) {
            // Every order restarts the search at prime_start; `used` keeps them distinct.
            int64_t cur = prime_start - 1;
            for (int h = 0; h < n_heads; ++h) {
                cur = next_unused_prime(cur, used);
                used.insert(cur);
                t.offsets.push_back(t.rows);
                t.primes.push_back(cur);
                t.rows += cur;
            }
        }
        out.push_back(std::move(t));
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Multipliers

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, size_t n) {
    MS_ASSERT(high > low);
    numpy_pcg64 gen(seed);
    // numpy's _rand_int64 excludes high: the inclusive span is high - low - 1 (as unsigned, so
    // the full int64 range cannot overflow).
    const uint64_t rng = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) - 1;
    const auto off = static_cast<uint64_t>(low);
    std::vector<int64_t> out(n);
    for (auto& v : out) {
        uint64_t r = 0;
        if (rng == 0) {
            r = 0;
        } else if (rng < 0xffffffffULL) {
            // A 32-bit span draws 32-bit values: halves of one 64-bit output, low half first.
            r = gen.bounded_lemire_uint32(static_cast<uint32_t>(rng));
        } else if (rng == 0xffffffffULL) {
            r = gen.next_uint32();
        } else if (rng == std::numeric_limits<uint64_t>::max()) {
            r = gen.next_uint64();
        } else {
            r = gen.bounded_lemire_uint64(rng);
        }
        v = static_cast<int64_t>(off + r);
    }
    return out;
}

std::vector<int64_t> hash_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab) {
    MS_ASSERT(layer_id >= 0 && max_ngram >= 1 && compressed_vocab >= 1);
    // bound keeps every g * m (g < compressed_vocab) inside int64, so the hash never wraps.
    const int64_t bound = (std::numeric_limits<int64_t>::max() / compressed_vocab) / 2;
    MS_ASSERT(bound >= 1);
    auto r = numpy_default_rng_integers(10007ULL * static_cast<uint64_t>(layer_id), 0, bound,
                                        static_cast<size_t>(max_ngram));
    for (auto& v : r) v = 2 * v + 1;
    return r;
}

// ---------------------------------------------------------------------------------------------
// Byte-level decoding

namespace {

void append_utf8(std::string& out, int32_t cp) {
    utf8proc_uint8_t buf[4];
    const auto n = utf8proc_encode_char(cp, buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// Code point -> byte of the GPT-2 byte<->unicode table, -1 where the code point is not in it.
const std::array<int, 512>& byte_of_char() {
    static const std::array<int, 512> table = [] {
        std::array<int, 512> t;
        t.fill(-1);
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
            t[static_cast<size_t>(printable ? b : 256 + extra++)] = b;
        }
        return t;
    }();
    return table;
}

// Bytes of the well-formed UTF-8 sequence starting at s[i] (Unicode Table 3-7), or the length
// of its maximal invalid prefix as a negative number.
int utf8_sequence_length(std::string_view s, size_t i) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b = byte(i);
    if (b < 0x80) return 1;
    int width = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (b >= 0xc2 && b <= 0xdf) width = 2;
    else if (b >= 0xe0 && b <= 0xef) width = 3, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
    else if (b >= 0xf0 && b <= 0xf4) width = 4, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
    else return -1;
    for (int k = 1; k < width; ++k) {
        if (i + static_cast<size_t>(k) >= s.size()) return -k;
        const unsigned char c = byte(i + static_cast<size_t>(k));
        const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xbf);
        if (!ok) return -k;
    }
    return width;
}

}  // namespace

std::string utf8_lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        const int n = utf8_sequence_length(bytes, i);
        if (n > 0) {
            out.append(bytes.substr(i, static_cast<size_t>(n)));
            i += static_cast<size_t>(n);
        } else {
            out += "\xEF\xBF\xBD";
            i += static_cast<size_t>(-n);
        }
    }
    return out;
}

std::string decode_byte_level(std::string_view token) {
    const auto& table = byte_of_char();
    std::string bytes;
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(token.data());
    for (size_t i = 0; i < token.size();) {
        utf8proc_int32_t cp = -1;
        const auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(token.size() - i), &cp);
        const int b = (n > 0 && cp >= 0 && cp < 512) ? table[static_cast<size_t>(cp)] : -1;
        // One character outside the table: HF keeps the token's own bytes.
        if (b < 0) return utf8_lossy(token);
        bytes.push_back(static_cast<char>(b));
        i += static_cast<size_t>(n);
    }
    return utf8_lossy(bytes);
}

// ---------------------------------------------------------------------------------------------
// Compressed token map

namespace {

constexpr int32_t sentinel = 0xE000;  // the reference's private-use stand-in for a lone " "

result<std::u32string> to_code_points(std::string_view s) {
    std::u32string out;
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
    for (size_t i = 0; i < s.size();) {
        utf8proc_int32_t cp = -1;
        const auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
        if (n <= 0) return make_error("engram token map: invalid UTF-8 in a token");
        out.push_back(static_cast<char32_t>(cp));
        i += static_cast<size_t>(n);
    }
    return out;
}

std::string to_utf8(const std::u32string& cps) {
    std::string out;
    for (char32_t c : cps) append_utf8(out, static_cast<int32_t>(c));
    return out;
}

// utf8proc_map on an explicit length, so tokens holding NUL survive.
result<std::string> utf8proc_transform(std::string_view s, int options) {
    utf8proc_uint8_t* dst = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                static_cast<utf8proc_option_t>(options));
    if (n < 0) return make_error(std::string("engram token map: ") + utf8proc_errmsg(n));
    std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
    return out;
}

// HF StripAccents drops every combining mark (General_Category M: Mn, Mc, Me).
bool is_combining_mark(char32_t c) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

// Rust char::to_lowercase (what HF Lowercase applies): the simple mapping, except U+0130 whose
// unconditional full lowercase is two code points.
void append_lowercase(std::u32string& out, char32_t c) {
    if (c == 0x130) {
        out += U"i\u0307";
        return;
    }
    out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

bool is_collapsible_space(char32_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Rust char::is_whitespace (Unicode White_Space), what HF Strip trims.
bool is_white_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

// StripAccents + Lowercase + Replace([ \t\r\n]+, " ") on NFD text.
std::u32string strip_lower_collapse(const std::u32string& nfd) {
    std::u32string out;
    for (char32_t c : nfd) {
        if (is_combining_mark(c)) continue;
        std::u32string lowered;
        append_lowercase(lowered, c);
        for (char32_t l : lowered) {
            if (is_collapsible_space(l)) {
                if (!out.empty() && out.back() == U' ') continue;
                l = U' ';
            }
            out.push_back(l);
        }
    }
    return out;
}

// Replace(^ $, sentinel), Strip, Replace(sentinel, " "): a token that is exactly one space keeps
// it. Done literally, so a token holding the sentinel itself behaves as in the reference.
std::u32string strip_keeping_lone_space(std::u32string s) {
    if (s == U" ") s = std::u32string(1, static_cast<char32_t>(sentinel));
    size_t b = 0, e = s.size();
    while (b < e && is_white_space(s[b])) ++b;
    while (e > b && is_white_space(s[e - 1])) --e;
    s = s.substr(b, e - b);
    for (auto& c : s)
        if (c == static_cast<char32_t>(sentinel)) c = U' ';
    return s;
}

}  // namespace

result<std::string> normalize_token_key(std::string_view decoded) {
    auto nfkc = utf8proc_transform(decoded, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (!nfkc) return nfkc.err();
    auto nfd = utf8proc_transform(*nfkc, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    if (!nfd) return nfd.err();
    auto cps = to_code_points(*nfd);
    if (!cps) return cps.err();
    return to_utf8(strip_keeping_lone_space(strip_lower_collapse(*cps)));
}

result<token_map> build_compressed_token_map(const std::vector<std::string>& decoded,
                                             const std::vector<std::string>& raw) {
    if (decoded.size() != raw.size())
        return make_error("engram token map: decoded and raw token lists differ in length");
    if (decoded.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
        return make_error("engram token map: vocabulary too large");
    token_map tm;
    tm.map.reserve(decoded.size());
    std::unordered_map<std::string, int32_t> ids;
    for (size_t i = 0; i < decoded.size(); ++i) {
        std::string key;
        if (decoded[i].find("\xEF\xBF\xBD") != std::string::npos) {
            key = raw[i];  // partial UTF-8: the decode alone is meaningless, the raw form is unique
        } else {
            auto norm = normalize_token_key(decoded[i]);
            if (!norm) return norm.err();
            key = norm->empty() ? decoded[i] : std::move(*norm);
        }
        const auto [it, fresh] = ids.try_emplace(std::move(key), static_cast<int32_t>(ids.size()));
        tm.map.push_back(it->second);
    }
    tm.compressed_vocab = static_cast<int64_t>(ids.size());
    return tm;
}

}  // namespace moestream::engram
