#!/usr/bin/env bash
# CLI contract tests: run the real binary on real files it forges.
# Usage: cli_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer data).
set -euo pipefail
BIN=$(realpath "$1")
SHARED=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TOKJSON="$SRC/.deps/tokenizer-deepseek_v3/models/tokenizer.json"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=tests/cli/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# (Captured first: `| grep -q` would close the pipe early, and the overview, larger than one
# stdio buffer, would die of SIGPIPE under pipefail.)
overview=$("$BIN" --help)
grep -q forge <<<"$overview" || fail "--help does not list forge"
for c in forge inspect tokenize detokenize chat-template "bench tokenizer" "bench quant"; do
  # shellcheck disable=SC2086
  "$BIN" $c --help | grep -q "usage: moestream $c" || fail "$c --help"
done
expect_fail 2 "unknown command" "$BIN" nosuchcommand
expect_fail 2 "unknown option --bogus" "$BIN" forge --preset tiny --out "$WORK/x.gguf" --bogus
expect_fail 2 "unknown preset" "$BIN" forge --preset huge --out "$WORK/x.gguf"
expect_fail 2 "missing required option --out" "$BIN" forge --preset tiny

# flash is for planning: --dry-run plans, and a real forge refuses when the disk is too small.
"$BIN" forge --preset flash --out "$WORK/flash.gguf" --dry-run | grep -q "preset flash" || fail "flash dry run"
free_kb=$(df -Pk "$WORK" | awk 'NR==2 {print $4}')
if (( free_kb < 600 * 1024 * 1024 )); then
  expect_fail 1 "not enough disk space" "$BIN" forge --preset flash --out "$WORK/flash.gguf"
  [[ ! -e $WORK/flash.gguf ]] || fail "a refused forge left a file"
fi

if [[ ! -f $TOKJSON ]]; then
  echo "SKIP: $TOKJSON is absent (run scripts/setup.sh); model-level CLI checks skipped"
  exit 77
fi

# Same seed, same bytes; another seed, other bytes.
"$BIN" forge --preset tiny --out "$WORK/a.gguf" --draft-out "$WORK/a-draft.gguf" --seed 7 >/dev/null
"$BIN" forge --preset tiny --out "$WORK/b.gguf" --draft-out "$WORK/b-draft.gguf" --seed 7 >/dev/null
cmp -s "$WORK/a.gguf" "$WORK/b.gguf" || fail "forge is not deterministic (target)"
cmp -s "$WORK/a-draft.gguf" "$WORK/b-draft.gguf" || fail "forge is not deterministic (draft)"
"$BIN" forge --preset tiny --out "$WORK/c.gguf" --seed 8 >/dev/null
cmp -s "$WORK/a.gguf" "$WORK/c.gguf" && fail "different seeds gave the same bytes"

# inspect: tables, expert layout and the verdict.
out=$("$BIN" inspect "$WORK/a.gguf")
grep -q "verdict: valid deepseek41 model (10 layers, dim 64, 64 experts top-6)" <<<"$out" || fail "inspect verdict: $out"
grep -q "blk.0.ffn_gate_exps.weight" <<<"$out" || fail "inspect tensor table"
grep -q "3264 bytes per expert" <<<"$out" || fail "inspect expert bytes (tiny MXFP4 expert = 3264 B)"
grep -q "deepseek41.expert_count" <<<"$out" || fail "inspect metadata"
"$BIN" inspect "$WORK/a-draft.gguf" | grep -q "verdict: valid dflash model (3 layers, dim 64, 16 experts top-3)" ||
  fail "inspect draft verdict"
# A damaged file gets an INVALID verdict naming the problem, never a crash.
head -c 100000 "$WORK/a.gguf" >"$WORK/trunc.gguf"
expect_fail 1 "verdict: INVALID" "$BIN" inspect "$WORK/trunc.gguf"
printf 'XXXX' | dd of="$WORK/c.gguf" conv=notrunc status=none
expect_fail 1 "verdict: INVALID" "$BIN" inspect "$WORK/c.gguf"

# Sharded forge: every shard opens as one model.
"$BIN" forge --preset tiny --out "$WORK/s.gguf" --shards 3 --seed 7 >/dev/null
[[ -f $WORK/s-00002-of-00003.gguf ]] || fail "shard files"
"$BIN" inspect "$WORK/s-00002-of-00003.gguf" | grep -q "verdict: valid deepseek41" || fail "inspect split model"

# tokenize / detokenize / chat-template.
[[ $("$BIN" tokenize --model "$WORK/a.gguf" --text "Hello world") == "[19923,2058]" ]] || fail "tokenize"
[[ $("$BIN" tokenize --model "$WORK/a.gguf" --text "<｜User｜>Hi" --special) == "[128803,23166]" ]] || fail "tokenize --special"
printf 'Führer' >"$WORK/t.txt"
[[ $("$BIN" tokenize --model "$WORK/a.gguf" --file "$WORK/t.txt") == "[40,2134,42243]" ]] || fail "tokenize --file"
[[ $("$BIN" detokenize --model "$WORK/a.gguf" --ids 19923,2058) == "Hello world" ]] || fail "detokenize"
expect_fail 2 "outside the vocabulary" "$BIN" detokenize --model "$WORK/a.gguf" --ids 1,999999
printf '%s' '[{"role":"user","content":"Hello!"}]' >"$WORK/m.json"
[[ $("$BIN" chat-template --model "$WORK/a.gguf" --messages "$WORK/m.json" --add-generation-prompt) == \
   "<｜begin▁of▁sentence｜><｜User｜>Hello!<｜Assistant｜>" ]] || fail "chat-template"
printf '%s' '[{"role":"user"' >"$WORK/bad.json"
expect_fail 1 "bad.json" "$BIN" chat-template --model "$WORK/a.gguf" --messages "$WORK/bad.json"
expect_fail 1 "cannot" "$BIN" tokenize --model "$WORK/missing.gguf" --text hi
echo "cli: all checks passed"
