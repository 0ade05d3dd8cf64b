#!/usr/bin/env bash
# The model-running commands on real files: `logits` and `dump` against DeepSeek's reference
# fixtures (converted by `moestream convert`, picks forced so that top-k ties cannot blur the
# comparison), then `generate` on a forged model that carries the real tokenizer. Logits are read
# by python3's struct module (no numpy), independently of the binary's own safetensors code.
# Usage: model_cli_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (neither part could run).
set -euo pipefail
BIN=$(realpath "$1")
SHARED=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TOKJSON="$SRC/.deps/tokenizer-deepseek_v3/models/tokenizer.json"
FIX=$SHARED/fixtures/dsv41-tiny-bf16
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=tests/cli/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ran=0

for c in generate dump logits; do
  "$BIN" $c --help | grep -q "usage: moestream $c" || fail "$c --help"
done
"$BIN" generate --help | grep -q -- "-n, --n-predict N" || fail "generate --help lists -n"
# Usage errors come before any file is opened.
expect_fail 2 "missing required option --out" "$BIN" dump --model "$WORK/none.gguf" --tokens 1,2

# ---- the reference fixtures: logits, dump + compare ----
if [[ -f $FIX/prompt_len40.safetensors ]] && command -v python3 >/dev/null; then
  ran=1
  P40=$FIX/prompt_len40.safetensors
  cat >"$WORK/st.py" <<'PY'
import json, math, struct, sys

FMT = {"F32": "f", "F64": "d", "I32": "i", "I64": "q", "U8": "B"}

def read(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        t = json.loads(f.read(n))[name]
        a, b = t["data_offsets"]
        f.seek(8 + n + a)
        raw = f.read(b - a)
    fmt = FMT[t["dtype"]]
    return t["shape"], struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw)

def f32_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    return struct.unpack("<%df" % (len(raw) // 4), raw)

def pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)

cmd = sys.argv[1]
if cmd == "ids":  # FILE NAME [FIRST COUNT]: comma-separated integers
    _, v = read(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 4:
        v = v[int(sys.argv[4]):int(sys.argv[4]) + int(sys.argv[5])]
    print(",".join(str(x) for x in v))
elif cmd == "rows":  # FILE NAME LOGITS.f32 FIRST_ROW MIN_CORR: every row's correlation
    shape, ref = read(sys.argv[2], sys.argv[3])
    rows, vocab = shape
    got = f32_file(sys.argv[4])
    first = int(sys.argv[5])
    if len(got) < (first + rows) * vocab:
        sys.exit("%s holds %d floats, fewer than %d rows of %d" % (sys.argv[4], len(got), first + rows, vocab))
    cs = [pearson(got[(first + r) * vocab:(first + r + 1) * vocab], ref[r * vocab:(r + 1) * vocab]) for r in range(rows)]
    worst = min(range(rows), key=lambda r: cs[r])
    print("%s: %d rows, min corr %.6f (row %d), median %.6f" % (sys.argv[3], rows, cs[worst], worst, sorted(cs)[rows // 2]))
    if cs[worst] < float(sys.argv[6]):
        sys.exit("%s row %d: corr %.6f < %s" % (sys.argv[3], worst, cs[worst], sys.argv[6]))
elif cmd == "argmax":  # LOGITS.f32 VOCAB ROW: lowest id on ties, as the greedy sampler
    got, v, r = f32_file(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    row = got[r * v:(r + 1) * v]
    print(max(range(v), key=lambda i: (row[i], -i)))
PY
  st() { python3 "$WORK/st.py" "$@"; }

  out=$("$BIN" convert --checkpoint "$FIX" --out "$WORK/t.gguf" --draft-out "$WORK/d.gguf" 2>&1) || fail "convert: $out"
  IDS=$(st ids "$P40" input_ids)
  DEC=$(st ids "$P40" generated_ids 0 8)
  [[ $(tr ',' '\n' <<<"$IDS" | wc -l) == 40 ]] || fail "input_ids of prompt_len40: $IDS"

  # logits: prefill rows against prefill_logits, teacher-forced decode rows against decode_logits;
  # bit-identical across thread counts.
  for t in 1 2; do
    out=$("$BIN" logits --model "$WORK/t.gguf" --tokens "$IDS" --decode "$DEC" --force-picks "$P40" --threads $t \
      --out "$WORK/l$t.f32" 2>&1) || fail "logits --threads $t: $out"
  done
  grep -q "48 rows x 512 logits" <<<"$out" || fail "logits summary: $out"
  cmp -s "$WORK/l1.f32" "$WORK/l2.f32" || fail "logits differ between --threads 1 and --threads 2"
  st rows "$P40" prefill_logits "$WORK/l1.f32" 0 0.999 || fail "prefill logits against the reference"
  st rows "$P40" decode_logits "$WORK/l1.f32" 40 0.999 || fail "decode logits against the reference"

  # dump + compare: per-layer streams and the final tensors agree with the reference.
  out=$("$BIN" dump --model "$WORK/t.gguf" --draft "$WORK/d.gguf" --tokens "$IDS" --force-picks "$P40" \
    --out "$WORK/dump" 2>&1) || fail "dump: $out"
  grep -q "dump.safetensors" <<<"$out" || fail "dump summary: $out"
  D=$WORK/dump/dump.safetensors
  out=$("$BIN" compare "$D" "$FIX/layers_len40.safetensors" 2>&1) || fail "dump vs layers_len40: $out"
  for n in "layer_in_streams\[9\]" "layer_in_mean\[0\]" final_streams; do
    grep -q "^$n " <<<"$out" || fail "compare lacks row $n: $out"
  done
  out=$("$BIN" compare "$D" "$P40" 2>&1) || fail "dump vs prompt_len40: $out"
  for n in final_hidden final_normed prefill_logits dspark_main_hidden_prefill; do
    grep -q "^$n " <<<"$out" || fail "compare lacks row $n: $out"
  done
  # The dump's per-layer nodes follow the model's names; the stacked streams are the layer_in nodes.
  out=$("$BIN" compare "$D" "$D" --tensors 'blk.0.*' 2>&1) || fail "dump vs itself: $out"
  for n in blk.0.layer_in blk.0.q blk.0.kv blk.0.attn_out blk.0.router_scores blk.0.ffn_moe_out; do
    grep -q "^$n " <<<"$out" || fail "dump lacks $n: $out"
  done
  # Greedy generation on the file without a tokenizer: ids in, ids out; its first token is the
  # argmax of the last prompt row (picks computed, as generate computes them).
  "$BIN" logits --model "$WORK/t.gguf" --tokens "$IDS" --out "$WORK/free.f32" >/dev/null || fail "logits (free picks)"
  out=$("$BIN" generate --model "$WORK/t.gguf" --draft "$WORK/d.gguf" --prompt-tokens "$IDS" -n 3 2>"$WORK/err") ||
    fail "generate --prompt-tokens on the converted model: $(cat "$WORK/err")"
  [[ $out =~ ^[0-9]+\ [0-9]+\ [0-9]+$ ]] || fail "generate ids: '$out'"
  [[ ${out%% *} == "$(st argmax "$WORK/free.f32" 512 39)" ]] || fail "generate's first token is not the argmax: $out"
  grep -q "draft:" "$WORK/err" || fail "generate --draft reports no draft statistics: $(cat "$WORK/err")"
  # Speculative decoding (greedy): the plain output token for token, whatever the drafter and k;
  # the statistics line ends with the contract's counts.
  plain=$("$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" -n 20 2>"$WORK/err") ||
    fail "generate -n 20: $(cat "$WORK/err")"
  for spec in "oracle:0.0 --spec-k 3" "oracle:1.0 --spec-k 5" "oracle:0.5 --spec-k 2" "ngram --spec-k 4" \
              "dspark --spec-k 5 --draft $WORK/d.gguf" "oracle:1.0" "dspark --draft $WORK/d.gguf --spec-k auto" \
              "ngram --spec-k 0"; do
    # shellcheck disable=SC2086
    got=$("$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" -n 20 --drafter $spec 2>"$WORK/err") ||
      fail "generate --drafter $spec: $(cat "$WORK/err")"
    [[ $got == "$plain" ]] || fail "generate --drafter $spec differs from plain greedy: '$got' vs '$plain'"
    grep -qE "target steps [0-9]+, accepted [0-9]+ of [0-9]+ drafted$" "$WORK/err" ||
      fail "generate --drafter $spec: no speculative statistics: $(cat "$WORK/err")"
  done
  # (The first token comes from the prefill: 19 more, one per step plus the accepted drafts.)
  grep -q "target steps 19, accepted 0 of 0 drafted" "$WORK/err" || fail "--spec-k 0 drafts nothing: $(cat "$WORK/err")"
  # The contract: oracle:1.0 proposes the recorded greedy continuation exactly, oracle:0.0 never.
  "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" -n 20 --drafter oracle:1.0 --spec-k 5 2>"$WORK/err" >/dev/null
  grep -q "target steps 4, accepted 15 of 15 drafted" "$WORK/err" ||
    fail "an exact oracle is always accepted (three steps of 6 tokens, then the 20th alone): $(cat "$WORK/err")"
  "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" -n 20 --drafter oracle:0.0 --spec-k 5 2>"$WORK/err" >/dev/null
  grep -qE "accepted 0 of [1-9][0-9]* drafted" "$WORK/err" ||
    fail "oracle:0.0 replaces every proposed token: $(cat "$WORK/err")"
  expect_fail 2 "--drafter must be" "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" --drafter magic
  expect_fail 2 "rate in \[0, 1\]" "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" --drafter oracle:2
  expect_fail 2 "--spec-k must be 0..5" "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" --drafter ngram --spec-k 9
  # Speculative sampling: a seeded run is reproducible.
  a1=$("$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" -n 12 --temp 0.8 --seed 5 --drafter oracle:0.2 2>"$WORK/err") ||
    fail "generate --temp --drafter: $(cat "$WORK/err")"
  grep -q "temp 0.8.*seed 5 | drafter oracle:0.20" "$WORK/err" || fail "sampled speculative statistics: $(cat "$WORK/err")"
  a2=$("$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" -n 12 --temp 0.8 --seed 5 --drafter oracle:0.2 2>/dev/null)
  [[ $a1 == "$a2" ]] || fail "seeded speculative sampling is not reproducible: '$a1' vs '$a2'"
  # bench spec: every drafter and draft length against plain decoding (it fails on any output that
  # differs from plain greedy decoding).
  out=$("$BIN" bench spec --model "$WORK/t.gguf" --draft "$WORK/d.gguf" -n 8 --prompt-tokens 16 --rounds 1 \
    --kinds verbatim,prose 2>&1) || fail "bench spec: $out"
  for row in "plain          0" "oracle a=0.97  auto" "ngram          5" "dspark         3" "verbatim, new content" \
             "prose, repeated content" "bench spec verdict: "; do
    grep -q "^$row" <<<"$out" || fail "bench spec lacks the row '$row': $out"
  done
  expect_fail 2 "unknown kind" "$BIN" bench spec --model "$WORK/t.gguf" --kinds poetry
  expect_fail 2 "-n must be >= 2" "$BIN" bench spec --model "$WORK/t.gguf" -n 1
  expect_fail 2 "needs the draft head" "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" --drafter dspark
  expect_fail 2 "--spec-k needs --drafter" "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens "$IDS" --spec-k 2

  # Bad input: a clear error, the right exit code.
  expect_fail 1 "token id 600 is outside the vocabulary" "$BIN" logits --model "$WORK/t.gguf" --tokens 1,600 --out "$WORK/x.f32"
  expect_fail 1 "token id 600" "$BIN" dump --model "$WORK/t.gguf" --tokens 1,600 --out "$WORK/x"
  expect_fail 1 "token id 600" "$BIN" generate --model "$WORK/t.gguf" --prompt-tokens 1,600
  expect_fail 1 "differs from --tokens" "$BIN" logits --model "$WORK/t.gguf" --tokens 1,2,3 --force-picks "$P40" --out "$WORK/x.f32"
  expect_fail 1 "differs from --tokens" "$BIN" dump --model "$WORK/t.gguf" --tokens 1,2,3 --force-picks "$P40" --out "$WORK/x"
  expect_fail 2 "missing required option --out" "$BIN" logits --model "$WORK/t.gguf" --tokens 1,2,3
  expect_fail 2 "missing required option --out" "$BIN" dump --model "$WORK/t.gguf" --tokens 1,2,3
  expect_fail 1 "has no tokenizer" "$BIN" generate --model "$WORK/t.gguf" --prompt "Hello"
else
  echo "SKIP (part): $FIX or python3 absent; logits/dump checks against the reference skipped"
fi

# ---- generate on a forged model with the real tokenizer ----
if [[ -f $TOKJSON ]]; then
  ran=1
  X=$WORK/x.gguf
  "$BIN" forge --preset tiny --out "$X" >/dev/null || fail "forge tiny"
  out=$("$BIN" generate --model "$X" --prompt "Hello world" -n 8 2>"$WORK/err") || fail "generate: $(cat "$WORK/err")"
  [[ -n $out ]] || fail "generate printed no text"
  grep -q "prompt 3 tokens, prefill .* tok/s .* generated [0-9]* tokens, decode .* tok/s" "$WORK/err" ||
    fail "generate statistics: $(cat "$WORK/err")"
  "$BIN" generate --model "$X" --prompt "Hello" --chat -n 4 >/dev/null 2>"$WORK/err" || fail "generate --chat: $(cat "$WORK/err")"
  grep -q "prompt 4 tokens" "$WORK/err" || fail "chat prompt is BOS, User, Hello, Assistant: $(cat "$WORK/err")"
  # Sampling is reproducible from its seed.
  a=$("$BIN" generate --model "$X" --prompt "Once upon a time" -n 12 --seed 7 --temp 0.8 --top-k 40 2>/dev/null)
  b=$("$BIN" generate --model "$X" --prompt "Once upon a time" -n 12 --seed 7 --temp 0.8 --top-k 40 2>/dev/null)
  [[ $a == "$b" ]] || fail "same seed, different text: '$a' vs '$b'"
  out=$("$BIN" generate --model "$X" --prompt-tokens 19923,2058 -n 5 --seed 7 --temp 0.8 2>/dev/null) || fail "generate -n 5"
  n=$(wc -w <<<"$out")
  (( n >= 1 && n <= 5 )) || fail "-n 5 gave $n tokens: $out"
  [[ $out =~ ^[0-9\ ]+$ ]] || fail "--prompt-tokens prints ids: $out"
  # --backend: the CPU always runs; where no GPU is usable, cuda refuses in one clear line.
  "$BIN" generate --model "$X" --prompt-tokens 1,2,3 -n 2 --backend cpu >/dev/null 2>&1 || fail "generate --backend cpu"
  expect_fail 2 "must be auto, cpu or cuda" "$BIN" generate --model "$X" --prompt-tokens 1,2,3 --backend gpu
  if ! nvidia-smi -L >/dev/null 2>&1; then
    expect_fail 1 "moestream generate: --backend cuda: " "$BIN" generate --model "$X" --prompt-tokens 1,2,3 -n 2 --backend cuda
    out=$("$BIN" logits --model "$X" --tokens 1,2 --out "$WORK/l.f32" --backend cuda 2>&1) && fail "logits --backend cuda ran"
    [[ $(wc -l <<<"$out") == 1 ]] || fail "--backend cuda without a GPU says more than one line: $out"
  fi
  # The context limit stops generation with a message.
  "$BIN" generate --model "$X" --prompt-tokens 1,2,3 -n 100 --ctx-size 16 >/dev/null 2>"$WORK/err" || fail "ctx stop"
  grep -q "context limit of 16 tokens" "$WORK/err" || fail "context limit message: $(cat "$WORK/err")"
  expect_fail 1 "no room to generate" "$BIN" generate --model "$X" --prompt-tokens "$(seq -s, 1 16)" --ctx-size 16
  # Usage errors: exit 2 naming the problem.
  expect_fail 2 "--temp must be >= 0" "$BIN" generate --model "$X" --prompt hi --temp -1
  expect_fail 2 "top_p must be in (0, 1]" "$BIN" generate --model "$X" --prompt hi --top-p 0
  expect_fail 2 "min_p" "$BIN" generate --model "$X" --prompt hi --min-p 2
  expect_fail 2 "must be > 0" "$BIN" generate --model "$X" --prompt hi -n 0
  expect_fail 2 "--prompt is empty" "$BIN" generate --model "$X" --prompt ""
  expect_fail 2 "exactly one of --prompt or --prompt-tokens" "$BIN" generate --model "$X"
  expect_fail 2 "unknown option --bogus" "$BIN" generate --model "$X" --prompt hi --bogus
  # bench cpu on the forged model: every report line is there (figures are the machine's).
  "$BIN" bench cpu --model "$X" --prompt-tokens 4 --decode-tokens 2 --rounds 2 --threads 2 --no-warm --profile \
    >"$WORK/bench.txt" 2>&1 || fail "bench cpu: $(cat "$WORK/bench.txt")"
  for line in '^round 1: decode [0-9.]+ ms/token = [0-9.]+ GB/s; read bandwidth [0-9.]+ / [0-9.]+ GB/s' '^round 2: ' \
    '^prefill: 4 tokens in ' '^decode: 4 tokens in ' '^decode bytes/token: ' \
    '^decode bandwidth / read bandwidth around it: median [0-9]+% over 2 rounds' '^  attention +[0-9.]+ ms'; do
    grep -Eq "$line" "$WORK/bench.txt" || fail "bench cpu output lacks /$line/: $(cat "$WORK/bench.txt")"
  done
  expect_fail 2 "--rounds must be >= 1" "$BIN" bench cpu --model "$X" --rounds 0
else
  echo "SKIP (part): $TOKJSON is absent (run scripts/setup.sh); generate checks skipped"
fi

if (( ! ran )); then
  echo "SKIP: neither the fixtures nor the tokenizer data are present"
  exit 77
fi
echo "model cli: all checks passed"
