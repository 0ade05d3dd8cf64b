// moestream: one binary, many subcommands (see tools/command.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tools/command.h"

namespace moestream::tools {

std::vector<const command*>& command_registry() {
    static std::vector<const command*> registry;
    return registry;
}

int fail(std::string_view command_name, std::string_view message) {
    std::fprintf(stderr, "moestream %.*s: %.*s\n", int(command_name.size()), command_name.data(),
                 int(message.size()), message.data());
    return 1;
}

int usage_error(std::string_view command_name, std::string_view message) {
    std::fprintf(stderr, "moestream %.*s: %.*s\n(run `moestream %.*s --help` for usage)\n",
                 int(command_name.size()), command_name.data(), int(message.size()), message.data(),
                 int(command_name.size()), command_name.data());
    return 2;
}

namespace {

void print_overview() {
    auto cmds = command_registry();
    std::sort(cmds.begin(), cmds.end(), [](auto* a, auto* b) { return a->name < b->name; });
    std::printf(
        "moestream %s: a mixture-of-experts inference server that streams experts from disk\n\n"
        "usage: moestream <command> [options]    (moestream <command> --help for details)\n\n"
        "commands:\n",
        MOESTREAM_VERSION);
    for (const auto* c : cmds) {
        std::string_view s = c->summary;
        auto dot = s.find(". ");
        if (dot != std::string_view::npos) s = s.substr(0, dot + 1);
        std::printf("  %-18.*s %.*s\n", int(c->name.size()), c->name.data(), int(s.size()), s.data());
    }
}

// Longest registered command name that is a prefix of the argument words.
const command* match(const std::vector<std::string>& words, size_t& consumed) {
    const command* best = nullptr;
    for (const auto* c : command_registry()) {
        std::vector<std::string> parts;
        std::string_view n = c->name;
        while (!n.empty()) {
            auto sp = n.find(' ');
            parts.emplace_back(n.substr(0, sp));
            n = sp == std::string_view::npos ? std::string_view() : n.substr(sp + 1);
        }
        if (parts.size() > words.size()) continue;
        if (!std::equal(parts.begin(), parts.end(), words.begin())) continue;
        if (!best || parts.size() > consumed) {
            best = c;
            consumed = parts.size();
        }
    }
    return best;
}

}  // namespace
}  // namespace moestream::tools

int main(int argc, char** argv) {
    using namespace moestream;
    using namespace moestream::tools;
    std::vector<std::string> words(argv + 1, argv + argc);
    if (words.empty() || words[0] == "--help" || words[0] == "-h" || words[0] == "help") {
        print_overview();
        return words.empty() ? 2 : 0;
    }
    if (words[0] == "--version") {
        std::printf("moestream %s\n", MOESTREAM_VERSION);
        return 0;
    }
    size_t consumed = 0;
    const command* cmd = match(words, consumed);
    if (!cmd) {
        // A group word alone ("bench") lists its members.
        bool group = false;
        for (const auto* c : command_registry())
            if (c->name.starts_with(words[0] + " ")) {
                if (!group) std::printf("moestream %s: pick one of:\n", words[0].c_str());
                group = true;
                std::printf("  moestream %.*s\n", int(c->name.size()), c->name.data());
            }
        if (group) return 2;
        std::fprintf(stderr, "moestream: unknown command '%s' (run `moestream --help`)\n", words[0].c_str());
        return 2;
    }
    std::vector<std::string> rest(words.begin() + consumed, words.end());
    if (std::find(rest.begin(), rest.end(), "--help") != rest.end() ||
        std::find(rest.begin(), rest.end(), "-h") != rest.end()) {
        std::fputs(cli::usage(cmd->name, cmd->synopsis, cmd->summary, cmd->options).c_str(), stdout);
        return 0;
    }
    auto parsed = cli::args::parse(rest, cmd->options);
    if (!parsed) return usage_error(cmd->name, parsed.message());
    try {
        return cmd->run(*parsed);
    } catch (const std::exception& e) {
        // Tools are short-lived: an unexpected exception is reported, never a silent crash.
        return fail(cmd->name, std::string("unexpected error: ") + e.what());
    }
}
