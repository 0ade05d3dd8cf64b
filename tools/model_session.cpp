#include "tools/model_session.h"

#include <thread>

namespace moestream::tools {

std::unique_ptr<dsv41::sequence_state> model_session::new_sequence(int64_t tokens, int64_t rollback) const {
    return std::make_unique<dsv41::sequence_state>(files->hp, std::max<int64_t>(tokens, 1), rollback,
                                                   model->has_draft());
}

result<std::unique_ptr<model_session>> open_model_session(const moestream_config& cfg, bool with_draft) {
    if (cfg.model.path.empty()) return make_error("--model is required");
    if (cfg.runtime.backend == "cuda") return make_error("the CUDA backend is not built yet: use --backend cpu");
    auto s = std::make_unique<model_session>();
    auto files = load_model(cfg.model.path, with_draft ? cfg.model.draft_path : std::string());
    if (!files) return files.err();
    s->files = std::move(*files);
    int threads = int(cfg.runtime.threads);
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    s->backend = std::make_unique<cpu_backend>(threads);
    s->experts = std::make_unique<resident_experts>(*s->files);
    s->model = std::make_unique<dsv41::model>(s->files->hp, s->files->weights,
                                              s->files->draft ? &*s->files->draft : nullptr, *s->experts,
                                              *s->backend);
    return s;
}

result<std::vector<int32_t>> parse_token_list(std::string_view flag, std::string_view text) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string_view::npos) j = text.size();
        auto v = cli::parse_int(text.substr(i, j - i), flag);
        if (!v || *v < 0 || *v > INT32_MAX)
            return make_error("--" + std::string(flag) + ": '" + std::string(text.substr(i, j - i)) +
                              "' is not a token id (expected comma-separated non-negative integers)");
        out.push_back(int32_t(*v));
        i = j + 1;
    }
    return out;
}

}  // namespace moestream::tools
