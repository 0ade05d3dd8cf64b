#!/usr/bin/env bash
# CLI contract tests: run the real binary on real files. Args: MOESTREAM_BIN SHARED_DIR
set -euo pipefail
BIN=$1
SHARED=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
"$BIN" --help >/dev/null || fail "--help"
"$BIN" nosuchcommand 2>/dev/null && fail "unknown command accepted"
echo "cli: ok"
