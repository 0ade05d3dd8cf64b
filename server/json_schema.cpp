// JSON Schema -> json_schema (the subset and its rules are in json_schema.h). One recursive pass
// over the schema document builds the nodes (a $ref target is compiled once and shared, so the
// nodes form a DAG; the keywords of one node are read in json_schema_keywords.cpp); a second
// pass works out what the automaton needs from each node: the shortest valid value, the bytes
// the required properties still take, the nesting depth.
#include "server/json_schema.h"

#include <simdjson.h>

#include <algorithm>
#include <limits>

#include "server/json_schema_compiler.h"
#include "server/json_writer.h"
#include "server/request_fields.h"

namespace moestream::server {

using detail::path_index;
using detail::path_key;
using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;
using namespace schema_detail;

// ---- the number completions --------------------------------------------------------------------

uint32_t json_schema::number_rest(const node& n, const number_prefix& p) {
    if (!p.negative && !p.fraction && p.int_digits == 0) {  // nothing written yet: '-' is a choice too
        number_prefix positive = p, negative = p;
        positive.int_digits = 0;
        negative.negative = true;
        const uint32_t a = number_rest_signed(n, positive), b = number_rest_signed(n, negative);
        return b == k_none ? a : a == k_none ? b + 1 : std::min(a, b + 1);
    }
    return number_rest_signed(n, p);
}

uint32_t json_schema::number_rest_signed(const node& n, const number_prefix& p) {
    const scaled lo = n.bounded ? n.lo : -k_reach, hi = n.bounded ? n.hi : k_reach;
    if (p.fraction) {
        // Value so far v.f; g more fraction digits reach every multiple of 10^(15-f-g) in
        // [base, base + 10^(15-f) - step].
        const scaled base = scaled(p.int_value) * k_scale + scaled(p.frac_value) * pow10(15 - p.frac_digits);
        for (int g = p.frac_digits == 0 ? 1 : 0; p.frac_digits + g <= 15; ++g) {
            const scaled step = pow10(15 - p.frac_digits - g);
            if (progression_hits(base, base + pow10(15 - p.frac_digits) - step, step, p.negative, lo, hi))
                return uint32_t(g);
        }
        return k_none;
    }
    const bool leading_zero = p.int_digits == 1 && p.int_value == 0;
    const int m_min = p.int_digits == 0 ? 1 : 0;
    const int m_max = leading_zero ? 0 : 15 - p.int_digits;
    // In order of cost: m more integer digits, then (not for integers) '.' and g digits.
    for (int cost = m_min; cost <= m_max + 16; ++cost) {
        for (int m = m_min; m <= std::min(cost, m_max); ++m) {
            const int rest = cost - m;
            const int g = rest == 0 ? 0 : rest - 1;
            if (rest == 1 || (g > 0 && (n.integer || g > 15))) continue;
            // The integer parts m more digits give.
            scaled first, last;
            if (p.int_digits == 0) {
                first = m == 1 ? 0 : pow10(m - 1);
                last = pow10(m) - 1;
            } else {
                first = scaled(p.int_value) * pow10(m);
                last = first + pow10(m) - 1;
            }
            const scaled step = g == 0 ? k_scale : pow10(15 - g);
            const scaled a = first * k_scale, b = g == 0 ? last * k_scale : (last + 1) * k_scale - step;
            if (progression_hits(a, b, step, p.negative, lo, hi)) return uint32_t(cost);
        }
    }
    return k_none;
}

// ---- compiling -------------------------------------------------------------------------------------

uint32_t schema_compiler::add_trie(uint32_t root, std::string_view bytes) {
    auto& t = out_.tries_;
    if (root == k_none) {
        root = uint32_t(t.size());
        t.push_back({});
    }
    uint32_t at = root;
    for (char ch : bytes) {
        uint32_t c = out_.child(at, uint8_t(ch));
        if (c == 0) {
            c = uint32_t(t.size());
            json_schema::trie_node node;
            node.byte = uint8_t(ch);
            node.depth = uint16_t(t[at].depth + 1);
            node.next_sibling = t[at].first_child;
            t.push_back(node);
            t[at].first_child = c;
        }
        at = c;
    }
    t[at].end = true;
    return root;
}

api_result<uint32_t> schema_compiler::compile_ref(std::string_view ref, const std::string& path) {
    if (!ref.starts_with("#")) {
        if (auto e =
                unsupported(path, "$ref", "only references into the same document (\"#/...\") are supported"))
            return *e;
        return k_any;
    }
    const std::string key(ref);
    if (auto it = refs_.find(key); it != refs_.end()) return it->second;
    if (std::find(ref_stack_.begin(), ref_stack_.end(), key) != ref_stack_.end()) {
        if (auto e = unsupported(path, "$ref", "a recursive reference (" + key + ")")) return *e;
        return k_any;
    }
    // A JSON pointer (RFC 6901) after the '#'.
    element at = doc_;
    std::string target_path = param_;  // where the target sits in the document, for its errors
    std::string_view rest = ref.substr(1);
    while (!rest.empty()) {
        if (rest[0] != '/') return refuse(path, "$ref " + json_escape(ref) + " is not a JSON pointer");
        rest.remove_prefix(1);
        const size_t end = std::min(rest.find('/'), rest.size());
        std::string token(rest.substr(0, end));
        rest.remove_prefix(end);
        for (size_t i = 0; (i = token.find('~', i)) != std::string::npos; ++i) {
            if (i + 1 < token.size() && token[i + 1] == '1')
                token.replace(i, 2, "/");
            else if (i + 1 < token.size() && token[i + 1] == '0')
                token.replace(i, 2, "~");
        }
        element next;
        object o;
        array a;
        if (at.get_object().get(o) == simdjson::SUCCESS) {
            if (o.at_key(token).get(next) != simdjson::SUCCESS)
                return refuse(path, "$ref " + json_escape(ref) + " points to nothing in the schema");
        } else if (at.get_array().get(a) == simdjson::SUCCESS) {
            size_t i = 0;
            bool digits = !token.empty();
            for (char c : token) digits = digits && c >= '0' && c <= '9';
            if (!digits || (i = std::stoul(token)) >= a.size() || a.at(i).get(next) != simdjson::SUCCESS)
                return refuse(path, "$ref " + json_escape(ref) + " points to nothing in the schema");
        } else {
            return refuse(path, "$ref " + json_escape(ref) + " points to nothing in the schema");
        }
        at = next;
        target_path = path_key(target_path, token);
    }
    ref_stack_.push_back(key);
    auto n = compile(at, target_path);
    ref_stack_.pop_back();
    if (n) refs_[key] = *n;
    return n;
}

api_result<uint32_t> schema_compiler::compile_union(array alts, const std::string& path, bool nullable) {
    if (alts.size() == 0) return refuse(path, "must not be empty");
    std::vector<uint32_t> flat;
    size_t i = 0;
    for (element alt : alts) {
        auto n = compile(alt, path_index(path, i++));
        if (!n) return n.error();
        if (*n == k_never) continue;
        if (*n == k_any) return k_any;  // one alternative allows everything
        const auto& node = out_.nodes_[*n];
        for (uint32_t x : node.is_union() ? node.alternatives : std::vector<uint32_t>{*n})
            if (std::find(flat.begin(), flat.end(), x) == flat.end()) flat.push_back(x);
    }
    if (nullable) {
        json_schema::node null_node;
        null_node.types = schema_types::null;
        auto n = add(null_node, path);
        if (!n) return n.error();
        flat.push_back(*n);
    }
    if (flat.empty()) return k_never;
    if (flat.size() == 1) return flat[0];
    if (flat.size() > 64) return refuse(path, "more than 64 alternatives are not supported");
    json_schema::node u;
    u.alternatives = std::move(flat);
    return add(std::move(u), path);
}

api_result<uint32_t> schema_compiler::compile(element e, const std::string& path) {
    bool flag = false;
    if (e.get_bool().get(flag) == simdjson::SUCCESS) return flag ? k_any : k_never;
    object o;
    if (e.get_object().get(o) != simdjson::SUCCESS)
        return detail::wrong_type(path, "a schema (an object or a boolean)", e);

    // What kinds of keywords are here.
    bool assertions = false, has_ref = false, has_any_of = false, has_one_of = false, has_all_of = false;
    for (const auto field : o) {
        const std::string_view k = field.key;
        if (k == "$ref")
            has_ref = true;
        else if (k == "anyOf")
            has_any_of = true;
        else if (k == "oneOf")
            has_one_of = true;
        else if (k == "allOf")
            has_all_of = true;
        else if (k == "type" || k == "enum" || k == "const" || is_object_keyword(k) || is_array_keyword(k) ||
                 is_string_keyword(k) || is_number_keyword(k))
            assertions = true;
        else if (k == "uniqueItems") {
            bool unique = false;
            if (field.value.get_bool().get(unique) != simdjson::SUCCESS)
                return detail::wrong_type(path_key(path, k), "a boolean", field.value);
            if (unique)
                if (auto err = unsupported(path_key(path, k), k)) return *err;
        } else if (is_unsupported(k)) {
            if (auto err = unsupported(path_key(path, k), k)) return *err;
        }
        // Annotations and keywords JSON Schema does not define are ignored.
    }
    const int combinators = int(has_ref) + int(has_any_of) + int(has_one_of) + int(has_all_of);
    if (combinators > 0 && (assertions || combinators > 1)) {
        const char* k = has_ref ? "$ref" : has_any_of ? "anyOf" : has_one_of ? "oneOf" : "allOf";
        if (auto err = unsupported(path_key(path, k), k,
                                   "next to other assertions; move them into the referenced "
                                   "schema or each alternative"))
            return *err;
    }
    element nullable_e;
    bool nullable = false;
    if (o.at_key("nullable").get(nullable_e) == simdjson::SUCCESS &&
        nullable_e.get_bool().get(nullable) != simdjson::SUCCESS)
        nullable = false;

    if (has_ref) {
        std::string_view ref;
        element r = o.at_key("$ref").value_unsafe();
        if (r.get_string().get(ref) != simdjson::SUCCESS)
            return detail::wrong_type(path_key(path, "$ref"), "a string", r);
        return compile_ref(ref, path_key(path, "$ref"));
    }
    if (has_any_of || has_one_of) {
        const char* k = has_any_of ? "anyOf" : "oneOf";
        element alts = o.at_key(k).value_unsafe();
        array a;
        if (alts.get_array().get(a) != simdjson::SUCCESS)
            return detail::wrong_type(path_key(path, k), "an array", alts);
        return compile_union(a, path_key(path, k), nullable);
    }
    if (has_all_of) {
        element all = o.at_key("allOf").value_unsafe();
        array a;
        if (all.get_array().get(a) != simdjson::SUCCESS || a.size() == 0)
            return detail::wrong_type(path_key(path, "allOf"), "a non-empty array", all);
        if (a.size() > 1)
            if (auto err = unsupported(path_key(path, "allOf"), "allOf", "with more than one entry"))
                return *err;
        return compile(a.at(0).value_unsafe(), path_index(path_key(path, "allOf"), 0));
    }

    json_schema::node n;
    bool typed = false;
    if (auto err = read_types(o, path, n, typed)) return *err;
    if (auto err = read_string_bounds(o, path, n)) return *err;
    if (auto err = read_number_bounds(o, path, n)) return *err;
    if (auto err = read_literals(o, path, n, typed)) return *err;
    if (n.literals == k_none) {
        if (n.types & schema_types::object) {
            if (auto err = read_object(o, path, n)) return *err;
        }
        if (n.types & schema_types::array) {
            if (auto err = read_array(o, path, n)) return *err;
        }
        if (n.types == schema_types::all && !n.bounded && n.min_length == 0 && n.max_length == 0xFFFFFFFFu &&
            n.free_object && n.free_array && !n.integer)
            return k_any;
    }
    return add(std::move(n), path);
}

api_result<uint32_t> schema_compiler::restrict_to_objects(uint32_t id, const std::string& path) {
    const auto refuse_root = [&] {
        return refuse(path, "must describe a JSON object (tool arguments and response formats are objects)");
    };
    if (id == k_never) return refuse_root();
    json_schema::node n = out_.nodes_[id];
    if (n.is_union()) {
        std::vector<uint32_t> kept;
        for (uint32_t alt : n.alternatives) {
            const auto& a = out_.nodes_[alt];
            const bool objects = a.literals != k_none ? out_.child(a.literals, '{') != 0
                                                      : (a.types & schema_types::object) != 0;
            if (!objects) continue;
            auto r = restrict_to_objects(alt, path);
            if (!r) return r.error();
            kept.push_back(*r);
        }
        if (kept.empty()) return refuse_root();
        if (kept.size() == 1) return kept[0];
        n.alternatives = std::move(kept);
        return add(std::move(n), path);
    }
    if (n.literals != k_none) {
        // Keep the object texts: a new trie holding the '{' branch only.
        const uint32_t brace = out_.child(n.literals, '{');
        if (brace == 0) return refuse_root();
        json_schema::trie_node root;
        root.first_child = brace;
        out_.tries_.push_back(root);
        n.literals = uint32_t(out_.tries_.size() - 1);
        // The brace node's siblings belong to the old root only: copy it without them.
        json_schema::trie_node only = out_.tries_[brace];
        only.next_sibling = 0;
        out_.tries_.push_back(only);
        out_.tries_[n.literals].first_child = uint32_t(out_.tries_.size() - 1);
        return add(std::move(n), path);
    }
    if (!(n.types & schema_types::object)) return refuse_root();
    if (n.types == schema_types::object && id != k_any) return id;
    n.types = schema_types::object;
    if (id == k_any) {  // `true` / {}: any object
        n.free_object = true;
        n.additional = k_any;
    }
    return add(std::move(n), path);
}

// ---- what the automaton needs from each node -----------------------------------------------------

namespace {

struct finisher {
    json_schema::node* nodes;
    size_t count;
    std::vector<json_schema::trie_node>& tries;
    std::vector<uint8_t> state;  // 0 new, 1 in progress, 2 done
    std::vector<int> depth;

    // Fewest bytes to a text's end below each node of a literal trie, children first (an
    // explicit stack: one enum text may be thousands of bytes deep).
    uint32_t literal_rest(uint32_t root) {
        std::vector<std::pair<uint32_t, bool>> stack{{root, false}};
        while (!stack.empty()) {
            auto [t, children_done] = stack.back();
            stack.pop_back();
            auto& node = tries[t];
            if (!children_done) {
                stack.push_back({t, true});
                for (uint32_t c = node.first_child; c != 0; c = tries[c].next_sibling)
                    stack.push_back({c, false});
                continue;
            }
            uint32_t best = node.end ? 0 : k_saturated;
            for (uint32_t c = node.first_child; c != 0; c = tries[c].next_sibling)
                best = std::min(best, sat_add(tries[c].min_rest, 1));
            node.min_rest = best;
        }
        return tries[root].min_rest;
    }

    void visit(uint32_t id) {
        if (state[id] == 2) return;
        MS_ASSERT_MSG(state[id] == 0, "json_schema: a cycle survived compilation");
        state[id] = 1;
        json_schema::node& n = nodes[id];
        int d = 0;
        uint32_t best = k_saturated;
        if (n.is_union()) {
            for (uint32_t a : n.alternatives) {
                visit(a);
                best = std::min(best, nodes[a].min_bytes);
                d = std::max(d, depth[a]);
            }
        } else if (n.literals != k_none) {
            best = literal_rest(n.literals);
        } else {
            namespace st = schema_types;
            if (n.types & (st::null | st::boolean)) best = std::min<uint32_t>(best, 4);
            if (n.types & st::string) best = std::min(best, sat_add(2, n.min_length));
            if (n.types & st::number) {
                const uint32_t r = json_schema::number_rest(n, {});
                if (r != k_none) best = std::min(best, r);
            }
            if (n.types & st::object) {
                uint32_t entries = 0;
                int child_depth = 0;
                if (n.additional != k_none && n.additional != k_any) {
                    visit(n.additional);
                    child_depth = depth[n.additional];
                }
                const size_t np = n.properties.size();
                n.required_rest.assign(np + 1, 0);
                n.next_required.assign(np + 1, uint16_t(np));
                for (size_t i = np; i-- > 0;) {
                    const auto& p = n.properties[i];
                    visit(p.node);
                    child_depth = std::max(child_depth, depth[p.node]);
                    const uint32_t entry =
                        sat_add(uint32_t(p.key.size()) + 4, nodes[p.node].min_bytes);  // ,"k":v
                    n.required_rest[i] =
                        p.required ? sat_add(n.required_rest[i + 1], entry) : n.required_rest[i + 1];
                    n.next_required[i] = p.required ? uint16_t(i) : n.next_required[i + 1];
                }
                entries = n.required_rest.empty() ? 0 : n.required_rest[0];
                const uint32_t first = entries > 0 ? entries - 1 : 0;  // the first entry has no comma
                best = std::min(best, sat_add(2, first));
                if (!n.free_object) d = std::max(d, 1 + child_depth);
            }
            if (n.types & st::array) {
                uint32_t item = 1;  // "0"
                int child_depth = 0;
                if (n.items != k_any) {
                    visit(n.items);
                    item = nodes[n.items].min_bytes;
                    child_depth = depth[n.items];
                }
                const uint64_t inside =
                    n.min_items == 0 ? 0 : uint64_t(n.min_items) * (uint64_t(item) + 1) - 1;
                best = std::min(best, sat_add(2, inside));
                if (!n.free_array) d = std::max(d, 1 + child_depth);
            }
        }
        n.min_bytes = best;
        depth[id] = d;
        state[id] = 2;
    }
};

}  // namespace

schema_compiler::maybe_error schema_compiler::finish() {
    finisher f{out_.nodes_.data(), out_.nodes_.size(), out_.tries_,
               std::vector<uint8_t>(out_.nodes_.size(), 0), std::vector<int>(out_.nodes_.size(), 0)};
    for (uint32_t i = 0; i < out_.nodes_.size(); ++i) f.visit(i);
    for (uint32_t i = 0; i < out_.nodes_.size(); ++i)
        if (out_.nodes_[i].min_bytes >= k_saturated)
            return refuse(param_, "the schema allows no value of bounded size");
    out_.depth_ = f.depth[out_.root_];
    if (out_.depth_ > json_schema::k_max_depth)
        return refuse(param_, "objects and arrays nested deeper than " +
                                  std::to_string(json_schema::k_max_depth) + " levels are not supported");
    return std::nullopt;
}

api_result<std::shared_ptr<const json_schema>> json_schema::compile(std::string_view schema_json,
                                                                    std::string param, schema_mode mode) {
    simdjson::dom::parser parser;
    element doc;
    if (parser.parse(simdjson::padded_string(schema_json)).get(doc) != simdjson::SUCCESS)
        return bad_request(param, param + ": the schema is not valid JSON");
    auto out = std::make_shared<json_schema>();
    schema_compiler c(doc, param, mode, *out);
    auto root = c.compile(doc, param);
    if (!root) return root.error();
    auto object_root = c.restrict_to_objects(*root, param);
    if (!object_root) return object_root.error();
    out->root_ = *object_root;
    if (auto e = c.finish()) return *e;
    return std::shared_ptr<const json_schema>(std::move(out));
}

}  // namespace moestream::server
