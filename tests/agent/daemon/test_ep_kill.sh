#!/bin/bash
# kill -9 of one rank of an 8-rank expert-parallel job under load: mpirun -np 8 of the
# tiny model with --ep --attention-dp --ep-exchange dispatch on the CPU, where every rank
# routes its own tokens and each MoE layer exchanges them point to point with the ranks
# that hold their experts (so a dead rank is missed by a different set of peers each
# layer, not by one collective all ranks sit in). 8 streams run, each has its first
# token, then one rank is killed: REPEATS runs each killing a follower, a different one
# each run (ranks 1, 4, 7, 3, 6, 2, 5 in turn: the last rank comes third), and a third as
# many killing the leader (rank 0, which serves the streams). Each run checks, measured
# from the kill:
#   - every stream ends with an error status (neither success nor a hang), and the
#     mpirun job exits non-zero, within BOUND_S = INA_COMM_TIMEOUT_S + 10 s. Two things
#     can end the job: mpirun sees the rank die and takes the others down (about 2 s
#     on 2 cores), or an exchange that waits on the dead rank gives up after
#     INA_COMM_TIMEOUT_S (3 s here) and the leader fails the streams. The bound is the
#     slower of these plus 10 s for the drain, the streams' ends and the job's end, with
#     8 ranks sharing a few cores (slower still under the sanitizers);
#   - no process of the job is left afterwards: within 2 s of the job's end no ina-agent
#     with this test's token file on its command line runs (a rank blocked in an
#     exchange must not outlive mpirun);
#   - the job's log (all ranks' stdout and stderr) stays under 1 MB: the lines that
#     repeat while the ranks fail are rate-limited.
# Each run prints the killed rank and the measured seconds; the end prints the fastest
# and slowest.
# usage: test_ep_kill.sh MPIEXEC INA_AGENT INA REPEATS [RANK...]
#   RANK...: kill these ranks in turn, REPEATS runs in all, instead of the default order
set -u
if [ $# -lt 4 ] || ! [[ $4 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 MPIEXEC INA_AGENT INA REPEATS [RANK...]" >&2
  exit 2
fi
mpiexec=$1 agent=$2 ina=$3 repeats=$4
shift 4
nranks=8 streams=8 comm_timeout=3 heartbeat_timeout=1
BOUND_S=$((comm_timeout + 10))
LEFTOVER_MS=2000
victims=()
if [ $# -gt 0 ]; then
  for v in "$@"; do [[ $v =~ ^[0-7]$ ]] || { echo "$0: rank '$v' is not one of 0..$((nranks - 1))" >&2; exit 2; }; done
  for _ in $(seq "$repeats"); do victims+=("$1"); set -- "${@:2}" "$1"; done
else
  # Stride 3 over ranks 1..7 visits every follower once per 7 runs.
  for i in $(seq 0 $((repeats - 1))); do victims+=($((1 + (i * 3) % (nranks - 1)))); done
  for _ in $(seq $(((repeats + 2) / 3))); do victims+=(0); done
fi
tmp=$(mktemp -d)
# Only this test's own processes: every job here has this test's token file on its
# command line (other tests' agents may run beside it under ctest -j).
trap 'pkill -KILL -f -- "$tmp/token" 2>/dev/null; rm -rf "$tmp"' EXIT
echo "admin-$RANDOM" >"$tmp/token"
failed=0 runs=0
fail() { echo "FAIL: $*"; [ -f "$tmp/log" ] && grep -v -i -e pmix -e Perhaps "$tmp/log" | tail -20; failed=1; }
ms_now() { date +%s%3N; }
secs() { printf "%d.%03d" $(($1 / 1000)) $(($1 % 1000)); }

# start: mpirun in the background; waits for "serving"; sets port and pid[0..7]
start() {
  local r
  rm -f "$tmp/log"
  (INA_COMM_TIMEOUT_S=$comm_timeout "$mpiexec" --oversubscribe -np $nranks "$agent" --model tiny --ep --attention-dp \
     --ep-exchange dispatch --device cpu --threads 1 --admin-token-file "$tmp/token" \
     --heartbeat-timeout "$heartbeat_timeout" --drain-grace-ms 2000 >"$tmp/log" 2>&1
   echo "mpirun rc=$?" >>"$tmp/log") &
  # 8 ranks on a few cores (slower still under the sanitizers): up to 120 s to serve.
  for _ in $(seq 1200); do grep -q -e "serving$" -e "mpirun rc" "$tmp/log" 2>/dev/null && break; sleep 0.1; done
  port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$tmp/log" | grep -o "[0-9]*$")
  pid=()
  for r in $(seq 0 $((nranks - 1))); do
    pid[r]=$(grep -o "rank $r of [0-9]* .*(pid [0-9]*)" "$tmp/log" | grep -o "[0-9]*)" | tr -d ')' | head -1)
    [ -n "${pid[r]}" ] || return 1
  done
  [ -n "$port" ] && grep -q "serving$" "$tmp/log"
}

# run VICTIM: one run, killing rank VICTIM.
run() {
  local victim=$1 clients=() t0 k c rc ended=0 bytes took left job_end
  runs=$((runs + 1))
  local name="run $runs (kill rank $victim)"
  if ! start; then
    fail "$name: the job did not start serving"
    pkill -KILL -f -- "$tmp/token" 2>/dev/null
    for _ in $(seq 50); do grep -q "mpirun rc" "$tmp/log" && break; sleep 0.1; done
    return
  fi
  for k in $(seq $streams); do
    # 4000 tokens: the tiny model's context is 4096, and they take longer than the test
    "$ina" generate --server "127.0.0.1:$port" --prompt-ids "$k,2,3" --max-new-tokens 4000 --ignore-eos \
      >"$tmp/stream$k" 2>&1 &
    clients+=($!)
  done
  # The streams are under way: each has its first token, within 60 s.
  for _ in $(seq 600); do
    local waiting=0
    for k in $(seq $streams); do grep -q "^prompt 0: *[0-9]" "$tmp/stream$k" || waiting=1; done
    [ "$waiting" = 0 ] && break
    sleep 0.1
  done
  sleep 0.5
  t0=$(ms_now)
  kill -KILL "${pid[victim]}"
  # Each stream had tokens before the kill (else this run tests nothing).
  for k in $(seq $streams); do
    grep -q "^prompt 0: *[0-9]" "$tmp/stream$k" ||
      fail "$name: stream $k had no token before the kill: $(head -c 300 "$tmp/stream$k")"
  done
  # Every stream and the job end within the bound.
  while [ $(($(ms_now) - t0)) -lt $((BOUND_S * 1000)) ]; do
    local live=0
    for c in "${clients[@]}"; do kill -0 "$c" 2>/dev/null && live=1; done
    [ "$live" = 0 ] && grep -q "mpirun rc" "$tmp/log" && break
    sleep 0.1
  done
  took=$(($(ms_now) - t0)) job_end=$(ms_now)
  [ "$took" -lt $((BOUND_S * 1000)) ] ||
    fail "$name: the streams and the job had not all ended $(secs "$took") s after the kill (bound $BOUND_S s)"
  for k in $(seq $streams); do
    c=${clients[$((k - 1))]}
    if kill -0 "$c" 2>/dev/null; then
      kill -KILL "$c" 2>/dev/null
      wait "$c" 2>/dev/null
      fail "$name: stream $k still ran $BOUND_S s after the kill"
      continue
    fi
    wait "$c"
    local crc=$? last; last=$(tail -c 600 "$tmp/stream$k" | grep -o -e "finish: .*" -e "ina generate: .*" | tail -1)
    if [ "$crc" = 0 ]; then
      fail "$name: stream $k ended with status 0: $last"
    elif ! grep -q -e "finish: error" -e "^ina generate: " <<<"$last"; then
      fail "$name: stream $k ended without an error: $last"
    else
      ended=$((ended + 1))
      echo "$last" >"$tmp/last_$victim"
    fi
  done
  rc=$(grep -o "mpirun rc=[0-9]*" "$tmp/log" | grep -o "[0-9]*$")
  if [ -z "$rc" ]; then
    fail "$name: the job still ran $BOUND_S s after the kill"
    pkill -KILL -f -- "$tmp/token" 2>/dev/null
    for _ in $(seq 50); do grep -q "mpirun rc" "$tmp/log" && break; sleep 0.1; done
    job_end=$(ms_now)
  elif [ "$rc" = 0 ]; then
    fail "$name: the job exited with status 0"
  fi
  # No rank outlives the job (after a hung job was killed above, this checks that too).
  while left=$(pgrep -f -- "$tmp/token"); [ -n "$left" ] && [ $(($(ms_now) - job_end)) -lt $LEFTOVER_MS ]; do sleep 0.1; done
  if [ -n "$left" ]; then
    fail "$name: processes of the job still ran $LEFTOVER_MS ms after it ended: $(ps -o pid=,stat=,args= -p "$(tr '\n' ',' <<<"$left" | sed 's/,$//')" | cut -c 1-160)"
    pkill -KILL -f -- "$tmp/token" 2>/dev/null
  fi
  bytes=$(wc -c <"$tmp/log")
  [ "$bytes" -lt 1048576 ] || fail "$name: the job logged $bytes bytes"
  echo "$took" >>"$tmp/took"
  [ "${INA_TEST_VERBOSE:-0}" = 1 ] && { grep -v "^prompt\|^ *[0-9]" "$tmp/stream1" | tail -3; grep -v -i pmix "$tmp/log"; }
  local end="streams and job ended"
  [ "$took" -lt $((BOUND_S * 1000)) ] || end="streams and job not all ended"
  echo "$name: job status ${rc:-none}, $ended of $streams streams ended with an error; $end $(secs "$took") s after the kill" \
       "(bound $BOUND_S s); $bytes bytes of log; a stream's end: $(cat "$tmp/last_$victim" 2>/dev/null)"
}

for v in "${victims[@]}"; do run "$v"; done
if [ -f "$tmp/took" ]; then
  echo "end after the kill: fastest $(secs "$(sort -n "$tmp/took" | head -1)") s, slowest" \
       "$(secs "$(sort -n "$tmp/took" | tail -1)") s of $(wc -l <"$tmp/took") runs (bound $BOUND_S s)"
fi
[ "$failed" = 0 ] && echo "test_ep_kill: $runs runs passed" || echo "test_ep_kill: FAILED"
exit $failed
