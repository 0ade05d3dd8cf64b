// Command-line parsing for the subcommands: `--name value`, `--name=value`, `--flag`, and
// positional arguments. Every option is declared up front so `--help` lists it and an unknown or
// malformed option is a clear error naming it. An option may also declare a one-letter alias
// (`-n 5` for `--n-predict 5`, as llama.cpp users type it); any other word starting with a single
// dash stays positional, so negative numbers ("-1") keep working as values and positionals.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/result.h"

namespace moestream::cli {

struct option_spec {
    std::string_view name;        // without the leading "--"
    std::string_view value_name;  // empty for a boolean flag
    std::string_view help;
    char short_name = 0;          // optional alias `-c`; 0 = none. Stored under `name`.
};

class args {
public:
    // argv excludes the program and subcommand words. Options may repeat (`values` gives all).
    static result<args> parse(std::span<const std::string> argv, std::span<const option_spec> specs);

    bool has(std::string_view name) const;
    bool flag(std::string_view name) const { return has(name); }
    std::optional<std::string> get(std::string_view name) const;  // last occurrence
    std::vector<std::string> values(std::string_view name) const;  // every occurrence, in order
    std::string get_or(std::string_view name, std::string_view fallback) const;
    result<int64_t> get_int(std::string_view name, int64_t fallback) const;
    result<double> get_double(std::string_view name, double fallback) const;
    // Errors unless the option is present.
    result<std::string> require(std::string_view name) const;

    const std::vector<std::string>& positional() const { return positional_; }

private:
    std::multimap<std::string, std::string, std::less<>> values_;
    std::vector<std::string> positional_;
};

// "usage: moestream <command> ...\n\n<summary>\n\noptions:\n  --x VALUE   help\n"
std::string usage(std::string_view command, std::string_view synopsis, std::string_view summary,
                  std::span<const option_spec> specs);

// Strict number parsing used by the option getters and the JSON config.
result<int64_t> parse_int(std::string_view text, std::string_view what);
result<double> parse_double(std::string_view text, std::string_view what);

}  // namespace moestream::cli
