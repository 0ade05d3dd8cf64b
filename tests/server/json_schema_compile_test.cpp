// JSON Schema compilation (what is refused, with which param; what lenient mode drops) and the
// schema automaton byte by byte: the documents it accepts and refuses, and that its cost is the
// exact shortest completion, checked by completing random prefixes one cost-lowering byte at a
// time and validating the result with the independent validator (json_schema_validator.h).
#include <boost/test/unit_test.hpp>
#include <random>
#include <string>
#include <vector>

#include "json_schema_validator.h"
#include "server/json_schema.h"
#include "server/json_schema_automaton.h"
#include "tools/agent_schemas.h"

namespace moestream::test {
namespace {

using server::json_schema;
using server::schema_automaton;
using server::schema_mode;

std::shared_ptr<const json_schema> compiled(std::string_view schema, schema_mode mode = schema_mode::exact) {
    auto s = json_schema::compile(schema, "p", mode);
    if (!s) BOOST_FAIL(std::string(schema) << ": " << s.error().message);
    return *s;
}

server::json_limits limits() {
    server::json_limits l;
    l.banned_char = U'\uFF5C';
    return l;
}

// Feeds a document byte by byte: the index of the first refused byte, -1 when all are accepted,
// and whether it is complete then.
struct fed {
    long refused = -1;
    bool complete = false;
};
fed feed(const json_schema& s, std::string_view doc) {
    schema_automaton a(&s, limits());
    for (size_t i = 0; i < doc.size(); ++i) {
        schema_automaton next = a;
        if (!next.step(uint8_t(doc[i]))) return {long(i), false};
        a = next;
    }
    return {-1, a.complete()};
}

void accepts(std::string_view schema, std::string_view doc) {
    const auto s = compiled(schema);
    const auto r = feed(*s, doc);
    BOOST_TEST(r.refused == -1, doc << " refused at " << r.refused);
    BOOST_TEST(r.complete, doc << " not complete");
    const schema_validator v(schema);
    BOOST_TEST(v.check(doc) == "", doc);
}

void refuses(std::string_view schema, std::string_view doc, long at) {
    const auto s = compiled(schema);
    const auto r = feed(*s, doc);
    BOOST_TEST(r.refused == at, doc << ": refused at " << r.refused << ", expected " << at);
}

void refused_compile(std::string_view schema, std::string_view param, std::string_view says) {
    auto s = json_schema::compile(schema, "p", schema_mode::exact);
    BOOST_TEST_REQUIRE(!s.ok(), schema);
    BOOST_TEST(s.error().status == 400);
    BOOST_TEST(s.error().param == param, schema << ": param " << s.error().param);
    BOOST_TEST(s.error().message.find(says) != std::string::npos, s.error().message);
}

std::string_view corpus(std::string_view name) {
    for (const auto& a : tools::k_agent_schemas)
        if (a.name == name) return a.schema;
    BOOST_FAIL("no corpus schema " << name);
    return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(json_schema_compile)

BOOST_AUTO_TEST_CASE(the_agent_corpus_compiles_exactly) {
    for (const auto& a : tools::k_agent_schemas) {
        auto s = json_schema::compile(a.schema, "tools[0].function.parameters", schema_mode::exact);
        BOOST_TEST_REQUIRE(s.ok(), a.name << ": " << (s.ok() ? "" : s.error().message));
        BOOST_TEST((*s)->dropped().empty());
        BOOST_TEST(schema_validator(a.schema).ok());
    }
}

BOOST_AUTO_TEST_CASE(unsupported_keywords_are_refused_by_name) {
    refused_compile(R"({"type":"object","properties":{"x":{"type":"string","pattern":"^a"}}})",
                    "p.properties.x.pattern", "'pattern' is not supported");
    refused_compile(R"({"type":"object","patternProperties":{"^a":{}}})", "p.patternProperties",
                    "'patternProperties'");
    refused_compile(R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":5}}})",
                    "p.properties.n.multipleOf", "'multipleOf'");
    refused_compile(R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})",
                    "p.properties.a.uniqueItems", "'uniqueItems'");
    refused_compile(R"({"type":"object","properties":{"a":{"type":"array","items":[{"type":"string"}]}}})",
                    "p.properties.a.items", "tuple form");
    refused_compile(R"({"type":"object","minProperties":1})", "p.minProperties", "'minProperties'");
    refused_compile(R"({"type":"object","properties":{"a":{"not":{"type":"null"}}}})", "p.properties.a.not",
                    "'not'");
    refused_compile(R"({"type":"object","if":{},"then":{}})", "p.if", "'if'");
    refused_compile(R"({"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}}})",
                    "p.properties.a.$ref", "same document");
    refused_compile(R"({"type":"object","properties":{"child":{"$ref":"#"}}})", "p.properties.child.$ref",
                    "recursive");
    refused_compile(R"({"allOf":[{"type":"object","required":["a"]},{"required":["b"]}]})", "p.allOf",
                    "more than one");
    refused_compile(R"({"type":"object","properties":{"a":{"type":"string"}},"anyOf":[{"required":["a"]}]})",
                    "p.anyOf", "next to other assertions");
}

BOOST_AUTO_TEST_CASE(invalid_schemas_name_the_field) {
    refused_compile(R"({"type":"thing"})", "p.type", "unknown type");
    refused_compile(R"({"type":"string"})", "p", "must describe a JSON object");
    refused_compile(R"({"type":"object","properties":{"s":{"type":"string","minLength":5,"maxLength":2}}})",
                    "p.properties.s.minLength", "above maxLength");
    refused_compile(R"({"type":"object","properties":{"n":{"type":"integer","minimum":0.2,"maximum":0.8}}})",
                    "p.properties.n", "no integer satisfies");
    refused_compile(R"({"type":"object","properties":{"e":{"enum":[]}}})", "p.properties.e.enum",
                    "must not be empty");
    refused_compile(R"({"type":"object","properties":{"e":{"type":"string","enum":[1,2]}}})",
                    "p.properties.e.enum", "no value satisfies");
    refused_compile(R"({"type":"object","required":["x"],"additionalProperties":false})", "p.required",
                    "neither properties nor additionalProperties");
    refused_compile(R"({"type":"object","properties":{"x":false},"required":["x"]})", "p.properties.x",
                    "allows no value");
    refused_compile(R"({"type":"object","properties":{"x":{"$ref":"#/$defs/missing"}}})",
                    "p.properties.x.$ref", "points to nothing");
    refused_compile(R"({"type":"object","properties":{"x":{"type":"array","minItems":3,"maxItems":1}}})",
                    "p.properties.x.minItems", "above maxItems");
}

BOOST_AUTO_TEST_CASE(lenient_mode_drops_what_it_cannot_enforce) {
    const std::string schema =
        R"({"type":"object","properties":{"x":{"type":"string","pattern":"^a","format":"email"},"n":{"type":"integer","multipleOf":3}},"required":["x"]})";
    auto s = json_schema::compile(schema, "p", schema_mode::lenient);
    BOOST_TEST_REQUIRE(s.ok());
    const auto& dropped = (*s)->dropped();
    BOOST_TEST(dropped.size() == 2u);
    BOOST_TEST((std::find(dropped.begin(), dropped.end(), "p.properties.x.pattern") != dropped.end()));
    BOOST_TEST((std::find(dropped.begin(), dropped.end(), "p.properties.n.multipleOf") != dropped.end()));
    // The rest still holds: x is required and a string.
    BOOST_TEST(feed(**s, R"({"x":"b","n":4})").complete);
    BOOST_TEST(feed(**s, R"({"n":4})").refused == 2);
}

BOOST_AUTO_TEST_CASE(roots_are_objects) {
    const auto nullable = compiled(R"({"type":["object","null"],"properties":{"a":{"type":"integer"}}})");
    BOOST_TEST(feed(*nullable, "null").refused == 0);
    BOOST_TEST(feed(*nullable, R"({"a":1})").complete);
    const auto either = compiled(
        R"({"anyOf":[{"type":"string"},{"type":"object","properties":{"k":{"const":true}},"required":["k"]}]})");
    BOOST_TEST(feed(*either, "\"s\"").refused == 0);
    BOOST_TEST(feed(*either, R"({"k":true})").complete);
    const auto any = compiled("{}");
    BOOST_TEST(feed(*any, R"({"free":[1,{"x":null}],"y":"z"})").complete);
    BOOST_TEST(feed(*any, "[1]").refused == 0);
    const auto literal = compiled(R"({"enum":[{"a":1},"x",[2]]})");
    BOOST_TEST(feed(*literal, R"({"a":1})").complete);
    BOOST_TEST(feed(*literal, "\"x\"").refused == 0);
}

BOOST_AUTO_TEST_CASE(documents_of_the_corpus) {
    const auto todo = corpus("TodoWrite");
    accepts(todo, R"({"todos":[]})");
    accepts(
        todo,
        R"({"todos":[{"content":"a","status":"pending","activeForm":"b"},{"content":"\u00e9","status":"completed","activeForm":"x y"}]})");
    refuses(todo, R"({"todos":[{"content":"","status":"pending","activeForm":"b"}]})",
            22);  // minLength 1: the closing quote
    refuses(todo, R"({"todos":[{"content":"a","status":"done","activeForm":"b"}]})",
            35);                                                             // no enum text starts with d
    refuses(todo, R"({"todos":[{"content":"a","status":"pending"}]})", 43);  // activeForm is required
    refuses(todo, R"({"todos":[{"status":"pending","content":"a","activeForm":"b"}]})",
            12);                                     // schema order: content first
    refuses(todo, R"({"todos":[],"extra":1})", 11);  // no undeclared keys: no comma
    refuses(todo, R"({})", 1);

    const auto read = corpus("read_file");
    accepts(read, R"({"path":"a.txt","offset":1,"limit":2000})");
    accepts(read, R"({"path":"x"})");
    refuses(read, R"({"path":"a","offset":0})", 21);    // minimum 1
    refuses(read, R"({"path":"a","limit":2001})", 23);  // maximum 2000: the last digit
    refuses(read, R"({"path":"a","offset":1.5})", 22);  // an integer
    refuses(read, R"({"path":"a","offset":1e2})", 22);
    refuses(read, R"({"path":"","offset":1})", 9);  // minLength 1
    accepts(read, "{ \"path\" : \"a\" ,\n\t\"offset\": 10 }");
    refuses(read, "{     \"path\":\"a\"}", 5);  // whitespace is bounded

    const auto bash = corpus("Bash");
    accepts(bash, R"({"command":"ls -la","timeout":600000,"run_in_background":false})");
    accepts(bash, R"({"command":"x","timeout":599999.99})");
    accepts(bash, R"({"command":"x","timeout":-3})");
    refuses(bash, R"({"command":"x","timeout":600000.5})", 32);
    refuses(bash, R"({"command":"x","timeout":6e5})", 26);  // no exponent on a bounded number

    const auto browser = corpus("browser");
    accepts(browser, R"({"action":{"type":"click","x":1,"y":2}})");
    accepts(browser, R"({"action":{"type":"type","text":"hi"}})");
    accepts(browser, R"({"action":{"type":"scroll","dy":-9.75}})");
    refuses(browser, R"({"action":{"type":"scroll","dy":-10.5}})", 36);
    refuses(browser, R"({"action":{"type":"click","text":"x"}})", 27);
    refuses(browser, R"({"action":{"type":"drag"}})", 19);

    const auto search = corpus("search");
    accepts(search, R"({"query":"x","max_results":null,"site":"a.b"})");
    accepts(search, R"({"query":"x","max_results":50})");
    refuses(search, R"({"query":"x","max_results":51})", 28);
    refuses(search, R"({"query":"x","other":1})", 14);

    const auto run = corpus("run");
    accepts(run, R"({"cmd":"ls","cwd":null,"env":{"A":"1","B":"2"}})");
    accepts(run, R"({"cmd":["git","status"],"cwd":"/tmp"})");
    refuses(run, R"({"cmd":[]})", 8);                          // minItems 1
    refuses(run, R"({"cmd":"ls","env":{"A":1}})", 23);         // additionalProperties string
    refuses(run, R"({"cmd":"ls","env":{"\u0041":"1"}})", 20);  // undeclared keys hold no escapes

    const auto grep = corpus("grep");
    accepts(grep, R"({"pattern":"a","paths":["x","y","z"],"ranges":[{"start":0,"end":3}]})");
    refuses(grep, R"({"pattern":"a","paths":["x","y","z","w"]})", 35);  // maxItems 3
    refuses(grep, R"({"pattern":"a","ranges":[{"start":-1,"end":3}]})", 35);

    const auto edit = corpus("Edit");
    accepts(
        edit,
        R"({"file_path":"a.c","edits":[{"old_string":"x","new_string":"y","mode":"insert_after","replace_all":true}],"options":{"encoding":"latin-1"}})");
    refuses(edit, R"({"file_path":"a.c","edits":[]})", 28);  // minItems 1

    // Strings may not hold U+FF5C raw (marker text); escaped it is fine.
    refuses(corpus("apply_patch"), "{\"input\":\"a\xEF\xBD\x9C\"}", 13);
    accepts(corpus("apply_patch"), R"({"input":"a\uff5c"})");
}

// From random prefixes of valid documents, the byte that lowers the cost by one always exists
// and completes the document in exactly that many bytes, and the result is valid: the cost is
// the shortest completion, no more, no less.
BOOST_AUTO_TEST_CASE(the_cost_is_the_shortest_completion) {
    std::mt19937 rng(11);
    // Bytes a random writer tries: JSON's structure, digits, letters, an escape, a UTF-8 lead.
    const std::string alphabet = "{}[]\":,-.0123456789eEtrufalsn \\abcxyz_\xC3\xA9";
    int64_t completed = 0;
    for (const auto& a : tools::k_agent_schemas) {
        const auto s = compiled(a.schema);
        const schema_validator v(a.schema);
        for (int trial = 0; trial < 60; ++trial) {
            schema_automaton at(s.get(), limits());
            std::string doc;
            const size_t length = rng() % 48;
            for (size_t n = 0; n < length * 4 && doc.size() < length && !at.complete(); ++n) {
                const char c = alphabet[rng() % alphabet.size()];
                schema_automaton next = at;
                if (!next.step(uint8_t(c))) continue;
                at = next;
                doc.push_back(c);
            }
            size_t cost = at.min_bytes_to_complete();
            while (!at.complete()) {
                bool found = false;
                for (int b = 0; b < 256 && !found; ++b) {
                    schema_automaton next = at;
                    if (!next.step(uint8_t(b)) || next.min_bytes_to_complete() + 1 != cost) continue;
                    at = next;
                    doc.push_back(char(b));
                    found = true;
                }
                BOOST_TEST_REQUIRE(found, a.name << ": no byte lowers the cost " << cost << " after " << doc);
                --cost;
            }
            BOOST_TEST_REQUIRE(cost == 0u, a.name << ": complete with cost left " << cost << ": " << doc);
            BOOST_TEST_REQUIRE(v.check(doc) == "", a.name << ": " << doc);
            ++completed;
        }
    }
    BOOST_TEST(completed == int64_t(60 * tools::k_agent_schemas.size()));
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
