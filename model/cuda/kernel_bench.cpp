#include "model/cuda/kernel_bench.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <random>

#include "model/bf16.h"
#include "model/cuda/cuda_backend.h"
#include "model/q8_0_tiles.h"
#include "model/quant.h"

namespace moestream::cuda {
namespace {

timing summary(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

// Weight sets a round rotates over: together at least three times the 60 MB L2 of an H200 (and
// at least two), so every launch reads its weights from memory.
int sets_for(double bytes_per_set) {
    const double l2x3 = 3.0 * 60e6;
    return std::clamp(int(std::ceil(l2x3 / std::max(bytes_per_set, 1.0))), 2, 64);
}

std::vector<uint8_t> random_matrix(ggml_type type, int64_t rows, int64_t cols) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 0.5f);
    std::vector<float> row(static_cast<size_t>(cols));
    const int64_t rb = row_bytes(dtype_info(type), cols);
    std::vector<uint8_t> out(size_t(rows * rb));
    for (int64_t r = 0; r < rows; ++r) {
        for (auto& v : row) v = d(rng);
        quant::quantize_row(type, row.data(), out.data() + r * rb, cols);
    }
    return out;
}

// Device buffers of one case: `sets` copies of its matrices, x, and the outputs.
struct case_buffers {
    std::vector<backend_array<uint8_t>> w;  // [set * matrices + m]
    backend_array<float> x, y, u, rw;
};

}  // namespace

double weight_bytes(const matmul_case& c) {
    return double(c.jobs) * (c.pair ? 2.0 : 1.0) * double(c.rows) * double(row_bytes(dtype_info(c.type), c.cols));
}

result<timing> copy_seconds(backend& be, size_t bytes, int rounds) {
    backend_array<uint8_t> a, b;
    a.bind(be);
    b.bind(be);
    if (!a.try_resize(bytes) || !b.try_resize(bytes)) return make_error("no room for the copy buffers");
    std::vector<double> t;
    for (int r = 0; r <= rounds; ++r) {
        auto s = device_seconds(be, [&] { be.copy(b.data(), a.data(), bytes); });
        if (!s) return s.err();
        if (r > 0) t.push_back(*s);  // the first is a warm-up
    }
    return summary(t);
}

result<timing> matmul_seconds(backend& be, const matmul_case& c, int64_t n, int rounds, bool graph) {
    const int mats = c.jobs * (c.pair ? 2 : 1);
    const int sets = sets_for(weight_bytes(c));
    auto host = random_matrix(c.type, c.rows, c.cols);
    if (c.layout == weight_layout::q8_0_tiles) {
        // Tiled on the host, as the dense weights' upload does.
        if (!q8_0_tiles::tileable(c.rows, c.cols, row_bytes(dtype_info(c.type), c.cols)))
            return make_error("this shape does not tile");
        std::vector<uint8_t> tiled(host.size());
        q8_0_tiles::tile_matrix(host.data(), tiled.data(), c.rows, c.cols);
        host = std::move(tiled);
    }
    case_buffers b;
    for (int i = 0; i < sets * mats; ++i) {
        b.w.emplace_back(be);
        if (!b.w.back().try_resize(host.size())) return make_error("no room for the weight sets");
        be.upload(b.w.back().data(), host.data(), host.size());
    }
    std::vector<float> x(size_t(n * c.cols));
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = round_to_bf16(d(rng));
    b.x = backend_array<float>(be, x.size());
    be.upload(b.x.data(), x.data(), x.size() * sizeof(float));
    b.y = backend_array<float>(be, size_t(c.jobs * n * c.rows));
    b.u = backend_array<float>(be, size_t(c.jobs * n * c.rows));
    std::vector<float> ones(size_t(n), 1.0f);
    b.rw = backend_array<float>(be, ones.size());
    be.upload(b.rw.data(), ones.data(), ones.size() * sizeof(float));
    if (c.layout == weight_layout::mxfp4_tiles) {
        std::vector<weight_view> all;
        for (const auto& w : b.w) all.push_back(weight_view::contiguous(w.data(), c.type, c.cols, c.rows));
        be.tile_mxfp4(all);
    }
    std::vector<std::vector<matmul_job>> launches(static_cast<size_t>(sets));
    for (int s = 0; s < sets; ++s)
        for (int j = 0; j < c.jobs; ++j) {
            const auto view = [&](int m) {
                weight_view v = weight_view::contiguous(b.w[size_t(s * mats + m)].data(), c.type, c.cols, c.rows);
                v.layout = c.layout;
                return v;
            };
            matmul_job job{view(c.pair ? 2 * j : j), b.x.data(), c.cols, n, b.y.data() + j * n * c.rows, c.rows, true};
            if (c.pair) {
                job.up = view(2 * j + 1);
                job.u = b.u.data() + j * n * c.rows;
                job.u_stride = c.rows;
                job.swiglu_limit = 10.0f;
                job.swiglu_w = b.rw.data();
            }
            launches[size_t(s)].push_back(job);
        }
    std::vector<double> t;
    for (int r = 0; r <= rounds; ++r) {
        auto secs = device_seconds(be, [&] {
            if (graph) be.step_begin();
            for (const auto& l : launches) be.matmul_batch(l);
            if (graph) be.step_end();
        });
        if (!secs) return secs.err();
        if (r > 0) t.push_back(*secs / sets);
    }
    return summary(t);
}

namespace {

// cuBLAS, loaded on first use (the binary does not link it: a machine without the CUDA libraries
// in the loader's path still runs everything else).
struct cublas_api {
    using create_fn = cublasStatus_t (*)(cublasHandle_t*);
    using stream_fn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
    using gemm_fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                       const void*, cudaDataType, int, const void*, cudaDataType, int, const void*,
                                       void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    create_fn create = nullptr;
    stream_fn set_stream = nullptr;
    gemm_fn gemm = nullptr;
    cublasHandle_t handle = nullptr;
    std::string error;
};

cublas_api& cublas() {
    static cublas_api api = [] {
        cublas_api a;
        void* lib = nullptr;
        for (const char* name : {"libcublas.so.13", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13"})
            if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
        if (!lib) {
            a.error = std::string("cuBLAS could not be loaded: ") + dlerror();
            return a;
        }
        a.create = reinterpret_cast<cublas_api::create_fn>(dlsym(lib, "cublasCreate_v2"));
        a.set_stream = reinterpret_cast<cublas_api::stream_fn>(dlsym(lib, "cublasSetStream_v2"));
        a.gemm = reinterpret_cast<cublas_api::gemm_fn>(dlsym(lib, "cublasGemmEx"));
        if (!a.create || !a.set_stream || !a.gemm) a.error = "cuBLAS lacks cublasCreate_v2/cublasSetStream_v2/cublasGemmEx";
        else if (a.create(&a.handle) != CUBLAS_STATUS_SUCCESS) a.error = "cublasCreate failed";
        return a;
    }();
    return api;
}

}  // namespace

result<timing> cublas_bf16_seconds(backend& be, const matmul_case& c, int64_t n, int rounds) {
    auto& api = cublas();
    if (!api.error.empty()) return make_error(api.error);
    const int mats = c.jobs * (c.pair ? 2 : 1);
    matmul_case bf = c;
    bf.type = ggml_type::bf16;
    const int sets = sets_for(weight_bytes(bf));
    const size_t w_bytes = size_t(c.rows * c.cols) * 2;
    std::vector<uint16_t> host(size_t(c.rows * c.cols));
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 0.5f);
    for (auto& v : host) v = quant::f32_to_bf16(d(rng));
    std::vector<backend_array<uint8_t>> w;
    for (int i = 0; i < sets * mats; ++i) {
        w.emplace_back(be);
        if (!w.back().try_resize(w_bytes)) return make_error("no room for the weight sets");
        be.upload(w.back().data(), host.data(), w_bytes);
    }
    std::vector<uint16_t> xh(size_t(n * c.cols));
    for (auto& v : xh) v = quant::f32_to_bf16(d(rng));
    backend_array<uint8_t> x(be, xh.size() * 2);
    be.upload(x.data(), xh.data(), xh.size() * 2);
    backend_array<float> y(be, size_t(mats * n * c.rows));
    auto stream = stream_of(be);
    if (!stream) return stream.err();
    api.set_stream(api.handle, static_cast<cudaStream_t>(*stream));
    const float alpha = 1.0f, beta = 0.0f;
    bool failed = false;
    std::vector<double> t;
    for (int r = 0; r <= rounds; ++r) {
        auto secs = device_seconds(be, [&] {
            for (int s = 0; s < sets; ++s)
                for (int m = 0; m < mats; ++m)
                    // Row-major y[n, rows] = x[n, cols] · W[rows, cols]^T is, column-major,
                    // y'[rows, n] = W'^T x' with W' = W as [cols, rows].
                    failed |= api.gemm(api.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(c.rows), int(n), int(c.cols), &alpha,
                                       w[size_t(s * mats + m)].data(), CUDA_R_16BF, int(c.cols), x.data(), CUDA_R_16BF,
                                       int(c.cols), &beta, y.data() + m * n * c.rows, CUDA_R_32F, int(c.rows),
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
        });
        if (!secs) return secs.err();
        if (failed) return make_error("cublasGemmEx failed");
        if (r > 0) t.push_back(*secs / sets);
    }
    return summary(t);
}

}  // namespace moestream::cuda
