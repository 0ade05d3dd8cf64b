// moestream tokenize / detokenize / chat-template: the model file's tokenizer and chat format.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/chat_template.h"
#include "scheduler/model_gguf.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

result<std::string> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error("cannot read '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

const cli::option_spec kTokenizeOptions[] = {
    {"model", "FILE.gguf", "model whose tokenizer to use"},
    {"text", "STR", "text to tokenize"},
    {"file", "PATH", "tokenize the contents of a file"},
    {"special", "", "parse special/added tokens written in the text (e.g. <｜User｜>)"},
};

int run_tokenize(const cli::args& a) {
    constexpr std::string_view name = "tokenize";
    auto model = a.require("model");
    if (!model) return usage_error(name, model.message());
    if (a.has("text") == a.has("file")) return usage_error(name, "give exactly one of --text or --file");
    std::string text;
    if (a.has("text")) {
        text = *a.get("text");
    } else {
        auto t = read_file(*a.get("file"));
        if (!t) return fail(name, t.message());
        text = std::move(*t);
    }
    auto tok = load_tokenizer(*model);
    if (!tok) return fail(name, tok.message());
    auto ids = tok->encode(text, a.flag("special"));
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

const cli::option_spec kDetokenizeOptions[] = {
    {"model", "FILE.gguf", "model whose tokenizer to use"},
    {"ids", "1,2,3", "comma-separated token ids"},
};

int run_detokenize(const cli::args& a) {
    constexpr std::string_view name = "detokenize";
    auto model = a.require("model");
    if (!model) return usage_error(name, model.message());
    auto list = a.require("ids");
    if (!list) return usage_error(name, list.message());
    auto tok = load_tokenizer(*model);
    if (!tok) return fail(name, tok.message());
    std::vector<int32_t> ids;
    std::stringstream ss(*list);
    for (std::string item; std::getline(ss, item, ',');) {
        while (!item.empty() && item.front() == ' ') item.erase(0, 1);
        if (item.empty()) continue;
        auto v = cli::parse_int(item, "--ids");
        if (!v) return usage_error(name, v.message());
        if (*v < 0 || *v >= tok->vocab_size())
            return usage_error(name, "--ids: token id " + item + " is outside the vocabulary (0.." +
                                         std::to_string(tok->vocab_size() - 1) + ")");
        ids.push_back(int32_t(*v));
    }
    utf8_stream_decoder dec;
    std::string text = dec.push(tok->decode(ids)) + dec.finish();
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
}

const cli::option_spec kChatOptions[] = {
    {"model", "FILE.gguf", "model whose chat format and special tokens to use"},
    {"messages", "FILE.json", "OpenAI-style messages array"},
    {"add-generation-prompt", "", "end with the assistant prefix, ready for generation"},
};

int run_chat_template(const cli::args& a) {
    constexpr std::string_view name = "chat-template";
    auto model = a.require("model");
    if (!model) return usage_error(name, model.message());
    auto path = a.require("messages");
    if (!path) return usage_error(name, path.message());
    auto json = read_file(*path);
    if (!json) return fail(name, json.message());
    auto messages = parse_chat_messages(*json);
    if (!messages) return fail(name, *path + ": " + messages.message());
    auto tok = load_tokenizer(*model);
    if (!tok) return fail(name, tok.message());
    chat_special_tokens special;
    special.bos = tok->token_bytes(tok->data().bos_id);
    special.eos = tok->token_bytes(tok->data().eos_id);
    auto rendered = render_chat(*messages, a.flag("add-generation-prompt"), special);
    if (!rendered) return fail(name, rendered.message());
    std::fwrite(rendered->data(), 1, rendered->size(), stdout);
    std::fputc('\n', stdout);
    return 0;
}

const command kTokenize{"tokenize", "--model FILE.gguf (--text STR | --file PATH) [--special]",
                        "Prints the token ids of a text as a JSON array on one line.", kTokenizeOptions, run_tokenize};
const command kDetokenize{"detokenize", "--model FILE.gguf --ids 1,2,3", "Prints the text of token ids.",
                          kDetokenizeOptions, run_detokenize};
const command kChatTemplate{"chat-template", "--model FILE.gguf --messages FILE.json [--add-generation-prompt]",
                            "Prints the prompt that the model's chat format renders for a messages array.",
                            kChatOptions, run_chat_template};
MS_REGISTER_COMMAND(kTokenize);
MS_REGISTER_COMMAND(kDetokenize);
MS_REGISTER_COMMAND(kChatTemplate);

}  // namespace
}  // namespace moestream::tools
