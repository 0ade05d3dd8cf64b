// JSON Schema, the subset agents send, compiled into the form constrained decoding follows
// (server/json_schema_automaton.h): tool arguments (`parameters`, `input_schema`) and
// response_format json_schema.
//
// Supported (every generated value is valid against the schema under JSON Schema's own rules):
//   type (a name or an array of names: null, boolean, object, array, string, number, integer),
//   enum, const (any JSON values), properties, required, additionalProperties (bool or schema),
//   items (a schema), minItems, maxItems, minLength, maxLength (in code points), minimum,
//   maximum, exclusiveMinimum, exclusiveMaximum (numbers, or draft 4's booleans), anyOf, oneOf,
//   allOf with one entry, local $ref ("#", "#/$defs/X", "#/definitions/X", any JSON pointer into
//   the document; not recursive), nullable (OpenAPI), uniqueItems false.
// Annotations are ignored: title, description, default, examples, format, $schema, $id,
// $comment, deprecated, readOnly, writeOnly, content*, discriminator, and any keyword JSON
// Schema does not define (its own rule).
// Refused (400 naming the keyword, param = the schema's path + the keyword's), or ignored in
// lenient mode (see schema_mode): pattern, patternProperties, propertyNames, minProperties,
// maxProperties, dependentRequired, dependentSchemas, dependencies, if/then/else, not, allOf
// with several entries, multipleOf, uniqueItems true, contains, minContains, maxContains,
// prefixItems, items as an array, additionalItems, unevaluated*, $dynamicRef, $recursiveRef,
// remote or recursive $ref, anyOf/oneOf next to other assertions.
//
// What is generated, within the valid values (the model chooses inside this set):
//  - Object properties come in the schema's order; required ones always, optional ones may be
//    left out. Keys the schema does not declare are only written when additionalProperties is
//    true or a schema, or when the object declares no properties at all (`{"type":"object"}`):
//    a model must not invent keys (an absent additionalProperties would allow them). Such keys
//    come after the required properties, hold no backslash escapes and never repeat a declared
//    name.
//  - enum and const values are written exactly as the schema writes them (minified).
//  - Numbers: at most 15 integer and 15 fraction digits (so every parser reads them exactly as
//    written); no exponent when the schema bounds them; integers have neither fraction nor
//    exponent.
//  - anyOf/oneOf: the alternatives are followed together while the text fits several; oneOf is
//    enforced as anyOf (a value matching two overlapping alternatives is possible).
//  - A schema without `type` that uses keywords of one kind (properties, items, minLength,
//    minimum, ...) is generated as that kind.
//  - The root is an object (tool arguments, and OpenAI's rule for response formats): a root
//    admitting other types is restricted to its objects; one admitting none is refused.
// Bounds: at most k_max_nodes compiled nodes, k_max_properties properties per object, nesting of
// constrained containers up to k_max_depth, enum texts up to k_max_literal_bytes in all.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace moestream::server {

// exact: a keyword that cannot be enforced is a 400 (strict tools, response_format).
// lenient: such keywords are dropped and the rest is enforced (a forced call to a tool that did
// not ask for strictness: its schema describes the arguments, it was not a promise to refuse).
enum class schema_mode { exact, lenient };

namespace schema_types {
constexpr uint8_t null = 1, boolean = 2, object = 4, array = 8, string = 16, number = 32;
constexpr uint8_t all = 63;
}  // namespace schema_types

class json_schema {
  public:
    static constexpr size_t k_max_nodes = 4096;
    static constexpr size_t k_max_properties = 64;
    static constexpr int k_max_depth = 16;
    static constexpr size_t k_max_literal_bytes = 1 << 16;
    static constexpr size_t k_max_key_bytes = 1024;
    static constexpr uint32_t k_none = 0xFFFFFFFFu;
    // Scaled numbers: value * 10^15 (15 fraction digits), |value| < 10^15.
    using scaled = __int128;
    static constexpr int64_t k_scale = 1000000000000000;  // 10^15

    struct property {
        std::string key;  // the key's text between its quotes (JSON-escaped)
        uint32_t node = 0;
        bool required = false;
    };
    struct node {
        uint8_t types = schema_types::all;
        bool integer = false;                // numbers must be integers
        std::vector<uint32_t> alternatives;  // anyOf/oneOf, flattened (none is itself a union)
        uint32_t literals = k_none;          // enum/const: the literal trie's root
        // string
        uint32_t min_length = 0, max_length = 0xFFFFFFFFu;
        // number
        bool bounded = false;
        scaled lo = 0, hi = 0;  // inclusive, scaled
        // object
        std::vector<property> properties;
        uint32_t additional = k_none;  // the schema of undeclared keys' values; k_none: no such keys
        uint32_t key_trie = k_none;    // the trie of the declared keys
        bool free_object = false;      // any object (the JSON automaton reads it alone)
        uint32_t free_key_min = 0;     // the shortest undeclared key (0, or 1 when "" is declared)
        std::vector<uint32_t>
            required_rest;  // [p]: bytes of the required entries at >= p, each with its comma
        std::vector<uint16_t>
            next_required;  // [p]: the first required index >= p (properties.size() if none)
        // array
        uint32_t items = k_none;  // k_none: any value
        uint32_t min_items = 0, max_items = 0xFFFFFFFFu;
        bool free_array = false;
        uint32_t min_bytes = 0;  // the shortest valid value's length
        bool is_union() const { return !alternatives.empty(); }
    };
    // A byte trie (keys of one object, or the literal texts of one enum).
    struct trie_node {
        uint32_t first_child = 0, next_sibling = 0;  // 0: none (a root is never a child)
        uint8_t byte = 0;
        uint16_t depth = 0;     // bytes from the root
        int16_t property = -1;  // keys: the property whose key ends here
        bool end = false;       // literals: a text ends here
        uint32_t min_rest = 0;  // literals: fewest bytes to an end below
        uint64_t below = 0;     // keys: the properties whose key passes here (bit per index)
    };

    // Compiles the schema in `schema_json` (JSON text). `param` is the field the schema came
    // from ("tools[0].function.parameters"): errors name it plus the keyword's path.
    static api_result<std::shared_ptr<const json_schema>> compile(std::string_view schema_json,
                                                                  std::string param, schema_mode mode);

    uint32_t root() const { return root_; }
    const node& at(uint32_t i) const { return nodes_[i]; }
    size_t size() const { return nodes_.size(); }
    const trie_node& trie(uint32_t i) const { return tries_[i]; }
    // The child of trie node `t` for byte `b`, 0 when none.
    uint32_t child(uint32_t t, uint8_t b) const {
        for (uint32_t c = tries_[t].first_child; c != 0; c = tries_[c].next_sibling)
            if (tries_[c].byte == b) return c;
        return 0;
    }
    // The deepest nesting of constrained containers below (and including) the root.
    int depth() const { return depth_; }
    // Keywords lenient mode dropped ("properties.x.pattern"), for the log.
    const std::vector<std::string>& dropped() const { return dropped_; }

    // For the number automaton: the fewest bytes that finish a number inside `n`'s bounds from a
    // prefix (see json_schema.cpp), or k_none when no completion is inside them.
    struct number_prefix {  // {} is the empty prefix
        bool negative;
        uint8_t int_digits;  // 0: nothing yet, or only '-'
        bool fraction;       // '.' was read
        uint8_t frac_digits;
        uint64_t int_value, frac_value;
        bool operator==(const number_prefix&) const = default;
    };
    static uint32_t number_rest(const node& n, const number_prefix& p);

  private:
    // number_rest once the sign is settled (a prefix with nothing in it is read as positive).
    static uint32_t number_rest_signed(const node& n, const number_prefix& p);

  public:
  private:
    friend class schema_compiler;
    std::vector<node> nodes_;
    std::vector<trie_node> tries_;
    uint32_t root_ = 0;
    int depth_ = 0;
    std::vector<std::string> dropped_;
};

}  // namespace moestream::server
