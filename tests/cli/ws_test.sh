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
wait_ready

rc=0
node "$HERE/ws_test.mjs" "ws://127.0.0.1:$PORT/v1/ws" "$KEY" "$SERVER" || rc=$?
if [[ $rc != 0 ]]; then
  echo "--- server log (tail) ---" >&2
  tail -n 30 "$WORK/serve.log" >&2
  fail "ws_test.mjs failed (exit $rc)"
fi

# The last case sent SIGTERM: the server must stop by itself, cleanly.
expect_clean_stop
echo "ws test passed"
