#include "fixture_model.h"

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "../common/test_support.h"
#include "tools/convert_checkpoint.h"

namespace moestream::test {

std::string fixture_path(const std::string& name) { return (fixtures_dir() / name).string(); }

namespace {

std::unique_ptr<loaded_model> convert_and_load(const std::string& name, const std::string& tag, bool lossless) {
    const auto dir = scratch_dir("exact-" + name + "-" + tag + (lossless ? "-lossless" : ""));
    convert::options o{fixture_path(name), (dir / "target.gguf").string(), (dir / "draft.gguf").string(), 1};
    o.lossless = lossless;
    auto st = convert::convert_checkpoint(o, [](std::string_view) {});
    if (!st.ok()) BOOST_FAIL("convert " << name << ": " << st.message());
    auto files = load_model(o.out, o.draft_out);
    if (!files.ok()) BOOST_FAIL("load " << name << ": " << files.message());
    return std::move(*files);
}

}  // namespace

fixture_model& fixture(const std::string& name, int threads, bool lossless) {
    static std::map<std::tuple<std::string, int, bool>, std::unique_ptr<fixture_model>> cache;
    auto& slot = cache[{name, threads, lossless}];
    if (slot) return *slot;
    slot = std::make_unique<fixture_model>();
    slot->dir = fixture_path(name);
    slot->files = convert_and_load(name, std::to_string(threads), lossless);
    slot->backend = std::make_unique<cpu_backend>(threads);
    slot->experts = std::make_unique<resident_experts>(*slot->files);
    slot->model = std::make_unique<dsv41::model>(slot->files->hp, slot->files->weights, &*slot->files->draft,
                                                 *slot->experts, *slot->backend);
    return *slot;
}

std::unique_ptr<fixture_model> fixture_on(std::unique_ptr<backend> be, const std::string& name, bool lossless,
                                          int64_t expert_slots) {
    auto m = std::make_unique<fixture_model>();
    m->dir = fixture_path(name);
    // Its own load (the files are small): the fixture owns what its model views.
    m->files = convert_and_load(name, std::string("on-") + be->name() + "-" + std::to_string(expert_slots), lossless);
    m->backend = std::move(be);
    auto dev = upload_dense_weights(*m->backend, *m->files);
    if (!dev.ok()) BOOST_FAIL("upload " << name << ": " << dev.message());
    m->device = std::move(*dev);
    const int64_t total = m->files->total_experts();
    const int64_t slots = expert_slots > 0 ? expert_slots : total;
    auto ex = device_experts::create(*m->backend, *m->files, slots, slots >= total);
    if (!ex.ok()) BOOST_FAIL("expert slots " << name << ": " << ex.message());
    m->experts = std::move(*ex);
    m->model = std::make_unique<dsv41::model>(m->files->hp, m->device->weights, &*m->device->draft, *m->experts,
                                              *m->backend);
    return m;
}

namespace {
const safetensors::tensor& find(const safetensors::file& f, const std::string& path, const std::string& name) {
    const auto* t = f.find(name);
    BOOST_TEST_REQUIRE(t != nullptr, path << ": no tensor " << name);
    return *t;
}
}  // namespace

std::vector<float> read_f32(const std::string& path, const std::string& tensor, std::vector<int64_t>* shape) {
    auto f = safetensors::file::open(path);
    if (!f.ok()) BOOST_FAIL(f.message());
    const auto& t = find(*f, path, tensor);
    BOOST_TEST_REQUIRE((t.type == safetensors::dtype::f32));
    std::vector<float> out(static_cast<size_t>(t.elements()));
    std::memcpy(out.data(), f->data(t).data(), out.size() * 4);
    if (shape) *shape = t.shape;
    return out;
}

std::vector<int64_t> read_i64(const std::string& path, const std::string& tensor, std::vector<int64_t>* shape) {
    auto f = safetensors::file::open(path);
    if (!f.ok()) BOOST_FAIL(f.message());
    const auto& t = find(*f, path, tensor);
    std::vector<int64_t> out(static_cast<size_t>(t.elements()));
    const auto bytes = f->data(t);
    for (size_t i = 0; i < out.size(); ++i) {
        if (t.type == safetensors::dtype::i64) std::memcpy(&out[i], bytes.data() + 8 * i, 8);
        else if (t.type == safetensors::dtype::i32) {
            int32_t v;
            std::memcpy(&v, bytes.data() + 4 * i, 4);
            out[i] = v;
        } else out[i] = int64_t(uint8_t(bytes[i]));
    }
    if (shape) *shape = t.shape;
    return out;
}

std::vector<int32_t> prompt_ids(const std::string& fixture_name, int len) {
    const auto ids = read_i64(fixture_path(fixture_name) + "/prompt_len" + std::to_string(len) + ".safetensors", "input_ids");
    return {ids.begin(), ids.end()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double correlation(const float* a, const float* b, int64_t n) {
    double ma = 0, mb = 0;
    for (int64_t i = 0; i < n; ++i) ma += a[i], mb += b[i];
    ma /= double(n), mb /= double(n);
    double sab = 0, saa = 0, sbb = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double da = a[i] - ma, db = b[i] - mb;
        sab += da * db, saa += da * da, sbb += db * db;
    }
    if (saa == 0 || sbb == 0) return saa == sbb ? 1.0 : 0.0;
    return sab / std::sqrt(saa * sbb);
}

}  // namespace moestream::test
