#include "server/json_schema_automaton.h"

#include <algorithm>
#include <bit>

#include "config/assert.h"

namespace moestream::server {

namespace {

constexpr uint32_t k_none = json_schema::k_none;
constexpr uint32_t k_free_key = k_none - 1;  // frame.aux after the key: an undeclared key
constexpr size_t k_never = size_t(1) << 40;  // no completion (a thread about to die)

// What a thread is reading right now.
enum slot : uint8_t {
    s_container,  // structure: the top frame's phase says what comes next
    s_expect,     // a value of `node` comes next
    s_string,     // inside a string value
    s_number,     // inside a number
    s_other,      // true/false/null or a container the schema leaves free (the scalar automaton reads it)
    s_literal,    // inside one of `node`'s enum/const texts; count = its trie node
    s_done,       // the root value is complete
};
enum object_phase : uint8_t { o_open, o_next, o_key, o_colon, o_value, o_after };
enum array_phase : uint8_t { a_open, a_value, a_after };
constexpr uint8_t f_array = 1;     // frame flag: the container is an array
constexpr uint8_t f_free_key = 2;  // frame flag (object key): the key may still be an undeclared one

bool is_ws(uint8_t b) {
    return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}
bool is_digit(uint8_t b) {
    return b >= '0' && b <= '9';
}

}  // namespace

schema_automaton::schema_automaton(const json_schema* schema, json_limits limits)
    : schema_(schema), limits_(limits) {
    MS_ASSERT(schema_ && schema_->depth() <= k_frames);
    thread& t = t_[0];
    t = thread{};
    t.slot = s_expect;
    t.node = schema_->root();
    n_ = 1;
}

void schema_automaton::copy_from(const schema_automaton& o) {
    schema_ = o.schema_;
    limits_ = o.limits_;
    n_ = o.n_;
    for (int i = 0; i < n_; ++i) t_[size_t(i)] = o.t_[size_t(i)];
}

json_limits schema_automaton::scalar_limits(const thread& t) const {
    json_limits l = limits_;
    l.object_only = false;
    l.max_depth = uint8_t(std::max(1, int(limits_.max_depth) - int(t.depth)));
    return l;
}

bool schema_automaton::feed(std::string_view bytes) {
    schema_automaton next = *this;
    for (char c : bytes)
        if (!next.step(uint8_t(c))) return false;
    *this = next;
    return true;
}

bool schema_automaton::step(uint8_t b) {
    static thread_local forks spare;
    spare.clear();
    int alive = 0;
    for (int i = 0; i < n_; ++i) {
        thread& t = t_[size_t(i)];
        if (!step_thread(t, b, spare)) continue;
        if (alive != i) t_[size_t(alive)] = t;
        ++alive;
    }
    for (const thread& f : spare)
        if (alive < k_threads) t_[size_t(alive++)] = f;
    // Readings that arrived at the same state are one.
    for (int i = 1; i < alive; ++i)
        for (int j = 0; j < i; ++j)
            if (t_[size_t(i)] == t_[size_t(j)]) {
                t_[size_t(i)] = t_[size_t(--alive)];
                --i;
                break;
            }
    n_ = uint8_t(alive);
    return n_ > 0;
}

bool schema_automaton::complete() const {
    for (int i = 0; i < n_; ++i)
        if (t_[size_t(i)].slot == s_done) return true;
    return false;
}

// ---- stepping one thread ---------------------------------------------------------------------------

bool schema_automaton::step_thread(thread& t, uint8_t b, forks& f) const {
    if (!is_ws(b)) t.ws = 0;
    switch (t.slot) {
        case s_done:
            return false;
        case s_expect:
            if (is_ws(b)) return t.depth > 0 && whitespace(t);
            return start_value(t, t.node, b, f);
        case s_string:
            return string_byte(t, b);
        case s_number:
            return number_byte(t, b, f);
        case s_other:
            if (!t.scalar.step(b)) return false;
            if (t.scalar.complete()) value_done(t);
            return true;
        case s_literal:
            return literal_byte(t, b, f);
        case s_container:
            return container_byte(t, b, f);
    }
    return false;
}

bool schema_automaton::whitespace(thread& t) const {
    if (t.ws >= limits_.max_whitespace) return false;
    ++t.ws;
    return true;
}

bool schema_automaton::start_value(thread& t, uint32_t node, uint8_t b, forks& f) const {
    const auto& n = schema_->at(node);
    if (!n.is_union()) return start_plain(t, node, b);
    // Every alternative the first byte fits is followed; the first in place.
    const thread base = t;
    bool placed = false;
    for (uint32_t alt : n.alternatives) {
        thread c = base;
        if (!start_plain(c, alt, b)) continue;
        if (!placed)
            t = c, placed = true;
        else
            f.push_back(c);
    }
    return placed;
}

bool schema_automaton::start_scalar(thread& t, uint32_t node, uint8_t slot, uint8_t b) const {
    t.slot = slot;
    t.node = node;
    t.scalar = json_automaton(scalar_limits(t));
    return t.scalar.step(b);
}

bool schema_automaton::start_plain(thread& t, uint32_t node, uint8_t b) const {
    using namespace schema_types;
    const auto& n = schema_->at(node);
    if (n.literals != k_none) {
        const uint32_t c = schema_->child(n.literals, b);
        if (c == 0) return false;
        t.slot = s_literal;
        t.node = node;
        t.count = c;
        if (schema_->trie(c).end && schema_->trie(c).first_child == 0) value_done(t);
        return true;
    }
    switch (b) {
        case '{':
            if (!(n.types & object)) return false;
            return n.free_object ? start_scalar(t, node, s_other, b) : push(t, node, false);
        case '[':
            if (!(n.types & array)) return false;
            return n.free_array ? start_scalar(t, node, s_other, b) : push(t, node, true);
        case '"':
            if (!(n.types & string)) return false;
            t.count = 0;
            return start_scalar(t, node, s_string, b);
        case 't':
        case 'f':
            if (!(n.types & boolean)) return false;
            return start_scalar(t, node, s_other, b);
        case 'n':
            if (!(n.types & null)) return false;
            return start_scalar(t, node, s_other, b);
        default:
            if (b != '-' && !is_digit(b)) return false;
            if (!(n.types & number)) return false;
            t.number = {};
            return start_scalar(t, node, s_number, b) && track_number(t, b);
    }
}

bool schema_automaton::push(thread& t, uint32_t node, bool array) const {
    if (t.depth >= k_frames) return false;
    frame& fr = t.frames[t.depth++];
    fr = frame{};
    fr.node = uint16_t(node);
    fr.flags = array ? f_array : 0;
    fr.phase = array ? uint8_t(a_open) : uint8_t(o_open);
    t.slot = s_container;
    return true;
}

bool schema_automaton::pop(thread& t) const {
    MS_ASSERT(t.depth > 0);
    t.frames[--t.depth] = frame{};
    value_done(t);
    return true;
}

void schema_automaton::value_done(thread& t) const {
    t.ws = 0;
    t.count = 0;
    t.node = 0;
    t.number = {};
    t.number_rest = 0;
    t.scalar = json_automaton();
    if (t.depth == 0) {
        t.slot = s_done;
        return;
    }
    frame& fr = t.frames[t.depth - 1];
    if (fr.flags & f_array) {
        fr.phase = a_after;
        if (fr.pos < 0xFFFF) ++fr.pos;
    } else {
        fr.phase = o_after;
    }
    t.slot = s_container;
}

bool schema_automaton::string_byte(thread& t, uint8_t b) const {
    const bool between_characters = t.scalar.in_string_text();
    if (!t.scalar.step(b)) return false;
    const auto& n = schema_->at(t.node);
    if (t.scalar.complete()) {  // the closing quote
        if (t.count < n.min_length) return false;
        value_done(t);
        return true;
    }
    if (between_characters) {  // a character (or an escape) starts: counted at its first byte
        if (t.count >= n.max_length) return false;
        ++t.count;
    }
    return true;
}

bool schema_automaton::track_number(thread& t, uint8_t b) const {
    const auto& n = schema_->at(t.node);
    if ((b == '.' || b == 'e' || b == 'E') && n.integer) return false;
    if (!n.bounded) return true;
    if (b == 'e' || b == 'E') return false;  // bounds are checked on plain decimals
    auto& p = t.number;
    if (b == '-') {
        p.negative = true;
    } else if (b == '.') {
        p.fraction = true;
    } else if (p.fraction) {
        p.frac_value = p.frac_value * 10 + uint64_t(b - '0');
        ++p.frac_digits;
    } else {
        p.int_value = p.int_value * 10 + uint64_t(b - '0');
        ++p.int_digits;
    }
    t.number_rest = json_schema::number_rest(n, p);
    return t.number_rest != k_none;
}

bool schema_automaton::number_byte(thread& t, uint8_t b, forks& f) const {
    json_automaton next = t.scalar;
    if (next.step(b)) {
        t.scalar = next;
        return track_number(t, b);
    }
    // `b` is not part of the number: the number ends before it, if it may.
    if (!t.scalar.complete()) return false;
    if (schema_->at(t.node).bounded && t.number_rest != 0) return false;
    value_done(t);
    return container_byte(t, b, f);
}

bool schema_automaton::literal_byte(thread& t, uint8_t b, forks& f) const {
    if (const uint32_t c = schema_->child(t.count, b); c != 0) {
        t.count = c;
        if (schema_->trie(c).end && schema_->trie(c).first_child == 0) value_done(t);
        return true;
    }
    // A text that is a prefix of a longer one (numbers: 1 and 12) ends before `b`.
    if (!schema_->trie(t.count).end) return false;
    value_done(t);
    return container_byte(t, b, f);
}

bool schema_automaton::container_byte(thread& t, uint8_t b, forks& f) const {
    if (t.slot != s_container || t.depth == 0) return false;
    frame& fr = t.frames[t.depth - 1];
    return (fr.flags & f_array) ? array_byte(t, fr, b, f) : object_byte(t, fr, b);
}

uint64_t schema_automaton::allowed_properties(const frame& fr) const {
    const auto& n = schema_->at(fr.node);
    const size_t np = n.properties.size();
    if (fr.pos >= np) return 0;
    // From the next one up to the next required one: properties come in the schema's order.
    const size_t last = std::min<size_t>(n.next_required[fr.pos], np - 1);
    const size_t width = last - fr.pos + 1;
    const uint64_t ones = width >= 64 ? ~uint64_t(0) : (uint64_t(1) << width) - 1;
    return ones << fr.pos;
}

bool schema_automaton::free_key_allowed(const frame& fr) const {
    const auto& n = schema_->at(fr.node);
    return n.additional != k_none && n.next_required[fr.pos] == n.properties.size();
}

bool schema_automaton::begin_key(thread& t, frame& fr) const {
    const auto& n = schema_->at(fr.node);
    const bool free = free_key_allowed(fr);
    if (fr.pos >= n.properties.size() && !free) return false;
    t.scalar = json_automaton(scalar_limits(t));
    const bool quote = t.scalar.step('"');
    MS_ASSERT(quote);
    fr.phase = o_key;
    fr.aux = n.key_trie;
    fr.flags = free ? f_free_key : 0;
    return true;
}

bool schema_automaton::key_byte(thread& t, frame& fr, uint8_t b) const {
    json_automaton next = t.scalar;
    if (!next.step(b)) return false;
    if (next.complete()) {  // the closing quote: which property is this?
        const int16_t declared = fr.aux != k_none ? schema_->trie(fr.aux).property : int16_t(-1);
        if (declared >= 0) {
            // A declared name is that property or nothing (never an undeclared key).
            if (!(allowed_properties(fr) & (uint64_t(1) << declared))) return false;
            fr.aux = uint32_t(declared);
            fr.pos = uint16_t(declared + 1);
        } else if (fr.flags & f_free_key) {
            fr.aux = k_free_key;
        } else {
            return false;
        }
        fr.phase = o_colon;
        fr.flags = 0;
        t.scalar = json_automaton();
        return true;
    }
    if (b == '\\') fr.flags &= uint8_t(~f_free_key);  // undeclared keys are written without escapes
    if (fr.aux != k_none) {
        const uint32_t c = schema_->child(fr.aux, b);
        fr.aux = c != 0 ? c : k_none;
    }
    const bool declared_possible =
        fr.aux != k_none && (schema_->trie(fr.aux).below & allowed_properties(fr)) != 0;
    if (!declared_possible && !(fr.flags & f_free_key)) return false;
    t.scalar = next;
    return true;
}

bool schema_automaton::object_byte(thread& t, frame& fr, uint8_t b) const {
    const auto& n = schema_->at(fr.node);
    const bool no_required_left = n.next_required[fr.pos] == n.properties.size();
    if (fr.phase == o_key) return key_byte(t, fr, b);
    if (is_ws(b)) return fr.phase != o_value && whitespace(t);
    switch (fr.phase) {
        case o_open:
            if (b == '}') return no_required_left && pop(t);
            return b == '"' && begin_key(t, fr);
        case o_next:
            return b == '"' && begin_key(t, fr);
        case o_colon:
            if (b != ':') return false;
            fr.phase = o_value;
            t.slot = s_expect;
            t.node = fr.aux == k_free_key ? n.additional : n.properties[fr.aux].node;
            return true;
        case o_after:
            if (b == '}') return no_required_left && pop(t);
            if (b != ',') return false;
            if (fr.pos >= n.properties.size() && !free_key_allowed(fr)) return false;
            fr.phase = o_next;
            return true;
        default:
            return false;
    }
}

bool schema_automaton::array_byte(thread& t, frame& fr, uint8_t b, forks& f) const {
    const auto& n = schema_->at(fr.node);
    if (fr.phase == a_value) return false;
    if (is_ws(b)) return whitespace(t);
    if (b == ']') return fr.pos >= n.min_items && pop(t);
    if (fr.phase == a_after) {
        if (b != ',' || fr.pos >= n.max_items) return false;
        fr.phase = a_value;
        t.slot = s_expect;
        t.node = n.items;
        return true;
    }
    // a_open: the first item starts with this byte.
    if (n.max_items == 0) return false;
    fr.phase = a_value;
    t.slot = s_expect;
    t.node = n.items;
    return start_value(t, n.items, b, f);
}

// ---- costs -------------------------------------------------------------------------------------

size_t schema_automaton::min_bytes_to_complete() const {
    size_t best = k_never;
    for (int i = 0; i < n_; ++i) best = std::min(best, thread_cost(t_[size_t(i)]));
    MS_ASSERT_MSG(n_ == 0 || best < k_never, "schema_automaton: a live state with no completion");
    return best;
}

size_t schema_automaton::thread_cost(const thread& t) const {
    size_t c = 0;
    switch (t.slot) {
        case s_done:
            return 0;
        case s_container:
            break;
        case s_expect:
            c = schema_->at(t.node).min_bytes;
            break;
        case s_string: {
            const auto& n = schema_->at(t.node);
            c = t.scalar.min_bytes_to_complete() + (t.count < n.min_length ? n.min_length - t.count : 0);
            break;
        }
        case s_number:
            c = schema_->at(t.node).bounded ? t.number_rest : t.scalar.min_bytes_to_complete();
            break;
        case s_other:
            c = t.scalar.min_bytes_to_complete();
            break;
        case s_literal:
            c = schema_->trie(t.count).min_rest;
            break;
    }
    for (int i = 0; i < t.depth; ++i) c += frame_rest(t, t.frames[size_t(i)], i + 1 == t.depth);
    return c;
}

// The cheapest way to finish the key being read, its value and the object's required rest
// (without the closing brace).
size_t schema_automaton::key_rest(const thread& t, const frame& fr, bool) const {
    const auto& n = schema_->at(fr.node);
    size_t best = k_never;
    if (fr.aux != k_none) {
        const auto& tn = schema_->trie(fr.aux);
        for (uint64_t m = tn.below & allowed_properties(fr); m != 0; m &= m - 1) {
            const int j = std::countr_zero(m);
            const auto& p = n.properties[size_t(j)];
            // rest of the key, '"', ':', the value, the required entries after it
            best = std::min(best, (p.key.size() - tn.depth) + 2 + schema_->at(p.node).min_bytes +
                                      n.required_rest[size_t(j) + 1]);
        }
    }
    if (fr.flags & f_free_key) best = std::min(best, free_key_rest(t, fr, false));
    return best;
}

// Finishing the key as an undeclared one: close it (one more character first when it reads as a
// declared name so far, or `assume_exact`), ':', the additional value, the required rest.
size_t schema_automaton::free_key_rest(const thread& t, const frame& fr, bool assume_exact) const {
    const auto& n = schema_->at(fr.node);
    size_t close = t.scalar.min_bytes_to_complete();
    const bool exact = fr.aux != k_none && schema_->trie(fr.aux).property >= 0;
    if (exact || assume_exact) close = std::max<size_t>(close, 2);
    return close + 1 + schema_->at(n.additional).min_bytes + n.required_rest[fr.pos];
}

size_t schema_automaton::frame_rest(const thread& t, const frame& fr, bool top) const {
    const auto& n = schema_->at(fr.node);
    if (fr.flags & f_array) {
        const size_t item = schema_->at(n.items).min_bytes;
        const size_t done = fr.pos + (fr.phase == a_value ? 1 : 0);  // the item being written counts
        const size_t need = n.min_items > done ? n.min_items - done : 0;
        if (fr.phase == a_open) return 1 + (need > 0 ? need * (item + 1) - 1 : 0);
        return 1 + need * (item + 1);
    }
    const size_t np = n.properties.size();
    const size_t required = n.required_rest[fr.pos];
    switch (fr.phase) {
        case o_open:
            return 1 + (required > 0 ? required - 1 : 0);
        case o_next: {
            if (n.next_required[fr.pos] < np) return 1 + required - 1;
            // Only optional entries remain, and one must come after the comma: the cheapest.
            size_t best = k_never;
            for (size_t j = fr.pos; j < np; ++j)
                best = std::min(best,
                                n.properties[j].key.size() + 3 + schema_->at(n.properties[j].node).min_bytes);
            if (free_key_allowed(fr))
                best = std::min<size_t>(best, n.free_key_min + 3 + schema_->at(n.additional).min_bytes);
            return 1 + best;
        }
        case o_key:
            return 1 + key_rest(t, fr, top);
        case o_colon: {
            const uint32_t v = fr.aux == k_free_key ? n.additional : n.properties[fr.aux].node;
            return 1 + schema_->at(v).min_bytes + required + 1;
        }
        case o_value:
        case o_after:
            return required + 1;
    }
    return k_never;
}

// ---- the mask shortcut ---------------------------------------------------------------------------

schema_automaton::text_run schema_automaton::string_text(uint64_t limit) const {
    text_run run;
    if (limits_.banned_char != 0 && limits_.banned_char != U'\uFF5C')
        return run;  // token_table's text is that
    for (int i = 0; i < n_; ++i) {
        const thread& t = t_[size_t(i)];
        if (t.slot == s_string && t.scalar.in_string_text()) {
            const auto& n = schema_->at(t.node);
            const size_t cost = thread_cost(t);
            // A text token of k characters lowers the cost by min(k, characters still needed).
            const bool lowers = t.count < n.min_length;
            if (cost > limit && !(lowers && cost - 1 <= limit)) continue;
            const uint32_t room = n.max_length - t.count;
            run.plain_chars = std::max(run.plain_chars, room);
            run.escaped = true;
            run.escaped_chars = std::max(run.escaped_chars, room);
            continue;
        }
        if (t.slot == s_other && t.scalar.in_string_text()) {  // a string inside a free container
            if (thread_cost(t) <= limit) {
                run.plain_chars = run.escaped_chars = 0xFFFFFFFFu;
                run.escaped = true;
            }
            continue;
        }
        if (t.slot == s_container && t.depth > 0) {
            const frame& fr = t.frames[t.depth - 1];
            if (!(fr.flags & f_array) && fr.phase == o_key && (fr.flags & f_free_key) &&
                t.scalar.in_string_text()) {
                // Any plain text keeps an undeclared key going; after it the key may read as a
                // declared name, which costs one more character.
                size_t cost = free_key_rest(t, fr, true) + 1;
                for (int k = 0; k + 1 < t.depth; ++k) cost += frame_rest(t, t.frames[size_t(k)], false);
                if (cost <= limit) run.plain_chars = 0xFFFFFFFFu;
                continue;
            }
        }
        return text_run{};  // this thread is not in a string's text: every token needs a walk
    }
    run.applies = true;
    return run;
}

}  // namespace moestream::server
