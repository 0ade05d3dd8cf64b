#!/usr/bin/env bash
# `moestream compare` contract: verdicts, flags, exit codes, matching rules, then the reference
# fixtures when present. Inputs are written by python3's struct module (no numpy needed), so the
# test does not depend on the writer it is meant to check dumps of.
# Usage: compare_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no python3).
set -euo pipefail
BIN=$(realpath "$1")
SHARED=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=tests/cli/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! command -v python3 >/dev/null; then
  echo "SKIP: python3 is absent; it writes this test's safetensors inputs"
  exit 77
fi

# expect_rc CODE cmd...: runs cmd, checks its exit code, leaves its stdout+stderr in $out.
out=""
expect_rc() {
  local code=$1; shift
  local rc=0
  out=$("$@" 2>&1) || rc=$?
  [[ $rc == "$code" ]] || fail "expected exit $code from '$*', got $rc: $out"
}
has() { grep -q -- "$1" <<<"$out" || fail "output lacks '$1': $out"; }
hasnt() { ! grep -q -- "$1" <<<"$out" || fail "output has '$1': $out"; }
# row NAME: the table row whose name column is exactly NAME, for checks on one row.
row() {
  local r
  r=$(awk -v n="$1" '$1 == n' <<<"$out")
  [[ -n $r ]] || fail "no row '$1': $out"
  echo "$r"
}

python3 - "$WORK" <<'PY'
import json, math, os, random, struct, sys

work = sys.argv[1]
FMT = {"F32": "f", "F64": "d", "I32": "i", "I64": "q", "U8": "B"}

def bf16(x):  # truncation is exact for the small integers used here
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16

def write(path, tensors, meta=None):
    """tensors: [(name, dtype, shape, values)] written in this order."""
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, dt, shape, vals in tensors:
        if dt == "BF16":
            blob = struct.pack("<%dH" % len(vals), *[bf16(v) for v in vals])
        else:
            blob = struct.pack("<%d%s" % (len(vals), FMT[dt]), *vals)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def rnd(seed, n):
    r = random.Random(seed)
    return [r.gauss(0.0, 1.0) for _ in range(n)]

def prod(shape):
    return math.prod(shape)

# A small "dump": per-layer tensors, a stacked layer_in_streams [layers, tokens, 4, dim], a tensor
# listed in "stacked", final_hidden, an integer tensor. Data order differs from the "order" key.
L, T, D = 3, 4, 8
ref = [
    ("final_hidden", "F32", [T, D], rnd(1, T * D)),
    ("layer_in_streams", "F32", [L, T, 4, D], rnd(2, L * T * 4 * D)),
    ("blk.0.attn_out", "F32", [T, D], rnd(3, T * D)),
    ("blk.1.attn_out", "F32", [T, D], rnd(4, T * D)),
    ("blk_out", "F32", [L, T * D], rnd(5, L * T * D)),
    ("router_ids", "I32", [L, 2], [1, 2, 3, 4, 5, 6]),
]
order = "layer_in_streams,blk.0.attn_out,blk.1.attn_out,blk_out,final_hidden,router_ids"
meta = {"order": order, "stacked": "blk_out"}
write(f"{work}/ref.safetensors", ref, meta)
write(f"{work}/same.safetensors", ref, meta)

# Layer 2 of layer_in_streams replaced by noise and final_hidden nudged a lot: layer_in_streams[2]
# is the first divergence (in the "order" key's order, although final_hidden comes first in data).
bad = [list(t) for t in ref]
per = T * 4 * D
bad[1][3] = bad[1][3][:2 * per] + rnd(99, per)
bad[0][3] = [v + 0.5 * n for v, n in zip(bad[0][3], rnd(98, T * D))]
bad[5][3] = [1, 2, 3, 4, 5, 7]
write(f"{work}/bad.safetensors", [tuple(t) for t in bad], meta)

# NaN in blk.1 (every other value identical).
nan = [list(t) for t in ref]
nan[3][3] = nan[3][3][:5] + [float("nan")] + nan[3][3][6:]
write(f"{work}/nan.safetensors", [tuple(t) for t in nan], meta)

# Known values: b alternates +-1 over 64*512 elements, so ||b|| = sqrt(64*512) = 181.019;
# a = 2b: corr 1, rel_err 1, ||a|| = 362.039. bf16 holds the same values as f32.
n = 64 * 512
b = [1.0 if i % 2 else -1.0 for i in range(n)]
write(f"{work}/known_b.safetensors", [("x", "F32", [64, 512], b), ("h", "F32", [4], [1, 2, 3, 4])])
write(f"{work}/known_a.safetensors", [("x", "F32", [64, 512], [2 * v for v in b]), ("h", "BF16", [4], [1, 2, 3, 4])])

# Shape mismatch, same-count reshape, and names on one side only.
write(f"{work}/shape_a.safetensors", [("m", "F32", [4, 8], rnd(7, 32)), ("r", "F32", [2, 8], rnd(8, 16)),
                                      ("only_a1", "F32", [2], [1, 2]), ("only_a2", "F32", [2], [1, 2])])
write(f"{work}/shape_b.safetensors", [("m", "F32", [8, 8], rnd(7, 64)), ("r", "F32", [16], rnd(8, 16)),
                                      ("only_b", "F32", [2], [1, 2])])

# A directory holding one name in two files with different shapes (prompt_len1/40 style).
os.makedirs(f"{work}/dirA")
write(f"{work}/dirA/p1.safetensors", [("logits", "F32", [1, 4], [1, 2, 3, 4])])
write(f"{work}/dirA/p2.safetensors", [("logits", "F32", [2, 4], [1, 2, 3, 4, 5, 6, 7, 8])])
write(f"{work}/single.safetensors", [("logits", "F32", [2, 4], [1, 2, 3, 4, 5, 6, 7, 8])])

os.makedirs(f"{work}/empty")
with open(f"{work}/corrupt.safetensors", "wb") as f:
    f.write(struct.pack("<Q", 1000) + b"{")
PY

"$BIN" compare --help | grep -q "usage: moestream compare" || fail "compare --help"
"$BIN" compare --help | grep -q "name and shape" || fail "--help explains matching by name and shape"
overview=$("$BIN" --help)  # captured: see cli_test.sh
grep -q "compare" <<<"$overview" || fail "--help does not list compare"

# Identical inputs pass; stacked tensors are split per leading index, in the "order" key's order.
expect_rc 0 "$BIN" compare "$WORK/ref.safetensors" "$WORK/same.safetensors"
has "verdict: PASS"
row "layer_in_streams[2]" | grep -q "1.000000" || fail "identical corr: $out"
row "blk_out[1]" >/dev/null   # listed in the "stacked" metadata
hasnt "divergence"
has "not float, identical (not compared): 1 (router_ids)"
first_row=$(grep -A1 "^name" <<<"$out" | tail -1)
[[ $first_row == "layer_in_streams[0] "* ]] || fail "rows do not follow the order metadata: $first_row"
[[ $(grep -n "^final_hidden" <<<"$out" | cut -d: -f1) -gt $(grep -n "^blk_out\[2\]" <<<"$out" | cut -d: -f1) ]] ||
  fail "final_hidden is listed before blk_out: $out"

# A perturbed layer is the first divergence; later failures are "below"; earlier layers pass.
expect_rc 1 "$BIN" compare "$WORK/bad.safetensors" "$WORK/ref.safetensors"
row "layer_in_streams[2]" | grep -q "<- first divergence" || fail "layer 2 not flagged: $out"
row "layer_in_streams[1]" | grep -q "divergence\|below" && fail "layer 1 flagged: $out"
row "final_hidden" | grep -q "below" || fail "final_hidden not 'below': $out"
has "first divergence: layer_in_streams\[2\]"
has "not float, DIFFERENT (not compared): 1 (router_ids)"
# A lower threshold lets the nudged final_hidden pass; a filter leaves the broken layer out.
expect_rc 1 "$BIN" compare "$WORK/bad.safetensors" "$WORK/ref.safetensors" --min-corr 0.5
row "final_hidden" | grep -q "below\|divergence" && fail "--min-corr 0.5: $out"
expect_rc 0 "$BIN" compare "$WORK/bad.safetensors" "$WORK/ref.safetensors" --tensors 'blk.*,blk_out'
hasnt "layer_in_streams"
has "verdict: PASS"

# NaN anywhere fails the row even though every other value agrees.
expect_rc 1 "$BIN" compare "$WORK/nan.safetensors" "$WORK/ref.safetensors"
row "blk.1.attn_out" | grep -q "<- first divergence (non-finite: A 1, B 0)" || fail "NaN row: $out"

# Norms carry enough digits to recognise constants; bf16 against f32 compares as numbers.
expect_rc 0 "$BIN" compare "$WORK/known_a.safetensors" "$WORK/known_b.safetensors"
row "x" | grep -q "1.000000   1.000e+00      362.039      181.019   1.000e+00" || fail "known values: $out"
row "h" | grep -q "1.000000   0.000e+00" || fail "bf16 vs f32: $out"

# Shape mismatches are failing rows; a reshape with the same count is compared, with a note;
# one-sided names are listed.
expect_rc 1 "$BIN" compare "$WORK/shape_a.safetensors" "$WORK/shape_b.safetensors"
row "m" | grep -q "shape differs: B is \[8, 8\]" || fail "shape mismatch: $out"
row "r" | grep -q "1.000000.*B shape \[16\] (same element count)" || fail "same-count reshape: $out"
has "only in A: 2 (only_a1, only_a2)"
has "only in B: 1 (only_b)"
has "1 shape/dtype mismatch"

# A directory holding one name in several files: matched by name and shape, labelled by file.
expect_rc 0 "$BIN" compare "$WORK/dirA" "$WORK/single.safetensors"
row "p2:logits" | grep -q "1.000000" || fail "dir match by shape: $out"
has "only in A: 1 (p1:logits)"
expect_rc 0 "$BIN" compare "$WORK/single.safetensors" "$WORK/dirA"
row "logits" | grep -q "B from p2" || fail "B file note: $out"

# Usage and read errors: exit 2, naming the path.
expect_fail 2 "$WORK/missing.safetensors" "$BIN" compare "$WORK/missing.safetensors" "$WORK/ref.safetensors"
expect_fail 2 "$WORK/missing-dir" "$BIN" compare "$WORK/ref.safetensors" "$WORK/missing-dir"
expect_fail 2 "no \*.safetensors file" "$BIN" compare "$WORK/empty" "$WORK/ref.safetensors"
expect_fail 2 "corrupt.safetensors" "$BIN" compare "$WORK/corrupt.safetensors" "$WORK/ref.safetensors"
expect_fail 2 "expected two paths" "$BIN" compare "$WORK/ref.safetensors"
expect_fail 2 "min-corr" "$BIN" compare "$WORK/ref.safetensors" "$WORK/same.safetensors" --min-corr 2
expect_fail 2 "min-corr" "$BIN" compare "$WORK/ref.safetensors" "$WORK/same.safetensors" --min-corr abc
expect_fail 1 "nothing compared" "$BIN" compare "$WORK/ref.safetensors" "$WORK/same.safetensors" --tensors 'zzz*'

# The reference fixtures: the margin variant departs after layer 0 (its router bias differs).
FIX=$SHARED/fixtures
if [[ -d $FIX/dsv41-tiny-bf16 && -d $FIX/dsv41-tiny-bf16-margin ]]; then
  expect_rc 0 "$BIN" compare "$FIX/dsv41-tiny-bf16/layers_len40.safetensors" "$FIX/dsv41-tiny-bf16/layers_len40.safetensors"
  has "verdict: PASS: 23 rows"
  expect_rc 1 "$BIN" compare "$FIX/dsv41-tiny-bf16/layers_len40.safetensors" \
    "$FIX/dsv41-tiny-bf16-margin/layers_len40.safetensors"
  row "layer_in_streams[0]" | grep -q "1.000000   0.000e+00" || fail "fixture layer 0: $out"
  row "layer_in_mean[1]" | grep -q "<- first divergence" || fail "fixture first divergence: $out"
  row "layer_in_streams[9]" | grep -q "below" || fail "fixture later layer: $out"
  # prefill_logits is in three files of a side, with three shapes: each matches its own.
  expect_rc 0 "$BIN" compare "$FIX/dsv41-tiny-bf16" "$FIX/dsv41-tiny-bf16" --tensors prefill_logits
  for p in 1 7 40; do row "prompt_len$p:prefill_logits" >/dev/null; done
  expect_rc 0 "$BIN" compare "$FIX/dsv41-tiny-bf16/prompt_len40.safetensors" "$FIX/dsv41-tiny-bf16" \
    --tensors prefill_logits,final_hidden
  row "prefill_logits" | grep -q "1.000000.*B from prompt_len40" || fail "file against directory: $out"
else
  echo "SKIP (part): $FIX/dsv41-tiny-bf16{,-margin} absent; fixture comparisons skipped"
fi
echo "compare: all checks passed"
