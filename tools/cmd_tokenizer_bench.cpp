// `moestream bench tokenizer`: single-thread encode throughput of the byte-level BPE tokenizer,
// in MB/s of input text and tokens/s. By default the input is the repository's own C++ sources,
// a realistic mix of identifiers, punctuation and indentation.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench tokenizer";

const cli::option_spec kOptions[] = {
    {"model", "FILE.gguf", "use the tokenizer stored in a model file"},
    {"tokenizer-json", "PATH", "use an HF tokenizer.json (tokenizer_config.json beside it is read too)"},
    {"file", "PATH", "text to encode (default: every .cpp/.h file under the source tree)"},
    {"repeat", "N", "encode the text N times and report the total (default 5)"},
    {"special", "", "parse added tokens written in the text"},
};

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

result<std::string> read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error("cannot read '" + path.string() + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// All .cpp/.h files of the repository, in a stable order, skipping build and fetched folders.
result<std::string> repo_sources() {
    // The build passes absolute source paths, so this file's folder locates the tree; a moved
    // binary falls back to the current directory.
    std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path();
    if (!std::filesystem::is_directory(root)) root = std::filesystem::current_path();
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        const auto name = it->path().filename().string();
        if (it->is_directory() && (name.starts_with("build") || name.starts_with("."))) {
            it.disable_recursion_pending();
            continue;
        }
        const auto ext = it->path().extension();
        if (it->is_regular_file() && (ext == ".cpp" || ext == ".h")) files.push_back(it->path());
    }
    if (ec) return make_error("cannot list " + root.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& f : files) {
        auto t = read_file(f);
        MS_TRY(t);
        text += *t;
    }
    if (text.empty()) return make_error("no .cpp/.h files under " + root.string());
    return text;
}

result<tokenizer> open_tokenizer(const cli::args& a) {
    if (a.has("model") == a.has("tokenizer-json"))
        return make_error("give exactly one of --model or --tokenizer-json");
    if (auto m = a.get("model")) return load_tokenizer(*m);
    auto data = load_hf_tokenizer(*a.get("tokenizer-json"), 129280);
    MS_TRY(data);
    return tokenizer::create(std::move(*data));
}

int run(const cli::args& a) {
    const auto repeat = a.get_int("repeat", 5);
    if (!repeat) return usage_error(kName, repeat.message());
    if (*repeat <= 0) return usage_error(kName, "--repeat must be > 0");
    if (a.has("model") == a.has("tokenizer-json"))
        return usage_error(kName, "give exactly one of --model or --tokenizer-json");
    auto tok = open_tokenizer(a);
    if (!tok) return fail(kName, tok.message());
    auto text = a.has("file") ? read_file(*a.get("file")) : repo_sources();
    if (!text) return fail(kName, text.message());
    const bool special = a.flag("special");

    (void)tok->encode(std::string_view(*text).substr(0, 1 << 16), special);  // warm caches
    // CPU time of this thread is the "one core" figure even when the machine is busy; wall time
    // is printed beside it.
    size_t tokens = 0;
    const double c0 = thread_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < *repeat; ++i) tokens += tok->encode(*text, special).size();
    const double cpu = thread_cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = double(text->size()) * double(*repeat);
    std::printf("tokenizer encode: %.2f MB/s (%.0f bytes, %zu tokens, %.3f s)\n", bytes / cpu / 1e6, bytes,
                tokens, cpu);
    std::printf("tokenizer encode: %.0f tokens/s, %.2f bytes/token, 1 thread (wall %.3f s: %.2f MB/s)\n",
                double(tokens) / cpu, bytes / double(tokens), wall, bytes / wall / 1e6);
    return 0;
}

const command kCommand{kName, "(--tokenizer-json PATH | --model FILE.gguf) [--file PATH] [--repeat N] [--special]",
                       "Measures single-thread tokenizer encode throughput (MB/s of text and tokens/s). "
                       "The default input is every .cpp/.h file of the source tree.",
                       kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
