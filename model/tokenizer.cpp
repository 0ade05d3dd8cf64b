// Byte-level BPE with the DeepSeek-V3 pre-tokenizer. Encoding never materialises strings: the
// text is split into byte ranges, each range starts as one symbol per byte (the id of its GPT-2
// byte-level character) and merges are looked up by (left id, right id) in an open-addressing
// table, so the hot path does no per-piece heap allocation.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "model/unicode.h"

namespace moestream {

namespace {

using unicode::char_classes;

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the others to U+0100 upwards in
// byte order, so every byte has a visible, non-space character.
std::array<char32_t, 256> make_byte_to_char() {
    std::array<char32_t, 256> m{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        m[b] = printable ? char32_t(b) : next++;
    }
    return m;
}

const std::array<char32_t, 256>& byte_to_char() {
    static const auto m = make_byte_to_char();
    return m;
}

// Inverse mapping: character -> byte, or -1 (characters only go up to U+0143).
int char_to_byte(char32_t c) {
    static const auto inv = [] {
        std::array<int16_t, 512> t;
        t.fill(-1);
        for (int b = 0; b < 256; ++b) t[byte_to_char()[b]] = int16_t(b);
        return t;
    }();
    return c < inv.size() ? inv[c] : -1;
}

constexpr uint32_t no_rank = std::numeric_limits<uint32_t>::max();

// (left id, right id) -> (rank, merged id), open addressing with linear probing. The table is
// at most half full, so probes are short.
class merge_table {
public:
    struct entry {
        uint64_t key = empty_key;
        uint32_t rank = no_rank;
        int32_t id = -1;
    };

    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < 2 * n) cap <<= 1;
        slots_.assign(cap, entry{});
        mask_ = cap - 1;
    }

    // A later duplicate overwrites an earlier one, as HF's HashMap collect does.
    void insert(int32_t a, int32_t b, uint32_t rank, int32_t id) {
        MS_ASSERT(!slots_.empty());
        const uint64_t k = key(a, b);
        for (size_t i = hash(k);; i = (i + 1) & mask_) {
            if (slots_[i].key == empty_key || slots_[i].key == k) {
                slots_[i] = {k, rank, id};
                return;
            }
        }
    }

    const entry* find(int32_t a, int32_t b) const {
        const uint64_t k = key(a, b);
        for (size_t i = hash(k);; i = (i + 1) & mask_) {
            const entry& e = slots_[i];
            if (e.key == k) return &e;
            if (e.key == empty_key) return nullptr;
        }
    }

private:
    static constexpr uint64_t empty_key = ~uint64_t(0);
    static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
    size_t hash(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 29) & mask_; }

    std::vector<entry> slots_;
    size_t mask_ = 0;
};

struct cp_info {
    uint32_t offset;  // byte offset of the code point in the segment
    uint16_t cls;     // unicode::char_class flags (0 for an invalid byte sequence)
};

// Reused buffers for one encode() call.
struct scratch {
    std::vector<cp_info> cps;
    std::vector<int32_t> ids;
    std::vector<uint32_t> ranks;
    std::vector<int32_t> merged;
    struct symbol {
        int32_t id, prev, next;
        bool alive;
    };
    struct heap_item {
        uint32_t rank;
        int32_t pos;
        int32_t id;
        // std heaps are max-heaps: "greater" means lower rank, then lower position (HF order).
        bool operator<(const heap_item& o) const {
            return rank != o.rank ? rank > o.rank : pos > o.pos;
        }
    };
    std::vector<symbol> symbols;
    std::vector<heap_item> heap;

    // Memo of piece -> ids for one encode() call. Long texts repeat words constantly (code:
    // identifiers, indentation), and a hit replaces a dozen merge-table probes by one hash. Keys
    // point into the text being encoded, which outlives the call, so nothing is copied.
    struct memo_slot {
        const char* text = nullptr;  // nullptr: empty slot
        uint32_t len = 0;
        uint32_t ids_begin = 0, ids_len = 0;
        uint64_t hash = 0;
    };
    static constexpr size_t memo_slots = size_t(1) << 14;
    std::vector<memo_slot> memo;
    std::vector<int32_t> memo_ids;
    size_t memo_used = 0;
};

uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
    return h;
}

// ---- pre-tokenizer: the three Isolated regex splits, applied to each other's pieces ----------

// Split 1: \p{N}{1,3}
template <class F>
void split_numbers(const cp_info* c, size_t b, size_t e, F&& emit) {
    size_t gap = b, i = b;
    while (i < e) {
        if (!(c[i].cls & unicode::cls_number)) {
            ++i;
            continue;
        }
        size_t j = i + 1;
        while (j < e && j < i + 3 && (c[j].cls & unicode::cls_number)) ++j;
        if (gap < i) emit(gap, i);
        emit(i, j);
        i = gap = j;
    }
    if (gap < e) emit(gap, e);
}

// Split 2: [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
template <class F>
void split_cjk(const cp_info* c, size_t b, size_t e, F&& emit) {
    size_t gap = b, i = b;
    while (i < e) {
        if (!(c[i].cls & unicode::cls_cjk)) {
            ++i;
            continue;
        }
        size_t j = i + 1;
        while (j < e && (c[j].cls & unicode::cls_cjk)) ++j;
        if (gap < i) emit(gap, i);
        emit(i, j);
        i = gap = j;
    }
    if (gap < e) emit(gap, e);
}

size_t run_end(const cp_info* c, size_t i, size_t e, uint16_t cls) {
    while (i < e && (c[i].cls & cls)) ++i;
    return i;
}

// Split 3, one attempt at position i; returns the match end, or i when no alternative matches.
// Alternatives are tried in order (leftmost-first, like a backtracking engine); each one's
// backtracking is resolved by hand in the comments.
size_t match_main(const cp_info* c, size_t i, size_t e) {
    using namespace unicode;
    const uint16_t ci = c[i].cls;
    const uint16_t cn = i + 1 < e ? c[i + 1].cls : 0;
    constexpr uint16_t lm = cls_letter | cls_mark;
    constexpr uint16_t ps = cls_punct | cls_symbol;
    // [!"#...~][A-Za-z]+
    if ((ci & cls_ascii_punct) && (cn & cls_ascii_alpha)) return run_end(c, i + 2, e, cls_ascii_alpha);
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : first with the optional char, then without it.
    if (!(ci & (cls_newline | cls_letter | ps)) && (cn & lm)) return run_end(c, i + 2, e, lm);
    if (ci & lm) return run_end(c, i + 1, e, lm);
    // ' ?[\p{P}\p{S}]+[\r\n]*'
    if ((ci & cls_ascii_space) && (cn & ps)) return run_end(c, run_end(c, i + 2, e, ps), e, cls_newline);
    if (ci & ps) return run_end(c, run_end(c, i + 1, e, ps), e, cls_newline);
    if (!(ci & cls_space)) return i;
    const size_t j = run_end(c, i, e, cls_space);
    // \s*[\r\n]+ : \s* gives back characters until one is a newline, so the match ends just
    // after the last newline of the whitespace run.
    for (size_t k = j; k > i; --k)
        if (c[k - 1].cls & cls_newline) return k;
    // \s+(?!\S) : the whole run at the end of the piece, else all but the last whitespace.
    if (j == e) return j;
    if (j - i >= 2) return j - 1;
    // \s+
    return j;
}

template <class F>
void split_main(const cp_info* c, size_t b, size_t e, F&& emit) {
    size_t gap = b, i = b;
    while (i < e) {
        const size_t m = match_main(c, i, e);
        if (m == i) {
            ++i;
            continue;
        }
        if (gap < i) emit(gap, i);
        emit(i, m);
        i = gap = m;
    }
    if (gap < e) emit(gap, e);
}

}  // namespace

struct tokenizer::impl {
    tokenizer_data data;
    std::vector<std::string> bytes;  // decoded bytes per id
    std::array<int32_t, 256> byte_id{};
    merge_table merges;
    // Added tokens in a byte trie, so finding the longest one at a position costs one step per
    // matching byte whatever the number of tokens (all 818 DeepSeek ones start with '<').
    struct trie_node {
        int32_t token = -1;  // id of the added token ending here
        uint32_t length = 0; // its length in bytes
        std::vector<std::pair<uint8_t, uint32_t>> kids;  // byte -> node index
    };
    std::vector<trie_node> trie{trie_node{}};  // node 0 is the root
    std::array<uint32_t, 256> root_kid{};       // first byte -> node index (0: none), the fast skip
    std::unordered_map<std::string, int32_t> added_lookup;
    void add_to_trie(std::string_view content, int32_t id);

    void encode_plain(std::string_view text, std::vector<int32_t>& out, scratch& s) const;
    void bpe(std::string_view piece, std::vector<int32_t>& out, scratch& s) const;
    void bpe_memo(std::string_view piece, std::vector<int32_t>& out, scratch& s) const;
    void bpe_small(std::string_view piece, std::vector<int32_t>& out, scratch& s) const;
    void bpe_large(std::string_view piece, std::vector<int32_t>& out, scratch& s) const;
    // Longest added token starting at text[pos]: its trie node, or nullptr.
    const trie_node* match_added(std::string_view text, size_t pos) const;
};

void tokenizer::impl::encode_plain(std::string_view text, std::vector<int32_t>& out, scratch& s) const {
    if (text.empty()) return;
    s.cps.clear();
    for (size_t pos = 0; pos < text.size();) {
        const auto b = uint8_t(text[pos]);
        if (b < 0x80) {
            s.cps.push_back({uint32_t(pos), char_classes(b)});
            ++pos;
            continue;
        }
        const auto d = unicode::decode_utf8(text, pos);
        // Invalid bytes (HF never sees them: its input is a Rust String) are kept as classless
        // characters so their bytes still go through byte-level BPE and round-trip.
        s.cps.push_back({uint32_t(pos), d.valid ? char_classes(d.cp) : uint16_t(0)});
        pos += d.len;
    }
    const size_t n = s.cps.size();
    s.cps.push_back({uint32_t(text.size()), 0});  // sentinel: end offset of the last code point
    const cp_info* c = s.cps.data();
    auto emit_piece = [&](size_t b, size_t e) {
        bpe_memo(text.substr(c[b].offset, c[e].offset - c[b].offset), out, s);
    };
    split_numbers(c, 0, n, [&](size_t b1, size_t e1) {
        split_cjk(c, b1, e1, [&](size_t b2, size_t e2) { split_main(c, b2, e2, emit_piece); });
    });
}

void tokenizer::impl::bpe_memo(std::string_view piece, std::vector<int32_t>& out, scratch& s) const {
    if (piece.size() < 2 || piece.size() > 64 || s.memo.empty()) return bpe(piece, out, s);
    const uint64_t h = hash_bytes(piece);
    const size_t mask = s.memo.size() - 1;
    size_t i = size_t(h) & mask;
    for (; s.memo[i].text; i = (i + 1) & mask) {
        const auto& m = s.memo[i];
        if (m.hash == h && m.len == piece.size() && std::memcmp(m.text, piece.data(), piece.size()) == 0) {
            out.insert(out.end(), s.memo_ids.begin() + m.ids_begin, s.memo_ids.begin() + m.ids_begin + m.ids_len);
            return;
        }
    }
    const size_t first = out.size();
    bpe(piece, out, s);
    if (s.memo_used * 2 >= s.memo.size()) {  // half full: start over rather than probe long
        std::fill(s.memo.begin(), s.memo.end(), scratch::memo_slot{});
        s.memo_ids.clear();
        s.memo_used = 0;
        i = size_t(h) & mask;
    }
    s.memo[i] = {piece.data(), uint32_t(piece.size()), uint32_t(s.memo_ids.size()), uint32_t(out.size() - first), h};
    s.memo_ids.insert(s.memo_ids.end(), out.begin() + ptrdiff_t(first), out.end());
    ++s.memo_used;
}

void tokenizer::impl::bpe(std::string_view piece, std::vector<int32_t>& out, scratch& s) const {
    MS_ASSERT(!piece.empty());
    if (piece.size() == 1) {
        out.push_back(byte_id[uint8_t(piece[0])]);
        return;
    }
    // Short pieces (nearly all of them) use flat arrays and a linear scan for the best pair;
    // long ones would be quadratic that way and use a heap over a linked list instead.
    if (piece.size() <= 64)
        bpe_small(piece, out, s);
    else
        bpe_large(piece, out, s);
}

void tokenizer::impl::bpe_small(std::string_view piece, std::vector<int32_t>& out, scratch& s) const {
    auto& ids = s.ids;
    auto& ranks = s.ranks;    // ranks[i]: rank of the pair (ids[i], ids[i+1])
    auto& merged = s.merged;  // merged[i]: id that pair becomes
    const size_t n0 = piece.size();
    ids.resize(n0);
    ranks.resize(n0 - 1);
    merged.resize(n0 - 1);
    for (size_t i = 0; i < n0; ++i) ids[i] = byte_id[uint8_t(piece[i])];
    auto set_pair = [&](size_t i) {
        const auto* m = merges.find(ids[i], ids[i + 1]);
        ranks[i] = m ? m->rank : no_rank;
        merged[i] = m ? m->id : -1;
    };
    for (size_t i = 0; i + 1 < n0; ++i) set_pair(i);
    size_t n = n0;
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; ++i)
            if (ranks[i] < ranks[best]) best = i;  // strict: the leftmost of equal ranks wins
        if (ranks[best] == no_rank) break;
        ids[best] = merged[best];
        const size_t tail = n - best - 2;  // elements after best+1
        std::memmove(&ids[best + 1], &ids[best + 2], tail * sizeof(int32_t));
        if (tail > 0) {
            std::memmove(&ranks[best + 1], &ranks[best + 2], (tail - 1) * sizeof(uint32_t));
            std::memmove(&merged[best + 1], &merged[best + 2], (tail - 1) * sizeof(int32_t));
        }
        --n;
        if (best + 1 < n) set_pair(best);
        if (best > 0) set_pair(best - 1);
    }
    out.insert(out.end(), ids.begin(), ids.begin() + ptrdiff_t(n));
}

void tokenizer::impl::bpe_large(std::string_view piece, std::vector<int32_t>& out, scratch& s) const {
    // HF's algorithm: a heap of candidate merges ordered by (rank, position); stale entries
    // (a side already merged, or the pair no longer produces the recorded id) are skipped.
    auto& sym = s.symbols;
    auto& heap = s.heap;
    const int32_t n = int32_t(piece.size());
    sym.resize(size_t(n));
    heap.clear();
    for (int32_t i = 0; i < n; ++i) sym[size_t(i)] = {byte_id[uint8_t(piece[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1, true};
    auto push_pair = [&](int32_t left) {
        const int32_t right = sym[size_t(left)].next;
        if (right < 0) return;
        if (const auto* m = merges.find(sym[size_t(left)].id, sym[size_t(right)].id)) {
            heap.push_back({m->rank, left, m->id});
            std::push_heap(heap.begin(), heap.end());
        }
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const auto top = heap.back();
        heap.pop_back();
        auto& left = sym[size_t(top.pos)];
        if (!left.alive || left.next < 0) continue;
        auto& right = sym[size_t(left.next)];
        const auto* m = merges.find(left.id, right.id);
        if (!m || m->id != top.id) continue;
        left.id = top.id;
        right.alive = false;
        left.next = right.next;
        if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
        if (left.prev >= 0) push_pair(left.prev);
        push_pair(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

void tokenizer::impl::add_to_trie(std::string_view content, int32_t id) {
    MS_ASSERT(!content.empty());
    uint32_t node = 0;
    for (char ch : content) {
        const auto b = uint8_t(ch);
        uint32_t next = 0;
        for (const auto& [kb, ki] : trie[node].kids)
            if (kb == b) next = ki;
        if (next == 0) {
            next = uint32_t(trie.size());
            trie[node].kids.emplace_back(b, next);  // before emplace_back below invalidates refs
            trie.emplace_back();
            if (node == 0) root_kid[b] = next;
        }
        node = next;
    }
    // A duplicate content keeps the first id, as HF's added vocabulary does.
    if (trie[node].token < 0) trie[node] = {id, uint32_t(content.size()), std::move(trie[node].kids)};
}

const tokenizer::impl::trie_node* tokenizer::impl::match_added(std::string_view text, size_t pos) const {
    const trie_node* best = nullptr;
    uint32_t node = root_kid[uint8_t(text[pos])];
    for (size_t i = pos + 1; node != 0; ++i) {
        if (trie[node].token >= 0) best = &trie[node];
        if (i == text.size()) break;
        uint32_t next = 0;
        for (const auto& [kb, ki] : trie[node].kids)
            if (kb == uint8_t(text[i])) next = ki;
        node = next;
    }
    return best;
}

// ---- public API -----------------------------------------------------------------------------

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

result<tokenizer> tokenizer::create(tokenizer_data data) {
    if (data.model != "gpt2")
        return make_error("tokenizer: unsupported model '" + data.model + "' (only byte-level BPE, gpt2)");
    const size_t n = data.tokens.size();
    if (n == 0) return make_error("tokenizer: empty vocabulary");
    if (n > size_t(std::numeric_limits<int32_t>::max())) return make_error("tokenizer: vocabulary too large");
    if (data.token_types.empty()) data.token_types.assign(n, int32_t(token_type::normal));
    if (data.token_types.size() != n)
        return make_error("tokenizer: " + std::to_string(data.token_types.size()) + " token types for " +
                          std::to_string(n) + " tokens");
    for (int32_t id : {data.bos_id, data.eos_id})
        if (id < 0 || size_t(id) >= n)
            return make_error("tokenizer: bos/eos id " + std::to_string(id) + " outside the vocabulary");

    auto p = std::make_unique<impl>();
    p->bytes.resize(n);
    std::unordered_map<std::string_view, int32_t> vocab;
    vocab.reserve(n * 2);
    for (size_t id = 0; id < n; ++id) {
        const std::string& tok = data.tokens[id];
        const auto type = token_type(data.token_types[id]);
        if (type == token_type::control || type == token_type::user_defined) {
            p->bytes[id] = tok;  // added tokens decode to their content
            continue;
        }
        if (type == token_type::unused) continue;  // placeholders decode to nothing
        vocab.emplace(tok, int32_t(id));  // the first id wins for a duplicate string
        std::string& out = p->bytes[id];
        for (size_t pos = 0; pos < tok.size();) {
            const auto d = unicode::decode_utf8(tok, pos);
            const int b = d.valid ? char_to_byte(d.cp) : -1;
            if (b >= 0)
                out.push_back(char(b));
            else
                out.append(tok, pos, d.len);  // not a byte-level character: keep it verbatim
            pos += d.len;
        }
    }
    for (int b = 0; b < 256; ++b) {
        auto it = vocab.find(unicode::to_utf8(byte_to_char()[b]));
        if (it == vocab.end())
            return make_error("tokenizer: the vocabulary has no token for byte " + std::to_string(b) +
                              " (not a byte-level BPE vocabulary)");
        p->byte_id[b] = it->second;
    }

    p->merges.reserve(data.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < data.merges.size(); ++rank) {
        const std::string& m = data.merges[rank];
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos || sp + 1 >= m.size())
            return make_error("tokenizer: merge " + std::to_string(rank) + " '" + m + "' is not 'LEFT RIGHT'");
        const std::string_view a(m.data(), sp), b(m.data() + sp + 1, m.size() - sp - 1);
        joined.assign(a).append(b);
        auto ia = vocab.find(a), ib = vocab.find(b), ij = vocab.find(joined);
        if (ia == vocab.end() || ib == vocab.end() || ij == vocab.end())
            return make_error("tokenizer: merge " + std::to_string(rank) + " '" + m +
                              "' uses a token missing from the vocabulary");
        p->merges.insert(ia->second, ib->second, uint32_t(rank), ij->second);
    }

    // The trie gives the leftmost-longest match (HF's aho-corasick MatchKind::LeftmostLongest).
    // HF matches non-normalized tokens in a first pass and normalized ones in a second; with
    // DeepSeek's empty normalizer that differs only if one added token could start inside
    // another, which "<｜...｜>" tokens cannot.
    for (size_t id = 0; id < n; ++id) {
        const auto type = token_type(data.token_types[id]);
        if ((type != token_type::control && type != token_type::user_defined) || data.tokens[id].empty()) continue;
        p->add_to_trie(data.tokens[id], int32_t(id));
        p->added_lookup.emplace(data.tokens[id], int32_t(id));
    }
    p->data = std::move(data);
    return tokenizer(std::move(p));
}

std::vector<int32_t> tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    scratch s;
    // The memo pays for its 512 KiB table only on texts long enough to repeat themselves.
    if (text.size() >= 16384) s.memo.resize(scratch::memo_slots);
    if (!parse_special || impl_->added_lookup.empty()) {
        impl_->encode_plain(text, out, s);
        return out;
    }
    size_t gap = 0;
    for (size_t pos = 0; pos < text.size();) {
        const impl::trie_node* t = impl_->root_kid[uint8_t(text[pos])] ? impl_->match_added(text, pos) : nullptr;
        if (!t) {
            ++pos;
            continue;
        }
        impl_->encode_plain(text.substr(gap, pos - gap), out, s);
        out.push_back(t->token);
        pos = gap = pos + t->length;
    }
    impl_->encode_plain(text.substr(gap), out, s);
    return out;
}

std::string tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids)
        if (id >= 0 && size_t(id) < impl_->bytes.size()) out += impl_->bytes[size_t(id)];
    return out;
}

std::string tokenizer::token_bytes(int32_t id) const {
    // Out-of-range ids (client input) decode to nothing rather than abort the server.
    if (id < 0 || size_t(id) >= impl_->bytes.size()) return {};
    return impl_->bytes[size_t(id)];
}

int32_t tokenizer::vocab_size() const { return int32_t(impl_->bytes.size()); }
const tokenizer_data& tokenizer::data() const { return impl_->data; }

int32_t tokenizer::find_added(std::string_view content) const {
    auto it = impl_->added_lookup.find(std::string(content));
    return it == impl_->added_lookup.end() ? -1 : it->second;
}

// ---- streaming decoder ----------------------------------------------------------------------

namespace {
// Appends `bytes` as valid UTF-8: each maximal invalid subpart becomes one U+FFFD.
void append_sanitized(std::string& out, std::string_view bytes) {
    for (size_t pos = 0; pos < bytes.size();) {
        const auto d = unicode::decode_utf8(bytes, pos);
        if (d.valid)
            out.append(bytes, pos, d.len);
        else
            unicode::append_utf8(out, unicode::replacement_char);
        pos += d.len;
    }
}
}  // namespace

std::string utf8_stream_decoder::push(std::string_view token_bytes) {
    pending_.append(token_bytes);
    const size_t keep = unicode::complete_prefix_length(pending_);
    std::string out;
    append_sanitized(out, std::string_view(pending_).substr(0, keep));
    pending_.erase(0, keep);
    return out;
}

std::string utf8_stream_decoder::finish() {
    std::string out;
    append_sanitized(out, pending_);
    pending_.clear();
    return out;
}

}  // namespace moestream
