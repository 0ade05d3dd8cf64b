#!/usr/bin/env bash
# `moestream serve` on loopback with a forged tiny model: every HTTP route with curl, then the
# official OpenAI Node SDK (tests/cli/serve_clients.mjs), then `moestream bench serve` against it,
# then a graceful SIGTERM. JSON answers are checked with node (no jq on the machine).
# Usage: serve_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer, node, curl or
# the openai npm package).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node curl" "openai"


"$BIN" serve --help | grep -q "usage: moestream serve" || fail "serve --help"
"$BIN" bench serve --help | grep -q "usage: moestream bench serve" || fail "bench serve --help"
expect_fail 2 "missing required option --url" "$BIN" bench serve
expect_fail 2 "https is not supported" "$BIN" bench serve --url https://127.0.0.1:1
expect_fail 2 "--concurrency must be between" "$BIN" bench serve --url http://127.0.0.1:1 --concurrency 0

"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" --tokenizer-json "$TOKJSON" >/dev/null
"$BIN" serve --model "$WORK/tiny.gguf" --port 0 --alias tiny --ctx-size 2048 --device-cache 0.05 \
  --host-cache 0.1 --drain 2 >"$WORK/serve.log" 2>&1 &
SERVER=$!
wait_ready
URL="http://127.0.0.1:$PORT"
R=$WORK/r.json

# ---- every route with curl ----
[[ $(get /health "$R") == 200 ]] || fail "/health"
jcheck "$R" 'd.status === "ok"' "/health body"

[[ $(get /v1/models "$R") == 200 ]] || fail "/v1/models"
jcheck "$R" 'd.object === "list" && d.data.length === 1 && d.data[0].id === "tiny" && d.data[0].meta.n_ctx === 2048' \
  "/v1/models lists the alias with the serving context"

[[ $(post /v1/chat/completions '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"seed":3}' "$R") == 200 ]] ||
  fail "chat: $(cat "$R")"
jcheck "$R" 'd.object === "chat.completion" && d.choices[0].message.role === "assistant" &&
  ["stop","length"].includes(d.choices[0].finish_reason) && d.usage.completion_tokens <= 6 &&
  d.usage.total_tokens === d.usage.prompt_tokens + d.usage.completion_tokens && d.timings.predicted_n === d.usage.completion_tokens' \
  "chat completion shape"

headers=$WORK/headers
curl -sS -D "$headers" -o "$WORK/stream.txt" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' \
  "$URL/v1/chat/completions"
grep -qi '^content-type: text/event-stream' "$headers" || fail "chat stream content type: $(cat "$headers")"
grep -qi '^transfer-encoding: chunked' "$headers" || fail "chat stream is not chunked"
[[ $(grep -c '^data: ' "$WORK/stream.txt") -ge 8 ]] || fail "chat stream events: $(cat "$WORK/stream.txt")"
[[ $(grep '^data: ' "$WORK/stream.txt" | tail -n 1) == "data: [DONE]" ]] || fail "the chat stream does not end with [DONE]"
grep '^data: {' "$WORK/stream.txt" | tail -n 1 | sed 's/^data: //' >"$R"
jcheck "$R" 'd.choices.length === 0 && d.usage.completion_tokens === 6' "the chat stream's last chunk carries usage"

[[ $(post /v1/completions '{"prompt":"Once upon a time","max_tokens":5,"echo":true,"logprobs":3,"temperature":0}' "$R") == 200 ]] ||
  fail "completions: $(cat "$R")"
jcheck "$R" 'd.object === "text_completion" && d.choices[0].text.startsWith("Once upon a time") &&
  d.choices[0].logprobs.tokens.length === d.usage.prompt_tokens - 1 + 5 && d.choices[0].logprobs.token_logprobs[0] === null &&
  d.choices[0].logprobs.token_logprobs.slice(1).every((x) => x <= 0) &&
  d.choices[0].logprobs.top_logprobs.slice(1).every((t) => Object.keys(t).length >= 1) && d.usage.completion_tokens === 5' \
  "completions with echo and logprobs (the echoed prompt scored, its first token null)"

[[ $(post /completion '{"prompt":"Once upon a time","n_predict":4,"temperature":0}' "$R") == 200 ]] ||
  fail "/completion: $(cat "$R")"
jcheck "$R" 'd.stop === true && typeof d.content === "string" && d.tokens_predicted === 4 && d.tokens.length === 4 &&
  d.timings.predicted_n === 4 && d.timings.prompt_n + d.timings.cache_n === d.tokens_evaluated &&
  ["limit","eos"].includes(d.stop_type)' "/completion with timings"
curl -sS -o "$WORK/native.txt" -H 'Content-Type: application/json' \
  -d '{"prompt":"Once upon a time","n_predict":4,"temperature":0,"stream":true}' "$URL/completion"
grep -q '^data: \[DONE\]' "$WORK/native.txt" && fail "the native stream must not end with [DONE]"
grep '^data: ' "$WORK/native.txt" | tail -n 1 | sed 's/^data: //' >"$R"
jcheck "$R" 'd.stop === true && d.tokens_predicted === 4' "the native stream ends with its final object"

[[ $(post /infill '{"input_prefix":"def add(a, b):\n    ","input_suffix":"\n","n_predict":4}' "$R") == 200 ]] ||
  fail "/infill: $(cat "$R")"
jcheck "$R" 'typeof d.content === "string" && d.tokens_predicted >= 1 && d.stop === true' "/infill"

[[ $(post /tokenize '{"content":"Hello world"}' "$R") == 200 ]] || fail "/tokenize"
jcheck "$R" 'Array.isArray(d.tokens) && d.tokens.length >= 2 && d.tokens.every(Number.isInteger)' "/tokenize ids"
ids=$(node -e 'console.log(JSON.stringify(JSON.parse(require("fs").readFileSync(process.argv[1])).tokens))' "$R")
[[ $(post /tokenize '{"content":"Hello world","with_pieces":true}' "$R") == 200 ]] || fail "/tokenize with pieces"
jcheck "$R" 'd.tokens.map((t) => t.piece).join("") === "Hello world"' "/tokenize pieces"
[[ $(post /detokenize "{\"tokens\":$ids}" "$R") == 200 ]] || fail "/detokenize"
jcheck "$R" 'd.content === "Hello world"' "/detokenize gives the text back"

[[ $(get /props "$R") == 200 ]] || fail "/props"
jcheck "$R" 'd.total_slots >= 1 && d.default_generation_settings.n_ctx === 2048 && d.model_path.endsWith("tiny.gguf")' "/props"
slots=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).total_slots)' "$R")
[[ $(get /slots "$R") == 200 ]] || fail "/slots"
jcheck "$R" "Array.isArray(d) && d.length === $slots && d.every((s) => s.n_ctx === 2048 && s.is_processing === false)" "/slots"

[[ $(get /metrics "$WORK/metrics.txt") == 200 ]] || fail "/metrics"
for name in llamacpp:prompt_tokens_total llamacpp:tokens_predicted_total llamacpp:requests_processing \
  moestream:time_to_first_token_seconds_bucket moestream:num_requests_running moestream:generation_tokens_total \
  moestream:request_success_total moestream:http_requests_total; do
  grep -q "^$name" "$WORK/metrics.txt" || fail "/metrics lacks $name"
done
predicted=$(awk '/^llamacpp:tokens_predicted_total/ {print $2}' "$WORK/metrics.txt" | head -n 1)
awk -v p="$predicted" 'BEGIN { exit !(p + 0 >= 25) }' || fail "/metrics counted $predicted predicted tokens, expected >= 25"

[[ $(get /v1/nothing "$R") == 404 ]] || fail "an unknown route is not 404"
jcheck "$R" 'd.error.code === 404 && d.error.type === "not_found_error"' "404 body"
[[ $(post /v1/completions '{"prompt":"x","max_tokens":"many"}' "$R") == 400 ]] || fail "a bad field is not 400"
jcheck "$R" 'd.error.code === 400 && d.error.param === "max_tokens"' "400 names the field"

# ---- the official OpenAI SDK ----
rc=0
node "$HERE/serve_clients.mjs" "$URL" || rc=$?
if [[ $rc != 0 ]]; then
  echo "--- server log (tail) ---" >&2
  tail -n 30 "$WORK/serve.log" >&2
  fail "serve_clients.mjs failed (exit $rc)"
fi

# ---- bench serve ----
for api in completions chat; do
  "$BIN" bench serve --url "$URL" --api $api --concurrency 4 --requests 8 --prompt-tokens 24 --max-tokens 6 \
    >"$WORK/bench.txt" 2>&1 || fail "bench serve --api $api failed: $(cat "$WORK/bench.txt")"
  grep -Eq '^Successful requests: +8$' "$WORK/bench.txt" || fail "bench serve --api $api: $(cat "$WORK/bench.txt")"
  grep -Eq '^Failed requests: +0$' "$WORK/bench.txt" || fail "bench serve --api $api had failures"
  grep -Eq '^Total generated tokens: +48$' "$WORK/bench.txt" || fail "bench serve --api $api: 8 x 6 tokens expected"
  for m in "Mean TTFT (ms)" "P99 TPOT (ms)" "Median ITL (ms)" "Mean E2EL (ms)" "Output token throughput (tok/s)"; do
    line=$(grep -F "$m:" "$WORK/bench.txt") || fail "bench serve prints no '$m'"
    awk -v v="${line##* }" 'BEGIN { exit !(v + 0 > 0) }' || fail "bench serve: $line"
  done
done
# A refused connection is a failed request; all failed -> exit 1.
free_port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close();})')
expect_fail 1 "every request failed" "$BIN" bench serve --url "http://127.0.0.1:$free_port" --requests 3 --concurrency 2
"$BIN" bench serve --url "http://127.0.0.1:$free_port" --requests 3 --concurrency 2 >"$WORK/bench.txt" 2>&1 || true
grep -Eq '^Failed requests: +3$' "$WORK/bench.txt" || fail "bench serve does not count the failures: $(cat "$WORK/bench.txt")"
grep -Eq '^ +3 x connect: Connection refused' "$WORK/bench.txt" || fail "bench serve does not report the refused connections"

# ---- graceful stop ----
kill -TERM "$SERVER"
expect_clean_stop
echo "serve: ok"
