// The forge routing scheme does what docs/forge.md says: content-dependent routing (tokens of one
// topic pick overlapping experts, tokens of different topics do not) and skewed popularity, and
// the bytes are a pure function of the seed.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "model/quant.h"
#include "tools/forge_weights.h"

using namespace moestream;

namespace {

forge::forge_context tiny_context(uint64_t seed, const std::vector<std::string>& words) {
    forge::forge_context ctx;
    ctx.hp = *dsv41::preset("tiny");
    ctx.hp.vocab = int64_t(words.size());
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

// Layer-L top-k experts of each token from its embedding alone (RMS-normed, sqrt-softplus
// scores, bias for selection): the routing the residual stream starts from.
std::vector<std::set<int>> route_embeddings(const forge::forge_context& ctx, int layer) {
    const auto all = dsv41::target_tensors(ctx.hp);
    const auto embd = materialise(ctx, spec(all, "token_embd.weight"));
    const auto gate = materialise(ctx, spec(all, "blk." + std::to_string(layer) + ".ffn_gate_inp.weight"));
    const auto bias = materialise(ctx, spec(all, "blk." + std::to_string(layer) + ".exp_probs_b.bias"));
    const int64_t d = ctx.hp.dim, n = ctx.hp.n_experts;
    std::vector<std::set<int>> picks;
    for (int64_t t = 0; t < ctx.hp.vocab; ++t) {
        const float* e = embd.data() + t * d;
        double ms = 0;
        for (int64_t i = 0; i < d; ++i) ms += double(e[i]) * e[i];
        const double inv = 1.0 / std::sqrt(ms / double(d));
        std::vector<std::pair<double, int>> score;
        for (int64_t x = 0; x < n; ++x) {
            double z = 0;
            for (int64_t i = 0; i < d; ++i) z += double(gate[size_t(x * d + i)]) * e[i] * inv;
            const double s = std::sqrt(std::log1p(std::exp(z)));
            score.push_back({-(s + bias[size_t(x)]), int(x)});
        }
        std::sort(score.begin(), score.end());
        std::set<int> top;
        for (int k = 0; k < ctx.hp.n_active; ++k) top.insert(score[size_t(k)].second);
        picks.push_back(top);
    }
    return picks;
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
    const auto picks = route_embeddings(ctx, 0);
    double same = 0, other = 0;
    int n_same = 0, n_other = 0;
    for (size_t a = 0; a < 64; ++a)
        for (size_t b = a + 1; b < 64; ++b) {
            const bool related = a / 4 == b / 4;  // spellings of one stem
            BOOST_TEST_REQUIRE((ctx.topic_of_token[a] == ctx.topic_of_token[b]) >= related);
            (related ? same : other) += overlap(picks[a], picks[b]);
            (related ? n_same : n_other) += 1;
        }
    same /= n_same;
    other /= n_other;
    BOOST_TEST_MESSAGE("mean top-6 overlap: same content " << same << ", other content " << other);
    BOOST_TEST(same >= 3.0);
    BOOST_TEST(other <= 1.5);
    BOOST_TEST(same >= 3 * other);
}

BOOST_AUTO_TEST_CASE(expert_popularity_is_skewed_not_uniform) {
    const auto words = vocabulary();
    const auto ctx = tiny_context(5, words);
    for (int layer : {0, 5}) {
        const auto picks = route_embeddings(ctx, layer);
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
        BOOST_TEST(top_eighth > total / 4);  // uniform would be 12.5%
    }
}

BOOST_AUTO_TEST_CASE(bytes_depend_only_on_the_seed) {
    const auto words = vocabulary();
    const auto all = dsv41::target_tensors(tiny_context(1, words).hp);
    for (const char* name : {"token_embd.weight", "blk.3.ffn_up_exps.weight", "blk.2.attn_q_b.weight",
                             "blk.1.engram_embd.weight"}) {
        const auto& s = spec(all, name);
        int64_t rows = 1;
        for (size_t k = 1; k < s.shape.size(); ++k) rows *= s.shape[k];
        const size_t bytes = size_t(row_bytes(dtype_info(s.type), s.shape[0]) * rows);
        std::vector<std::byte> a(bytes), b(bytes), c(bytes);
        forge::fill_tensor(tiny_context(1, words), s, a);
        forge::fill_tensor(tiny_context(1, words), s, b);
        forge::fill_tensor(tiny_context(2, words), s, c);
        BOOST_TEST((a == b), name << ": same seed, same bytes");
        BOOST_TEST((a != c), name << ": another seed, other bytes");
    }
}
