#!/usr/bin/env bash
# `moestream convert` on the golden checkpoints: target + draft, inspect verdicts, the lossless
# MXFP4 repack line, and bad inputs. Usage: convert_test.sh MOESTREAM_BIN SHARED_DIR.
# Exit 77 = skipped (fixtures absent).
set -euo pipefail
BIN=$(realpath "$1")
FIX=$2/fixtures
[[ -f "$FIX/dsv41-tiny-fp8/model.safetensors" ]] || { echo "fixtures absent: skipped"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=tests/cli/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$BIN" convert --help | grep -q "usage: moestream convert" || fail "convert --help"

for fx in dsv41-tiny-bf16 dsv41-tiny-bf16-margin dsv41-tiny-fp8; do
  out=$("$BIN" convert --checkpoint "$FIX/$fx" --out "$WORK/$fx.gguf" --draft-out "$WORK/$fx-draft.gguf" 2>&1) ||
    fail "convert $fx: $out"
  grep -q "without tokenizer" <<<"$out" || fail "$fx: no note about the missing tokenizer: $out"
  files=("$WORK/$fx.gguf" "$WORK/$fx-draft.gguf")
  for f in "${files[@]}"; do
    v=$("$BIN" inspect "$f" 2>&1) || fail "inspect $f: $v"
    grep -q "verdict: valid" <<<"$v" || fail "inspect $f: $v"
  done
  if [[ $fx == dsv41-tiny-fp8 ]]; then
    line=$(grep -o "mxfp4 repack: [0-9]*/[0-9]* blocks bit-identical" <<<"$out") || fail "no repack line: $out"
    read -r n m <<<"$(sed -E 's#.*: ([0-9]+)/([0-9]+).*#\1 \2#' <<<"$line")"
    [[ $n == "$m" && $n -gt 0 ]] || fail "repack not lossless: $line"
  fi
done

# Sharded target.
"$BIN" convert --checkpoint "$FIX/dsv41-tiny-fp8" --out "$WORK/sh.gguf" --shards 2 >/dev/null || fail "sharded convert"
[[ -f "$WORK/sh-00002-of-00002.gguf" ]] || fail "sharded convert wrote no second shard"
"$BIN" inspect "$WORK/sh-00001-of-00002.gguf" | grep -q "verdict: valid" || fail "sharded inspect"

# Bad inputs: exit 1 and a message naming the problem.
expect_fail 1 "not a checkpoint folder" "$BIN" convert --checkpoint "$WORK/nope" --out "$WORK/x.gguf"
mkdir "$WORK/trunc"
cp "$FIX/dsv41-tiny-fp8/config.json" "$FIX/dsv41-tiny-fp8/engram_tables.safetensors" "$WORK/trunc/"
head -c 1000000 "$FIX/dsv41-tiny-fp8/model.safetensors" >"$WORK/trunc/model.safetensors"
expect_fail 1 "model.safetensors: tensor .* out of range" "$BIN" convert --checkpoint "$WORK/trunc" --out "$WORK/x.gguf"
mkdir "$WORK/dim"
cp "$FIX/dsv41-tiny-fp8/model.safetensors" "$FIX/dsv41-tiny-fp8/engram_tables.safetensors" "$WORK/dim/"
sed 's/"dim": 64,/"dim": 96,/' "$FIX/dsv41-tiny-fp8/config.json" >"$WORK/dim/config.json"
expect_fail 1 "token_embd.weight" "$BIN" convert --checkpoint "$WORK/dim" --out "$WORK/x.gguf"
# A token map that disagrees with the config's compressed vocabulary (another tokenizer) is refused.
mkdir -p "$WORK/cvocab"
cp "$FIX/dsv41-tiny-fp8/model.safetensors" "$FIX/dsv41-tiny-fp8/engram_tables.safetensors" "$WORK/cvocab/"
sed 's/"engram_compressed_vocab_size": 384/"engram_compressed_vocab_size": 385/' "$FIX/dsv41-tiny-fp8/config.json" >"$WORK/cvocab/config.json"
expect_fail 1 "engram_compressed_vocab_size is 385 but the engram token map has 384" "$BIN" convert --checkpoint "$WORK/cvocab" --out "$WORK/x.gguf"
echo "convert tests passed"
