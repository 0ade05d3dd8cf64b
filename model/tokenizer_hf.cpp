// load_hf_tokenizer: turns an HF tokenizer.json (+ tokenizer_config.json beside it) into the
// GGUF-shaped tokenizer_data, the same form the runtime reads from tokenizer.ggml.* metadata.
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include <simdjson.h>

#include "model/tokenizer.h"

namespace moestream {

namespace {

using simdjson::dom::element;

std::string json_error(const std::string& path, const std::string& what, simdjson::error_code e) {
    return path + ": " + what + " (" + simdjson::error_message(e) + ")";
}

// An HF special-token entry in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> token_content(element obj, const char* key) {
    element v;
    if (obj[key].get(v) != simdjson::SUCCESS) return std::nullopt;
    std::string_view s;
    if (v.get_string().get(s) == simdjson::SUCCESS) return std::string(s);
    if (v["content"].get_string().get(s) == simdjson::SUCCESS) return std::string(s);
    return std::nullopt;
}

// Fills bos/eos/pad, add_bos/add_eos and the chat template from tokenizer_config.json. The file
// is optional: without it the tokenizer_data defaults stay.
status read_config(const std::filesystem::path& path, tokenizer_data& data,
                   const std::unordered_map<std::string, int32_t>& ids_by_content) {
    if (!std::filesystem::exists(path)) return {};
    simdjson::dom::parser parser;
    element root;
    if (auto e = parser.load(path.string()).get(root)) return make_error(json_error(path.string(), "cannot parse", e));
    auto set_id = [&](const char* key, int32_t& id) -> status {
        auto content = token_content(root, key);
        if (!content) return {};
        auto it = ids_by_content.find(*content);
        if (it == ids_by_content.end())
            return make_error(path.string() + ": " + key + " '" + *content + "' is not a token");
        id = it->second;
        return {};
    };
    MS_TRY(set_id("bos_token", data.bos_id));
    MS_TRY(set_id("eos_token", data.eos_id));
    MS_TRY(set_id("pad_token", data.pad_id));
    bool flag = false;
    if (root["add_bos_token"].get_bool().get(flag) == simdjson::SUCCESS) data.add_bos = flag;
    if (root["add_eos_token"].get_bool().get(flag) == simdjson::SUCCESS) data.add_eos = flag;
    std::string_view tmpl;
    if (root["chat_template"].get_string().get(tmpl) == simdjson::SUCCESS) data.chat_template = std::string(tmpl);
    return {};
}

}  // namespace

result<tokenizer_data> load_hf_tokenizer(const std::string& tokenizer_json_path, int64_t vocab_size) {
    const std::string& path = tokenizer_json_path;
    if (!std::filesystem::exists(path)) return make_error(path + ": no such file");
    simdjson::dom::parser parser;
    element root;
    if (auto e = parser.load(path).get(root)) return make_error(json_error(path, "cannot parse", e));

    element model;
    if (auto e = root["model"].get(model)) return make_error(json_error(path, "no \"model\"", e));
    std::string_view type;
    if (model["type"].get_string().get(type) == simdjson::SUCCESS && type != "BPE")
        return make_error(path + ": model.type is '" + std::string(type) + "', only BPE is supported");
    simdjson::dom::object vocab;
    if (auto e = model["vocab"].get_object().get(vocab)) return make_error(json_error(path, "model.vocab", e));
    simdjson::dom::array merges;
    if (auto e = model["merges"].get_array().get(merges)) return make_error(json_error(path, "model.merges", e));
    simdjson::dom::array added;
    if (root["added_tokens"].get_array().get(added) != simdjson::SUCCESS) added = {};

    struct entry {
        std::string text;
        token_type type;
    };
    std::unordered_map<int64_t, entry> by_id;
    int64_t max_id = -1;
    for (auto field : vocab) {
        int64_t id = 0;
        if (auto e = field.value.get_int64().get(id); e || id < 0)
            return make_error(path + ": model.vocab[\"" + std::string(field.key) + "\"] is not a token id");
        by_id[id] = {std::string(field.key), token_type::normal};
        max_id = std::max(max_id, id);
    }
    for (element t : added) {
        int64_t id = 0;
        std::string_view content;
        bool special = false;
        if (t["id"].get_int64().get(id) || id < 0 || t["content"].get_string().get(content))
            return make_error(path + ": an added_tokens entry lacks id or content");
        if (t["special"].get_bool().get(special)) special = false;
        // An added token replaces a vocab entry of the same id (DeepSeek's ids 0..2).
        by_id[id] = {std::string(content), special ? token_type::control : token_type::user_defined};
        max_id = std::max(max_id, id);
    }
    if (vocab_size <= 0) vocab_size = max_id + 1;
    if (max_id >= vocab_size)
        return make_error(path + ": token id " + std::to_string(max_id) + " does not fit vocab_size " +
                          std::to_string(vocab_size));

    tokenizer_data data;
    data.tokens.resize(size_t(vocab_size));
    data.token_types.resize(size_t(vocab_size));
    std::unordered_set<std::string> used;
    std::unordered_map<std::string, int32_t> ids_by_content;
    for (auto& [id, e] : by_id) {
        used.insert(e.text);
        ids_by_content.emplace(e.text, int32_t(id));
        data.tokens[size_t(id)] = std::move(e.text);
        data.token_types[size_t(id)] = int32_t(e.type);
    }
    // Padding ids get unique placeholder strings: GGUF wants one string per id, and a duplicate
    // would make the vocabulary ambiguous.
    for (int64_t id = 0; id < vocab_size; ++id) {
        if (by_id.count(id)) continue;
        std::string name = "<|unused_" + std::to_string(id) + "|>";
        while (used.count(name)) name += "_";
        used.insert(name);
        data.tokens[size_t(id)] = std::move(name);
        data.token_types[size_t(id)] = int32_t(token_type::unused);
    }

    data.merges.reserve(merges.size());
    for (element m : merges) {
        std::string_view s;
        if (m.get_string().get(s) == simdjson::SUCCESS) {
            data.merges.emplace_back(s);
            continue;
        }
        // Newer tokenizer.json files store a merge as ["left", "right"].
        simdjson::dom::array pair;
        std::string_view a, b;
        if (m.get_array().get(pair) || pair.size() != 2 || pair.at(0).get_string().get(a) ||
            pair.at(1).get_string().get(b))
            return make_error(path + ": model.merges[" + std::to_string(data.merges.size()) +
                              "] is neither \"a b\" nor [\"a\", \"b\"]");
        data.merges.push_back(std::string(a) + " " + std::string(b));
    }

    const auto config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    MS_TRY(read_config(config, data, ids_by_content));
    return data;
}

}  // namespace moestream
