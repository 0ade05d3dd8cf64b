#include "config/cli.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace moestream::cli {
namespace {

const option_spec* find_spec(std::span<const option_spec> specs, std::string_view name) {
    for (const auto& s : specs)
        if (s.name == name) return &s;
    return nullptr;
}

const option_spec* find_short(std::span<const option_spec> specs, char c) {
    for (const auto& s : specs)
        if (s.short_name != 0 && s.short_name == c) return &s;
    return nullptr;
}

}  // namespace

result<args> args::parse(std::span<const std::string> argv, std::span<const option_spec> specs) {
    args out;
    for (size_t i = 0; i < argv.size(); ++i) {
        std::string_view word = argv[i];
        if (word == "--") {
            for (size_t j = i + 1; j < argv.size(); ++j) out.positional_.push_back(argv[j]);
            break;
        }
        // `-c VALUE` / `-c` for a declared alias; every other short word is positional as before.
        if (word.size() == 2 && word[0] == '-' && word[1] != '-') {
            if (const option_spec* spec = find_short(specs, word[1])) {
                if (spec->value_name.empty()) {
                    out.values_.emplace(std::string(spec->name), std::string());
                    continue;
                }
                if (i + 1 >= argv.size()) {
                    std::string msg = "option ";
                    msg += word;
                    msg += " needs a value (";
                    msg += spec->value_name;
                    msg += ')';
                    return make_error(std::move(msg));
                }
                out.values_.emplace(std::string(spec->name), argv[++i]);
                continue;
            }
        }
        if (word.size() < 3 || word.substr(0, 2) != "--") {
            out.positional_.emplace_back(word);
            continue;
        }
        std::string_view body = word.substr(2);
        std::optional<std::string_view> inline_value;
        if (auto eq = body.find('='); eq != std::string_view::npos) {
            inline_value = body.substr(eq + 1);
            body = body.substr(0, eq);
        }
        const option_spec* spec = find_spec(specs, body);
        if (!spec) return make_error("unknown option --" + std::string(body) + " (see --help)");
        if (spec->value_name.empty()) {
            if (inline_value) return make_error("option --" + std::string(body) + " takes no value");
            out.values_.emplace(std::string(body), std::string());
            continue;
        }
        if (inline_value) {
            out.values_.emplace(std::string(body), std::string(*inline_value));
            continue;
        }
        if (i + 1 >= argv.size())
            return make_error("option --" + std::string(body) + " needs a value (" +
                              std::string(spec->value_name) + ")");
        out.values_.emplace(std::string(body), argv[++i]);
    }
    return out;
}

bool args::has(std::string_view name) const { return values_.find(name) != values_.end(); }

std::optional<std::string> args::get(std::string_view name) const {
    auto [lo, hi] = values_.equal_range(name);
    if (lo == hi) return std::nullopt;
    return std::prev(hi)->second;
}

std::vector<std::string> args::values(std::string_view name) const {
    std::vector<std::string> out;
    auto [lo, hi] = values_.equal_range(name);
    for (auto it = lo; it != hi; ++it) out.push_back(it->second);
    return out;
}

std::string args::get_or(std::string_view name, std::string_view fallback) const {
    auto v = get(name);
    return v ? *v : std::string(fallback);
}

result<int64_t> args::get_int(std::string_view name, int64_t fallback) const {
    auto v = get(name);
    if (!v) return fallback;
    return parse_int(*v, "--" + std::string(name));
}

result<double> args::get_double(std::string_view name, double fallback) const {
    auto v = get(name);
    if (!v) return fallback;
    return parse_double(*v, "--" + std::string(name));
}

result<std::string> args::require(std::string_view name) const {
    auto v = get(name);
    if (!v) return make_error("missing required option --" + std::string(name));
    return *v;
}

std::string usage(std::string_view command, std::string_view synopsis, std::string_view summary,
                  std::span<const option_spec> specs) {
    // Appends only: GCC 12's -Wrestrict misfires on `"literal" + std::string` here.
    std::string out = "usage: moestream ";
    out += command;
    if (!synopsis.empty()) {
        out += ' ';
        out += synopsis;
    }
    out += "\n\n";
    out += summary;
    out += '\n';
    if (!specs.empty()) out += "\noptions:\n";
    size_t width = 0;
    // An alias is listed in front of its option ("-n, --n-predict N"), 4 more characters.
    for (const auto& s : specs)
        width = std::max(width, s.name.size() + s.value_name.size() + 3 + (s.short_name ? 4 : 0));
    for (const auto& s : specs) {
        std::string left;
        if (s.short_name) {
            left += '-';
            left += s.short_name;
            left += ", ";
        }
        left += "--";
        left += s.name;
        if (!s.value_name.empty()) {
            left += ' ';
            left += s.value_name;
        }
        left.resize(std::max(left.size(), width), ' ');
        out += "  " + left + "  " + std::string(s.help) + "\n";
    }
    out += "  --help" + std::string(width > 6 ? width - 6 : 0, ' ') + "  show this help\n";
    return out;
}

result<int64_t> parse_int(std::string_view text, std::string_view what) {
    int64_t v = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec == std::errc::result_out_of_range)
        return make_error(std::string(what) + ": '" + std::string(text) + "' is out of range");
    if (ec != std::errc() || p != end || text.empty())
        return make_error(std::string(what) + ": '" + std::string(text) + "' is not an integer");
    return v;
}

result<double> parse_double(std::string_view text, std::string_view what) {
    std::string s(text);
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size())
        return make_error(std::string(what) + ": '" + s + "' is not a number");
    if (errno == ERANGE || !std::isfinite(v))
        return make_error(std::string(what) + ": '" + s + "' is out of range");
    return v;
}

}  // namespace moestream::cli
