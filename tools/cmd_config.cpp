// moestream config: prints the effective configuration (defaults <- --config file <- flags), or
// the error that names the wrong field.
#include <cstdio>

#include "config/config.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

int run(const cli::args& a) {
    auto cfg = load_config(a);
    if (!cfg) return fail("config", cfg.message());
    std::fputs(to_json(*cfg).c_str(), stdout);
    return 0;
}

const std::vector<cli::option_spec>& options() {
    static const auto specs = with_config_options({{"model", "FILE.gguf", "model file"},
                                                   {"host", "ADDR", "listen address"},
                                                   {"port", "N", "listen port"},
                                                   {"api-key", "KEY", "accepted API key (repeatable)"}});
    return specs;
}

const command kCommand{"config", "[--config FILE.json] [flags]",
                       "Validates and prints the effective configuration as JSON (API keys redacted).", options(),
                       run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
