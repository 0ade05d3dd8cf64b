#!/usr/bin/env bash
# POST /v1/responses with real clients against `moestream serve` on loopback and the forged tiny
# model: first the official OpenAI SDK (openai 6.x, tests/cli/responses_clients.mjs), then the
# real Codex CLI (@openai/codex 0.169.0): one `codex exec` turn must exit 0, and a second turn of
# the same session (`codex exec resume --last`) must report cached prompt tokens in its usage,
# which /metrics must count as prefix-cache hits too.
#
# Codex ends a turn only on response.completed (an incomplete response is an error it retries),
# and the tiny model's random text never reaches its end-of-sequence token, so both turns use
# `--output-schema`: Codex sends the schema as text.format json_schema and the output is one JSON
# object that ends the response. Codex must not reach the network: it runs with CODEX_HOME and
# HOME in the scratch folder, update checks and analytics off, and every proxy variable pointing
# at a local trap that records any connection made to it (loopback is exempt, NO_PROXY); the test
# fails if the trap saw one.
# Usage: responses_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer, node, curl
# or one of the npm packages).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node curl" "openai @openai/codex"
NODE_MODULES=$MOESTREAM_NODE_DIR/node_modules
version_of() { node -p "require('$NODE_MODULES/$1/package.json').version"; }
[[ $(version_of openai) == 6.* ]] || fail "openai $(version_of openai) is installed, the tests need the pinned 6.x (run scripts/setup.sh)"
[[ $(version_of @openai/codex) == 0.169.0 ]] || fail "@openai/codex $(version_of @openai/codex) is installed, not the pinned 0.169.0"
CODEX_JS=$NODE_MODULES/@openai/codex/bin/codex.js

"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" --tokenizer-json "$TOKJSON" >/dev/null
# start_server CTX: serves the tiny model with that context; sets SERVER, PORT, URL.
start_server() {
  "$BIN" serve --model "$WORK/tiny.gguf" --port 0 --alias tiny --ctx-size "$1" --device-cache 0.05 \
    --host-cache 0.1 --drain 2 >"$WORK/serve.log" 2>&1 &
  SERVER=$!
  wait_ready
  URL="http://127.0.0.1:$PORT"
}
stop_server() {
  kill -TERM "$SERVER"
  expect_clean_stop
  mv "$WORK/serve.log" "$WORK/serve-$1.log"
}
show_log() {
  echo "--- server log (tail) ---" >&2
  tail -n 30 "$WORK/serve.log" >&2
}

# ---- the OpenAI SDK (a small context: the overflow cases stay cheap) ----
start_server 2048
rc=0
node "$HERE/responses_clients.mjs" "$URL" || rc=$?
if [[ $rc != 0 ]]; then
  show_log
  fail "responses_clients.mjs failed (exit $rc)"
fi
stop_server sdk

# ---- the Codex CLI (its prompt alone is about 11k tokens) ----
start_server 32768
TRAP_LOG=$WORK/proxy-trap.log
: >"$TRAP_LOG"
node -e '
  const fs = require("fs");
  const s = require("net").createServer((c) => {
    c.once("data", (d) => fs.appendFileSync(process.argv[1], d.toString("latin1").split("\r\n")[0] + "\n"));
    c.on("error", () => {});
    setTimeout(() => c.destroy(), 100);
  });
  s.listen(0, "127.0.0.1", () => fs.writeFileSync(process.argv[1] + ".port", String(s.address().port)));
' "$TRAP_LOG" &
TRAP=$!
trap 'kill "$TRAP" 2>/dev/null || true; server_test_cleanup' EXIT
for _ in $(seq 100); do [[ -s $TRAP_LOG.port ]] && break; sleep 0.05; done
TRAP_URL="http://127.0.0.1:$(cat "$TRAP_LOG.port")"

export CODEX_HOME=$WORK/codex-home
mkdir -p "$CODEX_HOME" "$WORK/home" "$WORK/project"
cat >"$CODEX_HOME/config.toml" <<EOF
model = "tiny"
model_provider = "local"
model_context_window = 32768
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.local]
name = "moestream"
base_url = "$URL/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

# Features that reach out on their own: the curated plugin sync (github.com, then chatgpt.com),
# ChatGPT apps, in-app updates.
[features]
plugins = false
remote_plugin = false
apps = false
in_app_updates = false
EOF
cat >"$WORK/answer.schema.json" <<'EOF'
{"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}},
 "required": ["answer"], "additionalProperties": false}
EOF
# codex ARGS...: runs the CLI offline in the scratch project; JSONL events on stdout.
codex() {
  (cd "$WORK/project" && env HOME="$WORK/home" HTTP_PROXY="$TRAP_URL" HTTPS_PROXY="$TRAP_URL" ALL_PROXY="$TRAP_URL" \
    http_proxy="$TRAP_URL" https_proxy="$TRAP_URL" all_proxy="$TRAP_URL" NO_PROXY=127.0.0.1,localhost \
    no_proxy=127.0.0.1,localhost timeout 600 node "$CODEX_JS" "$@" </dev/null)
}
# turn_usage FILE FIELD: the field of the usage of the turn.completed event in the JSONL file.
turn_usage() {
  node -e '
    const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean);
    const done = lines.map((l) => { try { return JSON.parse(l); } catch { return {}; } }).filter((e) => e.type === "turn.completed");
    if (done.length !== 1) { console.error("turn.completed events: " + done.length); process.exit(1); }
    console.log(done[0].usage[process.argv[2]]);' "$1" "$2"
}
run_turn() {
  local name=$1; shift
  local rc=0
  codex "$@" >"$WORK/$name.jsonl" 2>"$WORK/$name.err" || rc=$?
  if [[ $rc != 0 ]] || ! grep -q '"type":"turn.completed"' "$WORK/$name.jsonl"; then
    show_log
    echo "--- codex stdout ---" >&2; tail -c 3000 "$WORK/$name.jsonl" >&2
    echo "--- codex stderr ---" >&2; tail -n 20 "$WORK/$name.err" >&2
    fail "codex $name exited $rc without a completed turn"
  fi
}

run_turn turn1 exec --skip-git-repo-check --json --output-schema "$WORK/answer.schema.json" "Say hello in one word."
input1=$(turn_usage "$WORK/turn1.jsonl" input_tokens) || fail "turn 1: no usage"
[[ $input1 -gt 1000 ]] || fail "turn 1 reports $input1 input tokens: Codex's prompt did not arrive whole"
grep -q 'skipped, only function tools are served' "$WORK/serve.log" || fail "the skipped non-function tools were not logged"

run_turn turn2 exec resume --last --skip-git-repo-check --json --output-schema "$WORK/answer.schema.json" "And in two words?"
# Codex reports the session's running totals: turn 2's own figures are the differences.
total_input=$(turn_usage "$WORK/turn2.jsonl" input_tokens) || fail "turn 2: no usage"
cached1=$(turn_usage "$WORK/turn1.jsonl" cached_input_tokens) || fail "turn 1: no cached_input_tokens"
total_cached=$(turn_usage "$WORK/turn2.jsonl" cached_input_tokens) || fail "turn 2: no cached_input_tokens"
input2=$((total_input - input1)) cached2=$((total_cached - cached1))
[[ $input2 -gt $input1 ]] || fail "turn 2's prompt ($input2 tokens) does not hold turn 1's ($input1)"
# Turn 2 resends turn 1's conversation and answer: all of turn 1's prompt is a cached prefix.
[[ $cached2 -ge $((input1 - 1)) ]] || fail "turn 2 reports $cached2 cached tokens of $input2, expected at least $((input1 - 1))"
echo "codex: turn 1 $input1 prompt tokens ($cached1 cached), turn 2 $input2 prompt tokens of which $cached2 cached"

# The server's own figures agree with what Codex reported.
curl -sS -o "$WORK/metrics.txt" "$URL/metrics"
metric() { awk -v n="$1" 'index($1, n "{") == 1 || $1 == n {print $2; exit}' "$WORK/metrics.txt"; }
prompts=$(metric moestream:prompt_tokens_total)
hits=$(metric moestream:prefix_cache_hits_total)
[[ ${prompts%.*} == "$total_input" ]] || fail "/metrics counts $prompts prompt tokens, Codex $total_input"
[[ ${hits%.*} == "$total_cached" ]] || fail "/metrics counts $hits prefix-cache hit tokens, Codex $total_cached cached ones"
served=$(grep -c '^moestream:http_requests_total{.*handler="/v1/responses",method="POST",status="200"}' "$WORK/metrics.txt" || true)
[[ $served -ge 1 ]] || fail "/metrics has no /v1/responses 200s"

if [[ -s $TRAP_LOG ]]; then fail "Codex tried to reach the network through the proxy trap: $(sort -u "$TRAP_LOG" | head -n 5)"; fi
stop_server codex
echo "responses: ok"
