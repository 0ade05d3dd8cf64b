// Subcommand registry of the `moestream` binary. Each tools/cmd_*.cpp defines one command and
// registers it with MS_REGISTER_COMMAND; names may have two words ("bench io"). main.cpp picks
// the longest registered name that prefixes argv.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/cli.h"

namespace moestream::tools {

struct command {
    std::string_view name;      // "forge", "bench tokenizer"
    std::string_view synopsis;  // "--preset P --out FILE.gguf [--seed N]"
    std::string_view summary;   // one paragraph
    std::span<const cli::option_spec> options;
    int (*run)(const cli::args& args);  // returns the process exit code
};

std::vector<const command*>& command_registry();

struct command_registrar {
    explicit command_registrar(const command& c) { command_registry().push_back(&c); }
};

// Prints "moestream <cmd>: <message>" to stderr and returns exit code 1 (or 2 for usage errors).
int fail(std::string_view command_name, std::string_view message);
int usage_error(std::string_view command_name, std::string_view message);

}  // namespace moestream::tools

#define MS_CONCAT_INNER(a, b) a##b
#define MS_CONCAT(a, b) MS_CONCAT_INNER(a, b)
#define MS_REGISTER_COMMAND(cmd) \
    static ::moestream::tools::command_registrar MS_CONCAT(ms_registrar_, __LINE__){cmd}
