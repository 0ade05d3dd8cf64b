#!/usr/bin/env bash
# The end of `make run`: shows the demo model working with the most complete path that exists.
# (Serving lands with the serving issue; then this starts `moestream serve` on 127.0.0.1:8080.)
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
if "$BIN" serve --help >/dev/null 2>&1; then
  echo "== moestream serve on http://127.0.0.1:8080 =="
  echo "try: curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\"
  echo "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":32}'"
  exec "$BIN" serve --model "$MODEL" --config config/demo.json
fi
echo "moestream serve is not built yet in this version: the demo ends here."
