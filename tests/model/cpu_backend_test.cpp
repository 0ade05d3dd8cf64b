// Tests for the CPU backend's non-matmul ops (model/cpu_backend.cpp, model/cpu_elementwise.cpp):
// each op against a plain scalar reference written here, which is the backend's previous
// (serial, per-row / per-head) implementation. Where the op claims the same arithmetic the check
// is bit equality; where it changed the arithmetic (the order of a double sum, a vectorised exp)
// the tolerance is stated at the check. Every op must also give bit-identical rows for thread
// counts 1, 2, 3 and 7 and whatever other rows share the batch.
#include "model/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "model/attention_keys.h"
#include "model/bf16.h"
#include "model/cpu_elementwise.h"
#include "model/quant.h"
#include "tests/common/test_support.h"

using namespace moestream;

namespace {

constexpr int kThreadCounts[] = {1, 2, 3, 7};

std::vector<float> random_floats(size_t n, uint32_t seed, float sd = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

std::vector<float> bf16_floats(size_t n, uint32_t seed, float sd = 1.0f) {
    auto v = random_floats(n, seed, sd);
    round_to_bf16(v.data(), int64_t(v.size()));
    return v;
}

bool same_bits(float a, float b) {
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// Index of the first value whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
        if (!same_bits(a[i], b[i])) return int64_t(i);
    return -1;
}

#define REQUIRE_SAME_BITS(a, b)                                                                             \
    do {                                                                                                    \
        const std::vector<float>& a_ = (a);                                                                 \
        const std::vector<float>& b_ = (b);                                                                 \
        const int64_t at_ = first_bit_difference(a_, b_);                                                   \
        BOOST_REQUIRE_MESSAGE(at_ < 0, "bits differ at " << at_ << ": "                                     \
                                                         << a_[size_t(std::max<int64_t>(at_, 0))] << " vs " \
                                                         << b_[size_t(std::max<int64_t>(at_, 0))]);         \
    } while (0)

// Distance in representable floats (same sign assumed or both tiny).
int64_t ulps(float a, float b) {
    const auto key = [](float f) {
        const int32_t i = std::bit_cast<int32_t>(f);
        return i < 0 ? int64_t(int32_t(0x80000000u) - i) : int64_t(i);
    };
    return std::abs(key(a) - key(b));
}

// Runs op(backend) for each thread count and requires the same bits from all (op returns the
// values it produced).
std::vector<float> same_for_every_thread_count(const std::function<std::vector<float>(cpu_backend&)>& op) {
    std::vector<float> first;
    for (int t : kThreadCounts) {
        cpu_backend be(t);
        auto v = op(be);
        if (first.empty())
            first = std::move(v);
        else
            REQUIRE_SAME_BITS(v, first);
    }
    return first;
}

// ---- the previous implementations, as the references ----

double ref_dot(const float* a, const float* b, int64_t n) {
    float lane[32] = {};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 32; ++k) lane[k] += a[i + k] * b[i + k];
    for (int k = 0; i + k < n; ++k) lane[k] += a[i + k] * b[i + k];  // i is a multiple of 32
    for (int w = 16; w >= 1; w /= 2)
        for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
    return lane[0];
}

float ref_inv_rms(const float* x, int64_t n, float eps) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return 1.0f / std::sqrt(float(s / double(n)) + eps);
}

void ref_rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y, bool round) {
    for (int64_t r = 0; r < n; ++r) {
        const float s = ref_inv_rms(x + r * dim, dim, eps);
        for (int64_t i = 0; i < dim; ++i) {
            float v = x[r * dim + i] * s;
            if (w) v *= w[i];
            y[r * dim + i] = round ? round_to_bf16(v) : v;
        }
    }
}

void ref_rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
              const int64_t* pos, const float* freqs, bool inverse) {
    const int64_t pairs = rope_dim / 2;
    std::vector<float> c(static_cast<size_t>(pairs)), s(static_cast<size_t>(pairs));
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < pairs; ++i) {
            const float theta = float(pos[r]) * freqs[i];
            c[size_t(i)] = std::cos(theta);
            s[size_t(i)] = inverse ? -std::sin(theta) : std::sin(theta);
        }
        for (int h = 0; h < n_heads; ++h) {
            float* t = x + r * row_stride + h * head_dim + (head_dim - rope_dim);
            for (int64_t i = 0; i < pairs; ++i) {
                const float a = t[2 * i], b = t[2 * i + 1];
                t[2 * i] = round_to_bf16(a * c[size_t(i)] - b * s[size_t(i)]);
                t[2 * i + 1] = round_to_bf16(a * s[size_t(i)] + b * c[size_t(i)]);
            }
        }
    }
}

float ref_sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}

void ref_hc_mixes_from_mix(const float* H, int64_t n, int hc, int64_t dim, std::vector<float> mix,
                           const float* base, const float* scale, int iters, float hc_eps, float norm_eps,
                           float* pre, float* post, float* comb) {
    const int64_t n_mix = (2 + hc) * hc;
    for (int64_t r = 0; r < n; ++r) {
        float* m = mix.data() + r * n_mix;
        const float s = ref_inv_rms(H + r * hc * dim, hc * dim, norm_eps);
        for (int64_t i = 0; i < n_mix; ++i) m[i] *= s;
        for (int k = 0; k < hc; ++k) {
            pre[r * hc + k] = ref_sigmoid(m[k] * scale[0] + base[k]) + hc_eps;
            post[r * hc + k] = 2.0f * ref_sigmoid(m[hc + k] * scale[1] + base[hc + k]);
        }
        float* C = comb + r * hc * hc;
        for (int i = 0; i < hc; ++i) {
            float mx = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < hc; ++j) {
                C[i * hc + j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
                mx = std::max(mx, C[i * hc + j]);
            }
            float sum = 0;
            for (int j = 0; j < hc; ++j) sum += (C[i * hc + j] = std::exp(C[i * hc + j] - mx));
            for (int j = 0; j < hc; ++j) C[i * hc + j] = C[i * hc + j] / sum + hc_eps;
        }
        auto normalize_columns = [&] {
            for (int j = 0; j < hc; ++j) {
                float sum = 0;
                for (int i = 0; i < hc; ++i) sum += C[i * hc + j];
                for (int i = 0; i < hc; ++i) C[i * hc + j] /= sum + hc_eps;
            }
        };
        normalize_columns();
        for (int it = 1; it < iters; ++it) {
            for (int i = 0; i < hc; ++i) {
                float sum = 0;
                for (int j = 0; j < hc; ++j) sum += C[i * hc + j];
                for (int j = 0; j < hc; ++j) C[i * hc + j] /= sum + hc_eps;
            }
            normalize_columns();
        }
    }
}

void ref_hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) {
    for (int64_t r = 0; r < n; ++r)
        for (int64_t d = 0; d < dim; ++d) {
            float s = 0;
            for (int k = 0; k < hc; ++k) s += p[r * hc + k] * H[(r * hc + k) * dim + d];
            out[r * dim + d] = round_to_bf16(s);
        }
}

void ref_hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                   const float* comb, float* out) {
    std::vector<float> tmp(size_t(hc * dim));
    for (int64_t r = 0; r < n; ++r) {
        for (int j = 0; j < hc; ++j)
            for (int64_t d = 0; d < dim; ++d) {
                float t = 0.0f;
                for (int i = 0; i < hc; ++i) t += comb[r * hc * hc + i * hc + j] * H[(r * hc + i) * dim + d];
                tmp[size_t(j * dim + d)] = round_to_bf16(post[r * hc + j] * f[r * dim + d] + t);
            }
        std::copy(tmp.begin(), tmp.end(), out + r * hc * dim);
    }
}

// One query row with its keys as a pointer list (the references' form).
struct ref_row {
    const float* q;
    const uint16_t* const* keys;
    int64_t n_keys;
    float* out;
};

// Per (row, head): scores, max with the sink, exp, denominator, then Σ p_i k_i in key order.
void ref_attention(std::span<const ref_row> rows, int n_heads, int64_t head_dim, float scale,
                   const float* sinks, bool bf16_probs) {
    for (const ref_row& row : rows)
        for (int h = 0; h < n_heads; ++h) {
            const float* q = row.q + h * head_dim;
            float* o = row.out + h * head_dim;
            std::fill(o, o + head_dim, 0.0f);
            if (row.n_keys == 0) continue;
            std::vector<float> p(static_cast<size_t>(row.n_keys)), key(static_cast<size_t>(head_dim));
            float m = -1e30f;  // the scores' max (the sink is not in it)
            for (int64_t i = 0; i < row.n_keys; ++i) {
                for (int64_t d = 0; d < head_dim; ++d) key[size_t(d)] = key_value(row.keys[i], d, head_dim);
                p[size_t(i)] = float(ref_dot(q, key.data(), head_dim)) * scale;
                m = std::max(m, p[size_t(i)]);
            }
            float denom = std::exp(sinks[h] - m);
            for (int64_t i = 0; i < row.n_keys; ++i) denom += (p[size_t(i)] = std::exp(p[size_t(i)] - m));
            for (int64_t i = 0; i < row.n_keys; ++i) {
                const float a = bf16_probs ? round_to_bf16(p[size_t(i)]) : p[size_t(i)];
                for (int64_t d = 0; d < head_dim; ++d) o[d] += a * key_value(row.keys[i], d, head_dim);
            }
            const float inv = 1.0f / denom;
            for (int64_t d = 0; d < head_dim; ++d) o[d] = round_to_bf16(o[d] * inv);
        }
}

void ref_swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) {
    for (int64_t r = 0; r < n; ++r) {
        const float wr = w ? w[r] : 1.0f;
        for (int64_t i = 0; i < inter; ++i) {
            const float gv = std::min(g[r * inter + i], limit);
            const float uv = std::clamp(u[r * inter + i], -limit, limit);
            const float h = gv / (1.0f + std::exp(-gv)) * uv;
            g[r * inter + i] = round_to_bf16(wr * h);
        }
    }
}

void ref_indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                        const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) {
    for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < n_keys; ++j) {
            if (j >= n_visible[r]) {
                scores[r * n_keys + j] = -std::numeric_limits<float>::infinity();
                continue;
            }
            float s = 0;
            for (int h = 0; h < n_heads; ++h) {
                const float qk = round_to_bf16(
                    float(ref_dot(q + (r * n_heads + h) * head_dim, keys + j * head_dim, head_dim)));
                s += round_to_bf16(std::max(qk, 0.0f) * w[r * n_heads + h]);
            }
            scores[r * n_keys + j] = round_to_bf16(s);
        }
}

void ref_engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                     float norm_eps) {
    std::vector<float> hn(static_cast<size_t>(dim)), kn(static_cast<size_t>(dim));
    const float inv_sqrt_dim = 1.0f / std::sqrt(float(dim));
    for (int64_t r = 0; r < n; ++r) {
        const float* value = kv + (r * (hc + 1) + hc) * dim;
        for (int k = 0; k < hc; ++k) {
            float* Hk = H + (r * hc + k) * dim;
            ref_rms_norm(Hk, 1, dim, nullptr, norm_eps, hn.data(), true);
            ref_rms_norm(kv + (r * (hc + 1) + k) * dim, 1, dim, nullptr, norm_eps, kn.data(), true);
            double d = 0;
            for (int64_t i = 0; i < dim; ++i) d += double(hn[size_t(i)] * qk[k * dim + i] * kn[size_t(i)]);
            const float dotv = float(d) * inv_sqrt_dim;
            const float sgn = dotv > 0 ? 1.0f : (dotv < 0 ? -1.0f : 0.0f);
            const float gate = ref_sigmoid(sgn * std::sqrt(std::max(std::fabs(dotv), 1e-6f)));
            for (int64_t i = 0; i < dim; ++i) Hk[i] = round_to_bf16(Hk[i] + gate * value[i]);
        }
    }
}

// Runs fn on rows [0, n) in one call and on each row alone, requiring the same bits (the batch
// must not change a row). row_out(r) gives the row's output values after a call.
void require_rows_independent_of_batch(
    int64_t n, const std::function<std::vector<float>(int64_t first, int64_t count)>& fn) {
    const auto all = fn(0, n);
    BOOST_REQUIRE_EQUAL(all.size() % size_t(n), 0u);
    const size_t per_row = all.size() / size_t(n);
    for (int64_t r = 0; r < n; ++r) {
        const auto alone = fn(r, 1);
        const std::vector<float> part(all.begin() + int64_t(per_row) * r,
                                      all.begin() + int64_t(per_row) * (r + 1));
        REQUIRE_SAME_BITS(alone, part);
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cpu_backend_ops)

// The vectorised exp is the correctly rounded fp32 exp but within ~5e-8 ulp of a tie (2 of 747M
// inputs off by one ulp in an exhaustive-stride sweep; none in this sample), so it is within 1
// ulp of glibc's expf (0.502 ulp).
BOOST_AUTO_TEST_CASE(exp_rounds_correctly_but_near_ties_and_handles_specials) {
    std::vector<float> x;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
        const float f = std::bit_cast<float>(uint32_t(u));
        if (f >= -110.0f && f <= 90.0f) x.push_back(f);
    }
    for (float f = -104.0f; f <= 89.0f; f += 0.125f) x.push_back(f);  // the reduction's ties
    std::vector<float> y(x.size());
    elementwise::exp_floats(x.data(), y.data(), int64_t(x.size()));
    int64_t not_correctly_rounded = 0, off_glibc = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const float exact = float(expl((long double)x[i]));  // rounded twice: exact enough here
        BOOST_REQUIRE_LE(ulps(y[i], exact), 1);
        if (!same_bits(y[i], exact)) ++not_correctly_rounded;
        BOOST_REQUIRE_LE(ulps(y[i], std::exp(x[i])), 1);
        off_glibc += !same_bits(y[i], std::exp(x[i]));
    }
    BOOST_TEST_MESSAGE("exp: " << x.size() << " inputs, " << not_correctly_rounded
                               << " not correctly rounded, " << off_glibc
                               << " differ from std::exp by 1 ulp");
    BOOST_REQUIRE_LE(not_correctly_rounded, int64_t(x.size()) / 1000000);

    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> special{inf,        -inf,      1000.0f,  -1000.0f, 88.72283f, 88.72284f,
                                     -87.33655f, -103.972f, -103.98f, -150.0f,  0.0f,      -0.0f,
                                     129.0f,     -129.0f,   1e-30f,   -1e-30f};
    std::vector<float> out(special.size());
    elementwise::exp_floats(special.data(), out.data(), int64_t(special.size()));
    for (size_t i = 0; i < special.size(); ++i)
        BOOST_CHECK_MESSAGE(same_bits(out[i], std::exp(special[i])), "exp(" << special[i] << ") = " << out[i]
                                                                            << ", std::exp "
                                                                            << std::exp(special[i]));
    const float nan_in[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN()};
    float nan_out[2];
    elementwise::exp_floats(nan_in, nan_out, 2);
    BOOST_CHECK(std::isnan(nan_out[0]) && std::isnan(nan_out[1]));
}

// rms_norm: the sum of squares runs over 16 fixed double lanes instead of one serial double sum;
// squares are exact in double, so the two sums differ by ~1e-16 relative and the fp32 statistic
// (and so the output) is the same but for a rare last-ulp case: allowed 1 ulp of the output's
// format, and the run must stay bit-identical across thread counts and batches.
BOOST_AUTO_TEST_CASE(rms_norm_matches_serial_reference) {
    for (int64_t dim : {1, 17, 1024, 4096}) {
        const int64_t n = 9;
        const auto x = random_floats(size_t(n * dim), 11 + uint32_t(dim), 3.0f);
        const auto w = random_floats(size_t(dim), 12);
        for (bool round : {false, true})
            for (const float* wp : {static_cast<const float*>(nullptr), w.data()}) {
                std::vector<float> ref(x.size());
                ref_rms_norm(x.data(), n, dim, wp, 1e-6f, ref.data(), round);
                const auto got = same_for_every_thread_count([&](cpu_backend& be) {
                    std::vector<float> y(x.size());
                    be.rms_norm(x.data(), n, dim, wp, 1e-6f, y.data(), round);
                    return y;
                });
                int64_t differ = 0;
                for (size_t i = 0; i < ref.size(); ++i) {
                    const int64_t d = round ? ulps(got[i], ref[i]) >> 16 : ulps(got[i], ref[i]);
                    BOOST_REQUIRE_LE(d, 1);
                    differ += !same_bits(got[i], ref[i]);
                }
                if (differ)
                    BOOST_TEST_MESSAGE("rms_norm dim " << dim << ": " << differ
                                                       << " values differ from the serial sum");
                BOOST_CHECK_LE(differ, int64_t(ref.size()) / 1000);
                // In place (y aliases x) gives the same values.
                cpu_backend be(3);
                auto inplace = x;
                be.rms_norm(inplace.data(), n, dim, wp, 1e-6f, inplace.data(), round);
                REQUIRE_SAME_BITS(inplace, got);
            }
    }
    // A long prefill's rows are shared out: rows stay what they are alone.
    const int64_t n = 40, dim = 1024;
    const auto x = random_floats(size_t(n * dim), 5);
    cpu_backend be(7);
    require_rows_independent_of_batch(n, [&](int64_t first, int64_t count) {
        std::vector<float> y(size_t(count * dim));
        be.rms_norm(x.data() + first * dim, count, dim, nullptr, 1e-6f, y.data(), true);
        return y;
    });
}

// rope: the same arithmetic (cos/sin per row, cached across calls) -> bit-identical.
BOOST_AUTO_TEST_CASE(rope_is_bit_identical_to_reference) {
    const int n_heads = 5;
    const int64_t head_dim = 48, rope_dim = 16, stride = n_heads * head_dim + 3;
    const int64_t n = 6;
    std::vector<float> freqs_a(rope_dim / 2), freqs_b(rope_dim / 2);
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
        freqs_a[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(rope_dim));
        freqs_b[size_t(i)] = std::pow(160000.0f, -2.0f * float(i) / float(rope_dim));
    }
    const std::vector<int64_t> pos{0, 1, 7, 7, 1000, 123457};
    const auto x0 = bf16_floats(size_t(n * stride), 21);
    cpu_backend be(3);
    // Repeated calls hit the cos/sin cache; alternating tables and positions must not mix entries.
    for (int round = 0; round < 3; ++round)
        for (const auto* freqs : {&freqs_a, &freqs_b})
            for (bool inverse : {false, true}) {
                auto ref = x0, got = x0;
                ref_rope(ref.data(), n, stride, n_heads, head_dim, rope_dim, pos.data(), freqs->data(),
                         inverse);
                be.rope(got.data(), n, stride, n_heads, head_dim, rope_dim, pos.data(), freqs->data(),
                        inverse);
                REQUIRE_SAME_BITS(got, ref);
                // One row alone (a decode step at the same position).
                auto one = std::vector<float>(x0.begin() + 4 * stride, x0.begin() + 5 * stride);
                be.rope(one.data(), 1, stride, n_heads, head_dim, rope_dim, pos.data() + 4, freqs->data(),
                        inverse);
                REQUIRE_SAME_BITS(one,
                                  std::vector<float>(ref.begin() + 4 * stride, ref.begin() + 5 * stride));
            }
}

// hc_mixes: only inv_rms' sum order changed; the mixes agree with the serial reference to a few
// fp32 ulps (a last-ulp change of the statistic propagates through sigmoid / Sinkhorn), and are
// bit-identical across threads, with fn_h given or computed by the backend's matmul.
BOOST_AUTO_TEST_CASE(hc_mixes_match_reference) {
    const int hc = 4;
    const int64_t dim = 1024, n = 3, n_mix = (2 + hc) * hc;
    const auto H = bf16_floats(size_t(n * hc * dim), 31);
    const auto fn = random_floats(size_t(n_mix * hc * dim), 32, 0.01f);
    const auto base = random_floats(size_t(n_mix), 33);
    const std::vector<float> scale{0.5f, 0.7f, 1.3f};
    std::vector<float> mix(size_t(n * n_mix));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t o = 0; o < n_mix; ++o)
            mix[size_t(r * n_mix + o)] =
                float(ref_dot(fn.data() + o * hc * dim, H.data() + r * hc * dim, hc * dim));
    std::vector<float> pre(size_t(n * hc)), post(size_t(n * hc)), comb(size_t(n * hc * hc));
    ref_hc_mixes_from_mix(H.data(), n, hc, dim, mix, base.data(), scale.data(), 20, 1e-6f, 1e-6f, pre.data(),
                          post.data(), comb.data());
    const auto run = [&](cpu_backend& be, const float* fn_h) {
        std::vector<float> out(size_t(n * (hc + hc + hc * hc)));
        be.hc_mixes(H.data(), n, hc, dim, weight_view::contiguous(fn.data(), ggml_type::f32, hc * dim, n_mix),
                    base.data(), scale.data(), 20, 1e-6f, 1e-6f, out.data(), out.data() + n * hc,
                    out.data() + 2 * n * hc, fn_h);
        return out;
    };
    const auto given = same_for_every_thread_count([&](cpu_backend& be) { return run(be, mix.data()); });
    std::vector<float> ref(pre);
    ref.insert(ref.end(), post.begin(), post.end());
    ref.insert(ref.end(), comb.begin(), comb.end());
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        BOOST_REQUIRE_LE(ulps(given[i], ref[i]), 8);
        differ += !same_bits(given[i], ref[i]);
    }
    BOOST_TEST_MESSAGE("hc_mixes: " << differ << " of " << ref.size()
                                    << " values differ from the serial sum");
    // The matmul path: its own fp32 kernel computes fn · H, so only a tolerance against ref.
    const auto computed = same_for_every_thread_count([&](cpu_backend& be) { return run(be, nullptr); });
    for (size_t i = 0; i < ref.size(); ++i) BOOST_REQUIRE_CLOSE_FRACTION(computed[i], ref[i], 1e-4f);
}

// hc_collapse / hc_expand: the same sums in the same order along dim -> bit-identical, in place
// for expand, for dims that are and are not multiples of the kernels' block.
BOOST_AUTO_TEST_CASE(hc_collapse_and_expand_are_bit_identical) {
    for (int64_t dim : {1, 100, 1024}) {
        for (int hc : {1, 4, 5}) {
            const int64_t n = 5;
            const auto H = bf16_floats(size_t(n * hc * dim), 41 + uint32_t(dim));
            const auto f = bf16_floats(size_t(n * dim), 42);
            const auto p = random_floats(size_t(n * hc), 43);
            const auto post = random_floats(size_t(n * hc), 44);
            const auto comb = random_floats(size_t(n * hc * hc), 45);

            std::vector<float> ref_c(size_t(n * dim));
            ref_hc_collapse(H.data(), n, hc, dim, p.data(), ref_c.data());
            const auto got_c = same_for_every_thread_count([&](cpu_backend& be) {
                std::vector<float> out(size_t(n * dim));
                be.hc_collapse(H.data(), n, hc, dim, p.data(), out.data());
                return out;
            });
            REQUIRE_SAME_BITS(got_c, ref_c);

            std::vector<float> ref_e(H.size());
            ref_hc_expand(f.data(), H.data(), n, hc, dim, post.data(), comb.data(), ref_e.data());
            const auto got_e = same_for_every_thread_count([&](cpu_backend& be) {
                std::vector<float> out(H.size());
                be.hc_expand(f.data(), H.data(), n, hc, dim, post.data(), comb.data(), out.data());
                return out;
            });
            REQUIRE_SAME_BITS(got_e, ref_e);
            cpu_backend be(2);
            auto inplace = H;
            be.hc_expand(f.data(), inplace.data(), n, hc, dim, post.data(), comb.data(), inplace.data());
            REQUIRE_SAME_BITS(inplace, ref_e);
        }
    }
    // Rows of a long batch are shared out and stay what they are alone.
    const int hc = 4;
    const int64_t dim = 1024, n = 20;
    const auto H = bf16_floats(size_t(n * hc * dim), 46);
    const auto f = bf16_floats(size_t(n * dim), 47);
    const auto post = random_floats(size_t(n * hc), 48);
    const auto comb = random_floats(size_t(n * hc * hc), 49);
    cpu_backend be(7);
    require_rows_independent_of_batch(n, [&](int64_t first, int64_t count) {
        std::vector<float> out(size_t(count * hc * dim));
        be.hc_expand(f.data() + first * dim, H.data() + first * hc * dim, count, hc, dim,
                     post.data() + first * hc, comb.data() + first * hc * hc, out.data());
        return out;
    });
    require_rows_independent_of_batch(n, [&](int64_t first, int64_t count) {
        std::vector<float> out(size_t(count * dim));
        be.hc_collapse(H.data() + first * hc * dim, count, hc, dim, post.data() + first * hc, out.data());
        return out;
    });
}

namespace {

// A [rows, cols] weight matrix of random values quantised to `type`.
struct quantized_matrix {
    std::vector<uint8_t> bytes;
    weight_view view;
    quantized_matrix(ggml_type type, int64_t rows, int64_t cols, uint32_t seed) {
        const auto src = random_floats(size_t(rows * cols), seed, 0.05f);
        const int64_t rb = row_bytes(dtype_info(type), cols);
        bytes.resize(size_t(rows * rb));
        for (int64_t o = 0; o < rows; ++o) quant::quantize_row(type, src.data() + o * cols, bytes.data() + o * rb, cols);
        view = weight_view::contiguous(bytes.data(), type, cols, rows);
    }
};

}  // namespace

// A SwiGLU pair job gives what the gate and up matmuls followed by swiglu give (the MoE's
// gate/up pass with its activation inside), for any thread count, rows and row weights.
BOOST_AUTO_TEST_CASE(swiglu_pair_jobs_equal_matmuls_then_swiglu) {
    for (ggml_type type : {ggml_type::mxfp4, ggml_type::q8_0}) {
        for (int64_t n : {1, 3}) {
            const int64_t dim = 256, inter = 200;
            const quantized_matrix gate(type, inter, dim, 61), up(type, inter, dim, 62);
            const auto x = bf16_floats(size_t(n * dim), 63);
            const auto w = random_floats(size_t(n), 64);
            const float limit = 0.3f;  // small, so the clamps take effect
            cpu_backend ref_be(1);
            std::vector<float> ref_g(size_t(n * inter)), ref_u(size_t(n * inter));
            ref_be.matmul(gate.view, x.data(), dim, n, ref_g.data(), inter, true);
            ref_be.matmul(up.view, x.data(), dim, n, ref_u.data(), inter, true);
            for (const float* rw : {static_cast<const float*>(nullptr), w.data()}) {
                auto want = ref_g;
                ref_be.swiglu(want.data(), ref_u.data(), n, inter, limit, rw);
                const auto got = same_for_every_thread_count([&](cpu_backend& be) {
                    std::vector<float> g(size_t(n * inter)), u(size_t(n * inter));
                    matmul_job job{gate.view, x.data(), dim, n, g.data(), inter, true};
                    job.up = up.view;
                    job.u = u.data();
                    job.u_stride = inter;
                    job.swiglu_limit = limit;
                    job.swiglu_w = rw;
                    // With a plain job beside it, as in the MoE's passes.
                    std::vector<float> plain(size_t(n * inter));
                    const matmul_job jobs[] = {job, {up.view, x.data(), dim, n, plain.data(), inter, true}};
                    be.matmul_batch(jobs);
                    REQUIRE_SAME_BITS(u, ref_u);
                    REQUIRE_SAME_BITS(plain, ref_u);
                    return g;
                });
                REQUIRE_SAME_BITS(got, want);
            }
        }
    }
}

// matmul_batch shares its jobs' rows out by bytes, cutting jobs anywhere: every job still gets
// exactly matmul's values in every row, rows outside its output stay untouched, for jobs of
// every size (one row, odd counts, several tiles), a job with no input rows, and any thread count.
BOOST_AUTO_TEST_CASE(matmul_batch_gives_every_job_its_matmul) {
    struct spec {
        ggml_type type;
        int64_t rows, cols, n;
    };
    const spec specs[] = {{ggml_type::q8_0, 1, 256, 1},    {ggml_type::mxfp4, 37, 256, 1}, {ggml_type::bf16, 5, 96, 3},
                          {ggml_type::q8_0, 1000, 64, 1},  {ggml_type::f32, 3, 64, 1},     {ggml_type::q8_0, 40, 128, 0},
                          {ggml_type::mxfp4, 256, 512, 3}, {ggml_type::f16, 4, 32, 2}};
    std::vector<quantized_matrix> mats;
    std::vector<std::vector<float>> xs;
    uint32_t seed = 90;
    for (const auto& sp : specs) {
        mats.emplace_back(sp.type, sp.rows, sp.cols, seed++);
        xs.push_back(bf16_floats(size_t(std::max<int64_t>(sp.n, 1) * sp.cols), seed++));
    }
    constexpr float kCanary = -12345.0f;
    std::vector<float> want;
    cpu_backend ref_be(1);
    for (size_t i = 0; i < std::size(specs); ++i) {
        const auto& sp = specs[i];
        std::vector<float> y(size_t(sp.n * sp.rows + 1), kCanary);
        if (sp.n > 0) ref_be.matmul(mats[i].view, xs[i].data(), sp.cols, sp.n, y.data(), sp.rows, true);
        want.insert(want.end(), y.begin(), y.end());
    }
    const auto got = same_for_every_thread_count([&](cpu_backend& be) {
        std::vector<std::vector<float>> ys;
        std::vector<matmul_job> jobs;
        for (size_t i = 0; i < std::size(specs); ++i) {
            const auto& sp = specs[i];
            ys.emplace_back(size_t(sp.n * sp.rows + 1), kCanary);
            jobs.push_back({mats[i].view, xs[i].data(), sp.cols, sp.n, ys.back().data(), sp.rows, true});
        }
        be.matmul_batch(jobs);
        std::vector<float> all;
        for (const auto& y : ys) all.insert(all.end(), y.begin(), y.end());
        return all;
    });
    REQUIRE_SAME_BITS(got, want);
}

// output_sum equals its separate steps: each term's matmul (rounded to bf16), the sum in term
// order into the rows the terms name, starting from 0 and rounded to bf16, then hc_expand in
// place and hc_collapse; terms with weights and with precomputed y, dims that are and are not
// multiples of the slices, for any thread count.
BOOST_AUTO_TEST_CASE(output_sum_equals_its_separate_steps) {
    for (int64_t dim : {64, 1000, 1024}) {
        for (int64_t n : {1, 4}) {
            const int hc = 4;
            const int64_t inter = 96;
            const quantized_matrix w0(ggml_type::mxfp4, dim, inter, 71), w1(ggml_type::q8_0, dim, inter, 72),
                w2(ggml_type::mxfp4, dim, inter, 73);
            // Term 0 takes rows {n-1, 0} (out of order), term 1 every row, term 2 (y given) row 0,
            // term 3 (weights) rows {1 % n}.
            const std::vector<int64_t> rows0 = n > 1 ? std::vector<int64_t>{n - 1, 0} : std::vector<int64_t>{0};
            const std::vector<int64_t> rows3{1 % n};
            const auto h0 = bf16_floats(size_t(int64_t(rows0.size()) * inter), 74);
            const auto h1 = bf16_floats(size_t(n * inter), 75);
            const auto y2 = bf16_floats(size_t(dim), 76);
            const auto h3 = bf16_floats(size_t(inter), 77);
            const auto H0 = bf16_floats(size_t(n * hc * dim), 78);
            const auto post = random_floats(size_t(n * hc), 79);
            const auto comb = random_floats(size_t(n * hc * hc), 80);
            const auto pre = random_floats(size_t(n * hc), 81);

            // The separate steps.
            cpu_backend ref_be(1);
            std::vector<float> acc(size_t(n * dim), 0.0f), y(size_t(n * dim));
            auto add = [&](const std::vector<int64_t>* rows, int64_t m, const float* ys) {
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t d = 0; d < dim; ++d) acc[size_t((rows ? (*rows)[size_t(i)] : i) * dim + d)] += ys[i * dim + d];
            };
            ref_be.matmul(w0.view, h0.data(), inter, int64_t(rows0.size()), y.data(), dim, true);
            add(&rows0, int64_t(rows0.size()), y.data());
            ref_be.matmul(w1.view, h1.data(), inter, n, y.data(), dim, true);
            add(nullptr, n, y.data());
            const std::vector<int64_t> row0{0};
            add(&row0, 1, y2.data());
            ref_be.matmul(w2.view, h3.data(), inter, 1, y.data(), dim, true);
            add(&rows3, 1, y.data());
            std::vector<float> want_f(acc.size());
            for (size_t i = 0; i < acc.size(); ++i) want_f[i] = round_to_bf16(acc[i]);
            auto want_H = H0;
            ref_be.hc_expand(want_f.data(), want_H.data(), n, hc, dim, post.data(), comb.data(), want_H.data());
            std::vector<float> want_next(size_t(n * dim));
            ref_be.hc_collapse(want_H.data(), n, hc, dim, pre.data(), want_next.data());

            const output_term terms[] = {{w0.view, h0.data(), nullptr, rows0.data(), int64_t(rows0.size())},
                                         {w1.view, h1.data(), nullptr, nullptr, n},
                                         {{}, nullptr, y2.data(), row0.data(), 1},
                                         {w2.view, h3.data(), nullptr, rows3.data(), 1}};
            for (bool with_update : {false, true}) {
                const auto got = same_for_every_thread_count([&](cpu_backend& be) {
                    std::vector<float> f(size_t(n * dim)), next(size_t(n * dim), -1.0f);
                    auto H = H0;
                    const hc_update upd{H.data(), post.data(), comb.data(), pre.data(), next.data(), hc};
                    be.output_sum(terms, n, dim, f.data(), with_update ? &upd : nullptr);
                    if (with_update) {
                        REQUIRE_SAME_BITS(H, want_H);
                        REQUIRE_SAME_BITS(next, want_next);
                    } else {
                        REQUIRE_SAME_BITS(H, H0);
                    }
                    return f;
                });
                REQUIRE_SAME_BITS(got, want_f);
            }
        }
    }
}

namespace {

// Keys in a shared pool; each row attends to its own list of pointers into it (window entries
// and compressed entries, in any order, some shared between rows).
struct attention_case {
    int n_heads;
    int64_t head_dim;
    std::vector<int64_t> n_keys;  // per row
    std::vector<float> pool, q, sinks;
    std::vector<uint16_t> pool_bits;  // the pool as attention_row holds keys (bf16)
    std::vector<std::vector<const uint16_t*>> key_lists;
    std::vector<std::vector<int32_t>> key_ids;  // the same keys as entries of the pool (attention_row::selection)
    int64_t q_dim() const { return n_heads * head_dim; }
};

attention_case make_attention_case(int n_heads, int64_t head_dim, std::vector<int64_t> n_keys,
                                   uint32_t seed) {
    attention_case c{n_heads, head_dim, std::move(n_keys), {}, {}, {}, {}, {}, {}};
    const int64_t pool_keys = std::max<int64_t>(1, *std::max_element(c.n_keys.begin(), c.n_keys.end()) + 7);
    c.pool = bf16_floats(size_t(pool_keys * head_dim), seed);
    c.pool_bits.resize(c.pool.size());
    BOOST_REQUIRE(store_attention_keys(c.pool.data(), pool_keys, head_dim, c.pool_bits.data()));
    c.q = bf16_floats(size_t(int64_t(c.n_keys.size()) * c.q_dim()), seed + 1, 2.0f);
    c.sinks = random_floats(size_t(n_heads), seed + 2);
    std::mt19937 rng(seed + 3);
    for (int64_t nk : c.n_keys) {
        std::vector<const uint16_t*> keys;
        std::vector<int32_t> ids;
        for (int64_t i = 0; i < nk; ++i) {
            ids.push_back(int32_t(rng() % uint64_t(pool_keys)));
            keys.push_back(c.pool_bits.data() + int64_t(ids.back()) * head_dim);
        }
        c.key_lists.push_back(std::move(keys));
        c.key_ids.push_back(std::move(ids));
    }
    return c;
}

// Runs rows [first, first + count) of the case; returns their outputs.
std::vector<float> run_attention(const attention_case& c, size_t first, size_t count, bool bf16_probs,
                                 cpu_backend* be) {
    std::vector<float> out(count * size_t(c.q_dim()), -7.0f);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    if (be) {
        // Every key as a compressed entry of the pool, in the list's order.
        std::vector<attention_row> rows;
        for (size_t r = first; r < first + count; ++r) {
            attention_row a;
            a.q = c.q.data() + int64_t(r) * c.q_dim();
            a.out = out.data() + int64_t(r - first) * c.q_dim();
            a.latents = c.pool_bits.data();
            a.selection = c.key_ids[r].data();
            a.selection_len = c.n_keys[r];
            rows.push_back(a);
        }
        be->attention(rows, c.n_heads, c.head_dim, scale, c.sinks.data(), bf16_probs);
    } else {
        std::vector<ref_row> rows;
        for (size_t r = first; r < first + count; ++r)
            rows.push_back({c.q.data() + int64_t(r) * c.q_dim(), c.key_lists[r].data(), c.n_keys[r],
                            out.data() + int64_t(r - first) * c.q_dim()});
        ref_attention(rows, c.n_heads, c.head_dim, scale, c.sinks.data(), bf16_probs);
    }
    return out;
}

// The same softmax-weighted sum in long double, for the accuracy bound.
std::vector<double> exact_attention(const attention_case& c, size_t r) {
    std::vector<double> out(size_t(c.q_dim()), 0.0);
    if (c.n_keys[r] == 0) return out;
    const double scale = 1.0 / std::sqrt(double(c.head_dim));
    for (int h = 0; h < c.n_heads; ++h) {
        std::vector<long double> s(size_t(c.n_keys[r]));
        long double m = c.sinks[size_t(h)];
        for (int64_t i = 0; i < c.n_keys[r]; ++i) {
            long double d = 0;
            for (int64_t k = 0; k < c.head_dim; ++k)
                d += (long double)c.q[size_t(int64_t(r) * c.q_dim() + h * c.head_dim + k)] *
                     key_value(c.key_lists[r][size_t(i)], k, c.head_dim);
            s[size_t(i)] = d * scale;
            m = std::max(m, s[size_t(i)]);
        }
        long double denom = std::exp((long double)c.sinks[size_t(h)] - m);
        for (auto& v : s) denom += (v = std::exp(v - m));
        for (int64_t k = 0; k < c.head_dim; ++k) {
            long double acc = 0;
            for (int64_t i = 0; i < c.n_keys[r]; ++i) acc += s[size_t(i)] * key_value(c.key_lists[r][size_t(i)], k, c.head_dim);
            out[size_t(h * c.head_dim + k)] = double(acc / denom);
        }
    }
    return out;
}

}  // namespace

// Attention keys are stored with the halves of every whole 32-value chunk interleaved and the
// partial tail chunk in order: key_word is a permutation, and storing then reading gives the values.
BOOST_AUTO_TEST_CASE(attention_keys_interleave_whole_chunks) {
    for (int64_t n = 1; n <= 130; ++n) {
        std::vector<bool> seen(size_t(n), false);
        for (int64_t d = 0; d < n; ++d) {
            const int64_t w = key_word(d, n);
            BOOST_REQUIRE(w >= 0 && w < n && !seen[size_t(w)]);
            seen[size_t(w)] = true;
            if (d >= n - n % 32) BOOST_REQUIRE_EQUAL(w, d);
        }
    }
    BOOST_TEST(key_word(0, 40) == 0);
    BOOST_TEST(key_word(16, 40) == 1);
    BOOST_TEST(key_word(1, 40) == 2);
    BOOST_TEST(key_word(15, 40) == 30);
    BOOST_TEST(key_word(31, 40) == 31);
    BOOST_TEST(key_word(33, 40) == 33);
    BOOST_TEST(key_word(47, 64) == 62);
    BOOST_TEST(key_word(48, 64) == 33);
    const auto x = bf16_floats(2 * 72, 5);
    std::vector<uint16_t> bits(x.size());
    BOOST_REQUIRE(store_attention_keys(x.data(), 2, 72, bits.data()));
    for (int64_t k = 0; k < 2; ++k)
        for (int64_t d = 0; d < 72; ++d) BOOST_REQUIRE(same_bits(key_value(bits.data() + k * 72, d, 72), x[size_t(k * 72 + d)]));
    auto y = x;
    y[100] = std::nextafter(y[100], 1e30f);
    BOOST_TEST(!store_attention_keys(y.data(), 2, 72, bits.data()));
}

// attention: per value the same operations in the same order as the per-(row, head) loop, so the
// outputs are bit-identical to it, for every thread count, with or without bf16 weights, for
// rows alone or batched, head_dim a multiple of the slice width or not, rows without keys.
BOOST_AUTO_TEST_CASE(attention_is_bit_identical_to_per_head_reference) {
    struct shape {
        int n_heads;
        int64_t head_dim;
        std::vector<int64_t> n_keys;
    };
    const std::vector<shape> shapes{
        {16, 256, {1, 100, 0, 37, 256}}, {3, 40, {5, 1, 64, 0}}, {1, 16, {7}}, {2, 7, {3, 9}},
        {2, 48, {3, 20}}, {1, 96, {12}}, {4, 160, {9, 2}}};
    uint32_t seed = 60;
    for (const shape& s : shapes) {
        const auto c = make_attention_case(s.n_heads, s.head_dim, s.n_keys, seed += 10);
        for (bool bf16_probs : {false, true}) {
            const auto ref = run_attention(c, 0, s.n_keys.size(), bf16_probs, nullptr);
            const auto got = same_for_every_thread_count(
                [&](cpu_backend& be) { return run_attention(c, 0, s.n_keys.size(), bf16_probs, &be); });
            REQUIRE_SAME_BITS(got, ref);
            cpu_backend be(7);
            require_rows_independent_of_batch(int64_t(s.n_keys.size()), [&](int64_t first, int64_t count) {
                return run_attention(c, size_t(first), size_t(count), bf16_probs, &be);
            });
            // Accuracy against a long-double evaluation: bf16 output rounding (2^-9 relative)
            // plus fp32 accumulation; the bf16 weights add up to 2^-9 relative per term.
            for (size_t r = 0; r < s.n_keys.size(); ++r) {
                const auto exact = exact_attention(c, r);
                for (size_t k = 0; k < exact.size(); ++k)
                    BOOST_REQUIRE_SMALL(got[r * size_t(c.q_dim()) + k] - exact[k],
                                        8e-3 * std::fabs(exact[k]) + 5e-3);
            }
        }
    }
}

// Many keys per row: the rows are processed in groups of bounded scratch, and in the three-pass
// form (a row's keys past the one-pass bound); a row's values are those of the reference
// whatever its group and form. The second case puts short rows (one without keys, a head_dim
// with a partial slice) in a group with a long one, so they take the three passes too.
BOOST_AUTO_TEST_CASE(attention_long_rows_are_grouped_without_changing_values) {
    const auto c = make_attention_case(16, 16, {70000, 3, 90000, 150000}, 90);
    const auto ref = run_attention(c, 0, 4, true, nullptr);
    for (int t : {1, 3}) {
        cpu_backend be(t);
        REQUIRE_SAME_BITS(run_attention(c, 0, 4, true, &be), ref);
    }
    const auto mixed = make_attention_case(3, 40, {5, 0, 4000, 1, 64}, 91);
    for (bool bf16_probs : {false, true}) {
        const auto mixed_ref = run_attention(mixed, 0, 5, bf16_probs, nullptr);
        for (int t : {1, 4}) {
            cpu_backend be(t);
            REQUIRE_SAME_BITS(run_attention(mixed, 0, 5, bf16_probs, &be), mixed_ref);
            for (size_t r = 0; r < 5; ++r) {  // alone, the short rows take the one pass
                const auto alone = run_attention(mixed, r, 1, bf16_probs, &be);
                BOOST_REQUIRE(std::equal(alone.begin(), alone.end(), mixed_ref.begin() + long(r * 120), [](float a, float b) {
                    return same_bits(a, b);
                }));
            }
        }
    }
}

// swiglu: the vectorised exp is correctly rounded but near ties, std::exp (glibc) within 0.502 ulp,
// so they differ by one fp32 ulp on ~1e-4 of the inputs; after the bf16 output rounding the
// results differ from the std::exp reference by at most one bf16 ulp, and almost never.
BOOST_AUTO_TEST_CASE(swiglu_matches_reference) {
    const int64_t n = 6, inter = 3000;
    auto g0 = random_floats(size_t(n * inter), 71, 4.0f);
    const auto u = random_floats(size_t(n * inter), 72, 4.0f);
    const auto w = random_floats(size_t(n), 73);
    const float inf = std::numeric_limits<float>::infinity();
    // The clamps' edges and the exp's: beyond the limit, huge negative g (exp(-g) overflows).
    const float edges[] = {7.0f, 7.0001f, -7.0f, 100.0f, -100.0f, -88.8f, -1e30f, inf, -inf, 0.0f, -0.0f};
    for (size_t i = 0; i < std::size(edges); ++i) g0[i] = edges[i], g0[size_t(inter) + i] = -edges[i];
    for (const float* wp : {static_cast<const float*>(nullptr), w.data()}) {
        auto ref = g0;
        ref_swiglu(ref.data(), u.data(), n, inter, 7.0f, wp);
        const auto got = same_for_every_thread_count([&](cpu_backend& be) {
            auto g = g0;
            be.swiglu(g.data(), u.data(), n, inter, 7.0f, wp);
            return g;
        });
        int64_t differ = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
            BOOST_REQUIRE_LE(ulps(got[i], ref[i]) >> 16, 1);
            differ += !same_bits(got[i], ref[i]);
        }
        BOOST_TEST_MESSAGE("swiglu: " << differ << " of " << ref.size()
                                      << " values differ from the std::exp reference");
        BOOST_CHECK_LE(differ, int64_t(ref.size()) / 1000);
        for (size_t i = 0; i < std::size(edges); ++i) {
            BOOST_CHECK(same_bits(got[i], ref[i]));
            BOOST_CHECK(same_bits(got[size_t(inter) + i], ref[size_t(inter) + i]));
        }
    }
    cpu_backend be(7);
    require_rows_independent_of_batch(n, [&](int64_t first, int64_t count) {
        std::vector<float> g(g0.begin() + first * inter, g0.begin() + (first + count) * inter);
        be.swiglu(g.data(), u.data() + first * inter, count, inter, 7.0f, nullptr);
        return g;
    });
}

// indexer_scores: the same bf16 arithmetic per score, now shared out per (row, entry).
BOOST_AUTO_TEST_CASE(indexer_scores_are_bit_identical) {
    const int n_heads = 8;
    const int64_t head_dim = 64, n = 3, n_keys = 300;
    const auto q = bf16_floats(size_t(n * n_heads * head_dim), 81);
    const auto w = bf16_floats(size_t(n * n_heads), 82);
    const auto keys = bf16_floats(size_t(n_keys * head_dim), 83);
    const std::vector<int64_t> visible{300, 17, 0};
    std::vector<float> ref(size_t(n * n_keys));
    ref_indexer_scores(q.data(), w.data(), n, n_heads, head_dim, keys.data(), n_keys, visible.data(),
                       ref.data());
    const auto got = same_for_every_thread_count([&](cpu_backend& be) {
        std::vector<float> s(size_t(n * n_keys));
        be.indexer_scores(q.data(), w.data(), n, n_heads, head_dim, keys.data(), n_keys, visible.data(),
                          s.data());
        return s;
    });
    REQUIRE_SAME_BITS(got, ref);
}

// engram_gate: the norms' and the gate dot's double sums run over fixed lanes; the gate agrees
// with the serial sums to an fp32 ulp or so, the updated (bf16) streams to one bf16 ulp.
BOOST_AUTO_TEST_CASE(engram_gate_matches_reference) {
    const int hc = 4;
    const int64_t dim = 1024, n = 3;
    const auto H0 = bf16_floats(size_t(n * hc * dim), 91);
    const auto kv = bf16_floats(size_t(n * (hc + 1) * dim), 92);
    const auto qk = random_floats(size_t(hc * dim), 93);
    auto ref = H0;
    ref_engram_gate(ref.data(), n, hc, dim, kv.data(), qk.data(), 1e-6f);
    const auto got = same_for_every_thread_count([&](cpu_backend& be) {
        auto H = H0;
        be.engram_gate(H.data(), n, hc, dim, kv.data(), qk.data(), 1e-6f);
        return H;
    });
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        BOOST_REQUIRE_LE(ulps(got[i], ref[i]) >> 16, 1);
        differ += !same_bits(got[i], ref[i]);
    }
    BOOST_TEST_MESSAGE("engram_gate: " << differ << " of " << ref.size()
                                       << " values differ from the serial sums");
    BOOST_CHECK_LE(differ, int64_t(ref.size()) / 100);
}

BOOST_AUTO_TEST_SUITE_END()
