#include "scheduler/recorded_picks.h"

#include <algorithm>
#include <cstring>

#include "storage/safetensors.h"

namespace moestream {
namespace {

result<std::vector<int64_t>> read_ints(const safetensors::file& f, const safetensors::tensor& t) {
    const auto bytes = f.data(t);
    const int64_t n = t.elements();
    std::vector<int64_t> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        switch (t.type) {
            case safetensors::dtype::i64: std::memcpy(&out[size_t(i)], bytes.data() + 8 * i, 8); break;
            case safetensors::dtype::i32: {
                int32_t v;
                std::memcpy(&v, bytes.data() + 4 * i, 4);
                out[size_t(i)] = v;
                break;
            }
            case safetensors::dtype::u8: out[size_t(i)] = int64_t(uint8_t(bytes[size_t(i)])); break;
            default: return make_error(f.path() + ": tensor '" + t.name + "' is not an integer tensor");
        }
    }
    return out;
}

}  // namespace

const int64_t* recorded_picks::table::row(std::initializer_list<int64_t> index) const {
    if (index.size() + 1 != shape.size()) return nullptr;
    int64_t off = 0;
    size_t k = 0;
    for (int64_t i : index) {
        if (i < 0 || i >= shape[k]) return nullptr;
        off = off * shape[k] + i;
        ++k;
    }
    return values.data() + off * shape.back();
}

result<recorded_picks> recorded_picks::load(const std::string& path, const dsv41::hparams& hp) {
    auto f = safetensors::file::open(path);
    if (!f) return f.err();
    recorded_picks r;
    r.hp_ = hp;
    auto get = [&](const std::string& name, table& out, bool required) -> status {
        const auto* t = f->find(name);
        if (!t) return required ? make_error(path + ": tensor '" + name + "' is missing") : status{};
        auto v = read_ints(*f, *t);
        if (!v) return v.err();
        out.shape = t->shape;
        out.values = std::move(*v);
        if (out.shape.empty()) return make_error(path + ": tensor '" + name + "' is a scalar");
        return {};
    };
    table ids, gen;
    MS_TRY(get("input_ids", ids, true));
    MS_TRY(get("generated_ids", gen, false));
    for (int64_t v : ids.values) r.input_ids_.push_back(int32_t(v));
    for (int64_t v : gen.values) r.generated_ids_.push_back(int32_t(v));
    r.prompt_len_ = int64_t(r.input_ids_.size());
    MS_TRY(get("router_indices_prefill", r.router_prefill_, true));
    MS_TRY(get("router_indices_decode", r.router_decode_, false));
    MS_TRY(get("dspark_router_indices", r.draft_router_, false));
    for (int L : hp.index_source_layers) {
        MS_TRY(get("indexer_topk_prefill_layer" + std::to_string(L), r.indexer_prefill_[L], false));
        MS_TRY(get("indexer_topk_decode_layer" + std::to_string(L), r.indexer_decode_[L], false));
    }
    MS_TRY(get("candidate_mask_prefill_layer" + std::to_string(hp.candidate_source_layer),
               r.cand_prefill_[hp.candidate_source_layer], false));
    return r;
}

void recorded_picks::picks(const dsv41::pick_site& site, std::span<int32_t> ids) {
    const int64_t* rec = nullptr;
    int64_t width = 0;
    const bool prefill = site.pos < prompt_len_;
    switch (site.kind) {
        case dsv41::pick_kind::router: {
            const table& t = prefill ? router_prefill_ : router_decode_;
            rec = prefill ? t.row({site.layer, site.pos}) : t.row({site.pos - prompt_len_, site.layer});
            width = t.shape.empty() ? 0 : t.width();
            break;
        }
        case dsv41::pick_kind::draft_router: {
            const int64_t p = prompt_len_ + draft_step_;  // the target position the draft follows
            rec = draft_router_.row({draft_step_, site.layer - hp_.n_layers, site.pos - p - 1});
            width = draft_router_.shape.empty() ? 0 : draft_router_.width();
            break;
        }
        case dsv41::pick_kind::indexer: {
            auto& m = prefill ? indexer_prefill_ : indexer_decode_;
            auto it = m.find(site.layer);
            if (it != m.end() && !it->second.shape.empty()) {
                rec = it->second.row({prefill ? site.pos : site.pos - prompt_len_});
                width = it->second.width();
            }
            break;
        }
        case dsv41::pick_kind::candidates: break;
    }
    if (!rec) {
        ++unmatched_;
        return;
    }
    if (site.kind == dsv41::pick_kind::router || site.kind == dsv41::pick_kind::draft_router) {
        if (width != int64_t(ids.size())) {
            ++unmatched_;
            return;
        }
        for (size_t k = 0; k < ids.size(); ++k) ids[k] = int32_t(rec[k]);
        return;
    }
    // Indexer rows are padded with -1 to the recorded width.
    std::fill(ids.begin(), ids.end(), -1);
    for (int64_t k = 0; k < std::min<int64_t>(width, int64_t(ids.size())); ++k) ids[size_t(k)] = int32_t(rec[k]);
}

void recorded_picks::mask(const dsv41::pick_site& site, std::span<uint8_t> entries) {
    auto it = cand_prefill_.find(site.layer);
    if (site.pos >= prompt_len_ || it == cand_prefill_.end() || it->second.shape.empty()) {
        ++unmatched_;
        return;
    }
    const int64_t* rec = it->second.row({site.pos});
    if (!rec) {
        ++unmatched_;
        return;
    }
    for (int64_t j = 0; j < int64_t(entries.size()); ++j) entries[size_t(j)] = j < it->second.width() ? uint8_t(rec[j] != 0) : 0;
}

}  // namespace moestream
