#include "model/engram_tables.h"
#include "model/tokenizer.h"

namespace moestream::engram {

result<token_map> token_map_from_tokenizer(const tokenizer& tok, int32_t pad_id) {
    const auto& data = tok.data();
    MS_ASSERT(data.token_types.size() == data.tokens.size());
    if (pad_id < 0 || pad_id >= tok.vocab_size())
        return make_error("engram pad id " + std::to_string(pad_id) + " is outside the vocabulary");
    // Real tokens are those before the trailing run of padding entries.
    size_t real = 0;
    for (size_t i = 0; i < data.tokens.size(); ++i)
        if (data.token_types[i] != int32_t(token_type::unused)) real = i + 1;
    if (size_t(pad_id) >= real) return make_error("engram pad id " + std::to_string(pad_id) + " is a padding entry");
    std::vector<std::string> decoded, raw;
    decoded.reserve(real);
    raw.reserve(real);
    for (size_t i = 0; i < real; ++i) {
        decoded.push_back(utf8_lossy(tok.token_bytes(int32_t(i))));
        raw.push_back(data.tokens[i]);
    }
    auto map = build_compressed_token_map(decoded, raw);
    if (!map) return map.err();
    map->map.resize(data.tokens.size(), map->map[size_t(pad_id)]);
    return map;
}

}  // namespace moestream::engram
