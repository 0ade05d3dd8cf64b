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
