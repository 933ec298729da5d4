# Checks shared by the shell tests that drive ina-agent and ina (sourced, not run):
#   fail MESSAGE...           records a failure (failed=1) and prints it
#   check WHAT RC PATTERN CMD  runs CMD (stdout and stderr into $tmp/out); wants exit
#                              status RC and, unless PATTERN is "", the fixed string
#                              PATTERN in the output
#   json WHAT SCRIPT ARGS...   runs a Python check (with $python) over JSON files; its
#                              assertions say why
# The sourcing script sets $tmp (a scratch folder) and, for json, $python; `failed`
# starts at 0 here.
failed=0
fail() { echo "FAIL: $*"; failed=1; }

check() {
  local what=$1 want_rc=$2 pattern=$3 rc
  shift 3
  "$@" >"$tmp/out" 2>&1
  rc=$?
  if [ "$rc" != "$want_rc" ] || { [ -n "$pattern" ] && ! grep -qF -- "$pattern" "$tmp/out"; }; then
    fail "$what: exit $rc (want $want_rc)${pattern:+, output should hold '$pattern'}"
    sed 's/^/  | /' "$tmp/out" | tail -20
  else
    echo "ok: $what"
  fi
}

json() {
  local what=$1 script=$2
  shift 2
  if "$python" -c "$script" "$@" >"$tmp/py" 2>&1; then
    echo "ok: $what"
  else
    fail "$what"
    sed 's/^/  | /' "$tmp/py" | tail -8
  fi
}
