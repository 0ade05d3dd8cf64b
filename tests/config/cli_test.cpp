#include <boost/test/unit_test.hpp>

#include "config/cli.h"
#include "config/dtype.h"

using namespace moestream;

namespace {
const cli::option_spec kSpecs[] = {
    {"out", "FILE", "output"}, {"seed", "N", "seed"}, {"special", "", "flag"}, {"x", "V", "repeat"}};
}

BOOST_AUTO_TEST_CASE(parses_values_flags_and_positionals) {
    std::vector<std::string> argv{"--out", "a.gguf", "--seed=7", "--special", "pos", "--x", "1", "--x", "2"};
    auto a = cli::args::parse(argv, kSpecs);
    BOOST_REQUIRE(a.ok());
    BOOST_TEST(*a->get("out") == "a.gguf");
    BOOST_TEST(a->get_int("seed", 0).value() == 7);
    BOOST_TEST(a->flag("special"));
    BOOST_TEST(a->positional().size() == 1u);
    BOOST_TEST(a->values("x").size() == 2u);
    BOOST_TEST(*a->get("x") == "2");
}

BOOST_AUTO_TEST_CASE(rejects_unknown_and_malformed_options) {
    std::vector<std::string> unknown{"--nope", "1"};
    auto a = cli::args::parse(unknown, kSpecs);
    BOOST_REQUIRE(!a.ok());
    BOOST_TEST(a.message().find("--nope") != std::string::npos);

    std::vector<std::string> missing{"--out"};
    BOOST_TEST(!cli::args::parse(missing, kSpecs).ok());

    std::vector<std::string> flag_with_value{"--special=1"};
    BOOST_TEST(!cli::args::parse(flag_with_value, kSpecs).ok());

    std::vector<std::string> bad_int{"--seed", "12x"};
    auto b = cli::args::parse(bad_int, kSpecs);
    BOOST_REQUIRE(b.ok());
    auto seed = b->get_int("seed", 0);
    BOOST_REQUIRE(!seed.ok());
    BOOST_TEST(seed.message().find("--seed") != std::string::npos);
    BOOST_TEST(!cli::parse_int("99999999999999999999", "n").ok());
    BOOST_TEST(!cli::parse_double("nan", "d").ok());
    BOOST_TEST(!cli::parse_double("1e999", "d").ok());
}

BOOST_AUTO_TEST_CASE(dtype_table_matches_ggml) {
    BOOST_TEST(dtype_info(ggml_type::q8_0).block_bytes == 34);
    BOOST_TEST(dtype_info(ggml_type::mxfp4).block_bytes == 17);
    BOOST_TEST(static_cast<uint32_t>(ggml_type::bf16) == 30u);
    BOOST_TEST(static_cast<uint32_t>(ggml_type::mxfp4) == 39u);
    BOOST_TEST(!dtype_info(31).has_value());  // removed Q4_0_4_4 number
    BOOST_TEST(!dtype_info(40).has_value());
    BOOST_TEST(!dtype_info(64).has_value());
    BOOST_TEST(!dtype_info(0xffffffffu).has_value());
    // Every known id maps to its own entry (the lookup is indexed by id).
    for (uint32_t id = 0; id < 64; ++id)
        if (auto t = dtype_info(id)) {
            BOOST_TEST(static_cast<uint32_t>(t->type) == id);
            BOOST_TEST(&dtype_info(t->type) == &dtype_info(t->type));
            BOOST_TEST(dtype_info(t->type).name == t->name);
        }
    BOOST_TEST(parse_dtype("q8_0").has_value());
    BOOST_TEST(row_bytes(dtype_info(ggml_type::mxfp4), 64) == 34);
}
