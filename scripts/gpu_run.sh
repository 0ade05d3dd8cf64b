#!/usr/bin/env bash
# Runs on the GPU machine over a .gpu/ staged by scripts/gpu_bundle.sh: the CUDA suite (every op
# against the CPU backend, the reference fixtures, determinism), the start-up errors, bench
# kernels, and bench decode --backend cuda on forged mini-lite and mini. Logs go to $OUT (the
# device tool brings them back); the last lines printed are a summary.
# Usage: [PRESETS="mini"] [TESTS=filter] [KERNEL_AB="VAR=a VAR=b"] [DECODE_AB="VAR=a VAR=b"] scripts/gpu_run.sh [tests] [cli] [tiles] [kernels] [decode] [copy] [stream] [ab] [trace] [pdl] [modes] [spec] [profile] [envtrial] (default: the first five;
# stream: mini with the published budget proportions, 6.7% / 27% of its 12.8 GB of experts, the
# slots filled from the host tier, against --io-mode remap-sync)
set -uo pipefail
cd "$(dirname "$0")/.."
G=$PWD/.gpu
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOESTREAM_SHARED_DIR=$G/shared
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
BIN=$G/bin/moestream
what=${*:-tests cli tiles kernels decode}
summary=()
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
if [[ $what == *tests* ]]; then
  (cd /tmp && timeout 240 "$G/bin/test_cuda" ${TESTS:+--run_test=$TESTS} --log_level=message --report_level=detailed) > "$OUT/test_cuda.log" 2>&1
  summary+=("test_cuda exit $?: $(grep -E 'Test module|failure|error' "$OUT/test_cuda.log" | head -3 | tr '\n' ' ')")
fi
# forge needs the tokenizer (the decode and stream sections forge their models).
if [[ -f $G/tokenizer.json.gz ]]; then
  mkdir -p /tmp/moestream-deps/tokenizer-deepseek_v3/models
  gunzip -c "$G/tokenizer.json.gz" > /tmp/moestream-deps/tokenizer-deepseek_v3/models/tokenizer.json
  export MOESTREAM_DEPS_DIR=/tmp/moestream-deps
fi
# Correlation and largest difference of two float32 files of logits.
compare_logits() {
  python3 -c "
import array,sys
g=array.array('f'); g.frombytes(open('$1','rb').read())
c=array.array('f'); c.frombytes(open('$2','rb').read())
n=len(g); mg=sum(g)/n; mc=sum(c)/n
cov=sum((a-mg)*(b-mc) for a,b in zip(g,c)); vg=sum((a-mg)**2 for a in g); vc=sum((b-mc)**2 for b in c)
print('$3: %d values, correlation %.6f, max |diff| %.4g' % (n, cov/(vg*vc)**0.5, max(abs(a-b) for a,b in zip(g,c))))
"
}
if [[ $what == *cli* ]]; then
  # Start-up errors: one clear line, exit 1.
  if [[ -n ${MOESTREAM_DEPS_DIR:-} ]]; then
    "$BIN" forge --preset tiny --out /tmp/tiny.gguf > /dev/null
    "$BIN" logits --model /tmp/tiny.gguf --tokens 1,2,3 --decode 4,5 --backend cuda --out /tmp/g.f32 > "$OUT/cli.log" 2>&1
    echo "logits --backend cuda exit $?" >> "$OUT/cli.log"
    "$BIN" logits --model /tmp/tiny.gguf --tokens 1,2,3 --decode 4,5 --backend cpu --out /tmp/c.f32 >> "$OUT/cli.log" 2>&1
    compare_logits /tmp/g.f32 /tmp/c.f32 "cuda vs cpu logits" >> "$OUT/cli.log" 2>&1
    "$BIN" logits --model /tmp/tiny.gguf --tokens 1,2,3 --backend cuda --device-cache 100000 --out /tmp/x.f32 >> "$OUT/cli.log" 2>&1
    echo "expert cache larger than the card: exit $?" >> "$OUT/cli.log"
    "$BIN" logits --model /tmp/tiny.gguf --tokens 1,2,3 --backend cuda --ctx-size 1048576 --out /tmp/x.f32 >> "$OUT/cli.log" 2>&1
    echo "largest context: exit $?" >> "$OUT/cli.log"
    # More sequence state than the card holds: 1024 sequences of 1M tokens.
    echo '{"runtime": {"sequences_max": 1024, "context_tokens": 1048576}}' > /tmp/huge.json
    timeout 60 "$BIN" serve --model /tmp/tiny.gguf --port 0 --config /tmp/huge.json >> "$OUT/cli.log" 2>&1
    echo "serve with 1024 x 1M-token sequences: exit $?" >> "$OUT/cli.log"
    CUDA_VISIBLE_DEVICES= "$BIN" logits --model /tmp/tiny.gguf --tokens 1,2 --backend cuda --out /tmp/x.f32 >> "$OUT/cli.log" 2>&1
    echo "no visible GPU: exit $?" >> "$OUT/cli.log"
    summary+=("cli: $(grep -c . "$OUT/cli.log") lines in cli.log")
  fi
fi
if [[ $what == *tiles* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # MXFP4 experts tiled in the expert cache (the default) against the file's rows, end to end on a
  # model whose experts tile (mini-lite): the same logits bit for bit; and against the CPU.
  p=${TILES_PRESET:-mini-lite}
  [[ -f /tmp/$p.gguf ]] || "$BIN" forge --preset $p --out /tmp/$p.gguf --seed 1 > /dev/null 2>&1
  : > "$OUT/tiles.log"
  for t in 1 0; do
    MOESTREAM_MXFP4_TILES=$t "$BIN" logits --model /tmp/$p.gguf --tokens 1,2,3,4,5,6,7,8 --decode 9,10,11 --backend cuda \
      --out /tmp/tiles$t.f32 >> "$OUT/tiles.log" 2>&1
    echo "MOESTREAM_MXFP4_TILES=$t logits exit $?" >> "$OUT/tiles.log"
  done
  if cmp -s /tmp/tiles1.f32 /tmp/tiles0.f32; then echo "tiled and rows: logits bit-identical" >> "$OUT/tiles.log";
  else echo "tiled and rows: logits DIFFER" >> "$OUT/tiles.log"; fi
  "$BIN" logits --model /tmp/$p.gguf --tokens 1,2,3,4,5,6,7,8 --decode 9,10,11 --backend cpu --out /tmp/tilescpu.f32 \
    >> "$OUT/tiles.log" 2>&1
  compare_logits /tmp/tiles1.f32 /tmp/tilescpu.f32 "$p cuda (tiled) vs cpu logits" >> "$OUT/tiles.log" 2>&1
  summary+=("tiles: $(grep -E 'bit-identical|DIFFER|correlation' "$OUT/tiles.log" | tr '\n' ' ')")
fi
if [[ $what == *kernels* ]]; then
  if [[ -n ${KERNEL_AB:-} ]]; then
    # Kernel variants A/B in one session: KERNEL_AB="VAR=a VAR=b" (an environment setting per run,
    # e.g. MOESTREAM_MXFP4_SPLIT=0), KERNEL_ROUNDS passes interleaved; one log per setting, the
    # passes one after the other in it.
    for r in $(seq 1 ${KERNEL_ROUNDS:-2}); do
      for kv in $KERNEL_AB; do
        log="$OUT/bench_kernels_${kv//[^A-Za-z0-9]/_}.log"
        echo "=== pass $r: $kv" >> "$log"
        env "$kv" timeout 200 "$BIN" bench kernels --rounds ${KERNEL_BENCH_ROUNDS:-9} \
          --shapes ${SHAPES:-mini,flash} >> "$log" 2>&1
        summary+=("bench kernels $kv pass $r exit $?")
      done
    done
  else
    timeout 200 "$BIN" bench kernels --rounds 15 --shapes ${SHAPES:-mini,flash} > "$OUT/bench_kernels.log" 2>&1
    summary+=("bench kernels exit $?")
  fi
fi
if [[ $what == *decode* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  for preset in ${PRESETS:-mini-lite mini}; do
    [[ -f /tmp/$preset.gguf ]] || "$BIN" forge --preset $preset --out /tmp/$preset.gguf --seed 1 > /dev/null 2>&1 || continue
    if [[ -n ${DECODE_AB:-} ]]; then
      # Settings A/B in one session: DECODE_AB="VAR=a VAR=b" (an environment setting per run),
      # DECODE_ROUNDS interleaved passes; first the logits of a short prompt under each setting
      # against the first setting's, bit for bit.
      first=""
      for kv in $DECODE_AB; do
        env "$kv" "$BIN" logits --model /tmp/$preset.gguf --tokens 1,2,3,4,5,6,7,8 --decode 9,10,11 --backend cuda \
          --out /tmp/ab_${kv//[^A-Za-z0-9]/_}.f32 > /dev/null 2>&1
        f=/tmp/ab_${kv//[^A-Za-z0-9]/_}.f32
        if [[ -z $first ]]; then first=$f; elif cmp -s "$first" "$f"; then summary+=("$preset logits $kv: bit-identical");
        else summary+=("$preset logits $kv: DIFFER"); fi
      done
      for r in $(seq 1 ${DECODE_ROUNDS:-2}); do
        for kv in $DECODE_AB; do
          log="$OUT/decode_${preset}_${kv//[^A-Za-z0-9]/_}.log"
          echo "=== pass $r: $kv" >> "$log"
          env "$kv" timeout 180 "$BIN" bench decode --backend cuda --model /tmp/$preset.gguf --device-cache 64 -n 64 >> "$log" 2>&1
          summary+=("bench decode $preset $kv pass $r exit $?: $(grep -E 'prefill|decode at' "$log" | tail -2 | tr '\n' ' ')")
        done
      done
    else
      timeout 180 "$BIN" bench decode --backend cuda --model /tmp/$preset.gguf --device-cache 64 -n 64 > "$OUT/decode_$preset.log" 2>&1
      summary+=("bench decode $preset exit $?: $(grep -E 'decode at|GPU' "$OUT/decode_$preset.log" | tr '\n' ' ')")
    fi
  done
fi
if [[ $what == *copy* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # Expert uploads from the pinned host tier against the pinned H2D bandwidth, same run.
  p=${COPY_PRESET:-mini-lite}
  [[ -f /tmp/$p.gguf ]] || "$BIN" forge --preset $p --out /tmp/$p.gguf --seed 1 > /dev/null 2>&1
  timeout 200 "$BIN" bench copy --model /tmp/$p.gguf --rounds ${COPY_ROUNDS:-7} > "$OUT/bench_copy_$p.log" 2>&1
  summary+=("bench copy $p exit $?: $(tail -3 "$OUT/bench_copy_$p.log" | tr '\n' ' ')")
fi
if [[ $what == *stream* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  [[ -f /tmp/mini.gguf ]] || "$BIN" forge --preset mini --out /tmp/mini.gguf --seed 1 > /dev/null 2>&1
  timeout 300 "$BIN" bench decode --backend cuda --model /tmp/mini.gguf --device-cache 0.80 --host-cache 3.22 \
    -n 32 --prompt-tokens 256 > "$OUT/stream_mini.log" 2>&1
  summary+=("bench decode streaming mini exit $?: $(grep -E 'GPU|remap' "$OUT/stream_mini.log" | tr '\n' ' ')")
fi
if [[ $what == *ab* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # Rounds of streamed mini (published proportions) over streaming settings, engine alone
  # (--no-remap): AB="depth:keep[:policy[:head_start]] ..." (keep 0: MOESTREAM_KEEP_FIRST_LAYER=0;
  # policy: --cache-policy, lru by default; head_start: MOESTREAM_HEAD_START forwards), AB_ROUNDS
  # rounds, interleaved so that drift hits every setting alike. One log per setting (the device
  # tool brings back a bounded number of files), the rounds one after the other in it.
  [[ -f /tmp/mini.gguf ]] || "$BIN" forge --preset mini --out /tmp/mini.gguf --seed 1 > /dev/null 2>&1
  for r in $(seq 1 ${AB_ROUNDS:-2}); do
    for cfg in ${AB:-2:1 2:0 3:1}; do
      IFS=: read -r la keep pol hs <<< "$cfg"
      pol=${pol:-lru}; hs=${hs:-4}
      log="$OUT/ab_la${la}_keep${keep}_${pol}${hs}.log"
      echo "=== round $r: lookahead $la keep $keep policy $pol head start $hs" >> "$log"
      MOESTREAM_KEEP_FIRST_LAYER=$keep MOESTREAM_HEAD_START=$hs timeout 200 "$BIN" bench decode --backend cuda \
        --model /tmp/mini.gguf --device-cache 0.80 --host-cache 3.22 -n 32 --prompt-tokens 256 --graphs on \
        --no-remap --lookahead $la --cache-policy $pol >> "$log" 2>&1
      rc=$?
      summary+=("ab $cfg round $r exit $rc: $(sed -n "/=== round $r:/,\$p" "$log" | grep -E 'new content|GPU, graphs' | tr '\n' ' ')")
    done
  done
fi
if [[ $what == *trace* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # One traced pass of streamed mini (published proportions, TRACE_ARGS for settings), the
  # timeline summarised on the device (scripts/trace_report.py --layers --host) so that only a
  # text file comes back.
  [[ -f /tmp/mini.gguf ]] || "$BIN" forge --preset mini --out /tmp/mini.gguf --seed 1 > /dev/null 2>&1
  rm -f /tmp/trace.csv
  MOESTREAM_TRACE=/tmp/trace.csv timeout 200 "$BIN" bench decode --backend cuda --model /tmp/mini.gguf \
    --device-cache 0.80 --host-cache 3.22 -n 32 --prompt-tokens 256 --graphs ${TRACE_GRAPHS:-on} --no-remap ${TRACE_ARGS:-} \
    > "$OUT/trace_bench.log" 2>&1
  summary+=("traced bench exit $?: $(grep -E 'new content' "$OUT/trace_bench.log" | tr '\n' ' ')")
  python3 scripts/trace_report.py /tmp/trace.csv --layers --host > "$OUT/trace_report.txt" 2>&1
  summary+=("trace report exit $?: $(head -1 "$OUT/trace_report.txt")")
fi
if [[ $what == *envtrial* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # Streamed mini (published proportions) under each of STREAM_AB="VAR=a VAR=b" (environment
  # settings), STREAM_ROUNDS rounds interleaved, then one traced pass of each, summarised
  # (trace_report.py --layers --host: the forward thread's time a layer, the picks' wait in it).
  [[ -f /tmp/mini.gguf ]] || "$BIN" forge --preset mini --out /tmp/mini.gguf --seed 1 > /dev/null 2>&1
  for r in $(seq 1 ${STREAM_ROUNDS:-2}); do
    for kv in ${STREAM_AB:-MOESTREAM_BLOCKING_DOWNLOADS=1 MOESTREAM_BLOCKING_DOWNLOADS=0}; do
      log="$OUT/envtrial_${kv//[^A-Za-z0-9]/_}.log"
      echo "=== round $r: $kv" >> "$log"
      env "$kv" timeout 200 "$BIN" bench decode --backend cuda --model /tmp/mini.gguf --device-cache 0.80 \
        --host-cache 3.22 -n 32 --prompt-tokens 256 --graphs on --no-remap >> "$log" 2>&1
      rc=$?
      summary+=("envtrial $kv round $r exit $rc: $(sed -n "/=== round $r:/,\$p" "$log" | grep -E 'new content|GPU, graphs' | tr '\n' ' ')")
    done
  done
  for kv in ${STREAM_AB:-MOESTREAM_BLOCKING_DOWNLOADS=1 MOESTREAM_BLOCKING_DOWNLOADS=0}; do
    rm -f /tmp/trace.csv
    env "$kv" MOESTREAM_TRACE=/tmp/trace.csv timeout 200 "$BIN" bench decode --backend cuda --model /tmp/mini.gguf \
      --device-cache 0.80 --host-cache 3.22 -n 32 --prompt-tokens 256 --graphs on --no-remap > /dev/null 2>&1
    python3 scripts/trace_report.py /tmp/trace.csv --layers --host > "$OUT/trace_${kv//[^A-Za-z0-9]/_}.txt" 2>&1
    summary+=("trace $kv: $(grep -iE 'picks' "$OUT/trace_${kv//[^A-Za-z0-9]/_}.txt" | head -2 | tr '\n' ' ')")
  done
fi
if [[ $what == *pdl* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # Step graphs with programmatic edges (the default) against plain ones, same run.
  for preset in ${PRESETS:-mini-lite mini}; do
    [[ -f /tmp/$preset.gguf ]] || "$BIN" forge --preset $preset --out /tmp/$preset.gguf --seed 1 > /dev/null 2>&1 || continue
    for pdl in 1 0; do
      MOESTREAM_PDL=$pdl timeout 180 "$BIN" bench decode --backend cuda --model /tmp/$preset.gguf --device-cache 64 -n 64 \
        > "$OUT/decode_${preset}_pdl$pdl.log" 2>&1
      summary+=("bench decode $preset pdl $pdl exit $?: $(grep -E 'decode at|GPU|empty launch' "$OUT/decode_${preset}_pdl$pdl.log" | tr '\n' ' ')")
    done
  done
fi
if [[ $what == *modes* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # A step as one graph (its device time alone: the device's span of the graph) beside the
  # default parts.
  for preset in ${PRESETS:-mini-lite mini}; do
    [[ -f /tmp/$preset.gguf ]] || "$BIN" forge --preset $preset --out /tmp/$preset.gguf --seed 1 > /dev/null 2>&1 || continue
    MOESTREAM_STEP_SEGMENT_OPS=0 timeout 180 "$BIN" bench decode --backend cuda --model /tmp/$preset.gguf --device-cache 64 \
      -n 64 --graphs on > "$OUT/decode_${preset}_onegraph.log" 2>&1
    summary+=("bench decode $preset one graph a step exit $?: $(grep -E 'GPU|a step' "$OUT/decode_${preset}_onegraph.log" | tr '\n' ' ')")
  done
fi
if [[ $what == *spec* && -n ${MOESTREAM_DEPS_DIR:-} ]]; then
  # Speculative decoding against plain decoding on the GPU, streamed with the published budget
  # proportions (docs/benchmarks.md has the CPU run of the same command).
  p=${SPEC_PRESET:-mini-lite}
  [[ -f /tmp/$p-draft.gguf ]] || "$BIN" forge --preset $p --out /tmp/$p.gguf --draft-out /tmp/$p-draft.gguf --seed 1 > /dev/null 2>&1
  timeout ${SPEC_TIMEOUT:-400} stdbuf -oL "$BIN" bench spec --backend cuda --model /tmp/$p.gguf --draft /tmp/$p-draft.gguf \
    --device-cache ${SPEC_DEVICE_CACHE:-0.4} --host-cache ${SPEC_HOST_CACHE:-1.6} -n ${SPEC_N:-32} --rounds ${SPEC_ROUNDS:-3} \
    ${SPEC_ARGS:-} > "$OUT/bench_spec_$p.log" 2>&1
  summary+=("bench spec $p exit $?: $(grep -E 'verdict|noise' "$OUT/bench_spec_$p.log" | tr '\n' ' ')")
fi
if [[ $what == *profile* && -n ${MOESTREAM_DEPS_DIR:-} ]] && command -v ncu > /dev/null; then
  # Each kernel's device time (ncu, kernels one by one, so no launch gaps) in single-token
  # forwards (a one-token prompt, then PROFILE_STEPS decode steps) with stream launches (ncu did
  # not profile graph nodes here), summed per kernel and step by scripts/ncu_summary.py.
  p=${PROFILE_PRESET:-mini-lite}
  steps=${PROFILE_STEPS:-3}
  [[ -f /tmp/$p.gguf ]] || "$BIN" forge --preset $p --out /tmp/$p.gguf --seed 1 > /dev/null 2>&1
  # (k_round_bf16 left out: the bench's launch probes are thousands of them; the tiler runs at
  # load only.)
  timeout ${PROFILE_TIMEOUT:-200} ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    -k regex:'k_(matmul|attention|hc|route|sum_rows|rms_norm|norm_rows|rope|store|expand|order|indexer|engram|copy|gather|embed|argmax|stream_mean|pool|swiglu|add|scale|dequant|simulate)' \
    "$BIN" bench decode --backend cuda --model /tmp/$p.gguf --device-cache 64 -n $steps \
    --prompt-tokens 1 --graphs off --no-remap > "$OUT/ncu_decode_$p.csv" 2> "$OUT/ncu_decode_$p.err"
  summary+=("ncu decode $p exit $?: $(wc -l < "$OUT/ncu_decode_$p.csv") lines")
  python3 scripts/ncu_summary.py "$OUT/ncu_decode_$p.csv" --per $((steps + 1)) > "$OUT/ncu_summary_$p.txt" 2>&1
  summary+=("ncu per step: $(head -1 "$OUT/ncu_summary_$p.txt")")
fi
printf '%s\n' "${summary[@]}"
