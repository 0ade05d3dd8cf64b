#!/usr/bin/env bash
# Builds the GGUF fuzzer with clang (separate build folder) and runs it.
#   tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS
# Exit status: 0 no finding, non-zero a crash/sanitizer report (artifacts under
# BUILD_DIR/tests/fuzz/gguf_artifacts), 77 when clang++-14 or the libFuzzer runtime is missing.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build_dir=$1
seconds=$2
src_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

if ! command -v clang++-14 >/dev/null 2>&1; then
  echo "run_fuzz.sh: skipped: clang++-14 is not installed (apt-get install clang-14)" >&2
  exit 77
fi
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  >"$probe_dir/probe.cpp"
if ! clang++-14 -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" \
     >"$probe_dir/log" 2>&1; then
  echo "run_fuzz.sh: skipped: the libFuzzer runtime is missing (apt-get install libclang-rt-14-dev):" >&2
  cat "$probe_dir/log" >&2
  exit 77
fi

c_compiler=clang-14
command -v clang-14 >/dev/null 2>&1 || c_compiler=clang
cmake -S "$src_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER="$c_compiler" \
  -DMOESTREAM_FUZZ=ON -DMOESTREAM_CUDA=OFF -DMOESTREAM_FUZZ_SECONDS="$seconds"
ninja -C "$build_dir" gguf_fuzz gguf_fuzz_seeds
ctest --test-dir "$build_dir" -R '^gguf_fuzz' --output-on-failure
