#!/usr/bin/env bash
# The end of `make run`: shows the demo model working (inspect, tokenize, the chat template),
# then serves it with `moestream serve` on 127.0.0.1:8080 (config/demo.json) until Ctrl-C.
set -euo pipefail
BIN=$1
MODEL=$2
echo "== moestream inspect (verdict) =="
"$BIN" inspect --no-metadata --no-tensors "$MODEL"
echo
echo "== moestream tokenize =="
echo "\$ $BIN tokenize --model $MODEL --text 'Hello, streaming world!'"
"$BIN" tokenize --model "$MODEL" --text 'Hello, streaming world!'
echo
echo "== moestream chat-template =="
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
printf '%s' '[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi!"}]' >"$msgs"
"$BIN" chat-template --model "$MODEL" --messages "$msgs" --add-generation-prompt
echo
echo "== moestream serve on http://127.0.0.1:8080 =="
echo "try: curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":32}'"
rm -f "$msgs"  # exec ends this shell: the EXIT trap would not run
exec "$BIN" serve --model "$MODEL" --config config/demo.json
