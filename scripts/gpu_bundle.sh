#!/usr/bin/env bash
# Stages what a run on the GPU machine needs into .gpu/ (ignored by git; name it in the device
# tool's `carry`): the stripped moestream and test_cuda of a CUDA build, the shared libraries the
# GPU machine lacks (liburing, simdjson, spdlog, fmt, utf8proc, Boost.Test), the reference
# fixtures (../shared does not travel) and the DeepSeek tokenizer (gzipped, for forge there).
# The run itself is scripts/gpu_run.sh, on the device.
# Usage: scripts/gpu_bundle.sh [BUILD_DIR]   (default build; must have been built with CUDA)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=.gpu
grep -qx "/$OUT/" .git/info/exclude 2>/dev/null || echo "/$OUT/" >> .git/info/exclude
[[ -x $BUILD/tools/moestream && -x $BUILD/tests/test_cuda ]] ||
  { echo "gpu_bundle: $BUILD has no moestream or test_cuda (build with nvcc present)" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/shared"
for b in "$BUILD/tools/moestream" "$BUILD/tests/test_cuda"; do
  strip -o "$OUT/bin/$(basename "$b")" "$b"
done
# The libraries ldd resolves outside the C runtime and libstdc++ (both on the GPU machine).
for b in "$OUT"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}' | grep -Ev 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
SHARED=${MOESTREAM_SHARED:-../shared}
[[ -d $SHARED/fixtures ]] && cp -r "$SHARED/fixtures" "$OUT/shared/"
TOK=.deps/tokenizer-deepseek_v3/models/tokenizer.json
[[ -f $TOK ]] && gzip -c "$TOK" > "$OUT/tokenizer.json.gz"
du -sh "$OUT"; du -sh "$OUT"/*
