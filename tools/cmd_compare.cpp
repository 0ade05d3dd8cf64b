// moestream compare A B: tensor-by-tensor (layer-by-layer for stacked tensors) correlation and
// error between two safetensors files or directories of them, flagging the first row that
// diverges. Made to find where a port departs from a reference dump.
#include <fnmatch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "storage/safetensors.h"
#include "tools/command.h"
#include "tools/tensor_compare.h"

namespace moestream::tools {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kName = "compare";
constexpr double kDefaultMinCorr = 0.999;
constexpr size_t kListed = 6;  // names shown in the "only in" and "not compared" lists

const cli::option_spec kOptions[] = {
    {"min-corr", "X", "a row fails when its Pearson correlation is below X (default 0.999)"},
    {"tensors", "PATTERN",
     "compare only tensors whose name matches the shell glob PATTERN (e.g. 'blk.*', "
     "'layer_in_*'); comma-separated or repeated"},
};

// Names whose first dimension is a layer index in the dumps and the reference fixtures; a file
// can list more in its "stacked" metadata (see storage/safetensors_writer.h).
constexpr std::string_view kStackedNames[] = {"layer_in_streams", "layer_in_mean"};

std::vector<std::string> split_commas(std::string_view s) {
    std::vector<std::string> out;
    while (!s.empty()) {
        const auto comma = s.find(',');
        auto part = s.substr(0, comma);
        if (!part.empty()) out.emplace_back(part);
        s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
    }
    return out;
}

std::string shape_text(std::span<const int64_t> shape) {
    std::string s = "[";
    for (size_t d = 0; d < shape.size(); ++d) {
        if (d) s += ", ";
        s += std::to_string(shape[d]);
    }
    return s + "]";
}

// ---- the two sides ----

struct source {  // one file of a side
    std::string stem;  // file name without ".safetensors": tells apart a name held by several files
    size_t index = 0;  // position of the file in its side
    bool has_order = false;  // the writer's "order" metadata is present
    safetensors::file file;
    std::set<std::string, std::less<>> stacked;
};

struct item {  // one tensor of a side
    const source* src;
    const safetensors::tensor* t;
    size_t pos;  // in the side's order
};

struct side {
    std::vector<std::unique_ptr<source>> files;  // pointers: items refer to them
    std::vector<item> items;                     // files in name order, each in its own order
    std::map<std::string, int, std::less<>> name_count;
};

// The writer's "order" metadata when present (JSON key order is not reliable), else data order.
std::vector<const safetensors::tensor*> file_order(const safetensors::file& f) {
    std::vector<const safetensors::tensor*> by_offset;
    for (const auto& t : f.tensors()) by_offset.push_back(&t);
    std::stable_sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    auto it = f.metadata().find("order");
    if (it == f.metadata().end()) return by_offset;
    std::vector<const safetensors::tensor*> out;
    std::set<const safetensors::tensor*> seen;
    for (const auto& name : split_commas(it->second))
        if (const auto* t = f.find(name); t && seen.insert(t).second) out.push_back(t);
    for (const auto* t : by_offset)
        if (!seen.count(t)) out.push_back(t);
    return out;
}

bool selected(const std::string& name, const std::vector<std::string>& patterns) {
    if (patterns.empty()) return true;
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](const std::string& p) { return ::fnmatch(p.c_str(), name.c_str(), 0) == 0; });
}

result<std::vector<std::string>> side_files(const std::string& path) {
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (!fs::exists(st)) return make_error(path + ": no such file or directory");
    if (!fs::is_directory(st)) return std::vector<std::string>{path};
    std::vector<std::string> files;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
        if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) files.push_back(it->path().string());
    if (ec) return make_error(path + ": cannot list the directory: " + ec.message());
    if (files.empty()) return make_error(path + ": no *.safetensors file in this directory");
    std::sort(files.begin(), files.end());  // one directory: sorting paths sorts file names
    return files;
}

result<side> load_side(const std::string& path, const std::vector<std::string>& patterns) {
    auto files = side_files(path);
    if (!files) return files.err();
    side s;
    for (const auto& p : *files) {
        auto f = safetensors::file::open(p);
        if (!f) return f.err();
        auto src = std::make_unique<source>();
        src->stem = fs::path(p).stem().string();
        src->index = s.files.size();
        src->file = std::move(*f);
        src->has_order = src->file.metadata().count("order") > 0;
        for (auto n : kStackedNames) src->stacked.emplace(n);
        if (auto it = src->file.metadata().find("stacked"); it != src->file.metadata().end())
            for (auto& n : split_commas(it->second)) src->stacked.insert(std::move(n));
        for (const auto* t : file_order(src->file)) {
            if (!selected(t->name, patterns)) continue;
            s.items.push_back({src.get(), t, s.items.size()});
            ++s.name_count[t->name];
        }
        s.files.push_back(std::move(src));
    }
    return s;
}

// ---- matching ----

// For each item of A, the index of its partner in B. By name and shape first (a directory may
// hold one name in several files, e.g. prefill_logits of each prompt length), preferring a B file
// of the same name; then leftovers of the same name pair up as shape mismatches.
std::vector<std::optional<size_t>> match(const side& a, const side& b) {
    std::map<std::string_view, std::vector<size_t>> b_by_name;
    for (size_t j = 0; j < b.items.size(); ++j) b_by_name[b.items[j].t->name].push_back(j);
    std::vector<std::optional<size_t>> partner(a.items.size());
    std::vector<bool> used(b.items.size(), false);
    auto pick = [&](size_t i, bool same_shape) {
        auto it = b_by_name.find(a.items[i].t->name);
        if (it == b_by_name.end()) return;
        std::optional<size_t> best;
        for (size_t j : it->second) {
            if (used[j] || (same_shape && b.items[j].t->shape != a.items[i].t->shape)) continue;
            if (!best || (b.items[j].src->stem == a.items[i].src->stem && b.items[*best].src->stem != a.items[i].src->stem))
                best = j;
        }
        if (best) {
            partner[i] = best;
            used[*best] = true;
        }
    };
    for (size_t i = 0; i < a.items.size(); ++i) pick(i, true);
    for (size_t i = 0; i < a.items.size(); ++i)
        if (!partner[i]) pick(i, false);
    return partner;
}

// ---- rows ----

// Where a row is printed: by A's file, then (see key_of) group, major, minor.
using row_key = std::tuple<size_t, int, int64_t, size_t>;

struct row {
    row_key key;
    std::string label, shape;
    bool compared = false;  // false: a shape or dtype mismatch (the note says which)
    tensor_stats stats;
    std::string note;
    bool fails = false;
};

struct report {
    std::vector<row> rows;
    std::vector<std::string> not_float_same, not_float_differ;  // integer/bool/fp8 tensors
};

std::string label_of(const side& s, const item& it) {
    if (s.name_count.at(it.t->name) > 1) return it.src->stem + ":" + it.t->name;
    return it.t->name;
}

// Rows follow A's order: the file's "order" metadata, with a stacked tensor's rows in place. A
// file without it (a reference export, usually in name order: final_streams before layer_in_*)
// gets its stacked rows first, layer-major (row [0] of every stacked tensor, then [1], ...), and the
// rest in data order after them, so that "first divergence" points at the earliest layer.
row_key key_of(const item& a, bool split, int64_t slice) {
    if (a.src->has_order) return {a.src->index, 0, int64_t(a.pos), size_t(slice)};
    return split ? row_key{a.src->index, 0, slice, a.pos} : row_key{a.src->index, 1, 0, a.pos};
}

void add_rows(report& rep, const side& sa, const item& a, const side& sb, const item& b, double min_corr) {
    const auto& ta = *a.t;
    const auto& tb = *b.t;
    const std::string label = label_of(sa, a);
    std::string note;
    // Say which B file was taken when B holds the name in several files (unless A's label says it).
    if (sb.name_count.at(tb.name) > 1 && (sa.name_count.at(ta.name) == 1 || b.src->stem != a.src->stem))
        note = std::string("B from ") + b.src->stem;
    auto add_note = [&](std::string_view more) {
        if (!note.empty()) note += "; ";
        note += more;
    };

    if (!is_float(ta.type) || !is_float(tb.type)) {
        if (is_float(ta.type) == is_float(tb.type)) {  // neither is float: only say whether they are identical
            const auto da = a.src->file.data(ta), db = b.src->file.data(tb);
            const bool same = ta.type == tb.type && ta.shape == tb.shape && da.size() == db.size() &&
                              (da.empty() || std::memcmp(da.data(), db.data(), da.size()) == 0);
            (same ? rep.not_float_same : rep.not_float_differ).push_back(label);
            return;
        }
        add_note(std::string("dtype differs: A ") + std::string(safetensors::dtype_name(ta.type)) + ", B " +
                 std::string(safetensors::dtype_name(tb.type)));
        rep.rows.push_back({key_of(a, false, 0), label, shape_text(ta.shape), false, {}, note, true});
        return;
    }
    if (ta.elements() != tb.elements()) {
        add_note(std::string("shape differs: B is ") + shape_text(tb.shape));
        rep.rows.push_back({key_of(a, false, 0), label, shape_text(ta.shape), false, {}, note, true});
        return;
    }
    if (ta.shape != tb.shape) add_note(std::string("B shape ") + shape_text(tb.shape) + " (same element count)");

    const bool stacked = (a.src->stacked.count(ta.name) || b.src->stacked.count(tb.name)) && ta.shape.size() >= 2 &&
                         tb.shape.size() >= 2 && ta.shape[0] == tb.shape[0] && ta.shape[0] > 0;
    const int64_t slices = stacked ? ta.shape[0] : 1;
    const auto da = a.src->file.data(ta), db = b.src->file.data(tb);
    const size_t step_a = da.size() / size_t(slices), step_b = db.size() / size_t(slices);
    const std::span<const int64_t> inner = stacked ? std::span(ta.shape).subspan(1) : std::span(ta.shape);
    std::vector<float> buf_a, buf_b;
    for (int64_t i = 0; i < slices; ++i) {
        // Converted one slice at a time: a stacked dump of a real model is gigabytes.
        auto fa = to_f32(ta.type, da.subspan(size_t(i) * step_a, step_a), buf_a);
        auto fb = to_f32(tb.type, db.subspan(size_t(i) * step_b, step_b), buf_b);
        MS_ASSERT(fa && fb);  // both dtypes were checked to be float
        row r;
        r.key = key_of(a, stacked, i);
        r.label = stacked ? label + "[" + std::to_string(i) + "]" : label;
        r.shape = shape_text(inner);
        r.compared = true;
        r.stats = compare(*fa, *fb);
        r.note = note;
        r.fails = !r.stats.passes(min_corr);
        rep.rows.push_back(std::move(r));
    }
}

// ---- printing ----

void print_table(const report& rep) {
    int wl = 4, ws = 5;
    for (const auto& r : rep.rows) {
        wl = std::max(wl, int(r.label.size()));
        ws = std::max(ws, int(r.shape.size()));
    }
    std::printf("%-*s  %-*s  %10s  %10s  %11s  %11s  %10s\n", wl, "name", ws, "shape", "corr", "rel_err", "|a|", "|b|",
                "max|a-b|");
    bool diverged = false;
    for (const auto& r : rep.rows) {
        std::string flag;
        if (r.compared && r.fails) {
            flag = diverged ? "below" : "<- first divergence";
            diverged = true;
            if (!r.stats.finite())
                flag += std::string(" (non-finite: A ") + std::to_string(r.stats.nonfinite_a) + ", B " +
                        std::to_string(r.stats.nonfinite_b) + ")";
        }
        if (!r.note.empty()) flag += flag.empty() ? r.note : std::string("; ") + r.note;
        if (!r.compared) {
            std::printf("%-*s  %-*s  %10s  %10s  %11s  %11s  %10s  %s\n", wl, r.label.c_str(), ws, r.shape.c_str(), "-",
                        "-", "-", "-", "-", flag.c_str());
            continue;
        }
        const auto& s = r.stats;
        std::printf("%-*s  %-*s  %10.6f  %10.3e  %11.6g  %11.6g  %10.3e%s%s\n", wl, r.label.c_str(), ws,
                    r.shape.c_str(), s.corr, s.rel_err, s.norm_a, s.norm_b, s.max_abs_diff, flag.empty() ? "" : "  ",
                    flag.c_str());
    }
}

void print_list(const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    std::printf("%s: %zu (", what, names.size());
    for (size_t i = 0; i < names.size() && i < kListed; ++i) std::printf("%s%s", i ? ", " : "", names[i].c_str());
    std::printf("%s)\n", names.size() > kListed ? ", ..." : "");
}

std::string count(size_t n, std::string_view noun) {
    std::string s = std::to_string(n);
    s += ' ';
    s += noun;
    if (n != 1) s += noun.ends_with("ch") ? "es" : "s";
    return s;
}

void print_side(const char* tag, const std::string& path, const side& s) {
    std::printf("%s: %s (%s, %s)\n", tag, path.c_str(), count(s.files.size(), "file").c_str(),
                count(s.items.size(), "tensor").c_str());
}

// The last line, and the exit code: 0 when every row passes, 1 otherwise (or when nothing is common).
int print_verdict(const report& rep) {
    size_t failed = 0, mismatched = 0;
    const row* first = nullptr;
    const row* worst = nullptr;
    for (const auto& r : rep.rows) {
        failed += r.fails;
        mismatched += !r.compared;
        if (r.compared && r.fails && !first) first = &r;
        if (r.compared && (!worst || r.stats.corr < worst->stats.corr)) worst = &r;
    }
    if (rep.rows.empty()) {
        std::printf("verdict: nothing compared (no float tensor name common to A and B)\n");
        return 1;
    }
    if (!failed) {
        std::printf("verdict: PASS: %s, lowest corr %.6f (%s)\n", count(rep.rows.size(), "row").c_str(),
                    worst->stats.corr, worst->label.c_str());
        return 0;
    }
    std::printf("verdict: FAIL: %zu of %s fail", failed, count(rep.rows.size(), "row").c_str());
    if (mismatched) std::printf(" (%s)", count(mismatched, "shape/dtype mismatch").c_str());
    if (first && !first->stats.finite()) std::printf("; first divergence: %s (NaN/Inf)", first->label.c_str());
    else if (first) std::printf("; first divergence: %s (corr %.6f)", first->label.c_str(), first->stats.corr);
    std::printf("\n");
    return 1;
}

int run(const cli::args& args) {
    if (args.positional().size() != 2) return usage_error(kName, "expected two paths, A and B");
    auto min_corr = args.get_double("min-corr", kDefaultMinCorr);
    if (!min_corr) return usage_error(kName, min_corr.message());
    if (!(*min_corr >= -1.0 && *min_corr <= 1.0))
        return usage_error(kName, std::string("--min-corr must lie in [-1, 1], got ") + std::to_string(*min_corr));
    std::vector<std::string> patterns;
    for (const auto& v : args.values("tensors"))
        for (auto& p : split_commas(v)) patterns.push_back(std::move(p));

    const std::string& path_a = args.positional()[0];
    const std::string& path_b = args.positional()[1];
    // Unreadable inputs exit 2 like usage errors: no comparison was made, so 1 would claim a verdict.
    auto a = load_side(path_a, patterns);
    if (!a) {
        fail(kName, a.message());
        return 2;
    }
    auto b = load_side(path_b, patterns);
    if (!b) {
        fail(kName, b.message());
        return 2;
    }

    print_side("A", path_a, *a);
    print_side("B", path_b, *b);
    std::printf("rows in A's order; a row fails below corr %g or with any NaN/Inf\n\n", *min_corr);

    const auto partner = match(*a, *b);
    report rep;
    std::vector<std::string> only_a, only_b;
    std::vector<bool> b_used(b->items.size(), false);
    for (size_t i = 0; i < a->items.size(); ++i) {
        if (!partner[i]) {
            only_a.push_back(label_of(*a, a->items[i]));
            continue;
        }
        b_used[*partner[i]] = true;
        add_rows(rep, *a, a->items[i], *b, b->items[*partner[i]], *min_corr);
    }
    for (size_t j = 0; j < b->items.size(); ++j)
        if (!b_used[j]) only_b.push_back(label_of(*b, b->items[j]));

    std::stable_sort(rep.rows.begin(), rep.rows.end(), [](const row& x, const row& y) { return x.key < y.key; });
    if (!rep.rows.empty()) print_table(rep);
    std::printf("\n");
    print_list("only in A", only_a);
    print_list("only in B", only_b);
    print_list("not float, identical (not compared)", rep.not_float_same);
    print_list("not float, DIFFERENT (not compared)", rep.not_float_differ);

    return print_verdict(rep);
}

const command kCommand{
    kName, "A B [--min-corr X] [--tensors PATTERN]",
    "Layer-by-layer correlation of two safetensors files or directories, to find where a port departs "
    "from a reference (a `moestream dump` against the fixtures, two dumps). A directory side reads every "
    "*.safetensors in it, sorted by file name. Tensors are matched by name; where a side holds one name "
    "in several files (prompt_len1/7/40 all hold prefill_logits), by name and shape, a file of the same "
    "name first. Float tensors (F32, BF16, F16, F64; sums in double) get one row each, in A's order (its "
    "\"order\" metadata; without it, the per-layer rows of stacked tensors first, layer by layer, then the "
    "rest in data order): shape, Pearson correlation, ||a-b||/||b||, ||a||, ||b||, max |a-b|. Tensors whose "
    "first dimension is a layer or step (layer_in_streams, layer_in_mean, and those a file lists in its "
    "\"stacked\" metadata) get one row per leading index, name[i]. The first row below --min-corr or with "
    "a NaN/Inf is flagged '<- first divergence', later failing rows 'below'; an element-count mismatch is "
    "a failing row. Names on one side only and non-float tensors (identical or not) are listed after the "
    "table. Exit 0 when every row passes, 1 when any fails (or nothing is common), 2 on usage or read "
    "errors.",
    kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
