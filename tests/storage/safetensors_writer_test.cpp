// safetensors writer: files read back by the reader bit for bit (every dtype the dumps use, scalars,
// empty tensors, metadata needing JSON escapes), layout rules of the format, and refused input.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "storage/safetensors.h"
#include "storage/safetensors_writer.h"
#include "tests/common/test_support.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

template <class T>
std::vector<T> read_back(const safetensors::file& f, const std::string& name) {
    const auto* t = f.find(name);
    BOOST_REQUIRE_MESSAGE(t, "missing tensor " + name);
    auto bytes = f.data(*t);
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors_writer)

BOOST_AUTO_TEST_CASE(round_trips_through_the_reader) {
    auto dir = test::scratch_dir("safetensors_writer_rt");
    const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 181.019f};
    const std::vector<int32_t> i32 = {-7, 0, 2147483647};
    const std::vector<int64_t> i64 = {int64_t(1) << 40, -1};
    const std::vector<uint8_t> u8 = {1, 2, 3};  // odd size: the next tensor starts unaligned
    const std::vector<float> after_u8 = {42.0f};
    const std::vector<float> scalar = {9.0f};

    safetensors::writer w;
    BOOST_REQUIRE(w.add<float>("z.first", {2, 3}, f32));
    BOOST_REQUIRE(w.add<int32_t>("a.ints", {3}, i32));
    BOOST_REQUIRE(w.add<int64_t>("i64", {1, 2}, i64));
    BOOST_REQUIRE(w.add<uint8_t>("bytes", {3}, u8));
    BOOST_REQUIRE(w.add_view<float>("after_u8", {1}, after_u8));
    BOOST_REQUIRE(w.add<float>("empty", {0, 4}, std::span<const float>()));
    BOOST_REQUIRE(w.add<float>("scalar", {}, scalar));
    BOOST_REQUIRE(w.set_metadata("format", "pt"));
    BOOST_REQUIRE(w.set_metadata("note", "quote \" backslash \\ newline \n tab \t bell \x07 utf8 \xc3\xa9"));
    BOOST_REQUIRE(w.mark_stacked("z.first"));
    BOOST_TEST(w.size() == 7u);
    BOOST_TEST(w.contains("bytes"));

    const auto path = (dir / "rt.safetensors").string();
    auto st = w.write(path);
    BOOST_REQUIRE_MESSAGE(st, (st ? "" : st.message()));
    BOOST_TEST(!fs::exists(path + ".partial"));

    auto f = safetensors::file::open(path);
    BOOST_REQUIRE_MESSAGE(f, (f ? "" : f.message()));
    BOOST_TEST(f->tensors().size() == 7u);
    BOOST_TEST(read_back<float>(*f, "z.first") == f32);
    BOOST_TEST(read_back<int32_t>(*f, "a.ints") == i32);
    BOOST_TEST(read_back<int64_t>(*f, "i64") == i64);
    BOOST_TEST(read_back<uint8_t>(*f, "bytes") == u8);
    BOOST_TEST(read_back<float>(*f, "after_u8") == after_u8);
    BOOST_TEST(read_back<float>(*f, "scalar") == scalar);
    BOOST_TEST(f->find("z.first")->shape == (std::vector<int64_t>{2, 3}));
    BOOST_TEST(safetensors::dtype_name(f->find("a.ints")->type) == "I32");
    BOOST_TEST(safetensors::dtype_name(f->find("i64")->type) == "I64");
    BOOST_TEST(safetensors::dtype_name(f->find("bytes")->type) == "U8");
    const auto* empty = f->find("empty");
    BOOST_REQUIRE(empty);
    BOOST_TEST(empty->bytes == 0u);
    BOOST_TEST(empty->shape == (std::vector<int64_t>{0, 4}));
    BOOST_TEST(f->find("scalar")->shape.empty());

    const auto& md = f->metadata();
    BOOST_TEST(md.at("format") == "pt");
    BOOST_TEST(md.at("note") == "quote \" backslash \\ newline \n tab \t bell \x07 utf8 \xc3\xa9");
    BOOST_TEST(md.at("order") == "z.first,a.ints,i64,bytes,after_u8,empty,scalar");
    BOOST_TEST(md.at("stacked") == "z.first");
}

BOOST_AUTO_TEST_CASE(layout_follows_the_format) {
    auto dir = test::scratch_dir("safetensors_writer_layout");
    const std::vector<uint8_t> a = {1, 2, 3, 4, 5};
    const std::vector<float> b = {1, 2};
    safetensors::writer w;
    BOOST_REQUIRE(w.add<uint8_t>("a", {5}, a));
    BOOST_REQUIRE(w.add<float>("b", {2}, b));
    const auto path = (dir / "layout.safetensors").string();
    BOOST_REQUIRE(w.write(path));
    const std::string bytes = slurp(path);
    uint64_t len = 0;
    std::memcpy(&len, bytes.data(), 8);
    BOOST_TEST(len % 8 == 0u);  // the data section starts 8-byte aligned
    const std::string header = bytes.substr(8, len);
    BOOST_TEST(header.find_last_not_of(' ') == header.rfind('}'));  // padded with spaces only
    // Back to back, in insertion order, and the file ends where the last tensor does.
    BOOST_TEST(header.find(R"("a":{"dtype":"U8","shape":[5],"data_offsets":[0,5]})") != std::string::npos);
    BOOST_TEST(header.find(R"("b":{"dtype":"F32","shape":[2],"data_offsets":[5,13]})") != std::string::npos);
    BOOST_TEST(bytes.size() == 8 + len + 13);

    // An empty writer is still a valid file (metadata only).
    safetensors::writer none;
    BOOST_REQUIRE(none.write((dir / "none.safetensors").string()));
    auto f = safetensors::file::open((dir / "none.safetensors").string());
    BOOST_REQUIRE_MESSAGE(f, (f ? "" : f.message()));
    BOOST_TEST(f->tensors().empty());
    BOOST_TEST(f->metadata().at("order").empty());
}

BOOST_AUTO_TEST_CASE(rewrites_replace_the_file) {
    auto dir = test::scratch_dir("safetensors_writer_rewrite");
    const auto path = (dir / "x.safetensors").string();
    std::ofstream(path) << "old junk that is not safetensors";
    const std::vector<float> v = {3.0f};
    safetensors::writer w;
    BOOST_REQUIRE(w.add<float>("v", {1}, v));
    BOOST_REQUIRE(w.write(path));
    auto f = safetensors::file::open(path);
    BOOST_REQUIRE_MESSAGE(f, (f ? "" : f.message()));
    BOOST_TEST(read_back<float>(*f, "v") == v);
}

BOOST_AUTO_TEST_CASE(refuses_bad_input) {
    const std::vector<float> v = {1, 2, 3, 4};
    safetensors::writer w;
    BOOST_REQUIRE(w.add<float>("x", {4}, v));
    auto dup = w.add<float>("x", {2, 2}, v);
    BOOST_REQUIRE(!dup);
    BOOST_TEST(dup.message().find("'x'") != std::string::npos);
    BOOST_TEST(dup.message().find("twice") != std::string::npos);

    auto size = w.add<float>("y", {5}, v);
    BOOST_REQUIRE(!size);
    BOOST_TEST(size.message().find("'y'") != std::string::npos);
    BOOST_TEST(size.message().find("need 20") != std::string::npos);

    BOOST_TEST(!w.add<float>("a,b", {4}, v));
    BOOST_TEST(!w.add<float>("", {4}, v));
    BOOST_TEST(!w.add<float>("__metadata__", {4}, v));
    BOOST_TEST(!w.add<float>("neg", {-4}, v));
    BOOST_TEST(!w.set_metadata("order", "x"));
    BOOST_TEST(!w.set_metadata("stacked", "x"));
    BOOST_TEST(!w.mark_stacked("nosuch"));
    const std::vector<float> one = {1};
    BOOST_REQUIRE(w.add<float>("s", {}, one));
    BOOST_TEST(!w.mark_stacked("s"));
    BOOST_TEST(w.size() == 2u);  // refused tensors were not added
}

BOOST_AUTO_TEST_CASE(write_errors_name_the_path) {
    auto dir = test::scratch_dir("safetensors_writer_err");
    const auto path = (dir / "no" / "such" / "dir" / "x.safetensors").string();
    safetensors::writer w;
    auto st = w.write(path);
    BOOST_REQUIRE(!st);
    BOOST_TEST(st.message().find(path) != std::string::npos, st.message());
}

BOOST_AUTO_TEST_SUITE_END()
