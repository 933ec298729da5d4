#!/bin/bash
# ina-agent under faults: mpirun -np 2 (the tiny model, --ep, on the CPU) with 8 streams
# running, then one fault, REPEATS times for each kind:
#   stop-follower  SIGSTOP of rank 1       stop-leader  SIGSTOP of rank 0
#   kill-follower  kill -9 of rank 1       kill-leader  kill -9 of rank 0
# and, a third as many times, the first two with --attention-dp, whose MoE layers run
# the dispatch exchange (stop-follower-dispatch, kill-follower-dispatch).
# Each time:
#   - every stream ends with an error status, and the job exits non-zero, within BOUND_S
#     of the fault: INA_COMM_TIMEOUT_S (3 s here) for the collective that waits on the
#     silent rank, plus the drain and the job's end (a few seconds);
#   - the job's log (both ranks' stdout and stderr) stays under 1 MB: every line that can
#     repeat is rate-limited (a failed step used to log 10^5 lines a second);
#   - with a follower stopped, health turns NOT_SERVING, naming rank 1, within
#     HEALTH_BOUND_MS of the stop, before the collective timeout; a new Generate is then
#     refused with UNAVAILABLE. The bound: the heartbeat timeout (1 s here), plus one
#     liveness check (a tenth of it), plus up to 0.9 s for the liveness thread and the
#     health service to be scheduled on a loaded 2-core machine. What is checked against
#     it is the agent's moment, not the client's: the transition lies after the start of
#     the latest `ina health` call that still answered SERVING, so a SERVING answer to a
#     call begun past the bound is late for certain, whatever the client's own start-up
#     and connect took (on a loaded machine that alone has passed a second). A run whose
#     client got no answer before the job ended reads the agent's own log line of the
#     transition instead (the heartbeat's age then); the client must see it in most runs.
# usage: test_agent_faults.sh MPIEXEC INA_AGENT INA REPEATS [KIND...]  (default: every kind)
set -u
mpiexec=$1 agent=$2 ina=$3 repeats=$4
shift 4
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(stop-follower stop-leader kill-follower kill-leader stop-follower-dispatch
                                 kill-follower-dispatch)
comm_timeout=3 heartbeat_timeout=1 streams=8
BOUND_S=$((comm_timeout + 7))
HEALTH_BOUND_MS=2000
tmp=$(mktemp -d)
# Only this test's own processes: every job here has this test's token file on its
# command line (other tests' agents may run beside it under ctest -j).
trap 'pkill -KILL -f -- "$tmp/token" 2>/dev/null; rm -rf "$tmp"' EXIT
echo "admin-$RANDOM" >"$tmp/token"
failed=0 runs=0
fail() { echo "FAIL: $*"; [ -f "$tmp/log" ] && grep -v -i -e pmix -e Perhaps "$tmp/log" | tail -20; failed=1; }
ms_now() { date +%s%3N; }

# start [FLAGS...]: mpirun in the background; waits for "serving"; sets port, pid0, pid1
start() {
  rm -f "$tmp/log"
  (INA_COMM_TIMEOUT_S=$comm_timeout "$mpiexec" --oversubscribe -np 2 "$agent" --model tiny --ep "$@" --device cpu \
     --threads 1 --admin-token-file "$tmp/token" --heartbeat-timeout "$heartbeat_timeout" \
     --drain-grace-ms 2000 >"$tmp/log" 2>&1
   echo "mpirun rc=$?" >>"$tmp/log") &
  for _ in $(seq 600); do grep -q -e "serving$" -e "mpirun rc" "$tmp/log" 2>/dev/null && break; sleep 0.1; done
  port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$tmp/log" | grep -o "[0-9]*$")
  pid0=$(grep -o "rank 0 of .*(pid [0-9]*)" "$tmp/log" | grep -o "[0-9]*)" | tr -d ')')
  pid1=$(grep -o "rank 1 of .*(pid [0-9]*)" "$tmp/log" | grep -o "[0-9]*)" | tr -d ')')
  [ -n "$port" ] && [ -n "$pid0" ] && [ -n "$pid1" ] && grep -q "serving$" "$tmp/log"
}

# health_turns KIND T0: with rank 1 stopped at T0 (ms), polls `ina health` until it says
# NOT_SERVING naming rank 1. The agent turned between the start of the latest call that
# answered SERVING and the end of the first that answered NOT_SERVING; the start is
# checked against HEALTH_BOUND_MS, and both are recorded. Then checks that Generate is
# refused with UNAVAILABLE.
health_turns() {
  local kind=$1 t0=$2 out call_start serving_ms=0 seen=
  while [ $(($(ms_now) - t0)) -lt $((comm_timeout * 1000)) ]; do
    call_start=$(($(ms_now) - t0))
    out=$("$ina" health --server "127.0.0.1:$port" --timeout-ms 500 2>&1)
    if grep -q "NOT_SERVING" <<<"$out" && grep -q "rank 1 has not answered the heartbeat" <<<"$out"; then
      seen=$(($(ms_now) - t0))
      break
    fi
    # Only an answer that says SERVING bounds the moment; a call that timed out says nothing.
    grep -q "^health: SERVING$" <<<"$out" && serving_ms=$call_start
    sleep 0.05
  done
  if [ -z "$seen" ]; then
    # The client got no answer in the window the job lives on (each `ina health` is a
    # process start and two calls; on loaded cores they can all miss it). The agent's own
    # log line at the transition then tells when it turned: the heartbeat's age then,
    # which counts from the follower's last answer, before the stop.
    local age
    age=$(grep -o "rank 1 has not answered the heartbeat for [0-9.]* s: NOT_SERVING" "$tmp/log" | head -1 |
          grep -o "[0-9.]* s" | tr -d ' s')
    if [ -z "$age" ]; then
      fail "$kind: health did not turn NOT_SERVING within the collective timeout (nor did the agent log it): $out"
      return
    fi
    local age_ms
    age_ms=$(python3 -c "print(round($age * 1000))")
    [ "$age_ms" -le "$HEALTH_BOUND_MS" ] ||
      fail "$kind: the agent turned NOT_SERVING with the heartbeat ${age_ms} ms old (bound ${HEALTH_BOUND_MS} ms)"
    [ "$serving_ms" -le "$HEALTH_BOUND_MS" ] ||
      fail "$kind: health still answered SERVING to a call begun ${serving_ms} ms after the stop (bound ${HEALTH_BOUND_MS} ms)"
    echo "$kind: no health answer reached the client in time; the agent logged NOT_SERVING at heartbeat age ${age_ms} ms"
    echo "x" >>"$tmp/health_unseen"
    return
  fi
  [ "$serving_ms" -le "$HEALTH_BOUND_MS" ] ||
    fail "$kind: health still answered SERVING to a call begun ${serving_ms} ms after the stop (bound ${HEALTH_BOUND_MS} ms)"
  out=$("$ina" generate --server "127.0.0.1:$port" --prompt-ids 1,2 --max-new-tokens 2 2>&1)
  grep -q "UNAVAILABLE" <<<"$out" || fail "$kind: Generate with rank 1 silent was not refused UNAVAILABLE: $out"
  echo "$serving_ms $seen" >>"$tmp/health_ms"
}

# fault KIND: one run.
fault() {
  local kind=$1 victim signal clients=() t0 k c rc ended=0 bytes flags=()
  runs=$((runs + 1))
  [[ $kind == *-dispatch ]] && flags=(--attention-dp --ep-exchange dispatch)
  if ! start "${flags[@]}"; then fail "$kind: the job did not start serving"; return; fi
  case ${kind%-dispatch} in
    stop-follower) victim=$pid1 signal=STOP ;;
    stop-leader) victim=$pid0 signal=STOP ;;
    kill-follower) victim=$pid1 signal=KILL ;;
    kill-leader) victim=$pid0 signal=KILL ;;
    *) fail "unknown kind '$kind'"; kill -TERM "$pid0"; return ;;
  esac
  for k in $(seq $streams); do
    # 4000 tokens: the tiny model's context is 4096, and they take longer than the test
    "$ina" generate --server "127.0.0.1:$port" --prompt-ids "$k,2,3" --max-new-tokens 4000 --ignore-eos \
      >"$tmp/stream$k" 2>&1 &
    clients+=($!)
  done
  # The streams are under way: each has its first token (a second here; longer under the
  # sanitizers), within 30 s.
  for _ in $(seq 300); do
    local waiting=0
    for k in $(seq $streams); do grep -q "^prompt 0: *[0-9]" "$tmp/stream$k" || waiting=1; done
    [ "$waiting" = 0 ] && break
    sleep 0.1
  done
  sleep 0.5
  t0=$(ms_now)
  kill -"$signal" "$victim"
  # Each stream had tokens before the fault (else this run tests nothing).
  for k in $(seq $streams); do
    grep -q "^prompt 0: *[0-9]" "$tmp/stream$k" || fail "$kind: stream $k had no token before the fault: $(head -c 300 "$tmp/stream$k")"
  done
  [ "${kind%-dispatch}" = stop-follower ] && health_turns "$kind" "$t0"
  # Every stream and the job end within the bound.
  while [ $(($(ms_now) - t0)) -lt $((BOUND_S * 1000)) ]; do
    local live=0
    for c in "${clients[@]}"; do kill -0 "$c" 2>/dev/null && live=1; done
    [ "$live" = 0 ] && grep -q "mpirun rc" "$tmp/log" && break
    sleep 0.1
  done
  local took=$(($(ms_now) - t0))
  kill -KILL "$victim" 2>/dev/null
  for k in $(seq $streams); do
    c=${clients[$((k - 1))]}
    if kill -0 "$c" 2>/dev/null; then
      kill -KILL "$c" 2>/dev/null
      wait "$c" 2>/dev/null
      fail "$kind: stream $k still ran ${BOUND_S} s after the fault"
      continue
    fi
    wait "$c"
    local crc=$? last; last=$(tail -c 600 "$tmp/stream$k" | grep -o -e "finish: .*" -e "ina generate: .*" | tail -1)
    if [ "$crc" = 0 ]; then
      fail "$kind: stream $k ended with status 0: $last"
    elif [ "${kind%-dispatch}" = stop-follower ] && ! grep -q "finish: error.*timed out" <<<"$last"; then
      # The leader is alive: it fails the stream itself, naming the collective that timed out.
      fail "$kind: stream $k did not end with an error naming the timeout: $last"
    elif ! grep -q -e "finish: error" -e "^ina generate: " <<<"$last"; then
      fail "$kind: stream $k ended without an error: $last"
    else
      ended=$((ended + 1))
      echo "$last" >"$tmp/last_$kind"
    fi
  done
  rc=$(grep -o "mpirun rc=[0-9]*" "$tmp/log" | grep -o "[0-9]*$")
  if [ -z "$rc" ]; then
    fail "$kind: the job still ran ${BOUND_S} s after the fault"
    pkill -KILL -f -- "$tmp/token" 2>/dev/null
    for _ in $(seq 50); do grep -q "mpirun rc" "$tmp/log" && break; sleep 0.1; done
  elif [ "$rc" = 0 ]; then
    fail "$kind: the job exited with status 0"
  fi
  bytes=$(wc -c <"$tmp/log")
  [ "$bytes" -lt 1048576 ] || fail "$kind: the job logged $bytes bytes"
  echo "$took" >>"$tmp/took_$kind"
  [ "${INA_TEST_VERBOSE:-0}" = 1 ] && { grep -v "^prompt\|^ *[0-9]" "$tmp/stream1" | tail -3; grep -v -i pmix "$tmp/log"; }
  echo "$kind: job status ${rc:-none}, $ended of $streams streams ended with an error, all within ${took} ms; $bytes bytes of log"
}

for kind in "${kinds[@]}"; do
  n=$repeats
  [[ $kind == *-dispatch ]] && n=$(((repeats + 2) / 3))
  for _ in $(seq "$n"); do fault "$kind"; done
  # The slowest run of each kind, and the health times, for the record.
  echo "ok: $kind: $n runs, slowest end $(sort -n "$tmp/took_$kind" | tail -1) ms after the fault (bound $((BOUND_S * 1000)) ms); a stream's end: $(cat "$tmp/last_$kind" 2>/dev/null)"
done
# The client must see the transition itself in most runs, or the checks above test little.
if [ -f "$tmp/health_unseen" ]; then
  unseen=$(wc -l <"$tmp/health_unseen") seen_runs=$(cat "$tmp/health_ms" 2>/dev/null | wc -l)
  [ "$unseen" -le "$seen_runs" ] ||
    fail "health: the client saw the NOT_SERVING turn in only $seen_runs of $((seen_runs + unseen)) runs"
fi
[ -f "$tmp/health_ms" ] &&
  echo "health NOT_SERVING after a follower stopped, $(wc -l <"$tmp/health_ms") runs: latest SERVING answer to a call begun at most $(cut -d' ' -f1 "$tmp/health_ms" | sort -n | tail -1) ms after the stop (bound $HEALTH_BOUND_MS ms); NOT_SERVING seen by the client at most $(cut -d' ' -f2 "$tmp/health_ms" | sort -n | tail -1) ms after it"
[ "$failed" = 0 ] && echo "test_agent_faults: $runs runs passed" || echo "test_agent_faults: FAILED"
exit $failed
