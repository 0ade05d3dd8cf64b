// The forge routing scheme does what docs/forge.md says: content-dependent routing (tokens of one
// topic pick overlapping experts, tokens of different topics far fewer), skewed popularity, a
// layer-0 attention that adds a recency-weighted context (so consecutive tokens share experts)
// and an LM head blind to that context; and the bytes are a pure function of the seed.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/quant.h"
#include "tools/forge_weights.h"

using namespace moestream;

namespace {

forge::forge_context tiny_context(uint64_t seed, const std::vector<std::string>& words, int64_t window = 0) {
    forge::forge_context ctx;
    ctx.hp = *dsv41::preset("tiny");
    ctx.hp.vocab = int64_t(words.size());
    if (window > 0) ctx.hp.window = window;
    ctx.seed = seed;
    ctx.routing.topics = 16;
    ctx.topic_of_token = forge::token_topics(words, ctx.routing.topics);
    ctx.token_map.assign(words.size(), 0);
    ctx.compressed_vocab = 1;
    for (int k = 0; k < ctx.routing.topics; ++k) ctx.topic_dirs.push_back(forge::topic_direction(ctx, k));
    return ctx;
}

const dsv41::tensor_spec& spec(const std::vector<dsv41::tensor_spec>& all, const std::string& name) {
    auto it = std::find_if(all.begin(), all.end(), [&](auto& s) { return s.name == name; });
    BOOST_REQUIRE(it != all.end());
    return *it;
}

// Tensor as floats, rows of shape[0].
std::vector<float> materialise(const forge::forge_context& ctx, const dsv41::tensor_spec& s) {
    int64_t rows = 1;
    for (size_t k = 1; k < s.shape.size(); ++k) rows *= s.shape[k];
    const auto& t = dtype_info(s.type);
    std::vector<std::byte> bytes(size_t(row_bytes(t, s.shape[0]) * rows));
    forge::fill_tensor(ctx, s, bytes);
    std::vector<float> out(size_t(s.shape[0] * rows));
    for (int64_t r = 0; r < rows; ++r)
        quant::dequantize_row(s.type, bytes.data() + r * row_bytes(t, s.shape[0]), out.data() + r * s.shape[0], s.shape[0]);
    return out;
}

// Layer-L router of rows of hidden states (RMS-normed, sqrt-softplus scores, bias for selection):
// the top-k experts and the raw logits of each row.
struct routed {
    std::vector<std::set<int>> picks;
    std::vector<std::vector<double>> logits;
};

routed route_rows(const forge::forge_context& ctx, int layer, const std::vector<float>& rows, int64_t n_rows) {
    const auto all = dsv41::target_tensors(ctx.hp);
    const auto gate = materialise(ctx, spec(all, "blk." + std::to_string(layer) + ".ffn_gate_inp.weight"));
    const auto bias = materialise(ctx, spec(all, "blk." + std::to_string(layer) + ".exp_probs_b.bias"));
    const int64_t d = ctx.hp.dim, n = ctx.hp.n_experts;
    routed out;
    for (int64_t t = 0; t < n_rows; ++t) {
        const float* e = rows.data() + t * d;
        double ms = 0;
        for (int64_t i = 0; i < d; ++i) ms += double(e[i]) * e[i];
        const double inv = 1.0 / std::sqrt(ms / double(d));
        std::vector<std::pair<double, int>> score;
        std::vector<double> logits;
        for (int64_t x = 0; x < n; ++x) {
            double z = 0;
            for (int64_t i = 0; i < d; ++i) z += double(gate[size_t(x * d + i)]) * e[i] * inv;
            logits.push_back(z);
            const double s = std::sqrt(std::log1p(std::exp(z)));
            score.push_back({-(s + bias[size_t(x)]), int(x)});
        }
        std::sort(score.begin(), score.end());
        std::set<int> top;
        for (int k = 0; k < ctx.hp.n_active; ++k) top.insert(score[size_t(k)].second);
        out.picks.push_back(top);
        out.logits.push_back(logits);
    }
    return out;
}

// Layer-L routing of each token from its embedding alone: the routing the residual stream
// starts from, before any context.
routed route_embeddings(const forge::forge_context& ctx, int layer) {
    const auto all = dsv41::target_tensors(ctx.hp);
    return route_rows(ctx, layer, materialise(ctx, spec(all, "token_embd.weight")), ctx.hp.vocab);
}

double correlation(const std::vector<double>& a, const std::vector<double>& b) {
    double ma = 0, mb = 0;
    for (size_t i = 0; i < a.size(); ++i) ma += a[i], mb += b[i];
    ma /= double(a.size()), mb /= double(b.size());
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        ab += (a[i] - ma) * (b[i] - mb);
        aa += (a[i] - ma) * (a[i] - ma);
        bb += (b[i] - mb) * (b[i] - mb);
    }
    return ab / std::sqrt(aa * bb);
}

void rms_norm(float* x, int64_t n) {
    double ms = 0;
    for (int64_t i = 0; i < n; ++i) ms += double(x[i]) * x[i];
    const float inv = float(1.0 / std::sqrt(ms / double(n)));
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// Layer 0's attention over a token sequence, computed from the forged weights the way the model
// does (§3.4: input = the RMS-normed embedding, q through the low-rank pair, one shared kv head
// RMS-normed, RoPE on each head's last rope_dim dims, a sink per head, a sliding window, the
// grouped output projection): the residual update of every position, and the softmax weights
// of the last position's first head over its window (index = distance, [window]).
struct attention_result {
    std::vector<float> out;          // [T, dim]
    std::vector<double> last_probs;  // [distance]
};

attention_result layer0_attention(const forge::forge_context& ctx, const std::vector<int32_t>& tokens) {
    const auto& hp = ctx.hp;
    const auto all = dsv41::target_tensors(hp);
    const auto embd = materialise(ctx, spec(all, "token_embd.weight"));
    const auto qa = materialise(ctx, spec(all, "blk.0.attn_q_a.weight"));
    const auto qb = materialise(ctx, spec(all, "blk.0.attn_q_b.weight"));
    const auto wkv = materialise(ctx, spec(all, "blk.0.attn_kv.weight"));
    const auto oa = materialise(ctx, spec(all, "blk.0.attn_output_a.weight"));
    const auto ob = materialise(ctx, spec(all, "blk.0.attn_output_b.weight"));
    const auto sinks = materialise(ctx, spec(all, "blk.0.attn_sinks.weight"));
    const int64_t d = hp.dim, hd = hp.head_dim, nh = hp.n_heads, ql = hp.q_lora_rank, T = int64_t(tokens.size());
    const int64_t rd = hp.rope_dim, qd = nh * hd;
    auto matvec = [](const std::vector<float>& w, const float* x, int64_t in, int64_t out_n, float* y) {
        for (int64_t r = 0; r < out_n; ++r) {
            double s = 0;
            for (int64_t i = 0; i < in; ++i) s += double(w[size_t(r * in + i)]) * x[i];
            y[r] = float(s);
        }
    };
    auto rope = [&](float* v, int64_t pos, bool inverse) {  // last rd dims of one head
        for (int64_t i = 0; i < rd / 2; ++i) {
            const double f = 1.0 / std::pow(hp.rope_theta, double(2 * i) / double(rd));
            const double c = std::cos(double(pos) * f), s = (inverse ? -1 : 1) * std::sin(double(pos) * f);
            float* t = v + hd - rd + 2 * i;
            const double a = t[0], b = t[1];
            t[0] = float(a * c - b * s);
            t[1] = float(a * s + b * c);
        }
    };
    std::vector<float> q(size_t(T * qd)), kv(size_t(T * hd));
    for (int64_t t = 0; t < T; ++t) {
        std::vector<float> x(embd.begin() + tokens[size_t(t)] * d, embd.begin() + (tokens[size_t(t)] + 1) * d), qr(static_cast<size_t>(ql));
        rms_norm(x.data(), d);
        matvec(qa, x.data(), d, ql, qr.data());
        rms_norm(qr.data(), ql);
        matvec(qb, qr.data(), ql, qd, q.data() + t * qd);
        matvec(wkv, x.data(), d, hd, kv.data() + t * hd);
        rms_norm(kv.data() + t * hd, hd);
        rope(kv.data() + t * hd, t, false);
        for (int64_t h = 0; h < nh; ++h) rope(q.data() + t * qd + h * hd, t, false);
    }
    attention_result res;
    res.out.assign(size_t(T * d), 0.0f);
    const int64_t group_in = hd * hp.heads_per_group(), low = hp.o_lora_rank * hp.o_groups;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<float> o(static_cast<size_t>(qd), 0.0f), u(static_cast<size_t>(low));
        const int64_t first = std::max<int64_t>(0, t - hp.window + 1);
        for (int64_t h = 0; h < nh; ++h) {
            std::vector<double> sc;
            for (int64_t j = first; j <= t; ++j) {
                double s = 0;
                for (int64_t i = 0; i < hd; ++i) s += double(q[size_t(t * qd + h * hd + i)]) * kv[size_t(j * hd + i)];
                sc.push_back(s / std::sqrt(double(hd)));
            }
            const double m = std::max(double(sinks[size_t(h)]), *std::max_element(sc.begin(), sc.end()));
            double den = std::exp(double(sinks[size_t(h)]) - m);
            for (double& s : sc) den += (s = std::exp(s - m));
            for (int64_t j = first; j <= t; ++j)
                for (int64_t i = 0; i < hd; ++i) o[size_t(h * hd + i)] += float(sc[size_t(j - first)] / den) * kv[size_t(j * hd + i)];
            rope(o.data() + h * hd, t, true);
            if (t == T - 1 && h == 0)
                for (int64_t j = t; j >= first; --j) res.last_probs.push_back(sc[size_t(j - first)] / den);
        }
        for (int g = 0; g < hp.o_groups; ++g)
            for (int64_t r = 0; r < hp.o_lora_rank; ++r) {
                double s = 0;
                for (int64_t i = 0; i < group_in; ++i)
                    s += double(oa[size_t((g * hp.o_lora_rank + r) * group_in + i)]) * o[size_t(g * group_in + i)];
                u[size_t(g * hp.o_lora_rank + r)] = float(s);
            }
        matvec(ob, u.data(), low, d, res.out.data() + t * d);
    }
    return res;
}

double overlap(const std::set<int>& a, const std::set<int>& b) {
    int n = 0;
    for (int x : a) n += int(b.count(x));
    return n;
}

std::vector<std::string> vocabulary() {
    std::vector<std::string> words;
    const char* stems[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
                           "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"};
    // Each stem in four spellings that normalise alike ("Alpha", " alpha", ...), plus digits.
    for (const char* s : stems) {
        std::string w(s), cap = w;
        cap[0] = char(cap[0] - 'a' + 'A');
        for (const auto& v : {w, " " + w, cap, " " + cap}) words.push_back(v);
    }
    for (int i = 0; i < 64; ++i) words.push_back(std::to_string(i * 7));
    return words;
}

}  // namespace

BOOST_AUTO_TEST_CASE(related_tokens_route_to_related_experts) {
    const auto words = vocabulary();
    const auto ctx = tiny_context(3, words);
    const auto r = route_embeddings(ctx, 0);
    double same = 0, other = 0, same_corr = 0, other_corr = 0;
    int n_same = 0, n_other = 0;
    for (size_t a = 0; a < 64; ++a)
        for (size_t b = a + 1; b < 64; ++b) {
            const bool related = a / 4 == b / 4;  // spellings of one stem
            BOOST_TEST_REQUIRE((ctx.topic_of_token[a] == ctx.topic_of_token[b]) >= related);
            (related ? same : other) += overlap(r.picks[a], r.picks[b]);
            (related ? same_corr : other_corr) += correlation(r.logits[a], r.logits[b]);
            (related ? n_same : n_other) += 1;
        }
    same /= n_same, other /= n_other, same_corr /= n_same, other_corr /= n_other;
    BOOST_TEST_MESSAGE("mean top-6 overlap: same content " << same << ", other content " << other
                                                            << "; router logit correlation " << same_corr << " vs " << other_corr);
    // Router rows are random (the topic is in the hidden state, not in a cluster of experts), so
    // same-content tokens' logits correlate by about topic_share; other stems only through
    // related or colliding topics (16 stems share the tiny test's 8 word topics); the shared
    // popularity bias raises both top-6 overlaps.
    BOOST_TEST(same_corr >= 0.5);
    BOOST_TEST(other_corr <= 0.3);
    BOOST_TEST(same_corr >= 2 * other_corr);
    BOOST_TEST(same >= 2.4);
    BOOST_TEST(other <= 2.0);
    BOOST_TEST(same >= 1.4 * other);
}

BOOST_AUTO_TEST_CASE(expert_popularity_is_skewed_not_uniform) {
    const auto words = vocabulary();
    const auto ctx = tiny_context(5, words);
    for (int layer : {0, 5}) {
        const auto picks = route_embeddings(ctx, layer).picks;
        std::vector<int> count(size_t(ctx.hp.n_experts), 0);
        for (const auto& p : picks)
            for (int e : p) ++count[size_t(e)];
        std::vector<int> sorted = count;
        std::sort(sorted.rbegin(), sorted.rend());
        const int total = std::accumulate(count.begin(), count.end(), 0);
        const int top_eighth = std::accumulate(sorted.begin(), sorted.begin() + ctx.hp.n_experts / 8, 0);
        const int unused = int(std::count(count.begin(), count.end(), 0));
        BOOST_TEST_MESSAGE("layer " << layer << ": top 1/8 of experts take " << 100.0 * top_eighth / total
                                    << "% of selections, " << unused << " experts unused");
        BOOST_TEST(top_eighth > total / 3);  // uniform would be 12.5%
    }
}

BOOST_AUTO_TEST_CASE(bytes_depend_only_on_the_seed) {
    const auto words = vocabulary();
    const auto all = dsv41::target_tensors(tiny_context(1, words).hp);
    // Layer 0's query/key/output projections are constructed, not drawn: the same for any seed.
    for (const char* name : {"token_embd.weight", "output.weight", "blk.3.ffn_up_exps.weight", "blk.2.attn_q_b.weight",
                             "blk.0.attn_kv.weight", "blk.1.attn_kv.weight", "blk.4.ffn_gate_inp.weight",
                             "blk.1.engram_embd.weight"}) {
        const bool seeded = std::string_view(name) != "blk.0.attn_kv.weight";
        const auto& s = spec(all, name);
        int64_t rows = 1;
        for (size_t k = 1; k < s.shape.size(); ++k) rows *= s.shape[k];
        const size_t bytes = size_t(row_bytes(dtype_info(s.type), s.shape[0]) * rows);
        std::vector<std::byte> a(bytes), b(bytes), c(bytes);
        forge::fill_tensor(tiny_context(1, words), s, a);
        forge::fill_tensor(tiny_context(1, words), s, b);
        forge::fill_tensor(tiny_context(2, words), s, c);
        BOOST_TEST((a == b), name << ": same seed, same bytes");
        BOOST_TEST((a != c) == seeded, name << ": another seed, " << (seeded ? "other" : "the same") << " bytes");
    }
}

// Layer 0's attention is the context: a recency kernel exp(A (cos(f D) - 1)) ~ exp(-D^2 / 2 span^2)
// over the window, whose output is context_gain * sqrt(dim) times the kernel-weighted mean of the
// recent tokens' unit semantic vectors, in the semantic coordinates only.
BOOST_AUTO_TEST_CASE(layer0_attention_adds_a_recency_weighted_context) {
    const auto words = vocabulary();
    auto ctx = tiny_context(4, words, 64);  // a window wide enough to see the kernel's shape
    ctx.routing.context_span = 6;
    const int64_t d = ctx.hp.dim, sd = forge::semantic_dims(ctx.hp);
    std::vector<int32_t> seq;
    for (int t = 0; t < 40; ++t) seq.push_back((t * 37 + 11) % int(words.size()));
    const auto att = layer0_attention(ctx, seq);
    const auto& p = att.last_probs;
    BOOST_TEST_REQUIRE(p.size() == seq.size());
    for (size_t k = 1; k < 24; ++k) BOOST_TEST(p[k] < p[k - 1], "weight falls with the distance, " << k);
    const double at_span = p[6] / p[0], at_twice = p[12] / p[0];
    BOOST_TEST_MESSAGE("kernel: weight at distance span / at 0 = " << at_span << ", at 2 span " << at_twice);
    BOOST_TEST(at_span > 0.55);  // exp(-1/2) = 0.61 for the Gaussian
    BOOST_TEST(at_span < 0.67);
    BOOST_TEST(at_twice > 0.11);  // exp(-2) = 0.14
    BOOST_TEST(at_twice < 0.17);

    // The output of the last position against the kernel-weighted mean of unit semantic vectors.
    const auto all = dsv41::target_tensors(ctx.hp);
    const auto embd = materialise(ctx, spec(all, "token_embd.weight"));
    std::vector<double> expect(size_t(sd), 0.0);
    for (size_t k = 0; k < p.size(); ++k) {
        const float* e = embd.data() + seq[seq.size() - 1 - k] * d;
        double n2 = 0;
        for (int64_t i = 0; i < sd; ++i) n2 += double(e[i]) * e[i];
        for (int64_t i = 0; i < sd; ++i) expect[size_t(i)] += p[k] * e[i] / std::sqrt(n2);
    }
    const float* got = att.out.data() + (int64_t(seq.size()) - 1) * d;
    double dot = 0, gg = 0, ee = 0, rest = 0;
    for (int64_t i = 0; i < sd; ++i) {
        const double x = expect[size_t(i)] * ctx.routing.context_gain * std::sqrt(double(d));
        dot += got[i] * x, gg += double(got[i]) * got[i], ee += x * x;
    }
    for (int64_t i = sd; i < d; ++i) rest += double(got[i]) * got[i];
    BOOST_TEST_MESSAGE("context: cosine " << dot / std::sqrt(gg * ee) << ", norm ratio " << std::sqrt(gg / ee));
    BOOST_TEST(dot / std::sqrt(gg * ee) > 0.99);
    BOOST_TEST(std::sqrt(gg / ee) > 0.85);
    BOOST_TEST(std::sqrt(gg / ee) < 1.15);
    BOOST_TEST(rest == 0.0, "nothing outside the semantic coordinates");
}

// With the context, consecutive tokens of unrelated content share experts (their hidden states
// share most of the context); without it they share only the popular ones. The LM head does not
// read the context (or the anchor), so it cannot lock generation into repeating itself.
BOOST_AUTO_TEST_CASE(context_makes_consecutive_tokens_share_experts) {
    const auto words = vocabulary();
    const auto ctx = tiny_context(6, words);
    const int64_t d = ctx.hp.dim, sd = forge::semantic_dims(ctx.hp);
    std::vector<int32_t> seq;
    for (int t = 0; t < 48; ++t) seq.push_back(int32_t(((t * 29 + 5) % 16) * 4 + t % 4));  // a word stem per token
    const auto att = layer0_attention(ctx, seq);
    const auto all = dsv41::target_tensors(ctx.hp);
    const auto embd = materialise(ctx, spec(all, "token_embd.weight"));
    std::vector<float> plain(size_t(int64_t(seq.size()) * d)), with(plain.size());
    for (size_t t = 0; t < seq.size(); ++t)
        for (int64_t i = 0; i < d; ++i) {
            float x = embd[size_t(seq[t] * d + i)];
            plain[t * size_t(d) + size_t(i)] = x;
            with[t * size_t(d) + size_t(i)] = x + att.out[t * size_t(d) + size_t(i)];
        }
    const auto a = route_rows(ctx, 0, plain, int64_t(seq.size())), b = route_rows(ctx, 0, with, int64_t(seq.size()));
    double ov_plain = 0, ov_with = 0;
    for (size_t t = 9; t < seq.size(); ++t) {
        ov_plain += overlap(a.picks[t], a.picks[t - 1]) / double(seq.size() - 9);
        ov_with += overlap(b.picks[t], b.picks[t - 1]) / double(seq.size() - 9);
    }
    BOOST_TEST_MESSAGE("consecutive top-6 overlap: " << ov_plain << " from the embeddings, " << ov_with << " with the context");
    BOOST_TEST(ov_with >= ov_plain + 1.0);

    const auto head = materialise(ctx, spec(all, "output.weight"));
    for (int64_t t = 0; t < ctx.hp.vocab; ++t) {
        BOOST_TEST_REQUIRE(embd[size_t(t * d + sd)] == 1.0f, "the anchor coordinate is constant");
        for (int64_t i = 0; i <= sd; ++i) BOOST_TEST_REQUIRE(head[size_t(t * d + i)] == 0.0f);
    }
}
