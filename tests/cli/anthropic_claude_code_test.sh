#!/usr/bin/env bash
# The real Claude Code (the native binary of npm @anthropic-ai/claude-code-linux-x64, pinned by
# scripts/setup.sh) against `moestream serve` on loopback with the forged tiny model: `claude -p`
# runs one turn and exits 0, then `claude -p --continue` runs the second turn of the same
# conversation, which must read most of its prompt from the prefix cache (Claude Code's usage
# and /metrics). It never reaches the network: HOME is a scratch folder, nonessential traffic is
# off, and any proxy-following request would go to a closed port.
#
# The tiny model's text is random, so it practically never ends a reply by itself; the turns end
# at a stop sequence Claude Code is asked to send (CLAUDE_CODE_EXTRA_BODY), which is the model's
# real text up to that point (stop_reason stop_sequence). The stop strings are letters few tokens
# hold (z, q, x, j: a reply ends within a few dozen tokens): with "e" the first sampled token
# often held it, the reply was empty, Claude Code's one retry could be empty too and the turn
# failed (CI, 2026-12-04). Its prompt is Claude Code's own: about 11k tokens of system prompt and
# tool definitions.
# Usage: anthropic_claude_code_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped.
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node curl" "@anthropic-ai/claude-code-linux-x64"
CLAUDE=$MOESTREAM_NODE_DIR/node_modules/@anthropic-ai/claude-code-linux-x64/claude
[[ -x $CLAUDE ]] || { echo "SKIP: $CLAUDE is not an executable (run scripts/setup.sh)"; exit 77; }
"$CLAUDE" --version >/dev/null 2>&1 || { echo "SKIP: $CLAUDE does not run on this machine"; exit 77; }

CTX=16384
KEY=claude-code-test-key
"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" --tokenizer-json "$TOKJSON" >/dev/null
"$BIN" serve --model "$WORK/tiny.gguf" --port 0 --alias tiny --ctx-size $CTX --device-cache 0.05 --host-cache 0.1 \
  --api-key "$KEY" --drain 2 >"$WORK/serve.log" 2>&1 &
SERVER=$!
wait_ready
URL="http://127.0.0.1:$PORT"

mkdir -p "$WORK/home" "$WORK/project"
run_claude() {  # run_claude OUT ARGS...: claude in the scratch project, offline, against the server
  local out=$1
  shift
  (cd "$WORK/project" && env -i PATH="$PATH" HOME="$WORK/home" TERM=dumb \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
    HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 NO_PROXY=127.0.0.1,localhost \
    ANTHROPIC_BASE_URL="$URL" ANTHROPIC_AUTH_TOKEN="$KEY" ANTHROPIC_API_KEY= ANTHROPIC_MODEL=tiny \
    CLAUDE_CODE_MAX_CONTEXT_TOKENS=$CTX CLAUDE_CODE_MAX_OUTPUT_TOKENS=256 \
    CLAUDE_CODE_EXTRA_BODY='{"stop_sequences":["z","q","x","j"]}' \
    timeout 600 "$CLAUDE" "$@" --output-format json) >"$out" 2>"$out.err"
}
# check_result FILE JS-EXPRESSION WHAT: the expression over `r` (Claude Code's result object) holds.
check_result() {
  node -e '
    const text = require("fs").readFileSync(process.argv[1], "utf8");
    const start = text.indexOf("{\"");
    let r;
    try { r = JSON.parse(text.slice(start).trim().split("\n").pop()); } catch (e) { console.error("no result JSON: " + text.slice(0, 800)); process.exit(1); }
    if (!(eval(process.argv[2]))) { console.error(JSON.stringify(r).slice(0, 1500)); process.exit(1); }' "$1" "$2" ||
    fail "$3"
}
metric() { curl -sS -H "Authorization: Bearer $KEY" "$URL/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" {s += $2} END {print s + 0}'; }

# ---- turn 1 ----
rc=0
run_claude "$WORK/turn1.json" -p "List the files of this project." || rc=$?
if [[ $rc != 0 ]]; then
  echo "--- claude stderr ---" >&2; cat "$WORK/turn1.json.err" >&2
  echo "--- server log (tail) ---" >&2; tail -n 20 "$WORK/serve.log" >&2
  fail "claude -p exited $rc: $(head -c 1500 "$WORK/turn1.json")"
fi
# (Claude Code asks again when a reply is empty, which a stop sequence at the very first token
# makes it: its usage is the sum over the requests of the turn.)
check_result "$WORK/turn1.json" 'r.type === "result" && r.is_error === false && r.subtype === "success" &&
  ["stop_sequence", "end_turn"].includes(r.stop_reason) && typeof r.result === "string"' "turn 1 result"
check_result "$WORK/turn1.json" 'r.usage.cache_creation_input_tokens > 5000 && r.usage.input_tokens === 0 &&
  r.usage.output_tokens >= 1' "turn 1 usage: the whole prompt is processed and kept"
check_result "$WORK/turn1.json" "Object.values(r.modelUsage)[0].contextWindow === $CTX" \
  "CLAUDE_CODE_MAX_CONTEXT_TOKENS sets Claude Code's window to the server's context"
hits_before=$(metric 'llamacpp:prompt_tokens_total')

# ---- turn 2: the same conversation, its prompt extends turn 1's ----
rc=0
run_claude "$WORK/turn2.json" -p --continue "Now count them." || rc=$?
[[ $rc == 0 ]] || fail "claude -p --continue exited $rc: $(cat "$WORK/turn2.json.err") $(head -c 1500 "$WORK/turn2.json")"
check_result "$WORK/turn2.json" 'r.is_error === false && r.subtype === "success"' "turn 2 result"
# Everything up to turn 1's reply is shared; only the new user turn (and the billing header,
# which Claude Code changes per request and the server drops) is processed again.
check_result "$WORK/turn2.json" 'r.usage.cache_read_input_tokens > 5000 &&
  r.usage.cache_creation_input_tokens < r.usage.cache_read_input_tokens / 20 && r.usage.cache_creation_input_tokens >= 1' \
  "turn 2 reads turn 1's prompt from the prefix cache"
field() {  # field FILE EXPRESSION: a figure of Claude Code's result object `r`
  node -e 'const t=require("fs").readFileSync(process.argv[1],"utf8"); const r=JSON.parse(t.slice(t.indexOf("{\"")).trim().split("\n").pop()); console.log(eval(process.argv[2]))' "$1" "$2"
}
read_tokens=$(field "$WORK/turn2.json" 'r.usage.cache_read_input_tokens')
# What was measured (printed, not asserted): the cache's share of turn 2 and both turns' time to
# the first token as Claude Code saw it.
echo "turn 1: $(field "$WORK/turn1.json" 'r.usage.cache_creation_input_tokens') prompt tokens processed, first token after $(field "$WORK/turn1.json" 'r.ttft_ms') ms"
echo "turn 2: $read_tokens prompt tokens read from the prefix cache, $(field "$WORK/turn2.json" 'r.usage.cache_creation_input_tokens') processed, first token after $(field "$WORK/turn2.json" 'r.ttft_ms') ms"
[[ $(metric 'moestream:prefix_cache_hits_total') -ge $read_tokens ]] ||
  fail "/metrics counts fewer prefix-cache hits than turn 2 reported: $(curl -sS -H "Authorization: Bearer $KEY" "$URL/metrics" | grep prefix)"
(( $(metric 'llamacpp:prompt_tokens_total') > hits_before )) || fail "/metrics did not count turn 2's prompt"

kill -TERM "$SERVER"
expect_clean_stop
echo "anthropic_claude_code: ok"
