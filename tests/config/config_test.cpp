#include <boost/test/unit_test.hpp>
#include <fstream>

#include "config/config.h"
#include "tests/common/test_support.h"

using namespace moestream;

namespace {
result<moestream_config> load(std::vector<std::string> argv) {
    auto specs = with_config_options({{"model", "FILE", ""}, {"port", "N", ""}, {"api-key", "KEY", ""}});
    auto a = cli::args::parse(argv, specs);
    BOOST_REQUIRE(a.ok());
    return load_config(*a);
}
}  // namespace

BOOST_AUTO_TEST_CASE(defaults_validate) {
    auto c = load({});
    BOOST_REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.message()));
    BOOST_TEST(c->server.host == "127.0.0.1");
    BOOST_TEST(std::string(io_mode_name(c->io.mode)) == "coroutine");
}

BOOST_AUTO_TEST_CASE(flags_override_file_over_defaults) {
    auto dir = test::scratch_dir("config_layers");
    auto path = (dir / "c.json").string();
    std::ofstream(path) << R"({"cache": {"device_cache_gib": 3, "host_cache_gib": 9}, "io": {"depth": 7}})";
    auto c = load({"--config", path, "--host-cache", "11", "--io-mode", "remap-sync", "--api-key", "a", "--api-key", "b"});
    BOOST_REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.message()));
    BOOST_TEST(c->cache.device_cache_gib == 3.0);   // from the file
    BOOST_TEST(c->cache.host_cache_gib == 11.0);    // flag wins over the file
    BOOST_TEST(c->io.depth == 7);
    BOOST_TEST(c->io.chunk_kib == 1024);            // default
    BOOST_TEST(std::string(io_mode_name(c->io.mode)) == "remap-sync");
    BOOST_TEST(c->server.api_keys.size() == 2u);
    BOOST_TEST(to_json(*c).find("<redacted>") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(errors_name_the_field) {
    auto check = [](std::string json, std::string expect) {
        auto r = apply_json({}, json, "x.json");
        std::string msg;
        if (r.ok()) {
            auto v = validate(*r);
            BOOST_REQUIRE_MESSAGE(!v.ok(), "accepted: " + json);
            msg = v.message();
        } else {
            msg = r.message();
        }
        BOOST_TEST_MESSAGE(msg);
        BOOST_TEST(msg.find(expect) != std::string::npos, msg << " lacks " << expect);
    };
    check(R"({"io": {"depth": "deep"}})", "io.depth");
    check(R"({"io": {"depth": 0}})", "io.depth");
    check(R"({"io": {"chunk_kib": 6}})", "io.chunk_kib");
    check(R"({"io": {"mode": "fast"}})", "io.mode");
    check(R"({"io": {"lookahead_layers": 7}})", "io.lookahead_layers");
    check(R"({"cache": {"device_cache_gb": 1}})", "cache.device_cache_gb");
    check(R"({"cache": {"policy": "mru"}})", "cache.policy");
    check(R"({"caches": {}})", "caches");
    check(R"({"server": {"port": 70000}})", "server.port");
    check(R"({"log": {"level": "loud"}})", "log.level");
    check(R"({"io": )", "not valid JSON");
}

// The tiers' eviction policy: a flag or a field, printed and loaded again; a bad name is refused.
BOOST_AUTO_TEST_CASE(cache_policy) {
    auto d = load({});
    BOOST_REQUIRE(d.ok());
    BOOST_TEST(d->cache.policy == "lru");
    auto layered = load({"--cache-policy", "layered"});
    BOOST_REQUIRE_MESSAGE(layered.ok(), (layered.ok() ? "" : layered.message()));
    BOOST_TEST(layered->cache.policy == "layered");
    auto printed = apply_json({}, to_json(*layered), "printed.json");
    BOOST_REQUIRE_MESSAGE(printed.ok(), (printed.ok() ? "" : printed.message()));
    BOOST_TEST(printed->cache.policy == "layered");
    auto bad = load({"--cache-policy", "fifo"});
    BOOST_REQUIRE(!bad.ok());
    BOOST_TEST(bad.message().find("--cache-policy") != std::string::npos, bad.message());
    BOOST_TEST(bad.message().find("fifo") != std::string::npos, bad.message());
}

BOOST_AUTO_TEST_CASE(shipped_presets_are_valid) {
    for (auto name : {"demo.json", "deepseek-v41-flash-rtx5090.json"}) {
        auto c = load({"--config", (test::source_dir() / "config" / name).string()});
        BOOST_TEST_REQUIRE(c.ok(), name << ": " << (c.ok() ? "" : c.message()));
    }
    auto c = load({"--config", (test::source_dir() / "config/deepseek-v41-flash-rtx5090.json").string()});
    BOOST_TEST(c->cache.device_cache_gib == 18.0);
    BOOST_TEST(c->cache.host_cache_gib == 72.0);
    BOOST_TEST(c->runtime.context_tokens == 8192);
}

// The host tier defaults to "auto": a share of the memory available at start-up.
BOOST_AUTO_TEST_CASE(host_cache_auto) {
    auto d = load({});
    BOOST_REQUIRE(d.ok());
    BOOST_TEST(d->cache.host_cache_gib == cache_settings::k_auto);
    BOOST_TEST(d->cache.host_cache_share == 0.75);
    BOOST_TEST(host_tier_bytes(d->cache, 40ull << 30) == 30ull << 30);
    BOOST_TEST(to_json(*d).find(R"("host_cache_gib": "auto", "host_cache_share": 0.75)") != std::string::npos, to_json(*d));
    auto fixed = load({"--host-cache", "3"});
    BOOST_REQUIRE(fixed.ok());
    BOOST_TEST(host_tier_bytes(fixed->cache, 40ull << 30) == 3ull << 30);  // the available memory does not matter
    auto share = load({"--host-cache", "auto", "--host-cache-share", "0.5"});
    BOOST_REQUIRE(share.ok());
    BOOST_TEST(host_tier_bytes(share->cache, 40ull << 30) == 20ull << 30);
    auto dir = test::scratch_dir("config_host_auto");
    auto path = (dir / "c.json").string();
    std::ofstream(path) << R"({"cache": {"host_cache_gib": "auto", "host_cache_share": 0.25}})";
    auto file = load({"--config", path});
    BOOST_REQUIRE_MESSAGE(file.ok(), (file.ok() ? "" : file.message()));
    BOOST_TEST(file->cache.host_cache_gib == cache_settings::k_auto);
    BOOST_TEST(host_tier_bytes(file->cache, 40ull << 30) == 10ull << 30);
    // Round trip: what `moestream config` prints loads again.
    auto printed = apply_json({}, to_json(*file), "printed.json");
    BOOST_REQUIRE_MESSAGE(printed.ok(), (printed.ok() ? "" : printed.message()));
    BOOST_TEST(printed->cache.host_cache_gib == cache_settings::k_auto);
    BOOST_TEST(printed->cache.host_cache_share == 0.25);
    // Bad values name the field.
    for (const char* bad : {"-1", "lots"}) {
        auto r = load({"--host-cache", bad});
        BOOST_TEST_REQUIRE(!r.ok(), bad);
        BOOST_TEST(r.message().find("--host-cache") != std::string::npos, r.message());
    }
    for (const char* bad : {"0", "1.5"}) {
        auto r = load({"--host-cache-share", bad});
        BOOST_TEST_REQUIRE(!r.ok(), bad);
        BOOST_TEST(r.message().find("host_cache_share") != std::string::npos, r.message());
    }
    for (const char* json : {R"({"cache": {"host_cache_gib": "lots"}})", R"({"cache": {"host_cache_gib": -2}})"}) {
        auto r = apply_json({}, json, "x.json");
        BOOST_TEST_REQUIRE(!r.ok(), json);
        BOOST_TEST(r.message().find("cache.host_cache_gib") != std::string::npos, r.message());
    }
}

BOOST_AUTO_TEST_CASE(bad_flag_values_are_errors) {
    BOOST_TEST(!load({"--io-depth", "0"}).ok());
    BOOST_TEST(!load({"--device-cache", "lots"}).ok());
    BOOST_TEST(!load({"--config", "/nonexistent/x.json"}).ok());
}

// The speculative section (serve's) and its flags: --drafter / --spec-k over the file.
BOOST_AUTO_TEST_CASE(speculative_settings) {
    auto d = load({});
    BOOST_REQUIRE(d.ok());
    BOOST_TEST(d->speculative.drafter == "auto");
    BOOST_TEST(d->speculative.k == spec_settings::k_auto);
    auto f = apply_json({}, R"({"speculative": {"drafter": "ngram", "k": 3}})", "s.json");
    BOOST_REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.message()));
    BOOST_TEST(validate(*f).ok());
    BOOST_TEST(f->speculative.drafter == "ngram");
    BOOST_TEST(f->speculative.k == 3);
    // The printed configuration reads back.
    auto round = apply_json({}, to_json(*f), "printed.json");
    BOOST_REQUIRE(round.ok());
    BOOST_TEST(round->speculative.k == 3);
    BOOST_TEST(apply_json({}, R"({"speculative": {"k": "auto"}})", "s.json")->speculative.k == spec_settings::k_auto);
    BOOST_TEST(!apply_json({}, R"({"speculative": {"k": "many"}})", "s.json").ok());
    BOOST_TEST(!apply_json({}, R"({"speculative": {"n_max": 3}})", "s.json").ok());
    BOOST_TEST(!validate(*apply_json({}, R"({"speculative": {"drafter": "eagle"}})", "s.json")).ok());
    BOOST_TEST(!validate(*apply_json({}, R"({"speculative": {"k": 6}})", "s.json")).ok());

    const auto specs = with_config_options({{"drafter", "NAME", ""}, {"spec-k", "K", ""}});
    const auto flags = [&](std::vector<std::string> argv, spec_settings& s) {
        auto a = cli::args::parse(argv, specs);
        BOOST_REQUIRE(a.ok());
        return apply_spec_flags(*a, s);
    };
    spec_settings s = f->speculative;
    BOOST_TEST(flags({"--spec-k", "auto"}, s).ok());
    BOOST_TEST(s.drafter == "ngram");  // the file's
    BOOST_TEST(s.k == spec_settings::k_auto);
    BOOST_TEST(flags({"--drafter", "dspark", "--spec-k", "2"}, s).ok());
    BOOST_TEST(s.drafter == "dspark");
    BOOST_TEST(s.k == 2);
    const auto bad = flags({"--drafter", "oracle:0.5"}, s);
    BOOST_TEST(bad.message().find("--drafter") != std::string::npos, bad.message());
    BOOST_TEST(s.drafter == "dspark");  // unchanged by a refused flag
    BOOST_TEST(!flags({"--spec-k", "9"}, s).ok());
    BOOST_TEST(!flags({"--spec-k", "x"}, s).ok());
}
