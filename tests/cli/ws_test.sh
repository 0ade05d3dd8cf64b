#!/usr/bin/env bash
# The WebSocket protocol /v1/ws (docs/websocket.md) against a real `moestream serve` on loopback,
# driven by tests/cli/ws_test.mjs with the `ws` npm package; ends with a graceful SIGTERM.
# Usage: ws_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer data, node or ws).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "node" "ws"

"$BIN" forge --preset tiny --out "$WORK/tiny.gguf" >/dev/null
KEY="ws-test-key-$$"
# A request time limit of 6 s (the timeout case waits for it; every other request ends well within
# it) and --drain 1 (the shutdown case waits for the drain period before in-flight requests are
# cancelled).
echo '{"server": {"request_timeout_s": 6}}' >"$WORK/config.json"
"$BIN" serve --model "$WORK/tiny.gguf" --config "$WORK/config.json" --port 0 --api-key "$KEY" --drain 1 \
  >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 600); do
  grep -q "moestream serve: ready" "$WORK/serve.log" && break
  kill -0 "$SERVER" 2>/dev/null || fail "the server exited during start-up: $(cat "$WORK/serve.log")"
  sleep 0.1
done
grep -q "moestream serve: ready" "$WORK/serve.log" || fail "the server did not get ready within 60 s: $(cat "$WORK/serve.log")"
PORT=$(sed -n 's|^moestream serve: listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$WORK/serve.log" | head -1)
[[ -n $PORT ]] || fail "no port in the server's start-up line: $(cat "$WORK/serve.log")"

rc=0
node "$HERE/ws_test.mjs" "ws://127.0.0.1:$PORT/v1/ws" "$KEY" "$SERVER" || rc=$?
if [[ $rc != 0 ]]; then
  echo "--- server log (tail) ---" >&2
  tail -n 30 "$WORK/serve.log" >&2
  fail "ws_test.mjs failed (exit $rc)"
fi

# The last case sent SIGTERM: the server must stop by itself, cleanly.
for _ in $(seq 200); do
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$SERVER" 2>/dev/null; then fail "the server did not stop within 20 s of SIGTERM"; fi
src=0
wait "$SERVER" || src=$?
SERVER=
[[ $src == 0 ]] || fail "the server exited with $src after SIGTERM: $(tail -n 20 "$WORK/serve.log")"
grep -q "moestream serve: stopped" "$WORK/serve.log" || fail "no 'stopped' line: $(tail -n 20 "$WORK/serve.log")"
echo "ws test passed"
