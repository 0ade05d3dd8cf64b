#!/usr/bin/env bash
# The Anthropic Messages route of `moestream serve` on loopback with a forged tiny model, driven by
# the official Anthropic SDK (tests/cli/anthropic_sdk_clients.mjs): first a server with API keys
# and a small body limit (every shape, count_tokens, the prefix cache, the 400/401/404/413
# errors), then one whose single sequence and single queue place fill at once, with a short
# request time limit (429 for the key that fills it, 529 for another key, an error event after
# a stream started). Then a graceful SIGTERM of each.
# Usage: anthropic_sdk_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer, node,
# curl or the @anthropic-ai/sdk npm package).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node curl" "@anthropic-ai/sdk"

KEY=sdk-test-key
OTHER=sdk-other-key
"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" --tokenizer-json "$TOKJSON" >/dev/null

# run_clients MODE: the SDK checks against the server in URL; on failure, the server's log.
run_clients() {
  local rc=0
  node "$HERE/anthropic_sdk_clients.mjs" "$1" "$URL" "$KEY" "$OTHER" || rc=$?
  if [[ $rc != 0 ]]; then
    echo "--- server log (tail) ---" >&2
    tail -n 30 "$WORK/serve.log" >&2
    fail "anthropic_sdk_clients.mjs $1 failed (exit $rc)"
  fi
}

# ---- shapes, tools, cache, errors ----
cat >"$WORK/main.json" <<'EOF'
{"server": {"body_bytes_max": 262144}}
EOF
"$BIN" serve --model "$WORK/tiny.gguf" --config "$WORK/main.json" --port 0 --alias tiny --ctx-size 2048 \
  --device-cache 0.05 --host-cache 0.1 --api-key "$KEY" --api-key "$OTHER" --drain 2 >"$WORK/serve.log" 2>&1 &
SERVER=$!
wait_ready
URL="http://127.0.0.1:$PORT"
# The route answers before the SDK is involved: curl, and the Anthropic error shape of the
# transport's own 401.
code=$(curl -sS -o "$WORK/r.json" -w '%{http_code}' -H "x-api-key: $KEY" -H 'anthropic-version: 2023-06-01' \
  -d '{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"Hi"}]}' "$URL/v1/messages?beta=true")
[[ $code == 200 ]] || fail "POST /v1/messages?beta=true: $code $(cat "$WORK/r.json")"
grep -q '"type":"message"' "$WORK/r.json" || fail "the message object: $(cat "$WORK/r.json")"
code=$(curl -sS -o "$WORK/r.json" -w '%{http_code}' -d '{}' "$URL/v1/messages")
[[ $code == 401 ]] || fail "no key: $code"
grep -q '^{"type":"error","error":{"type":"authentication_error"' "$WORK/r.json" || fail "401 shape: $(cat "$WORK/r.json")"
run_clients main
kill -TERM "$SERVER"
expect_clean_stop

# ---- a full queue, and errors after the stream started ----
cat >"$WORK/overload.json" <<'EOF'
{"runtime": {"sequences_max": 1}, "server": {"wait_queue_max": 1, "request_timeout_s": 5}}
EOF
"$BIN" serve --model "$WORK/tiny.gguf" --config "$WORK/overload.json" --port 0 --alias tiny --ctx-size 8192 \
  --device-cache 0.05 --host-cache 0.1 --api-key "$KEY" --api-key "$OTHER" --drain 2 >"$WORK/serve.log" 2>&1 &
SERVER=$!
wait_ready
URL="http://127.0.0.1:$PORT"
run_clients overload
kill -TERM "$SERVER"
expect_clean_stop
echo "anthropic_sdk: ok"
