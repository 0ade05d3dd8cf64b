// Helpers of the CUDA suite: a CPU backend and a CUDA backend side by side, host <-> backend
// copies, random inputs, and comparisons (bit for bit, or within a relative bound).
#pragma once

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "model/backend.h"
#include "model/bf16.h"
#include "model/cpu_backend.h"
#include "model/cuda/cuda_backend.h"

namespace moestream::test {

// One CUDA backend per test process (made on first use).
inline backend& gpu() {
    static std::unique_ptr<backend> be = [] {
        auto b = cuda::make_backend({});
        if (!b) BOOST_FAIL("cuda backend: " << b.message());
        return std::move(*b);
    }();
    return *be;
}

inline cpu_backend& cpu() {
    static cpu_backend be(2);
    return be;
}

// v's values in a new array of `be`'s memory.
template <class T>
backend_array<T> put(backend& be, const std::vector<T>& v) {
    backend_array<T> a(be, v.size());
    be.upload(a.data(), v.data(), v.size() * sizeof(T));
    return a;
}

template <class T>
std::vector<T> get(backend& be, const backend_array<T>& a) {
    std::vector<T> v(a.size());
    be.download(v.data(), a.data(), v.size() * sizeof(T));
    return v;
}

// Values of bf16 precision (most activations are), fresh for every seed.
inline std::vector<float> bf16_values(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = round_to_bf16(d(rng));
    return v;
}

inline std::vector<float> float_values(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

inline bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ‖a - b‖ / ‖b‖ (NaN anywhere: infinity).
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
        if (std::isnan(a[i])) continue;
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

// How many values differ at all.
inline size_t count_different(const std::vector<float>& a, const std::vector<float>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
    return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

#define REQUIRE_BITS_EQUAL(a, b)                                                                     \
    BOOST_TEST_REQUIRE(bits_equal(a, b), "values differ: " << count_different(a, b) << " of " << (b).size() \
                                                           << ", rel error " << rel_error(a, b))

}  // namespace moestream::test
