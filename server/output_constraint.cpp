#include "server/output_constraint.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "config/assert.h"

namespace moestream::server {

// ---- token_table -----------------------------------------------------------------------------

namespace {

constexpr char32_t k_marker_bar = U'\uFF5C';

}  // namespace

token_table::token_table(const tokenizer& tok) {
    const int32_t n = tok.vocab_size();
    const auto& types = tok.data().token_types;
    const bool typed = types.size() == size_t(n);
    offsets_.reserve(size_t(n) + 1);
    offsets_.push_back(0);
    ordinary_.resize(size_t(n));
    std::vector<int32_t> ordinary_ids;
    bool single[256] = {};
    for (int32_t id = 0; id < n; ++id) {
        const std::string b = tok.token_bytes(id);
        bytes_ += b;
        MS_ASSERT_MSG(bytes_.size() <= std::numeric_limits<uint32_t>::max(), "token_table: vocabulary too large");
        offsets_.push_back(uint32_t(bytes_.size()));
        // Added tokens (end of sequence, markers, padding) are not text the model writes as
        // such; an untyped vocabulary still names them through its added-token lookup.
        const bool normal = typed ? types[size_t(id)] == int32_t(token_type::normal) : tok.find_added(b) != id;
        if (b.empty() || !normal) continue;
        ordinary_[size_t(id)] = 1;
        ordinary_ids.push_back(id);
        max_length_ = std::max(max_length_, b.size());
        if (b.size() == 1) single[uint8_t(b[0])] = true;
    }
    every_byte_ = std::all_of(std::begin(single), std::end(single), [](bool x) { return x; });
    // String text, found by the automaton itself: what leaves a string's text as it was.
    json_limits probe_limits;
    probe_limits.object_only = false;
    probe_limits.banned_char = k_marker_bar;
    json_automaton in_string(probe_limits);
    MS_ASSERT(in_string.feed("\"") && in_string.in_string_text());
    std::vector<int32_t> other;
    for (int32_t id : ordinary_ids) {
        json_automaton probe = in_string;
        if (probe.feed(bytes(id)) && probe.in_string_text()) string_text_.push_back(id);
        else other.push_back(id);
    }
    auto sort = [&](std::vector<int32_t> ids) {
        std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
            const auto ba = bytes(a), bb = bytes(b);
            return ba != bb ? ba < bb : a < b;
        });
        sorted_tokens out;
        out.shared.resize(ids.size());
        for (size_t i = 1; i < ids.size(); ++i) {
            const auto a = bytes(ids[i - 1]), b = bytes(ids[i]);
            const size_t m = std::min(a.size(), b.size());
            size_t k = 0;
            while (k < m && a[k] == b[k]) ++k;
            out.shared[i] = uint32_t(k);
        }
        out.ids = std::move(ids);
        return out;
    };
    all_ = sort(std::move(ordinary_ids));
    not_text_ = sort(std::move(other));
}

bool token_table::describes(const tokenizer& tok) const {
    if (tok.vocab_size() != vocab()) return false;
    const int32_t step = std::max(1, vocab() / 97);
    for (int32_t id = 0; id < vocab(); id += step)
        if (tok.token_bytes(id) != bytes(id)) return false;
    return vocab() == 0 || tok.token_bytes(vocab() - 1) == bytes(vocab() - 1);
}

std::shared_ptr<const token_table> token_table::of(const tokenizer& tok) {
    struct entry {
        const tokenizer* key;
        std::shared_ptr<const token_table> table;
    };
    constexpr size_t k_kept = 4;
    static std::mutex mu;
    static std::vector<entry> kept;  // most recently used last
    // Built under the lock: concurrent first requests wait for one build instead of each
    // making their own.
    std::lock_guard lock(mu);
    for (size_t i = 0; i < kept.size(); ++i) {
        if (kept[i].key != &tok) continue;
        entry e = kept[i];
        kept.erase(kept.begin() + std::ptrdiff_t(i));
        // Another tokenizer may live at a freed one's address.
        if (!e.table->describes(tok)) break;
        kept.push_back(e);
        return e.table;
    }
    auto table = std::make_shared<const token_table>(tok);
    if (kept.size() == k_kept) kept.erase(kept.begin());
    kept.push_back({&tok, table});
    return table;
}

// ---- output_constraint -----------------------------------------------------------------------

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
                    bool marker;
                };
                std::vector<span> spans;
                for (size_t pos = 0; pos < s.size();) {
                    size_t end = pos + 1;
                    bool marker = false;
                    for (int32_t m : markers_) {
                        const auto mb = table_->bytes(m);
                        if (!mb.empty() && std::string_view(s).substr(pos).starts_with(mb)) end = pos + mb.size(), marker = true;
                    }
                    spans.push_back({pos, end, marker});
                    pos = end;
                }
                cost.assign(s.size() + 1, 0);
                for (auto sp = spans.rbegin(); sp != spans.rend(); ++sp) {
                    cost[sp->begin] = cost[sp->end] + 1;
                    for (size_t q = sp->begin + 1; q < sp->end; ++q) cost[q] = cost[sp->end] + uint32_t(sp->end - q);
                }
                break;
            }
            case piece::name: {
                MS_ASSERT(!p.names.empty());
                const uint32_t root = uint32_t(names_.size());
                names_.push_back({});
                name_root_[i] = root;
                for (const auto& name : p.names) {
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
                    names_[at].is_end = true;
                }
                // Children come after their parent: one backward pass settles every minimum.
                for (uint32_t k = uint32_t(names_.size()); k-- > root;) {
                    name_node& node = names_[k];
                    uint32_t best = node.is_end ? 0 : std::numeric_limits<uint32_t>::max();
                    for (uint32_t c = node.first_child; c != 0; c = names_[c].next_sibling)
                        best = std::min(best, names_[c].min_rest + 1);
                    node.min_rest = best;
                }
                MS_ASSERT_MSG(i + 1 < n && pieces_[i + 1].kind == piece::text,
                              "output_constraint: a name must be followed by text");
                break;
            }
            case piece::json:
                MS_ASSERT_MSG(limits_.json.object_only, "output_constraint: the JSON piece must be an object");
                break;
        }
    }
    tail_cost_.assign(n, 0);
    for (size_t i = n; i-- > 1;) {
        const piece& p = pieces_[i];
        const uint32_t own = p.kind == piece::text   ? text_cost_[i][0]
                             : p.kind == piece::name ? names_[name_root_[i]].min_rest
                                                     : uint32_t(json_automaton(limits_.json).min_bytes_to_complete());
        tail_cost_[i - 1] = tail_cost_[i] + own;
    }
    enter(cur_);
    stack_.resize(table_->max_length() + 1);
    over_limit_ = limits_.max_tokens > 0 && int64_t(cost_of(cur_)) > limits_.max_tokens;
}

void output_constraint::enter(cursor& c) const {
    c.pos = 0;
    if (c.piece >= pieces_.size()) return;
    const piece& p = pieces_[c.piece];
    if (p.kind == piece::name) c.pos = name_root_[c.piece];
    if (p.kind == piece::json) c.json = json_automaton(limits_.json);
}

bool output_constraint::step(cursor& c, uint8_t b) const {
    for (;;) {
        if (c.piece >= pieces_.size()) return false;
        const piece& p = pieces_[c.piece];
        switch (p.kind) {
            case piece::text:
                if (uint8_t(p.literal[c.pos]) != b) return false;
                if (++c.pos == p.literal.size()) {
                    ++c.piece;
                    enter(c);
                }
                return true;
            case piece::name: {
                const name_node& node = names_[c.pos];
                for (uint32_t ch = node.first_child; ch != 0; ch = names_[ch].next_sibling) {
                    if (names_[ch].byte == b) {
                        c.pos = ch;
                        return true;
                    }
                }
                if (!node.is_end) return false;
                ++c.piece;  // the name is complete: `b` belongs to the next piece
                enter(c);
                continue;
            }
            case piece::json:
                if (!c.json.step(b)) return false;
                ++c.json_bytes;
                if (c.json.complete()) {
                    ++c.piece;
                    enter(c);
                }
                return true;
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
    const uint32_t tail = tail_cost_[c.piece];
    switch (pieces_[c.piece].kind) {
        case piece::text: return text_cost_[c.piece][c.pos] + tail;
        case piece::name: return names_[c.pos].min_rest + tail;
        case piece::json: return uint32_t(c.json.min_bytes_to_complete()) + tail;
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
    if (limits_.max_tokens > 0) return uint64_t(limits_.max_tokens - accepted_ - 1);
    return std::numeric_limits<uint64_t>::max();
}

bool output_constraint::done() const { return cur_.piece >= pieces_.size(); }

void output_constraint::allowed(std::span<uint8_t> mask) const {
    std::fill(mask.begin(), mask.end(), uint8_t(0));
    if (done()) return;
    const token_table& t = *table_;
    const size_t vocab = std::min(mask.size(), size_t(t.vocab()));
    const uint64_t limit = cost_limit();
    for (int32_t m : markers_) {
        cursor c = cur_;
        if (size_t(m) < vocab && feed(c, t.bytes(m)) && cost_of(c) <= limit) mask[size_t(m)] = 1;
    }
    // Inside a string's text, most tokens are plain text: they leave the state (and the cost)
    // as it is, so they are decided together; the rest are evaluated one by one.
    const auto& json = cur_.json;
    const bool in_text = cur_.piece < pieces_.size() && pieces_[cur_.piece].kind == piece::json &&
                         json.in_string_text() &&
                         (json.limits().banned_char == 0 || json.limits().banned_char == k_marker_bar);
    if (in_text && cost_of(cur_) <= limit)
        for (int32_t id : t.string_text())
            if (size_t(id) < vocab) mask[size_t(id)] = 1;
    mark(in_text ? t.other_than_string_text() : t.ordinary_tokens(), limit, mask);
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
    const bool marker = std::find(markers_.begin(), markers_.end(), token) != markers_.end();
    if (!table_->ordinary(token) && !marker) return false;
    cursor c = cur_;
    return feed(c, table_->bytes(token)) && cost_of(c) <= cost_limit();
}

void output_constraint::accept(int32_t token) {
    MS_ASSERT_MSG(allows(token), "output_constraint: a token it did not allow was accepted");
    const bool fed = feed(cur_, table_->bytes(token));
    MS_ASSERT(fed);
    ++accepted_;
}

// ---- factories ---------------------------------------------------------------------------------

std::unique_ptr<output_constraint> json_object_constraint(std::shared_ptr<const token_table> table,
                                                          constraint_limits limits) {
    std::vector<output_constraint::piece> pieces(1);
    pieces[0].kind = output_constraint::piece::json;
    return std::make_unique<output_constraint>(std::move(table), std::move(pieces), std::vector<int32_t>{}, limits);
}

std::unique_ptr<output_constraint> tool_call_constraint(std::shared_ptr<const token_table> table, const tokenizer& tok,
                                                        std::vector<std::string> names, constraint_limits limits) {
    using piece = output_constraint::piece;
    std::vector<int32_t> markers;
    for (const char* m : {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                          "<｜tool▁calls▁end｜>"}) {
        // A vocabulary without the marker token still gets the marker, spelled by ordinary tokens.
        if (const int32_t id = tok.find_added(m); id >= 0 && id < table->vocab() && table->bytes(id) == m)
            markers.push_back(id);
    }
    auto text = [](std::string s) {
        piece p;
        p.kind = piece::text;
        p.literal = std::move(s);
        return p;
    };
    std::vector<piece> pieces;
    pieces.push_back(text("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"));
    piece name;
    name.kind = piece::name;
    name.names = std::move(names);
    pieces.push_back(std::move(name));
    pieces.push_back(text("\n```json\n"));
    piece args;
    args.kind = piece::json;
    pieces.push_back(std::move(args));
    pieces.push_back(text("\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"));
    return std::make_unique<output_constraint>(std::move(table), std::move(pieces), std::move(markers), limits);
}

api_result<std::shared_ptr<token_constraint>> constraint_for_request(const completion_request& r,
                                                                     const constraint_spec& spec,
                                                                     const tokenizer* tok, int64_t max_tokens) {
    const bool forced_call = r.route == api_route::chat_completions && !r.tools.empty() &&
                             (r.choice.kind == tool_choice::required || r.choice.kind == tool_choice::function);
    if (!forced_call && spec.format != output_format::json_object)
        return api_result<std::shared_ptr<token_constraint>>(std::shared_ptr<token_constraint>());
    if (!tok) {
        return bad_request(forced_call ? "tool_choice" : "response_format",
                           "this model has no tokenizer, which constrained output needs");
    }
    constraint_limits limits;
    limits.max_tokens = max_tokens;
    auto table = token_table::of(*tok);
    if (forced_call) {
        std::vector<std::string> names;
        if (r.choice.kind == tool_choice::function) names.push_back(r.choice.function_name);
        else
            for (const auto& t : r.tools) names.push_back(t.name);
        return api_result<std::shared_ptr<token_constraint>>(tool_call_constraint(std::move(table), *tok, std::move(names), limits));
    }
    return api_result<std::shared_ptr<token_constraint>>(json_object_constraint(std::move(table), limits));
}

}  // namespace moestream::server
