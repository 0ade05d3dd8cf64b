#include "tools/forge_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "config/assert.h"
#include "model/engram_tables.h"
#include "model/quant.h"

namespace moestream::forge {
namespace {

// ---- deterministic randomness (integer-only, so identical on every machine) ----
uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t stream_key(uint64_t seed, std::string_view name, uint64_t chunk) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
    uint64_t s = seed ^ (h * 0x9e3779b97f4a7c15ull) ^ (chunk * 0xd1b54a32d192ed03ull);
    splitmix(s);
    return s;
}

struct rng {
    uint64_t state;
    uint64_t next() { return splitmix(state); }
    // Approximately N(0,1): Irwin-Hall sum of four 16-bit uniforms, exact in float arithmetic.
    float normal() {
        uint64_t r = next();
        uint32_t sum = uint32_t(r & 0xffff) + uint32_t((r >> 16) & 0xffff) + uint32_t((r >> 32) & 0xffff) +
                       uint32_t(r >> 48);
        // mean 4*32767.5, variance 4*(65536^2-1)/12
        return (float(sum) - 131070.0f) * (1.0f / 37837.2f);
    }
    uint32_t below(uint32_t n) { return uint32_t((next() >> 32) * n >> 32); }
};

template <class Fn>
void parallel_for(int64_t n, Fn fn) {
    const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
    if (threads <= 1) {
        for (int64_t i = 0; i < n; ++i) fn(i);
        return;
    }
    std::atomic<int64_t> next{0};
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
        pool.emplace_back([&] {
            for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
        });
    for (auto& th : pool) th.join();
}

struct name_parts {
    int layer = -1;          // blk.N, or -1
    std::string_view rest;   // name after "blk.N."
};

name_parts split_name(std::string_view name) {
    if (!name.starts_with("blk.")) return {-1, name};
    auto dot = name.find('.', 4);
    MS_ASSERT(dot != std::string_view::npos);
    return {std::stoi(std::string(name.substr(4, dot - 4))), name.substr(dot + 1)};
}

// A fixed permutation of [0, n) per (seed, purpose, layer).
std::vector<int32_t> permutation(uint64_t seed, std::string_view purpose, int layer, int n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    rng r{stream_key(seed, purpose, uint64_t(layer))};
    for (int i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[r.below(uint32_t(i + 1))]);
    return p;
}

// Writes float rows into the tensor's storage type.
void encode_rows(ggml_type type, const float* src, int64_t cols, int64_t rows, std::byte* dst) {
    const auto& t = dtype_info(type);
    const int64_t rb = row_bytes(t, cols);
    for (int64_t r = 0; r < rows; ++r) quant::quantize_row(type, src + r * cols, dst + r * rb, cols);
}

// Fills a 2-D (or 1-D) float-valued tensor row by row from `gen(row, col_values)`, in chunks.
template <class Gen>
void fill_rows(const forge_context& ctx, const dsv41::tensor_spec& s, std::span<std::byte> out, Gen gen) {
    const int64_t cols = s.shape[0];
    int64_t rows = 1;
    for (size_t k = 1; k < s.shape.size(); ++k) rows *= s.shape[k];
    const auto& t = dtype_info(s.type);
    const int64_t rb = row_bytes(t, cols);
    MS_ASSERT(int64_t(out.size()) == rb * rows);
    const int64_t chunk_rows = std::max<int64_t>(1, (1 << 16) / cols);
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    parallel_for(chunks, [&](int64_t c) {
        const int64_t r0 = c * chunk_rows, r1 = std::min(rows, r0 + chunk_rows);
        std::vector<float> buf(size_t((r1 - r0) * cols));
        rng r{stream_key(ctx.seed, s.name, uint64_t(c))};
        for (int64_t row = r0; row < r1; ++row) gen(row, std::span<float>(buf.data() + (row - r0) * cols, size_t(cols)), r);
        encode_rows(s.type, buf.data(), cols, r1 - r0, out.data() + r0 * rb);
    });
}

// MXFP4 blocks drawn directly (no float detour, ~20x faster than quantizing floats): the shared
// exponent makes one unit ~ sigma/1.5 and each nibble is a normal sample rounded to E2M1.
struct mxfp4_sampler {
    uint8_t scale_byte;
    uint8_t code_of[1 << 12];  // 12-bit uniform -> magnitude code 0..7

    explicit mxfp4_sampler(double sigma) {
        const int e = int(std::lround(std::log2(sigma / 1.5)));
        scale_byte = uint8_t(std::clamp(127 + e, 1, 254));
        const double ratio = sigma / std::ldexp(1.0, e);  // sigma in units
        static constexpr double kLevels[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
        for (int i = 0; i < (1 << 12); ++i) {
            // |N(0, ratio^2)| quantile at (i + 0.5) / 4096, then the nearest level.
            const double p = (i + 0.5) / 4096.0;
            double lo = 0, hi = 12 * ratio;
            for (int it = 0; it < 60; ++it) {
                double mid = 0.5 * (lo + hi);
                (std::erf(mid / (ratio * std::sqrt(2.0))) < p ? lo : hi) = mid;
            }
            int best = 0;
            for (int k = 1; k < 8; ++k)
                if (std::fabs(kLevels[k] - lo) < std::fabs(kLevels[best] - lo)) best = k;
            code_of[i] = uint8_t(best);
        }
    }

    // 32 nibbles = 32 x (12-bit uniform + sign bit), four per 64-bit draw; ggml layout: byte j
    // holds element j (low nibble) and element j+16 (high nibble).
    void block(rng& r, std::byte* out17) const {
        out17[0] = std::byte(scale_byte);
        uint8_t nib[32];
        for (int k = 0; k < 32; k += 4) {
            uint64_t bits = r.next();
            for (int j = 0; j < 4; ++j, bits >>= 13) nib[k + j] = uint8_t(code_of[bits & 0xfff] | ((bits >> 12) & 1) << 3);
        }
        for (int j = 0; j < 16; ++j) out17[1 + j] = std::byte(nib[j] | nib[j + 16] << 4);
    }
};

void fill_experts(const forge_context& ctx, const dsv41::tensor_spec& s, std::span<std::byte> out, double sigma) {
    MS_ASSERT(s.shape.size() == 3 && s.type == ggml_type::mxfp4);
    const int64_t per_expert = int64_t(out.size()) / s.shape[2];
    MS_ASSERT(per_expert % 17 == 0);
    const mxfp4_sampler sampler(sigma);
    parallel_for(s.shape[2], [&](int64_t e) {
        rng r{stream_key(ctx.seed, s.name, uint64_t(e))};
        std::byte* p = out.data() + e * per_expert;
        for (int64_t b = 0; b < per_expert / 17; ++b) sampler.block(r, p + b * 17);
    });
}

void fill_ints(std::span<std::byte> out, const std::vector<int64_t>& v, ggml_type type) {
    if (type == ggml_type::i64) {
        MS_ASSERT(out.size() == v.size() * 8);
        std::memcpy(out.data(), v.data(), out.size());
    } else {
        MS_ASSERT(type == ggml_type::i32 && out.size() == v.size() * 4);
        for (size_t i = 0; i < v.size(); ++i) {
            int32_t x = int32_t(v[i]);
            std::memcpy(out.data() + i * 4, &x, 4);
        }
    }
}

void fill_side_table(const forge_context& ctx, const dsv41::tensor_spec& s, std::span<std::byte> out) {
    const auto& hp = ctx.hp;
    auto tables = engram::compute_primes(hp.engram_layers, hp.engram_max_ngram, hp.engram_n_heads, hp.engram_prime_start);
    std::vector<int64_t> v;
    if (s.name == "engram_token_map.weight") {
        v.assign(ctx.token_map.begin(), ctx.token_map.end());
    } else if (s.name == "engram_primes.weight") {
        for (auto& t : tables) v.insert(v.end(), t.primes.begin(), t.primes.end());
    } else if (s.name == "engram_offsets.weight") {
        for (auto& t : tables) v.insert(v.end(), t.offsets.begin(), t.offsets.end());
    } else {
        MS_ASSERT(s.name == "engram_multipliers.weight");
        for (int l : hp.engram_layers) {
            auto m = engram::hash_multipliers(l, hp.engram_max_ngram, ctx.compressed_vocab);
            v.insert(v.end(), m.begin(), m.end());
        }
    }
    fill_ints(out, v, s.type);
}

bool ends_with(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

}  // namespace

std::vector<int32_t> token_topics(const std::vector<std::string>& token_text, int topics) {
    MS_ASSERT(topics >= 8);
    // Families: [0, 4) digits, [4, 8) punctuation/space, [8, topics) words (by normalised text).
    std::vector<int32_t> out(token_text.size());
    for (size_t i = 0; i < token_text.size(); ++i) {
        std::string_view t = token_text[i];
        while (!t.empty() && (t.front() == ' ' || t.front() == '\t' || t.front() == '\n')) t.remove_prefix(1);
        std::string norm;
        for (char c : t) norm += (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
        uint64_t h = 0xcbf29ce484222325ull;
        for (char c : norm) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
        h ^= h >> 29;
        if (!norm.empty() && norm[0] >= '0' && norm[0] <= '9') out[i] = int32_t(h % 4);
        else if (norm.empty() || (uint8_t(norm[0]) < 0x80 && !std::isalpha(uint8_t(norm[0]))))
            out[i] = int32_t(4 + h % 4);
        else out[i] = int32_t(8 + h % uint64_t(topics - 8));
    }
    return out;
}

int64_t semantic_dims(const dsv41::hparams& hp) {
    return std::max<int64_t>(1, std::min({hp.dim / 4, hp.o_lora_rank, hp.head_dim - hp.rope_dim}));
}

std::vector<float> topic_direction(const forge_context& ctx, int topic) {
    const int64_t d = ctx.hp.dim, sd = semantic_dims(ctx.hp);
    auto base = [&](int k) {
        std::vector<float> v(static_cast<size_t>(d), 0.0f);
        rng r{stream_key(ctx.seed, "topic-direction", uint64_t(k % ctx.routing.topics))};
        for (int64_t i = 0; i < sd; ++i) v[size_t(i)] = r.normal();
        return v;
    };
    auto v = base(topic);
    auto w = base(topic + 1);
    double n2 = 0;
    for (int64_t i = 0; i < d; ++i) {
        v[size_t(i)] += float(ctx.routing.neighbour_mix) * w[size_t(i)];
        n2 += double(v[size_t(i)]) * v[size_t(i)];
    }
    const float inv = float(1.0 / std::sqrt(n2));
    for (auto& x : v) x *= inv;
    return v;
}

namespace {

// Norm of an embedding row's semantic part: the expected one of topic + noise.
double semantic_norm(const dsv41::hparams& hp, const routing_scheme& rs) {
    return std::sqrt(rs.topic_share * double(hp.dim) + (1.0 - rs.topic_share) * double(semantic_dims(hp)));
}

struct context_plan {
    int64_t sd = 0;        // semantic coordinates [0, sd)
    int64_t anchor = 0;    // the embedding's constant coordinate
    int64_t pair_dim = 0;  // within a head: first element of the RoPE pair that carries recency
    float q_weight = 0, k_weight = 0, out_weight = 0;
};

context_plan plan_context(const forge_context& ctx) {
    const auto& hp = ctx.hp;
    const auto& rs = ctx.routing;
    context_plan c;
    c.sd = semantic_dims(hp);
    c.anchor = c.sd;
    // The fastest RoPE pair whose angle stays within pi over the window: the kernel
    // exp(A (cos(f D) - 1)) then decreases monotonically with the distance D.
    const int64_t pairs = hp.rope_dim / 2;
    int64_t ip = pairs - 1;
    double f = 0;
    for (int64_t i = 0; i < pairs; ++i) {
        f = 1.0 / std::pow(hp.rope_theta, double(2 * i) / double(hp.rope_dim));
        if (f * double(hp.window) <= M_PI) {
            ip = i;
            break;
        }
    }
    c.pair_dim = hp.head_dim - hp.rope_dim + 2 * ip;
    const double span = std::min(rs.context_span, 0.5 * double(hp.window));
    const double A = 1.0 / (f * span * f * span);  // kernel ~ exp(-D^2 / (2 span^2)) near 0
    // Layer-0 input: an embedding row, whose semantic part has norm S = semantic_norm and whose
    // anchor is 1 (over the same RMS). The key's pair element is 4 S, so after kv's RMS norm it
    // is the same for every token (the kernel's sharpness A must not vary with content):
    // sqrt(head_dim) * 4/sqrt(17) and the semantic part sqrt(head_dim)/sqrt(17) * unit.
    const double ratio = 4.0;
    c.k_weight = float(ratio * semantic_norm(hp, rs));
    const double hd = double(hp.head_dim), k_pair = std::sqrt(hd) * ratio / std::sqrt(1 + ratio * ratio),
                 v_sem = std::sqrt(hd) / std::sqrt(1 + ratio * ratio);
    // q = q_weight * sqrt(q_lora_rank) on the pair: score = q k / sqrt(head_dim) = A cos(f D).
    c.q_weight = float(A * std::sqrt(hd) / (std::sqrt(double(hp.q_lora_rank)) * k_pair));
    // o = v_sem * (weighted mean of unit semantic vectors) in each head; every group adds it.
    c.out_weight = float(rs.context_gain * std::sqrt(double(hp.dim)) / (double(hp.o_groups) * v_sem));
    return c;
}

}  // namespace

void fill_tensor(const forge_context& ctx, const dsv41::tensor_spec& s, std::span<std::byte> out) {
    const auto& hp = ctx.hp;
    const auto& rs = ctx.routing;
    const auto [layer, rest] = split_name(s.name);
    const double residual_scale = 1.0 / std::sqrt(2.0 * std::max(1, hp.n_layers + hp.n_mtp));
    const int64_t in = s.shape[0];

    if (s.kind == dsv41::tensor_spec::role::side_table) return fill_side_table(ctx, s, out);
    if (s.kind == dsv41::tensor_spec::role::expert) {
        const bool down = ends_with(rest, "ffn_down_exps.weight");
        return fill_experts(ctx, s, out, (1.0 / std::sqrt(double(in))) * (down ? residual_scale : 1.0));
    }
    if (s.kind == dsv41::tensor_spec::role::engram_table) {
        const bool scale = ends_with(rest, "engram_embd_scale.weight");
        const int64_t chunk = 1 << 20;
        parallel_for((int64_t(out.size()) + chunk - 1) / chunk, [&](int64_t c) {
            rng r{stream_key(ctx.seed, s.name, uint64_t(c))};
            const int64_t end = std::min<int64_t>(int64_t(out.size()), (c + 1) * chunk);
            for (int64_t i = c * chunk; i < end; ++i)
                out[size_t(i)] = scale ? std::byte(127 - 3) : std::byte(quant::f32_to_e4m3(r.normal()));
        });
        return;
    }

    auto constant = [&](float value) {
        fill_rows(ctx, s, out, [&](int64_t, std::span<float> row, rng&) { std::fill(row.begin(), row.end(), value); });
    };
    auto gaussian = [&](double sigma) {
        fill_rows(ctx, s, out, [&](int64_t, std::span<float> row, rng& r) {
            for (auto& x : row) x = float(sigma) * r.normal();
        });
    };

    if (ends_with(rest, "norm.weight")) return constant(1.0f);
    if (ends_with(rest, "attn_sinks.weight")) return constant(0.0f);
    if (ends_with(rest, "_scale.weight")) return constant(1.0f);  // hc scale
    if (ends_with(rest, "_base.weight")) {
        // pre = sigmoid(0) = .5, post = 2 sigmoid(0) = 1, comb leaning to the identity.
        const int hc = hp.hc_mult;
        return fill_rows(ctx, s, out, [&](int64_t, std::span<float> row, rng&) {
            std::fill(row.begin(), row.end(), 0.0f);
            for (int i = 0; i < hc; ++i) row[size_t(2 * hc + i * hc + i)] = 4.0f;
        });
    }
    if (ends_with(rest, "_fn.weight")) return gaussian(0.1 / std::sqrt(double(in)));
    if (ends_with(rest, "exp_probs_b.bias")) {
        // Zipf-like popularity: the expert of popularity rank k gets -s * ln(k+1) * scale.
        const int n = int(s.shape[0]);
        auto rank = permutation(ctx.seed, "popularity", layer, n);
        return fill_rows(ctx, s, out, [&](int64_t, std::span<float> row, rng&) {
            double mean = 0;
            for (int e = 0; e < n; ++e) mean += std::log(rank[size_t(e)] + 1.0);
            mean /= n;
            for (int e = 0; e < n; ++e)
                row[size_t(e)] = float(-rs.bias_scale * rs.zipf_exponent * (std::log(rank[size_t(e)] + 1.0) - mean));
        });
    }
    if (ends_with(rest, "ffn_gate_inp.weight")) {
        // Expert e of this layer serves topic perm[e] % topics: its router row points along that
        // topic's direction, so tokens of one topic (and of its neighbours) prefer its experts.
        const int n = int(s.shape[1]);
        auto perm = permutation(ctx.seed, "expert-topic", layer, n);
        const double inv_sqrt_d = 1.0 / std::sqrt(double(in));
        return fill_rows(ctx, s, out, [&](int64_t e, std::span<float> row, rng& r) {
            const auto& u = ctx.topic_dirs[size_t(perm[size_t(e)] % rs.topics)];
            for (int64_t i = 0; i < in; ++i)
                row[size_t(i)] = float(rs.topic_gain * u[size_t(i)] + rs.router_noise * inv_sqrt_d * r.normal());
        });
    }
    if (s.name == "output.weight") {
        // LM head: random rows over the coordinates after the anchor only (see semantic_dims).
        const int64_t first = semantic_dims(hp) + 1;
        const double sigma = 1.0 / std::sqrt(double(in));
        return fill_rows(ctx, s, out, [&](int64_t, std::span<float> row, rng& r) {
            for (int64_t i = 0; i < in; ++i) row[size_t(i)] = i < first ? 0.0f : float(sigma * r.normal());
        });
    }
    if (s.name == "token_embd.weight") {
        const double a = std::sqrt(rs.topic_share), b = std::sqrt(1.0 - rs.topic_share);
        const double sqrt_d = std::sqrt(double(in));
        const int64_t sd = semantic_dims(hp);
        const double sem_norm = semantic_norm(hp, rs);
        return fill_rows(ctx, s, out, [&](int64_t tok, std::span<float> row, rng& r) {
            const auto& u = ctx.topic_dirs[size_t(ctx.topic_of_token[size_t(tok)])];
            for (int64_t i = 0; i < in; ++i) row[size_t(i)] = float(a * sqrt_d * u[size_t(i)] + b * r.normal());
            // The semantic part gets exactly its expected norm (layer 0's keys rely on it), and
            // the anchor is a constant that layer 0's query and keys read.
            double n2 = 0;
            for (int64_t i = 0; i < sd; ++i) n2 += double(row[size_t(i)]) * row[size_t(i)];
            const double k = sem_norm / std::sqrt(std::max(n2, 1e-30));
            for (int64_t i = 0; i < sd; ++i) row[size_t(i)] = float(row[size_t(i)] * k);
            row[size_t(sd)] = 1.0f;
        });
    }
    if (layer == 0 && !ctx.draft && rs.context_gain > 0) {
        // Context: layer 0's attention (a sliding-window layer). Its query is a constant (read
        // from the anchor coordinate) on one RoPE pair and its keys carry the same constant, so
        // a key at distance D scores A cos(f D): a recency kernel ~exp(-D^2 / 2 span^2). Its
        // values are the tokens' semantic coordinates, and the output adds context_gain *
        // sqrt(dim) * (kernel-weighted mean of the recent tokens' unit semantic vectors) to those
        // coordinates: consecutive tokens share most of it, so they share experts.
        const context_plan c = plan_context(ctx);
        auto sparse_rows = [&](auto weight_of) {
            return fill_rows(ctx, s, out, [&](int64_t r, std::span<float> row, rng&) {
                std::fill(row.begin(), row.end(), 0.0f);
                weight_of(r, row);
            });
        };
        if (ends_with(rest, "attn_q_a.weight"))
            return sparse_rows([&](int64_t r, std::span<float> row) { if (r == 0) row[size_t(c.anchor)] = 1.0f; });
        if (ends_with(rest, "attn_q_b.weight"))
            return sparse_rows([&](int64_t r, std::span<float> row) { if (r % hp.head_dim == c.pair_dim) row[0] = c.q_weight; });
        if (ends_with(rest, "attn_kv.weight"))
            return sparse_rows([&](int64_t r, std::span<float> row) {
                if (r < c.sd) row[size_t(r)] = 1.0f;
                if (r == c.pair_dim) row[size_t(c.anchor)] = c.k_weight;
            });
        if (ends_with(rest, "attn_output_a.weight"))  // group g's first head -> its low-rank block
            return sparse_rows([&](int64_t r, std::span<float> row) {
                if (r % hp.o_lora_rank < c.sd) row[size_t(r % hp.o_lora_rank)] = 1.0f;
            });
        if (ends_with(rest, "attn_output_b.weight"))
            return sparse_rows([&](int64_t r, std::span<float> row) {
                if (r < c.sd)
                    for (int g = 0; g < hp.o_groups; ++g) row[size_t(g * hp.o_lora_rank + r)] = c.out_weight;
            });
    }
    const bool output_proj = ends_with(rest, "attn_output_b.weight") || ends_with(rest, "ffn_down_shexp.weight");
    const bool engram_proj = ends_with(rest, "engram_wkv.weight");
    double sigma = 1.0 / std::sqrt(double(in));
    if (output_proj) sigma *= residual_scale;
    if (engram_proj) sigma *= 0.5;
    gaussian(sigma);
}

}  // namespace moestream::forge
