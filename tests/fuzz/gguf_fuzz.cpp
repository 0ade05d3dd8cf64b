// libFuzzer target for gguf::parse. Any input must give a value or an error: no crash, no
// sanitizer report, no huge allocation. On success the parsed header's invariants are checked.
//
// Built with -DGGUF_FUZZ_SEED_WRITER the same file is instead a small program that writes a
// seed corpus of valid GGUF files (so the seeds always match the current writer).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "storage/gguf.h"

using namespace moestream;
using namespace moestream::gguf;

#ifndef GGUF_FUZZ_SEED_WRITER

namespace {

// Touches every value the way `inspect` and the model loader would.
void exercise(const value& v) {
    (void)v.to_display(4);
    (void)v.is_integer();
    if (v.is_integer()) {
        (void)v.as_u64();
        (void)v.as_i64();
    }
    (void)v.as_f64();
    (void)v.as_bool();
    (void)v.as_string();
    if (const auto* items = v.as_array())
        for (const auto& item : *items) exercise(item);
}

void check_invariants(const parsed_header& h, size_t size) {
    MS_ASSERT(h.alignment > 0 && (h.alignment & (h.alignment - 1)) == 0);
    MS_ASSERT(h.data_offset % h.alignment == 0);
    std::vector<const tensor_info*> order;
    for (const auto& t : h.tensors) {
        MS_ASSERT(t.n_dims >= 1 && t.n_dims <= kMaxDims);
        MS_ASSERT(t.elements() > 0);
        MS_ASSERT(t.bytes > 0 && t.file_offset == h.data_offset + t.offset);
        MS_ASSERT(t.file_offset % h.alignment == 0);
        MS_ASSERT(t.file_offset <= size && t.bytes <= size - t.file_offset);
        MS_ASSERT(dtype_info(static_cast<uint32_t>(t.type)).has_value());
        order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->file_offset < b->file_offset; });
    for (size_t i = 1; i < order.size(); ++i)
        MS_ASSERT(order[i - 1]->file_offset + order[i - 1]->bytes <= order[i]->file_offset);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto bytes = std::as_bytes(std::span(data, size));
    auto h = parse(bytes, "fuzz.gguf");
    if (!h.ok()) {
        MS_ASSERT(h.message().starts_with("fuzz.gguf: "));  // errors always name the file
        return 0;
    }
    for (const auto& e : h->metadata) exercise(e.val);
    check_invariants(*h, size);
    return 0;
}

#else  // GGUF_FUZZ_SEED_WRITER

namespace {

tensor_filler ramp(uint8_t seed) {
    return [seed](std::span<std::byte> out) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = std::byte(static_cast<uint8_t>(i + seed));
    };
}

bool write(writer& w, const std::string& path) {
    auto r = w.write(path);
    if (!r.ok()) std::fprintf(stderr, "%s\n", r.message().c_str());
    return r.ok();
}

}  // namespace

// Writes small valid GGUF files into argv[1] (alignment 32 keeps them a few hundred bytes).
int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    bool ok = true;
    {
        writer w({.alignment = 32});
        w.set("general.architecture", value::str("seed"));
        w.set("u8", value{value_type::u8, value_type::u8, uint64_t(7)});
        w.set("i16", value{value_type::i16, value_type::u8, int64_t(-3)});
        w.set("f64", value::f64(0.25));
        w.set("flag", value::boolean(true));
        w.set("u64", value::u64(1) );
        w.set("tokens", value::str_array(std::vector<std::string>{"<s>", "a", "bc"}));
        w.set("nested", value::array(value_type::array, {value::u32_array(std::vector<uint32_t>{1, 2}),
                                                         value::array(value_type::i8, {})}));
        ok &= write(w, dir + "/metadata.gguf");
    }
    {
        writer w({.alignment = 32});
        w.set("general.name", value::str("tensors"));
        w.add_tensor("a", ggml_type::f32, {4, 2}, ramp(1));
        w.add_tensor("b", ggml_type::q8_0, {32, 1, 2}, ramp(2));
        w.add_tensor("c", ggml_type::f16, {3}, ramp(3));
        w.add_tensor("d", ggml_type::q4_k, {256}, ramp(4));
        ok &= write(w, dir + "/tensors.gguf");
    }
    {
        writer w({.alignment = 32, .shards = 2});
        w.set("general.name", value::str("split"));
        w.add_tensor("x", ggml_type::i32, {5}, ramp(5));
        w.add_tensor("y", ggml_type::bf16, {2, 2, 2, 2}, ramp(6));
        ok &= write(w, dir + "/split.gguf");
    }
    {
        writer w({.alignment = 1});
        w.add_tensor("z", ggml_type::mxfp4, {32}, ramp(7));
        ok &= write(w, dir + "/align1.gguf");
    }
    return ok ? 0 : 1;
}

#endif
