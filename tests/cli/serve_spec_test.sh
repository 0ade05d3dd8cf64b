#!/usr/bin/env bash
# Speculative decoding in `moestream serve` on a forged tiny model (and its forged DSpark head):
# three servers one after the other, plain, prompt lookup (--drafter ngram --spec-k 3) and the
# draft head (--draft, whose drafter is the default, --spec-k 2). Greedy completions, alone and
# concurrent (batched), are token for token those of the plain server and of the same server with
# the per-request opt-out ("speculative.n_max": 0); sampled ones too for the same seed; timings
# carry draft_n / draft_n_accepted (accepted <= drafted) when drafts were made and never with the
# opt-out; /metrics counts drafts; /props and /slots say whether speculation is on.
# Usage: serve_spec_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer, node or curl).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node curl" ""

# The tokens of a /completion answer, or the text of a chat answer, on one line.
tokens_of() { node -e 'const d=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(JSON.stringify(d.tokens ?? d.choices[0].message.content))' "$1"; }

"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" --draft-out "$WORK/draft.gguf" --tokenizer-json "$TOKJSON" >/dev/null
common=(--model "$WORK/tiny.gguf" --port 0 --ctx-size 512 --device-cache 0.05 --host-cache 0.1 --drain 2)
expect_fail 2 "needs the draft head: --draft" "$BIN" serve "${common[@]}" --drafter dspark
expect_fail 2 "must be auto, dspark, ngram or none" "$BIN" serve "${common[@]}" --drafter eagle
expect_fail 2 "speculative.k (--spec-k)" "$BIN" serve "${common[@]}" --drafter ngram --spec-k 6
"$BIN" serve --help | grep -q -- "--drafter NAME" || fail "serve --help lacks --drafter"

prompts=("The quick brown fox jumps over the lazy dog. The quick brown fox" "Once upon a time"
  "one two three one two three one two three one two" "def add(a, b):")
native() { # native BODY-EXTRA: a greedy /completion body per prompt index $1
  printf '{"prompt":%s,"n_predict":24,"temperature":0%s}' "$(node -e 'console.log(JSON.stringify(process.argv[1]))' "${prompts[$1]}")" "$2"
}
sampled() {
  printf '{"prompt":%s,"n_predict":16,"temperature":1,"top_k":8,"seed":%d%s}' \
    "$(node -e 'console.log(JSON.stringify(process.argv[1]))' "${prompts[$1]}")" $((5 + $1)) "$2"
}
CHAT='{"messages":[{"role":"user","content":"Write a haiku about disks."}],"max_tokens":20,"temperature":0'

# run_server NAME FLAGS...: starts it, runs every request (saved as $WORK/NAME.*), stops it.
run_server() {
  local name=$1
  shift
  "$BIN" serve "${common[@]}" "$@" >"$WORK/serve.log" 2>&1 &
  SERVER=$!
  wait_ready
  URL="http://127.0.0.1:$PORT"
  local i out
  for i in "${!prompts[@]}"; do
    for mode in spec off; do
      local extra=""
      [[ $mode == off ]] && extra=',"speculative.n_max":0'
      out=$WORK/$name.$mode.native.$i.json
      [[ $(post /completion "$(native "$i" "$extra")" "$out") == 200 ]] || fail "$name /completion $i: $(cat "$out")"
      out=$WORK/$name.$mode.sampled.$i.json
      [[ $(post /completion "$(sampled "$i" "$extra")" "$out") == 200 ]] || fail "$name sampled $i: $(cat "$out")"
    done
  done
  # Concurrent (batched in the engine's steps), with and without the opt-out interleaved.
  local pids=()
  for i in "${!prompts[@]}"; do
    post /completion "$(native "$i" "")" "$WORK/$name.batch.spec.$i.json" >/dev/null &
    pids+=($!)
    post /completion "$(native "$i" ',"speculative.n_max":0')" "$WORK/$name.batch.off.$i.json" >/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "$name: a concurrent request failed"; done
  [[ $(post /v1/chat/completions "$CHAT}" "$WORK/$name.chat.spec.json") == 200 ]] || fail "$name chat"
  [[ $(post /v1/chat/completions "$CHAT,\"speculative.n_max\":0}" "$WORK/$name.chat.off.json") == 200 ]] || fail "$name chat opt-out"
  [[ $(get /metrics "$WORK/$name.metrics.txt") == 200 ]] || fail "$name /metrics"
  [[ $(get /props "$WORK/$name.props.json") == 200 ]] || fail "$name /props"
  [[ $(get /slots "$WORK/$name.slots.json") == 200 ]] || fail "$name /slots"
  kill -TERM "$SERVER"
  expect_clean_stop
}
# metric FILE NAME: the value of an unlabelled sample.
metric() { awk -v n="$2" '$1 ~ "^"n"[{]" {print $2; exit}' "$1"; }

run_server plain
run_server ngram --drafter ngram --spec-k 3
run_server dspark --draft "$WORK/draft.gguf" --spec-k 2
grep -q "speculative decoding: drafter dspark, k 2" "$WORK/serve.log" || fail "the dspark server did not say it speculates"

for name in plain ngram dspark; do
  for i in "${!prompts[@]}"; do
    for kind in native sampled batch; do
      want=$(tokens_of "$WORK/plain.off.${kind/batch/native}.$i.json")
      for mode in spec off; do
        f=$WORK/$name.$mode.$kind.$i.json
        [[ $kind == batch ]] && f=$WORK/$name.batch.$mode.$i.json
        [[ $(tokens_of "$f") == "$want" ]] || fail "$name $kind $mode prompt $i differs from plain serving: $(tokens_of "$f") vs $want"
        jcheck "$f" '!d.timings.draft_n || (d.timings.draft_n_accepted >= 0 && d.timings.draft_n_accepted <= d.timings.draft_n)' \
          "$name $kind $mode prompt $i: draft_n_accepted <= draft_n"
        [[ $mode == off || $name == plain ]] && jcheck "$f" '!("draft_n" in d.timings)' "$name $kind $mode $i: drafts without speculation"
      done
    done
  done
  [[ $(tokens_of "$WORK/$name.chat.spec.json") == $(tokens_of "$WORK/plain.chat.off.json") ]] || fail "$name chat differs"
  [[ $(tokens_of "$WORK/$name.chat.off.json") == $(tokens_of "$WORK/plain.chat.off.json") ]] || fail "$name chat opt-out differs"
  m=$WORK/$name.metrics.txt
  for family in llamacpp:spec_decode_num_drafts_total llamacpp:spec_decode_num_draft_tokens_total \
    llamacpp:spec_decode_num_accepted_tokens_total llamacpp:spec_decode_num_accepted_tokens_per_pos_total \
    moestream:spec_decode_num_draft_tokens_total moestream:spec_verification_steps_total \
    moestream:step_experts_total moestream:step_experts_steps_total moestream:step_experts_not_resident_total \
    moestream:step_disk_bytes_total moestream:step_residency_steps_total; do
    grep -q "^$family{" "$m" || fail "$name /metrics lacks $family"
  done
  drafted=$(metric "$m" llamacpp:spec_decode_num_draft_tokens_total)
  accepted=$(metric "$m" llamacpp:spec_decode_num_accepted_tokens_total)
  awk -v d="$drafted" -v a="$accepted" 'BEGIN { exit !(a + 0 <= d + 0) }' || fail "$name: accepted $accepted of $drafted"
  # The timings add up to the counters (every request of the server is in one file).
  sum=$(node -e '
    const fs = require("fs"), dir = process.argv[1], name = process.argv[2];
    let n = 0;
    for (const f of fs.readdirSync(dir)) if (f.startsWith(name + ".") && f.endsWith(".json") && !f.includes("props") && !f.includes("slots"))
      n += JSON.parse(fs.readFileSync(dir + "/" + f)).timings?.draft_n ?? 0;
    console.log(n)' "$WORK" "$name")
  [[ $sum == "$drafted" ]] || fail "$name: the responses drafted $sum tokens, /metrics says $drafted"
  case $name in
    plain)
      [[ $drafted == 0 ]] || fail "the plain server drafted $drafted tokens"
      jcheck "$WORK/plain.props.json" 'd.default_generation_settings.params["speculative.n_max"] === 0' "plain /props"
      jcheck "$WORK/plain.slots.json" 'd.every((s) => s.speculative === false)' "plain /slots" ;;
    ngram)
      jcheck "$WORK/ngram.props.json" 'd.default_generation_settings.params["speculative.n_max"] === 3' "ngram /props"
      jcheck "$WORK/ngram.slots.json" 'd.every((s) => s.speculative === true)' "ngram /slots" ;;
    dspark)
      # The head drafts every step of a fixed k: every speculating request shows it.
      awk -v d="$drafted" 'BEGIN { exit !(d + 0 > 0) }' || fail "the dspark server drafted nothing"
      for i in "${!prompts[@]}"; do
        jcheck "$WORK/dspark.spec.native.$i.json" 'd.timings.draft_n > 0' "dspark prompt $i: no draft_n in timings"
      done
      jcheck "$WORK/dspark.chat.spec.json" 'd.timings.draft_n > 0 && d.timings.draft_n_accepted <= d.timings.draft_n' \
        "dspark chat: no draft_n in the OpenAI response's timings"
      steps=$(metric "$m" moestream:spec_verification_steps_total)
      awk -v s="$steps" 'BEGIN { exit !(s + 0 > 0) }' || fail "no verification steps counted"
      grep -q '^moestream:step_experts_steps_total{model_name="[^"]*",kind="verify"} [1-9]' "$m" ||
        fail "no verification step's experts counted: $(grep step_experts "$m")"
      # (Served through the tiers: where the verification steps' experts were is recorded.)
      grep -q '^moestream:step_residency_steps_total{model_name="[^"]*",kind="verify"} [1-9]' "$m" ||
        fail "no verification step's residency counted: $(grep step_ "$m")"
      jcheck "$WORK/dspark.props.json" 'd.default_generation_settings.params["speculative.n_max"] === 2' "dspark /props" ;;
  esac
done
echo "serve_spec: ok"
