# Helpers shared by the CLI test scripts (sourced).
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_fail CODE PATTERN cmd...: the command exits CODE and its output contains PATTERN.
expect_fail() {
  local code=$1 pattern=$2; shift 2
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [[ $rc == "$code" ]] || fail "expected exit $code from '$*', got $rc: $out"
  grep -q -- "$pattern" <<<"$out" || fail "message of '$*' lacks '$pattern': $out"
}

# Server tests (serve_test.sh, ws_test.sh): sets SRC, TOKJSON and MOESTREAM_NODE_DIR, skips (exit
# 77) unless the tokenizer, node, the given commands and npm packages are there, and makes WORK, a
# temporary folder removed at exit together with the server whose pid is in SERVER.
# Usage: server_test_setup "cmd1 cmd2" "npm-pkg1 npm-pkg2"
server_test_setup() {
  SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  TOKJSON="$SRC/.deps/tokenizer-deepseek_v3/models/tokenizer.json"
  export MOESTREAM_NODE_DIR="${MOESTREAM_NODE_DIR:-$SRC/.deps/node}"
  if [[ ! -f $TOKJSON ]]; then
    echo "SKIP: $TOKJSON is absent (run scripts/setup.sh): the test model needs the tokenizer"
    exit 77
  fi
  local tool pkg
  for tool in $1; do
    if ! command -v "$tool" >/dev/null; then
      echo "SKIP: $tool is not installed (run scripts/setup.sh)"
      exit 77
    fi
  done
  for pkg in $2; do
    if [[ ! -f $MOESTREAM_NODE_DIR/node_modules/$pkg/package.json ]]; then
      echo "SKIP: the $pkg npm package is absent from $MOESTREAM_NODE_DIR/node_modules (run scripts/setup.sh)"
      exit 77
    fi
  done
  WORK=$(mktemp -d)
  SERVER=
  trap server_test_cleanup EXIT
}
server_test_cleanup() {
  if [[ -n ${SERVER:-} ]] && kill -0 "$SERVER" 2>/dev/null; then kill -KILL "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
# The server whose pid is in SERVER (log in $WORK/serve.log) was sent SIGTERM: it must exit by
# itself within 20 s, with status 0 and its "stopped" line.
expect_clean_stop() {
  for _ in $(seq 200); do
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVER" 2>/dev/null; then fail "the server did not stop within 20 s of SIGTERM"; fi
  local src=0
  wait "$SERVER" || src=$?
  SERVER=
  [[ $src == 0 ]] || fail "the server exited with $src after SIGTERM: $(tail -n 20 "$WORK/serve.log")"
  grep -q "moestream serve: stopped" "$WORK/serve.log" || fail "no 'stopped' line: $(tail -n 20 "$WORK/serve.log")"
}
# The server started in the background (pid in SERVER, log in $WORK/serve.log) must print its
# "ready" line within 60 s; sets PORT from its "listening on" line.
wait_ready() {
  for _ in $(seq 600); do
    grep -q "moestream serve: ready" "$WORK/serve.log" && break
    kill -0 "$SERVER" 2>/dev/null || fail "the server exited during start-up: $(cat "$WORK/serve.log")"
    sleep 0.1
  done
  grep -q "moestream serve: ready" "$WORK/serve.log" || fail "the server did not get ready within 60 s: $(cat "$WORK/serve.log")"
  PORT=$(sed -n 's|^moestream serve: listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$WORK/serve.log" | head -1)
  [[ -n $PORT ]] || fail "no port in the server's start-up line: $(cat "$WORK/serve.log")"
}

# JSON checks of a running server's answers (node; no jq on the machines).
# jcheck FILE JS-EXPRESSION WHAT: the expression (over `d`, the parsed file) is true.
jcheck() {
  node -e '
    const fs = require("fs");
    const text = fs.readFileSync(process.argv[1], "utf8");
    let d;
    try { d = JSON.parse(text); } catch (e) { console.error("not JSON: " + text.slice(0, 300)); process.exit(1); }
    if (!(eval(process.argv[2]))) { console.error(text.slice(0, 900)); process.exit(1); }' "$1" "$2" ||
    fail "$3"
}
# post ROUTE BODY OUT: POSTs JSON to $URL, the body goes to OUT, prints the HTTP status.
post() { curl -sS -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$URL$1"; }
get() { curl -sS -o "$2" -w '%{http_code}' "$URL$1"; }
