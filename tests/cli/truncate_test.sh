#!/usr/bin/env bash
# A model file truncated under a serving process (CPU backend, tiny tiers, requests in flight):
# every request ends with a result or an error, the process lives and /health keeps answering;
# the requests that need the lost bytes fail with an error naming the file; restoring the file
# lets requests succeed again. After load, serving reads nothing of the model through a memory
# mapping (dense weights copied out, experts and engram rows through the reader), so the lost
# bytes are read errors, not a SIGBUS.
# Usage: truncate_test.sh MOESTREAM_BIN SHARED_DIR. Exit 77 = skipped (no tokenizer or curl).
set -euo pipefail
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cli/lib.sh
source "$HERE/lib.sh"
server_test_setup "curl truncate" ""

MODEL=$WORK/tiny.gguf
"$BIN" forge --preset tiny --out "$MODEL" --tokenizer-json "$TOKJSON" >/dev/null
cp "$MODEL" "$WORK/tiny.orig"
SIZE=$(stat -c %s "$MODEL")
# One-slot tiers: almost every step reads experts from the file.
"$BIN" serve --model "$MODEL" --port 0 --backend cpu --ctx-size 1024 --device-cache 0 --host-cache 0.0001 \
  --drain 1 >"$WORK/serve.log" 2>&1 &
SERVER=$!
wait_ready
URL="http://127.0.0.1:$PORT"

# request N SEED: one chat completion in the background (its pid joins PIDS); its HTTP status
# goes to $WORK/N.code, its body to $WORK/N.json, curl's exit status to $WORK/N.rc.
PIDS=()
request() {
  (
    rc=0
    curl -sS -m 120 -o "$WORK/$1.json" -w '%{http_code}' -H 'Content-Type: application/json' \
      -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about $2\"}],\"max_tokens\":48,\"ignore_eos\":true,\"seed\":$2,\"temperature\":1}" \
      "$URL/v1/chat/completions" >"$WORK/$1.code" 2>"$WORK/$1.err" || rc=$?
    echo "$rc" >"$WORK/$1.rc"
  ) &
  PIDS+=($!)
}
# Waits for the requests started so far (not for the server, also a child of this shell).
requests_done() {
  wait "${PIDS[@]}"
  PIDS=()
}
# ended N: the request got a whole answer (curl succeeded) with a JSON body.
ended() {
  [[ $(cat "$WORK/$1.rc") == 0 ]] || fail "request $1 did not end with an answer: curl $(cat "$WORK/$1.rc"): $(cat "$WORK/$1.err")"
  grep -q '^{' "$WORK/$1.json" || fail "request $1 answered $(cat "$WORK/$1.code") without JSON: $(head -c 300 "$WORK/$1.json")"
}
health() { [[ $(curl -sS -m 10 -o /dev/null -w '%{http_code}' "$URL/health") == 200 ]] || fail "/health after $1"; }

request warm 1
requests_done
[[ $(cat "$WORK/warm.code") == 200 ]] || fail "before the truncation: $(cat "$WORK/warm.json")"

# Eight requests in flight, then the file loses its last tenth.
for i in $(seq 8); do request "a$i" $((100 + i)); done
sleep 0.5
truncate -s $((SIZE * 9 / 10)) "$MODEL"
requests_done
kill -0 "$SERVER" 2>/dev/null || fail "the server died when its model file was truncated: $(tail -n 20 "$WORK/serve.log")"
for i in $(seq 8); do ended "a$i"; done
health "the truncation"

# With the file short, requests that reach the lost bytes fail with an error naming the file.
failed=0
for i in $(seq 6); do request "b$i" $((200 + i)); done
requests_done
for i in $(seq 6); do
  ended "b$i"
  if [[ $(cat "$WORK/b$i.code") != 200 ]]; then
    failed=$((failed + 1))
    grep -q "tiny.gguf" "$WORK/b$i.json" || fail "request b$i failed without naming the file: $(head -c 400 "$WORK/b$i.json")"
  fi
done
((failed > 0)) || fail "no request needed the lost bytes: the test did not reach them"
kill -0 "$SERVER" 2>/dev/null || fail "the server died: $(tail -n 20 "$WORK/serve.log")"
health "failed reads"

# The file restored (the same inode, written again): requests succeed.
cp "$WORK/tiny.orig" "$MODEL"
for i in $(seq 4); do request "c$i" $((300 + i)); done
requests_done
for i in $(seq 4); do
  ended "c$i"
  [[ $(cat "$WORK/c$i.code") == 200 ]] || fail "after the restore, request c$i: $(head -c 400 "$WORK/c$i.json")"
done
health "the restore"

kill -TERM "$SERVER"
expect_clean_stop
echo "truncate: $failed of 6 requests failed on the short file, every request ended, the server lived"
