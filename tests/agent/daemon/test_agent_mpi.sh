#!/bin/bash
# ina-agent over several ranks of an mpirun job (CPU): rank 0 serves, the others follow.
#   1. --ep on 2 ranks (tiny model) and --tp 2 --ep on 4 ranks (a 4-head fixture), and
#      the same with attention DP (--attention-dp on 2 ranks of tiny, --tp 2 --ep 2 --dp 2
#      on the fixture's 4 ranks): the
#      streams of `ina generate --server` equal `ina generate` on one rank; health is
#      SERVING; node info lists every rank, says whether attention DP is on and names the
#      MoE exchange (dispatch under attention DP, all-gather otherwise), and two-batch
#      overlap (on 2 ranks of tiny with --two-batch-overlap) when it is on; SIGTERM
#      to rank 0 drains, every rank exits and mpirun returns 0.
#      While streams run, two random placements with redundant experts move experts
#      between the ranks (ina place): the streams still equal one rank's.
#      Two nodes emulated (INA_RANKS_PER_NODE=1): node 1's local rank 0 serves that
#      node's Node service, each node listing its own ranks.
#      Degrees that are not the layout's (--ep 3 or --dp 3 on 2 ranks) are refused before
#      serving, naming the numbers.
#   2. An idle follower takes under 5 % of a core (it waits without spinning), and so
#      does an idle leader (its heartbeat and idle steps).
# Faults (a rank stopped or killed) are test_agent_faults.sh's.
# usage: test_agent_mpi.sh MPIEXEC INA_AGENT INA FIXTURE_DIR
set -u
mpiexec=$1 agent=$2 ina=$3 fixture=$4
tmp=$(mktemp -d)
# Only this test's own processes: every job here has its token file (in its own $tmp) on
# its command line. "$agent --" also matched other tests' agents and launchers running
# beside it under ctest -j, and killed them (test_deploy_launch's job, with status 137).
trap 'pkill -KILL -f -- "$tmp/token" 2>/dev/null; rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
echo "admin-$RANDOM" >"$tmp/token"
failed=0
fail() { echo "FAIL: $*"; [ -f "$tmp/log" ] && grep -v -i -e pmix -e Perhaps "$tmp/log" | tail -20; failed=1; }

# start NP ARGS...: mpirun in the background; waits for "serving"; sets port, pid0, pid1
start() {
  local np=$1; shift
  rm -f "$tmp/log"
  ("$mpiexec" --oversubscribe -np "$np" "$agent" --admin-token-file "$tmp/token" "$@" >"$tmp/log" 2>&1; echo "mpirun rc=$?" >>"$tmp/log") &
  for _ in $(seq 300); do grep -q -e "serving$" -e "mpirun rc" "$tmp/log" 2>/dev/null && break; sleep 0.1; done
  port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$tmp/log" | grep -o "[0-9]*$")
  pid0=$(grep -o "rank 0 of .*(pid [0-9]*)" "$tmp/log" | grep -o "[0-9]*)" | tr -d ')')
  pid1=$(grep -o "rank 1 of .*(pid [0-9]*)" "$tmp/log" | grep -o "[0-9]*)" | tr -d ')')
  [ -n "$port" ] && [ -n "$pid0" ] && [ -n "$pid1" ] && grep -q "serving$" "$tmp/log"
}

# ended SECONDS: waits up to SECONDS for mpirun to return; prints its status
ended() {
  for _ in $(seq $(($1 * 10))); do grep -q "mpirun rc" "$tmp/log" && break; sleep 0.1; done
  grep -o "mpirun rc=[0-9]*" "$tmp/log" | grep -o "[0-9]*$"
}

# moved_under_load NP MODEL: applies two random placements (redundant replicas, experts
# moving between ranks) while streams run; every stream must equal one rank's.
moved_under_load() {
  local np=$1 model=$2 server=127.0.0.1:$port
  local args=(--prompt-ids 3,1,4,1,5 --prompt-ids 9,2,6 --max-new-tokens 40 --ignore-eos)
  local want; want=$("$ina" generate --model "$model" --device cpu "${args[@]}" | grep '^prompt ')
  for round in 1 2; do
    "$ina" generate --server "$server" "${args[@]}" >"$tmp/stream$round" 2>&1 &
    local gen=$!
    "$ina" place --server "$server" --show >"$tmp/shown.json" 2>&1
    python3 "$here/random_placement.py" "$tmp/shown.json" "$tmp/new.json" "$RANDOM" ||
      { fail "cannot make a random placement"; wait "$gen"; return; }
    if "$ina" place --server "$server" --file "$tmp/new.json" --admin-token-file "$tmp/token" \
        >"$tmp/placed" 2>&1 && grep -q "generation $round -> $((round + 1))" "$tmp/placed" &&
        ! grep -q " 0 bytes of expert weights moved" "$tmp/placed"; then
      echo "ok: $np ranks: placement $((round + 1)) under load: $(cat "$tmp/placed")"
    else
      fail "$np ranks: placement $((round + 1)) under load: $(cat "$tmp/placed")"
    fi
    wait "$gen"
    if [ "$(grep '^prompt ' "$tmp/stream$round")" != "$want" ]; then
      fail "$np ranks: streams across placement $((round + 1)) differ from one rank's"
      cat "$tmp/stream$round"; echo "want:"; echo "$want"
    else
      echo "ok: $np ranks: streams across placement $((round + 1)) equal one rank's"
    fi
  done
}

serve_and_stop() { # MODEL NP FLAGS...
  local model=$1 np=$2; shift 2
  if ! start "$np" --model "$model" "$@"; then fail "$np ranks $* did not start serving"; return; fi
  local args=(--prompt-ids 1,2,3,4,5 --prompt-ids 7 --prompt-ids 9,8 --max-new-tokens 10 --ignore-eos)
  local want got
  want=$("$ina" generate --model "$model" --device cpu "${args[@]}" | grep '^prompt ')
  got=$("$ina" generate --server "127.0.0.1:$port" "${args[@]}" | grep '^prompt ')
  if [ -z "$want" ] || [ "$got" != "$want" ]; then
    fail "$np ranks $*: streams differ from one rank"; echo "$got"; echo "want:"; echo "$want"
  else
    echo "ok: $np ranks $* $(basename "$model"): streams equal one rank's"
  fi
  moved_under_load "$np" "$model"
  "$ina" health --server "127.0.0.1:$port" | grep -q SERVING || fail "health is not SERVING"
  local info; info=$("$ina" info --server "127.0.0.1:$port")
  grep -q "ranks: $np of world size $np" <<<"$info" || fail "ina info does not list $np ranks: $info"
  # Attention data parallelism is reported exactly when it is on.
  local dp_on=0; [[ " $* " == *" --attention-dp "* || " $* " == *" --dp "* ]] && dp_on=1
  if [ "$(grep -c "attention data parallel" <<<"$info")" != "$dp_on" ]; then
    fail "$np ranks $*: ina info reports attention data parallelism wrongly: $info"
  fi
  # ... and the MoE exchange: dispatch under attention DP, all-gather otherwise.
  local exchange=allgather; [ "$dp_on" = 1 ] && exchange=dispatch
  grep -q "expert-parallel exchange: $exchange" <<<"$info" ||
    fail "$np ranks $*: ina info does not report the $exchange exchange: $info"
  # ... and two-batch overlap exactly when it is on.
  local tbo=0; [[ " $* " == *" --two-batch-overlap "* ]] && tbo=1
  [ "$(grep -c "two-batch overlap" <<<"$info")" = "$tbo" ] ||
    fail "$np ranks $*: ina info reports two-batch overlap wrongly: $info"
  kill -TERM "$pid0"
  local rc; rc=$(ended 30)
  if [ "$rc" != "0" ] || ! grep -q "ina-agent: stopped" "$tmp/log"; then
    fail "$np ranks $*: SIGTERM to rank 0 ended with '${rc:-no exit}'"
  else
    echo "ok: $np ranks: drained and stopped"
  fi
}

serve_and_stop tiny 2 --ep
serve_and_stop "$fixture" 4 --tp 2 --ep
serve_and_stop tiny 2 --ep --attention-dp
serve_and_stop "$fixture" 4 --tp 2 --ep 2 --dp 2
serve_and_stop tiny 2 --ep --attention-dp --two-batch-overlap

# refused DEGREES...: 2 ranks of tiny with a degree they cannot take exit 2, naming it.
refused() {
  local out rc
  out=$("$mpiexec" --oversubscribe -np 2 "$agent" --model tiny "$@" 2>&1); rc=$?
  if [ "$rc" = "0" ] || ! grep -q "the ranks form 2 group(s)" <<<"$out"; then
    fail "2 ranks $*: not refused as expected (rc $rc): $(grep ina-agent <<<"$out")"
  else
    echo "ok: 2 ranks $*: refused"
  fi
}
refused --ep 3
refused --ep --dp 3

# Two nodes (INA_RANKS_PER_NODE=1 makes each rank a node of its own): rank 1, node 1's
# local rank 0, serves that node's Node service; each node lists its own ranks.
export INA_RANKS_PER_NODE=1
if start 2 --model tiny --ep; then
  node1=$(grep -o "node 1 (rank 1) serves its Node service on 127.0.0.1:[0-9]*" "$tmp/log" | grep -o "[0-9]*$")
  if [ -z "$node1" ]; then
    fail "rank 1 (node 1) serves no Node service"
  else
    info0=$("$ina" info --server "127.0.0.1:$port") info1=$("$ina" info --server "127.0.0.1:$node1")
    if grep -q "ranks: 1 of world size 2" <<<"$info0" && grep -q "  rank 0:" <<<"$info0" &&
       grep -q "ranks: 1 of world size 2" <<<"$info1" && grep -q "  rank 1:" <<<"$info1" &&
       "$ina" health --server "127.0.0.1:$node1" | grep -q SERVING &&
       "$ina" load --server "127.0.0.1:$node1" | grep -q "kv pages"; then
      echo "ok: 2 nodes: each node's Node service lists its own rank; node 1 healthy and loaded"
    else
      fail "2 nodes: node services: $info0 / $info1"
    fi
  fi
  kill -TERM "$pid0"
  rc=$(ended 30)
  [ "$rc" = "0" ] && echo "ok: 2 nodes: drained and stopped" || fail "2 nodes: SIGTERM to rank 0 ended with '${rc:-no exit}'"
else
  fail "2 nodes did not start serving"
fi
unset INA_RANKS_PER_NODE

# An idle follower waits for the leader's next step without spinning: its naps grow with
# the wait (1 % of it, at most 10 ms; comm/comm_mpi.c), so it takes about 1 % of a core
# (it took 11 % polling every millisecond); its heartbeat thread wakes every 20 ms for a
# few microseconds. The idle leader adds an empty step a second and its heartbeat's
# pings. Bound: 5 % of a core each, measured over 3 s of idle after 3 s.
if start 2 --model tiny --ep; then
  sleep 3
  f0=$(awk '{print $14 + $15}' "/proc/$pid1/stat") l0=$(awk '{print $14 + $15}' "/proc/$pid0/stat")
  sleep 3
  f1=$(awk '{print $14 + $15}' "/proc/$pid1/stat") l1=$(awk '{print $14 + $15}' "/proc/$pid0/stat")
  hz=$(getconf CLK_TCK)
  for who in follower leader; do
    if [ $who = follower ]; then used=$(((f1 - f0) * 100 / (3 * hz))); else used=$(((l1 - l0) * 100 / (3 * hz))); fi
    [ "$used" -lt 5 ] && echo "ok: an idle $who used ${used} % of a core" ||
      fail "an idle $who used ${used} % of a core (at most 5 %)"
  done
  kill -TERM "$pid0"
  rc=$(ended 30)
  [ "$rc" = "0" ] || fail "idle: SIGTERM to rank 0 ended with '${rc:-no exit}'"
else
  fail "idle: did not start serving"
fi

exit $failed
