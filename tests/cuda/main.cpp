// The CUDA backend's suite. Without a usable GPU every test is skipped: the process exits 77
// (ctest's "skipped") before running any, saying why.
#define BOOST_TEST_MODULE cuda
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>

#include "model/cuda/cuda_backend.h"

namespace {

struct require_gpu {
    require_gpu() {
        auto info = moestream::cuda::probe(0);
        if (!info) {
            std::printf("cuda: skipped: %s\n", info.message().c_str());
            std::fflush(stdout);
            std::exit(77);
        }
        std::printf("cuda: running on %s\n", info->describe().c_str());
    }
};

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(require_gpu);
