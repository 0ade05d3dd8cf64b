#!/usr/bin/env bash
# Schema-following output and the serving fixes against a real `moestream serve` (forged tiny
# model): the OpenAI Node SDK (tests/cli/schema_clients.mjs), the shutdown drain with curl (the
# listener still answers: /health and new requests 503 while a stream runs), and the
# `bench constraint` / `bench serve` command lines.
# Usage: schema_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer, node, curl or
# the openai npm package).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node curl" "openai"

# ---- command lines ----
"$BIN" bench serve --help >"$WORK/help.txt"
grep -q -- "--model NAME" "$WORK/help.txt" && grep -q -- "--timeout S" "$WORK/help.txt" ||
  fail "bench serve's usage line lacks --model or --timeout: $(head -n 3 "$WORK/help.txt")"
grep '^usage:' "$WORK/help.txt" | grep -q -- '\[--model NAME\].*\[--timeout S\]' || fail "bench serve's usage line: $(head -n 2 "$WORK/help.txt")"
"$BIN" bench constraint --help | grep -q "usage: moestream bench constraint" || fail "bench constraint --help"
expect_fail 2 "give exactly one of --model or --tokenizer-json" "$BIN" bench constraint
expect_fail 2 "--outputs must be between" "$BIN" bench constraint --tokenizer-json "$TOKJSON" --outputs 0
"$BIN" bench constraint --tokenizer-json "$TOKJSON" --outputs 1 --max-tokens 40 >"$WORK/bench.txt" 2>&1 ||
  fail "bench constraint: $(cat "$WORK/bench.txt")"
for row in "TodoWrite +json_schema" "browser +forced call" "\\(none\\) +json_object" "\\(none\\) +free text"; do
  grep -Eq "^$row +[0-9]+/[0-9]+ +[0-9]+ +[0-9.]+ " "$WORK/bench.txt" || fail "bench constraint prints no '$row' row: $(cat "$WORK/bench.txt")"
done
echo '{"type":"object","properties":{"x":{"type":"string","pattern":"a"}}}' >"$WORK/bad.json"
expect_fail 1 "'pattern' is not supported" "$BIN" bench constraint --tokenizer-json "$TOKJSON" --schema "$WORK/bad.json"

# ---- a server ----
"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" --tokenizer-json "$TOKJSON" >/dev/null
"$BIN" serve --model "$WORK/tiny.gguf" --port 0 --alias tiny --ctx-size 4096 --device-cache 0.05 \
  --host-cache 0.1 --drain 60 >"$WORK/serve.log" 2>&1 &
SERVER=$!
wait_ready
URL="http://127.0.0.1:$PORT"

rc=0
node "$HERE/schema_clients.mjs" "$URL" || rc=$?
if [[ $rc != 0 ]]; then
  echo "--- server log (tail) ---" >&2
  tail -n 30 "$WORK/serve.log" >&2
  fail "schema_clients.mjs failed (exit $rc)"
fi

# ---- the drain: SIGTERM while a stream runs ----
curl -sSN -o "$WORK/stream.txt" -H 'Content-Type: application/json' \
  -d '{"prompt":"Go","max_tokens":4000,"ignore_eos":true,"stream":true}' "$URL/v1/completions" &
STREAM=$!
for _ in $(seq 300); do
  grep -q '"text"' "$WORK/stream.txt" 2>/dev/null && break
  sleep 0.1
done
grep -q '"text"' "$WORK/stream.txt" || fail "the stream did not start"
kill -TERM "$SERVER"
status=
for _ in $(seq 100); do
  status=$(curl -sS -o "$WORK/health.json" -w '%{http_code}' "$URL/health" || true)
  [[ $status == 503 ]] && break
  sleep 0.1
done
[[ $status == 503 ]] || fail "/health during the drain answered '$status', expected 503"
grep -q '"unavailable_error"' "$WORK/health.json" || fail "drain /health body: $(cat "$WORK/health.json")"
status=$(curl -sS -o "$WORK/late.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d '{"prompt":"x","max_tokens":2}' "$URL/v1/completions")
[[ $status == 503 ]] || fail "a completion during the drain answered $status, expected 503"
kill -0 "$SERVER" 2>/dev/null || fail "the server stopped while a stream still ran"
kill "$STREAM" 2>/dev/null || true  # the stream's client leaves: the drain ends with it
wait "$STREAM" 2>/dev/null || true
expect_clean_stop
echo "schema: ok"
