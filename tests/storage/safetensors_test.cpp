// safetensors reader: hand-made files read back, every corruption an error naming file/tensor,
// and the fixture checkpoint's reference names.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "storage/safetensors.h"
#include "tests/common/test_support.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

// Writes length + header + data exactly as given (no padding), so tests control every byte.
std::string write_raw(const fs::path& dir, const std::string& name, const std::string& header, const std::string& data,
                      int64_t claimed_len = -1) {
    const auto path = (dir / name).string();
    std::ofstream out(path, std::ios::binary);
    uint64_t n = claimed_len < 0 ? header.size() : uint64_t(claimed_len);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << data;
    return path;
}

const std::string kGood =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
    R"("b":{"dtype":"F4","shape":[2,4],"data_offsets":[16,20]},"c":{"dtype":"F8_E8M0","shape":[3],"data_offsets":[20,23]}})";

std::string good_data() {
    std::string d(23, '\0');
    const float v[4] = {1, 2, 3, 4};
    std::memcpy(d.data(), v, 16);
    d[16] = 0x21;
    return d;
}

std::string open_error(const std::string& path) {
    auto f = safetensors::file::open(path);
    BOOST_REQUIRE(!f);
    return f.message();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors_reader)

BOOST_AUTO_TEST_CASE(reads_hand_made_file) {
    auto dir = test::scratch_dir("safetensors_good");
    auto f = safetensors::file::open(write_raw(dir, "m.safetensors", kGood, good_data()));
    BOOST_REQUIRE_MESSAGE(f, (f ? "" : f.message()));
    BOOST_TEST(f->tensors().size() == 3u);
    BOOST_TEST(f->metadata().at("format") == "pt");
    const auto* a = f->find("a");
    BOOST_REQUIRE(a);
    BOOST_TEST(safetensors::dtype_name(a->type) == "F32");
    BOOST_TEST(a->elements() == 4);
    float back[4];
    std::memcpy(back, f->data(*a).data(), 16);
    BOOST_TEST(back[3] == 4.0f);
    const auto* b = f->find("b");
    BOOST_REQUIRE(b);
    BOOST_TEST(b->bytes == 4u);  // F4: two elements a byte
    BOOST_TEST(uint8_t(f->data(*b)[0]) == 0x21);
    BOOST_TEST(!f->find("zzz"));
}

BOOST_AUTO_TEST_CASE(truncated_files_are_errors) {
    auto dir = test::scratch_dir("safetensors_trunc");
    {
        const auto p = (dir / "tiny.safetensors").string();
        std::ofstream(p, std::ios::binary) << "abc";
        auto msg = open_error(p);
        BOOST_TEST(msg.find("tiny.safetensors") != std::string::npos);
        BOOST_TEST(msg.find("truncated") != std::string::npos);
    }
    {
        auto msg = open_error(write_raw(dir, "hdr.safetensors", kGood, "", int64_t(kGood.size()) + 100));
        BOOST_TEST(msg.find("truncated") != std::string::npos);
    }
    {
        // Data section shorter than the offsets: the tensor past the end is named.
        auto msg = open_error(write_raw(dir, "data.safetensors", kGood, good_data().substr(0, 18)));
        BOOST_TEST(msg.find("data.safetensors") != std::string::npos);
        BOOST_TEST(msg.find("'b'") != std::string::npos);
        BOOST_TEST(msg.find("out of range") != std::string::npos);
    }
}

BOOST_AUTO_TEST_CASE(header_corruptions_name_the_tensor) {
    auto dir = test::scratch_dir("safetensors_bad");
    struct bad_case {
        std::string header, expect;
    };
    const bad_case cases[] = {
        {R"({"x":{"dtype":"Q9","shape":[4],"data_offsets":[0,16]}})", "unknown dtype 'Q9'"},
        {R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", "need 20"},
        {R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[8,4]}})", "out of range"},
        {R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}})", "out of range"},
        {R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "non-negative"},
        {R"({"x":{"dtype":"F32","shape":[4]}})", "data_offsets"},
        {R"({"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", "odd element count"},
    };
    for (const auto& c : cases) {
        auto msg = open_error(write_raw(dir, "bad.safetensors", c.header, std::string(32, '\0')));
        BOOST_TEST_INFO(c.header);
        BOOST_TEST(msg.find("bad.safetensors") != std::string::npos);
        BOOST_TEST(msg.find("'x'") != std::string::npos);
        BOOST_TEST(msg.find(c.expect) != std::string::npos, msg);
    }
    auto overlap = open_error(write_raw(dir, "ov.safetensors",
                                        R"({"p":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                        R"("q":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                        std::string(16, '\0')));
    BOOST_TEST(overlap.find("'p'") != std::string::npos);
    BOOST_TEST(overlap.find("'q'") != std::string::npos);
    BOOST_TEST(overlap.find("overlap") != std::string::npos);
    auto json = open_error(write_raw(dir, "json.safetensors", "{not json", ""));
    BOOST_TEST(json.find("json.safetensors") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(reads_fixture_checkpoint,
                     *test::requires_path(test::fixtures_dir() / "dsv41-tiny-fp8" / "model.safetensors")) {
    auto f = safetensors::file::open((test::fixtures_dir() / "dsv41-tiny-fp8" / "model.safetensors").string());
    BOOST_REQUIRE_MESSAGE(f, (f ? "" : f.message()));
    for (const char* name : {"embed.weight", "head.weight", "norm.weight", "layers.0.attn.wq_a.weight",
                             "layers.0.attn.wq_a.scale", "layers.0.ffn.experts.63.w2.weight",
                             "layers.1.engram.embed.weight", "mtp.2.markov_head.embed.weight"})
        BOOST_TEST(f->find(name) != nullptr, name);
    const auto* w1 = f->find("layers.0.ffn.experts.0.w1.weight");
    BOOST_REQUIRE(w1);
    BOOST_TEST(safetensors::dtype_name(w1->type) == "F4");
    BOOST_TEST(w1->bytes == uint64_t(w1->elements() / 2));
    BOOST_TEST(safetensors::dtype_name(f->find("layers.0.attn.wkv.weight")->type) == "F8_E4M3");
}

BOOST_AUTO_TEST_SUITE_END()
