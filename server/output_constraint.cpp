#include "server/output_constraint.h"

#include <algorithm>
#include <limits>
#include <map>

#include "config/assert.h"

namespace moestream::server {

namespace {

constexpr char32_t k_marker_bar = U'\uFF5C';
constexpr uint32_t k_infinite = std::numeric_limits<uint32_t>::max() / 4;
constexpr uint8_t k_fired = 0xF0;  // watch_ values from here: trigger (value - k_fired) completed

constexpr std::string_view k_calls_begin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view k_calls_end = "<｜tool▁calls▁end｜>";
constexpr std::string_view k_call_begin = "<｜tool▁call▁begin｜>";
constexpr std::string_view k_call_end = "<｜tool▁call▁end｜>";
constexpr std::string_view k_sep = "<｜tool▁sep｜>";
constexpr std::string_view k_think_open = "<think>";
constexpr std::string_view k_think_close = "</think>";

uint32_t add_cost(uint32_t a, uint32_t b) { return std::min(a + b, k_infinite); }

}  // namespace

// ---- construction ------------------------------------------------------------------------------

output_constraint::output_constraint(std::shared_ptr<const token_table> table, std::vector<piece> pieces,
                                     std::vector<int32_t> markers, constraint_limits limits)
    : table_(std::move(table)), pieces_(std::move(pieces)), markers_(std::move(markers)), limits_(limits) {
    MS_ASSERT(table_ && !pieces_.empty());
    const size_t n = pieces_.size();
    text_cost_.resize(n);
    name_root_.assign(n, 0);
    names_.push_back({});  // index 0 is never a child, so 0 can mean "none" in the links
    for (size_t i = 0; i < n; ++i) {
        const piece& p = pieces_[i];
        switch (p.kind) {
            case piece::text: {
                const std::string& s = p.literal;
                MS_ASSERT(!s.empty());
                // Tokens to finish the text from each position: a marker not yet started is one
                // token; any other byte, and each byte left of a started marker, one each.
                auto& cost = text_cost_[i];
                struct span {
                    size_t begin, end;
                };
                std::vector<span> spans;
                for (size_t pos = 0; pos < s.size();) {
                    size_t end = pos + 1;
                    for (int32_t m : markers_) {
                        const auto mb = table_->bytes(m);
                        if (!mb.empty() && std::string_view(s).substr(pos).starts_with(mb)) end = pos + mb.size();
                    }
                    spans.push_back({pos, end});
                    pos = end;
                }
                cost.assign(s.size() + 1, 0);
                for (auto sp = spans.rbegin(); sp != spans.rend(); ++sp) {
                    cost[sp->begin] = cost[sp->end] + 1;
                    for (size_t q = sp->begin + 1; q < sp->end; ++q) cost[q] = cost[sp->end] + uint32_t(sp->end - q);
                }
                break;
            }
            case piece::name:
                MS_ASSERT(!p.names.empty() && (p.targets.empty() || p.targets.size() == p.names.size()));
                build_name_trie(i);
                break;
            case piece::json:
                MS_ASSERT_MSG(limits_.json.object_only, "output_constraint: the JSON piece must be an object");
                break;
            case piece::free:
                MS_ASSERT_MSG(i == 0, "output_constraint: free text comes first");
                if (p.reasoning_closes)
                    MS_ASSERT(p.reasoning == reasoning_start::open && p.triggers.empty() && p.targets.empty());
                else
                    MS_ASSERT(!p.triggers.empty() && (p.targets.empty() || p.targets.size() == p.triggers.size()));
                build_free_watch(p);
                break;
        }
    }
    settle_costs();
    enter(cur_, 0);
    stack_.resize(table_->max_length() + 1);
    over_limit_ = limits_.max_tokens > 0 && int64_t(cost_of(cur_)) > limits_.max_tokens;
}

uint32_t output_constraint::after(uint32_t piece, uint32_t next) const {
    const uint32_t n = uint32_t(pieces_.size());
    if (next == k_end) return n;
    if (next == k_next) return piece + 1;
    MS_ASSERT(next <= n);
    return next;
}

void output_constraint::build_name_trie(size_t i) {
    const piece& p = pieces_[i];
    const uint32_t root = uint32_t(names_.size());
    names_.push_back({});
    name_root_[i] = root;
    for (size_t k = 0; k < p.names.size(); ++k) {
        const std::string& name = p.names[k];
        MS_ASSERT(!name.empty());
        uint32_t at = root;
        for (char ch : name) {
            uint32_t child = names_[at].first_child;
            while (child != 0 && names_[child].byte != uint8_t(ch)) child = names_[child].next_sibling;
            if (child == 0) {
                child = uint32_t(names_.size());
                name_node node;
                node.byte = uint8_t(ch);
                node.next_sibling = names_[at].first_child;
                names_.push_back(node);
                names_[at].first_child = child;
            }
            at = child;
        }
        MS_ASSERT_MSG(!names_[at].is_end, "output_constraint: duplicate name");
        names_[at].is_end = true;
        names_[at].target = after(uint32_t(i), p.targets.empty() ? k_next : p.targets[k]);
        // A name ending where a longer one goes on is decided by the next byte, which must then
        // belong to the target.
        if (names_[at].first_child != 0 && names_[at].target < pieces_.size()) {
            const piece& t = pieces_[names_[at].target];
            MS_ASSERT_MSG(t.kind == piece::text, "output_constraint: a name that is a prefix must be followed by text");
            for (uint32_t c = names_[at].first_child; c != 0; c = names_[c].next_sibling)
                MS_ASSERT_MSG(names_[c].byte != uint8_t(t.literal[0]), "output_constraint: ambiguous name end");
        }
    }
}

// The output parser's view of free text (server/output_parser.h), as a byte automaton: where
// "<think>" may open the reasoning at the very start, the reasoning up to "</think>", and the
// content, watched for the triggers. A state is a phase and the text that may still become a
// marker.
void output_constraint::build_free_watch(const piece& p) {
    enum phase_t { start, reasoning, content };
    struct state {
        phase_t phase;
        std::string held;
        bool operator<(const state& o) const { return phase != o.phase ? phase < o.phase : held < o.held; }
    };
    std::map<state, uint8_t> ids;
    std::vector<state> states;
    auto id_of = [&](const state& s) {
        auto [it, added] = ids.emplace(s, uint8_t(states.size()));
        if (added) {
            MS_ASSERT_MSG(states.size() < k_fired, "output_constraint: too many watch states");
            states.push_back(s);
        }
        return it->second;
    };
    // Content: the longest suffix of `text` that may still become a trigger; or a trigger fired.
    auto content_after = [&](const std::string& text, int& fired) {
        fired = -1;
        for (size_t k = 0; k < p.triggers.size(); ++k)
            if (text.ends_with(p.triggers[k])) fired = int(k);
        if (fired >= 0) return std::string();
        for (size_t len = std::min(text.size(), size_t(64)); len > 0; --len) {
            const std::string_view tail = std::string_view(text).substr(text.size() - len);
            for (const auto& t : p.triggers)
                if (t.size() > len && std::string_view(t).starts_with(tail)) return std::string(tail);
        }
        return std::string();
    };
    const state first = p.reasoning == reasoning_start::may_open ? state{start, ""}
                        : p.reasoning == reasoning_start::open   ? state{reasoning, ""}
                                                                 : state{content, ""};
    watch_start_ = id_of(first);
    for (size_t s = 0; s < states.size(); ++s) {  // states grows as they are found
        watch_.resize(states.size() * 256);
        for (int b = 0; b < 256; ++b) {
            const state cur = states[s];
            const std::string text = cur.held + char(b);
            uint8_t to = 0;
            int fired = -1;
            if (cur.phase == start) {
                if (std::string_view(k_think_open).starts_with(text)) {
                    to = text == k_think_open ? id_of({reasoning, ""}) : id_of({start, text});
                } else {
                    // Not the reasoning: all of it is content.
                    const std::string held = content_after(text, fired);
                    to = fired >= 0 ? uint8_t(k_fired + fired) : id_of({content, held});
                }
            } else if (cur.phase == reasoning) {
                if (text.ends_with(k_think_close)) {
                    to = p.reasoning_closes ? k_fired : id_of({content, ""});
                } else {
                    std::string held;
                    for (size_t len = std::min(text.size(), k_think_close.size() - 1); len > 0; --len) {
                        const std::string_view tail = std::string_view(text).substr(text.size() - len);
                        if (std::string_view(k_think_close).starts_with(tail)) {
                            held = std::string(tail);
                            break;
                        }
                    }
                    to = id_of({reasoning, held});
                }
            } else {
                const std::string held = content_after(text, fired);
                to = fired >= 0 ? uint8_t(k_fired + fired) : id_of({content, held});
            }
            watch_.resize(states.size() * 256);
            watch_[s * 256 + size_t(b)] = to;
        }
    }
    // Roots: nothing held in the reasoning or the content; every trigger and "</think>" start
    // with '<', so a token without one stays there.
    watch_root_.assign(states.size(), 0);
    watch_close_left_.assign(states.size(), 0);
    for (size_t s = 0; s < states.size(); ++s)
        if (states[s].phase == reasoning) watch_close_left_[s] = uint8_t(k_think_close.size() - states[s].held.size());
    for (size_t s = 0; s < states.size(); ++s) {
        if (states[s].phase == start || !states[s].held.empty()) continue;
        for (const auto& t : p.triggers) MS_ASSERT(!t.empty() && t[0] == '<');
        watch_root_[s] = 1;
    }
}

// What it costs to finish the output from the start of each piece: the cheapest path to the end
// (names and triggers may lead back, so it is settled by relaxation).
void output_constraint::settle_costs() {
    const size_t n = pieces_.size();
    entry_cost_.assign(n + 1, k_infinite);
    entry_cost_[n] = 0;
    auto name_rest = [&](size_t i) {
        // Children come after their parent: one backward pass settles every minimum below the root.
        // A name piece's nodes run from its root to the next name piece's.
        const uint32_t root = name_root_[i];
        uint32_t last = uint32_t(names_.size());
        for (size_t k = i + 1; k < n; ++k)
            if (pieces_[k].kind == piece::name) {
                last = name_root_[k];
                break;
            }
        for (uint32_t k = last; k-- > root;) {
            name_node& node = names_[k];
            uint32_t best = node.is_end ? entry_cost_[node.target] : k_infinite;
            for (uint32_t c = node.first_child; c != 0; c = names_[c].next_sibling)
                best = std::min(best, add_cost(names_[c].min_rest, 1));
            node.min_rest = best;
        }
        // An unstarted name that is a marker costs its one token.
        for (size_t k = 0; k < pieces_[i].names.size(); ++k)
            for (int32_t m : markers_)
                if (table_->bytes(m) == pieces_[i].names[k]) {
                    const auto& targets = pieces_[i].targets;
                    const uint32_t target = after(uint32_t(i), targets.empty() ? k_next : targets[k]);
                    names_[root].min_rest = std::min(names_[root].min_rest, add_cost(entry_cost_[target], 1));
                }
        return names_[root].min_rest;
    };
    for (size_t round = 0; round <= n + 1; ++round) {
        bool changed = false;
        for (size_t i = n; i-- > 0;) {
            const piece& p = pieces_[i];
            uint32_t c = k_infinite;
            switch (p.kind) {
                case piece::text: c = add_cost(text_cost_[i][0], entry_cost_[after(uint32_t(i), p.next)]); break;
                case piece::json: {
                    const uint32_t own = p.schema ? p.schema->at(p.schema->root()).min_bytes : 2;  // "{}"
                    c = add_cost(own, entry_cost_[after(uint32_t(i), p.next)]);
                    break;
                }
                case piece::name: c = name_rest(i); break;
                case piece::free:  // free text may end at any token; the reasoning at its closing
                    c = p.reasoning_closes ? add_cost(uint32_t(k_think_close.size()), entry_cost_[i + 1]) : 0;
                    break;
            }
            if (c != entry_cost_[i]) entry_cost_[i] = c, changed = true;
        }
        if (!changed) break;
    }
    for (size_t i = 0; i < n; ++i) MS_ASSERT_MSG(entry_cost_[i] < k_infinite, "output_constraint: a piece never ends");
}

void output_constraint::enter(cursor& c, uint32_t piece) const {
    c.piece = piece;
    c.pos = 0;
    c.schema = schema_automaton();
    if (piece >= pieces_.size()) return;
    const struct piece& p = pieces_[piece];
    if (p.kind == piece::name) c.pos = name_root_[piece];
    if (p.kind == piece::free) c.pos = watch_start_;
    if (p.kind == piece::json) {
        if (p.schema) c.schema = schema_automaton(p.schema.get(), limits_.json);
        else c.json = json_automaton(limits_.json);
    }
}

// ---- stepping ----------------------------------------------------------------------------------

bool output_constraint::step(cursor& c, uint8_t b) const {
    for (;;) {
        if (c.piece >= pieces_.size()) return false;
        const piece& p = pieces_[c.piece];
        switch (p.kind) {
            case piece::text:
                if (uint8_t(p.literal[c.pos]) != b) return false;
                if (++c.pos == p.literal.size()) enter(c, after(c.piece, p.next));
                return true;
            case piece::name: {
                const name_node& node = names_[c.pos];
                for (uint32_t ch = node.first_child; ch != 0; ch = names_[ch].next_sibling) {
                    if (names_[ch].byte != b) continue;
                    c.pos = ch;
                    // A name nothing can extend is complete at its last byte.
                    if (names_[ch].is_end && names_[ch].first_child == 0) enter(c, names_[ch].target);
                    return true;
                }
                if (!node.is_end) return false;
                enter(c, node.target);  // the name is complete: `b` belongs to what follows
                continue;
            }
            case piece::json: {
                bool complete = false;
                if (p.schema) {
                    if (!c.schema.step(b)) return false;
                    complete = c.schema.complete();
                } else {
                    if (!c.json.step(b)) return false;
                    complete = c.json.complete();
                }
                ++c.json_bytes;
                if (complete) enter(c, after(c.piece, p.next));
                return true;
            }
            case piece::free: {
                const uint8_t to = watch_[size_t(c.pos) * 256 + b];
                if (to >= k_fired) {
                    const size_t trigger = to - k_fired;
                    enter(c, after(c.piece, p.targets.empty() ? k_next : p.targets[trigger]));
                } else {
                    c.pos = to;
                }
                return true;
            }
        }
        return false;
    }
}

bool output_constraint::feed(cursor& c, std::string_view bytes) const {
    for (char b : bytes)
        if (!step(c, uint8_t(b))) return false;
    return true;
}

uint32_t output_constraint::cost_of(const cursor& c) const {
    if (c.piece >= pieces_.size()) return 0;
    const piece& p = pieces_[c.piece];
    switch (p.kind) {
        case piece::text: return add_cost(text_cost_[c.piece][c.pos], entry_cost_[after(c.piece, p.next)]);
        case piece::name: return names_[c.pos].min_rest;
        case piece::json: {
            const size_t own = p.schema ? c.schema.min_bytes_to_complete() : c.json.min_bytes_to_complete();
            return add_cost(uint32_t(std::min<size_t>(own, k_infinite)), entry_cost_[after(c.piece, p.next)]);
        }
        case piece::free:
            return p.reasoning_closes ? add_cost(watch_close_left_[c.pos], entry_cost_[c.piece + 1]) : 0;
    }
    return 0;
}

bool output_constraint::closing() const {
    if (over_limit_ || cur_.json_bytes >= limits_.json_budget_bytes) return true;
    return limits_.max_tokens > 0 && limits_.max_tokens - accepted_ < int64_t(cost_of(cur_));
}

uint64_t output_constraint::cost_limit() const {
    const uint32_t now = cost_of(cur_);
    if (closing()) return now == 0 ? 0 : now - 1;
    // Room for the shortest ending after this token.
    if (limits_.max_tokens > 0) return uint64_t(std::max<int64_t>(0, limits_.max_tokens - accepted_ - 1));
    return std::numeric_limits<uint64_t>::max();
}

bool output_constraint::done() const { return cur_.piece >= pieces_.size(); }

// ---- the mask ----------------------------------------------------------------------------------

void output_constraint::mark_one(int32_t id, uint64_t limit, std::span<uint8_t> mask) const {
    if (size_t(id) >= mask.size()) return;
    cursor c = cur_;
    mask[size_t(id)] = feed(c, table_->bytes(id)) && cost_of(c) <= limit ? 1 : 0;
}

void output_constraint::allowed(std::span<uint8_t> mask) const {
    std::fill(mask.begin(), mask.end(), uint8_t(0));
    if (done()) return;
    const token_table& t = *table_;
    const size_t vocab = std::min(mask.size(), size_t(t.vocab()));
    const uint64_t limit = cost_limit();
    const piece& p = pieces_[cur_.piece];
    if (p.kind == piece::free) {
        allowed_free(mask, limit);
        return;
    }
    // Inside a string's text, most tokens are plain text: they leave the state (and the cost)
    // as it is (within a schema: but for the length), so they are decided together; the rest
    // are evaluated one by one.
    bool text_decided = false;
    if (p.kind == piece::json && p.schema) {
        // The schema's costs are the JSON's alone: what follows it is on top.
        const uint64_t tail = entry_cost_[after(cur_.piece, p.next)];
        const auto run = limit >= tail ? cur_.schema.string_text(limit - tail) : schema_automaton::text_run{true};
        text_decided = run.applies;
        if (run.applies && run.escaped && run.plain_chars == 0xFFFFFFFFu && run.escaped_chars == 0xFFFFFFFFu) {
            std::copy_n(t.string_text_mask().begin(), vocab, mask.begin());
        } else if (run.applies) {
            for (int32_t id : t.plain_text_upto(run.plain_chars))
                if (size_t(id) < vocab) mask[size_t(id)] = 1;
            if (run.escaped)
                for (int32_t id : t.escaped_text_upto(run.escaped_chars))
                    if (size_t(id) < vocab) mask[size_t(id)] = 1;
        }
    } else if (p.kind == piece::json) {
        const auto& json = cur_.json;
        text_decided = json.in_string_text() &&
                       (json.limits().banned_char == 0 || json.limits().banned_char == k_marker_bar);
        if (text_decided && cost_of(cur_) <= limit) std::copy_n(t.string_text_mask().begin(), vocab, mask.begin());
    }
    for (int32_t m : markers_) mark_one(m, limit, mask);
    mark(text_decided ? t.other_than_string_text() : t.ordinary_tokens(), limit, mask);
}

void output_constraint::allowed_free(std::span<uint8_t> mask, uint64_t limit) const {
    const token_table& t = *table_;
    const size_t vocab = std::min(mask.size(), size_t(t.vocab()));
    if (watch_root_[cur_.pos]) {
        // Nothing may become a marker yet: only a token with a '<' can change that (and the cost,
        // the same for every other token, decides them all).
        if (cost_of(cur_) <= limit) {
            std::copy_n(t.ordinary_mask().begin(), vocab, mask.begin());
            for (int32_t id : t.with_angle().ids)
                if (size_t(id) < vocab) mask[size_t(id)] = 0;
        }
        mark(t.with_angle(), limit, mask);
    } else {
        mark(t.ordinary_tokens(), limit, mask);
    }
    // Free text may end or hold any added token; reasoning before a shape only the markers.
    if (pieces_[cur_.piece].reasoning_closes)
        for (int32_t m : markers_) mark_one(m, limit, mask);
    else
        mark(t.added(), limit, mask);
}

void output_constraint::mark(const token_table::sorted_tokens& list, uint64_t limit, std::span<uint8_t> mask) const {
    // In byte order: stack_[k] is the state after the first k bytes of the latest token, valid
    // for k <= valid; a token sharing a prefix with it starts from there.
    const token_table& t = *table_;
    const size_t vocab = std::min(mask.size(), size_t(t.vocab()));
    const auto& ids = list.ids;
    const auto& shared = list.shared;
    stack_[0] = cur_;
    size_t valid = 0;
    for (size_t i = 0; i < ids.size();) {
        const int32_t id = ids[i];
        const std::string_view b = t.bytes(id);
        size_t k = std::min<size_t>(shared[i], valid);
        for (; k < b.size(); ++k) {
            stack_[k + 1] = stack_[k];
            if (!step(stack_[k + 1], uint8_t(b[k]))) break;
        }
        if (k < b.size()) {
            // Refused at byte k: so is every following token that shares the first k + 1 bytes.
            valid = k;
            for (++i; i < ids.size() && shared[i] > k; ++i) {
            }
            continue;
        }
        valid = b.size();
        if (size_t(id) < vocab && cost_of(stack_[b.size()]) <= limit) mask[size_t(id)] = 1;
        ++i;
    }
}

bool output_constraint::allows(int32_t token) const {
    if (done() || token < 0 || token >= table_->vocab()) return false;
    const std::string_view bytes = table_->bytes(token);
    if (bytes.empty()) return false;
    const bool marker = std::find(markers_.begin(), markers_.end(), token) != markers_.end();
    if (!table_->ordinary(token) && !marker && (!free() || pieces_[cur_.piece].reasoning_closes)) return false;
    cursor c = cur_;
    return feed(c, bytes) && cost_of(c) <= cost_limit();
}

void output_constraint::accept(int32_t token) {
    MS_ASSERT_MSG(allows(token), "output_constraint: a token it did not allow was accepted");
    const bool fed = feed(cur_, table_->bytes(token));
    MS_ASSERT(fed);
    ++accepted_;
}

// ---- factories ---------------------------------------------------------------------------------

namespace {

using piece = output_constraint::piece;

piece text_piece(std::string s, uint32_t next = output_constraint::k_next) {
    piece p;
    p.kind = piece::text;
    p.literal = std::move(s);
    p.next = next;
    return p;
}

// The reasoning an output starts in, up to its "</think>", before a forced shape.
piece reasoning_piece() {
    piece p;
    p.kind = piece::free;
    p.reasoning = output_constraint::reasoning_start::open;
    p.reasoning_closes = true;
    return p;
}

std::vector<int32_t> marker_tokens(const token_table& table, const tokenizer& tok) {
    std::vector<int32_t> markers;
    for (std::string_view m : {k_calls_begin, k_call_begin, k_sep, k_call_end, k_calls_end, k_think_close}) {
        // A vocabulary without the marker token still gets the marker, spelled by ordinary tokens.
        if (const int32_t id = tok.find_added(m); id >= 0 && id < table.vocab() && table.bytes(id) == m)
            markers.push_back(id);
    }
    return markers;
}

}  // namespace

std::unique_ptr<output_constraint> json_object_constraint(std::shared_ptr<const token_table> table,
                                                          constraint_limits limits,
                                                          std::shared_ptr<const json_schema> schema) {
    std::vector<piece> pieces(1);
    pieces[0].kind = piece::json;
    pieces[0].schema = std::move(schema);
    return std::make_unique<output_constraint>(std::move(table), std::move(pieces), std::vector<int32_t>{}, limits);
}

std::unique_ptr<output_constraint> json_output_constraint(std::shared_ptr<const token_table> table,
                                                          const tokenizer& tok, constraint_limits limits,
                                                          std::shared_ptr<const json_schema> schema,
                                                          bool close_reasoning) {
    if (!close_reasoning) return json_object_constraint(std::move(table), limits, std::move(schema));
    std::vector<piece> pieces;
    pieces.push_back(reasoning_piece());
    pieces.emplace_back();
    pieces[1].kind = piece::json;
    pieces[1].schema = std::move(schema);
    auto markers = marker_tokens(*table, tok);
    return std::make_unique<output_constraint>(std::move(table), std::move(pieces), std::move(markers), limits);
}

std::unique_ptr<output_constraint> tool_call_constraint(std::shared_ptr<const token_table> table, const tokenizer& tok,
                                                        std::vector<std::string> names, constraint_limits limits) {
    std::vector<tool_spec> tools;
    for (auto& n : names) tools.push_back({std::move(n), nullptr});
    return tool_call_constraint(std::move(table), tok, std::move(tools), limits, {});
}

std::unique_ptr<output_constraint> tool_call_constraint(std::shared_ptr<const token_table> table, const tokenizer& tok,
                                                        std::vector<tool_spec> tools, constraint_limits limits,
                                                        tool_call_options options) {
    MS_ASSERT(!tools.empty());
    using reasoning = output_constraint::reasoning_start;
    std::vector<piece> pieces;
    // Where "function<｜tool▁sep｜>NAME..." starts, and the name piece right after it.
    uint32_t call = 0;
    if (options.lazy) {
        piece free;
        free.kind = piece::free;
        free.reasoning = options.reasoning;
        free.triggers = {std::string(k_calls_begin), std::string(k_call_begin)};
        free.targets = {1, 2};
        pieces.push_back(std::move(free));
        pieces.push_back(text_piece(std::string(k_call_begin)));  // 1
        call = 2;
    } else {
        if (options.reasoning == reasoning::open) pieces.push_back(reasoning_piece());
        pieces.push_back(text_piece(std::string(k_calls_begin) + std::string(k_call_begin)));
        call = uint32_t(pieces.size());
    }
    pieces.push_back(text_piece("function" + std::string(k_sep)));  // call
    piece name;
    name.kind = piece::name;
    pieces.push_back(name);  // call + 1, filled below
    // One arguments chain per distinct schema: "\n```json\n", the object, the call's end.
    const uint32_t after_calls = uint32_t(call + 2);  // placeholder index of what follows a call
    std::vector<std::pair<const json_schema*, uint32_t>> chains;
    std::vector<std::string> names;
    std::vector<uint32_t> targets;
    std::vector<piece> chain_pieces;
    const uint32_t first_chain = call + 2;
    for (auto& t : tools) {
        uint32_t start = 0;
        auto it = std::find_if(chains.begin(), chains.end(), [&](const auto& c) { return c.first == t.schema.get(); });
        if (it != chains.end()) {
            start = it->second;
        } else {
            start = first_chain + uint32_t(chain_pieces.size());
            chains.push_back({t.schema.get(), start});
            chain_pieces.push_back(text_piece("\n```json\n"));
            piece args;
            args.kind = piece::json;
            args.schema = t.schema;
            chain_pieces.push_back(std::move(args));
            chain_pieces.push_back(text_piece("\n```" + std::string(k_call_end), after_calls));  // next fixed below
        }
        names.push_back(std::move(t.name));
        targets.push_back(start);
    }
    const uint32_t closing = first_chain + uint32_t(chain_pieces.size());
    for (size_t i = 2; i < chain_pieces.size(); i += 3) chain_pieces[i].next = closing;
    pieces[call + 1].names = std::move(names);
    pieces[call + 1].targets = std::move(targets);
    for (auto& p : chain_pieces) pieces.push_back(std::move(p));
    if (options.lazy && options.parallel) {
        // Another call, or the end of the section.
        piece more;
        more.kind = piece::name;
        more.names = {std::string(k_call_begin), std::string(k_calls_end)};
        more.targets = {call, output_constraint::k_end};
        pieces.push_back(std::move(more));
    } else {
        pieces.push_back(text_piece(std::string(k_calls_end), output_constraint::k_end));
    }
    auto markers = marker_tokens(*table, tok);
    return std::make_unique<output_constraint>(std::move(table), std::move(pieces), std::move(markers), limits);
}

}  // namespace moestream::server
