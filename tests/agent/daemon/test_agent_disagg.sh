#!/bin/bash
# Prefill/decode disaggregation on 127.0.0.1, on the CPU: a prefill agent (--role
# prefill) and a decode agent (--role decode --prefill-agent) against one plain agent
# (--role both) over the same requests.
#   equal:    32 concurrent requests of mixed prompt lengths (1 token to several pages;
#             half share a 48-token prefix, sent again in a second wave so the decode
#             agent's prefix cache holds it), greedy and seeded sampling: every stream
#             from the decode agent equals the plain agent's, for page sizes (prefill,
#             decode) = (16, 16), (1, 16), (16, 1); the second wave's shared prompts
#             report cached tokens; afterwards both agents hold only prefix-cache pages
#             and none in transfers. Then 8 requests on a V3 checkpoint fixture.
#   tp:       a prefill agent of two tensor-parallel ranks (mpirun, a 4-head V3 fixture)
#             with a one-rank decode agent: equal streams (MLA's latent cache is the same
#             on every TP rank, so rank 0's pages are the prompt's).
#   refused:  a decode agent whose prefill agent serves other weights, or another model,
#             or that runs on two ranks, does not start, and says why.
#   faults:   kill -9 of the prefill agent mid-transfer (its puts held back by the test
#             hook INA_TEST_KV_STALL_MS); kill -9 of the decode agent mid-transfer; a
#             transfer stalled past its timeout. Each time the client gets an error (not a
#             hang), the surviving agent keeps serving (a new request succeeds), and its
#             pages come back: idle, it uses only prefix-cache pages and none in transfers.
# With DISAGG_DEVICE=cuda the agents run on the GPU (one device for all): the hand-off
# then stages the device cache through UCX's host mirror. The GPU's rounding may depend
# on the batch and on how much of a prompt came from a prefix cache, so there requests
# run one at a time, and the prefill agent and the plain one keep no prefix cache (every
# entry either computes is a whole prompt's prefill); the decode agent keeps its own. The
# tensor-parallel part is left out there (it needs a GPU per rank).
# usage: [DISAGG_DEVICE=cpu|cuda] test_agent_disagg.sh INA_AGENT INA MPIEXEC V3_FIXTURE
set -u
agent=$1 ina=$2 mpiexec=$3 fixture=$4
device=${DISAGG_DEVICE:-cpu}
if [ "$device" != cpu ] && ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  if [ -n "${INA_REQUIRE_GPU:-}" ] && [ "${INA_REQUIRE_GPU}" != 0 ]; then
    echo "test_agent_disagg: FAILED: would skip (no GPU visible), and INA_REQUIRE_GPU is set"
    exit 1
  fi
  echo "test_agent_disagg: skipped (no GPU visible for DISAGG_DEVICE=$device)"
  exit 77
fi
tmp=$(mktemp -d)
# Every process this test starts is listed in $tmp/pids (mpirun takes its ranks along).
trap 'xargs -r kill -KILL <"$tmp/pids" 2>/dev/null; rm -rf "$tmp"' EXIT
: >"$tmp/pids"
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# start NAME ARGS...: an agent in the background, its log $tmp/NAME.log; waits for
# "serving"; sets port_NAME and pid_NAME.
start() {
  local name=$1
  shift
  rm -f "$tmp/$name.log"
  "$@" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >>"$tmp/pids"
  for _ in $(seq 600); do
    grep -q "serving$" "$tmp/$name.log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "serving$" "$tmp/$name.log"; then
    fail "$name did not start serving: $(tail -5 "$tmp/$name.log")"
    return 1
  fi
  eval "port_$name=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$tmp/$name.log" | head -1 | grep -o '[0-9]*$')"
  eval "pid_$name=$pid"
}
stop() { # stop NAME: SIGTERM (to rank 0 of an mpirun job), and it must exit 0
  local pid rank0
  eval "pid=\$pid_$1"
  rank0=$(grep -o "rank 0 of .*(pid [0-9]*)" "$tmp/$1.log" | grep -o "[0-9]*)" | tr -d ')')
  kill -TERM "${rank0:-$pid}" 2>/dev/null
  wait "$pid"
  local rc=$?
  [ "$rc" = 0 ] || fail "$1 exited $rc after SIGTERM: $(tail -5 "$tmp/$1.log")"
}

# The requests: prompt I's ids, and its sampling flags.
prompt_of() {
  local i=$1 len shared=
  case $((i % 8)) in
    0) len=1 ;; 1) len=5 ;; 2) len=17 ;; 3) len=40 ;; 4) len=64 ;; 5) len=100 ;; 6) len=150 ;; *) len=300 ;;
  esac
  [ $((i % 2)) = 1 ] && [ "$len" -gt 48 ] && shared=1
  python3 -c "
import random
i, n, shared = $i, $len, ${shared:-0}
r = random.Random(1000 + i)
p = [random.Random(7 * k + 3).randrange(1, 1000) for k in range(48)] if shared else []
print(','.join(str(x) for x in (p + [r.randrange(1, 1000) for _ in range(n - len(p))])))"
}
sampling_of() { [ $(($1 % 3)) = 2 ] && echo "--temperature 0.8 --top-p 0.9 --seed $((500 + $1))"; }

# run_wave PORT OUT FIRST LAST [MAX_NEW]: requests FIRST..LAST concurrently (one at a time
# on the GPU); OUT.I holds each output.
run_wave() {
  local port=$1 out=$2 first=$3 last=$4 max_new=${5:-12} pids=()
  for i in $(seq "$first" "$last"); do
    # shellcheck disable=SC2046
    "$ina" generate --server "127.0.0.1:$port" --prompt-ids "$(cat "$tmp/prompt.$i")" --max-new-tokens "$max_new" \
      --ignore-eos $(sampling_of "$i") --request-id "req-$i-$RANDOM" >"$out.$i" 2>&1 &
    pids+=($!)
    [ "$device" = cpu ] || wait "$!"
  done
  for p in "${pids[@]}"; do wait "$p"; done
}

# idle_pages NAME: after a moment, the agent uses only prefix-cache pages, none in transfers.
idle_pages() {
  local name=$1 port j used cached transfer
  eval "port=\$port_$name"
  for _ in $(seq 100); do
    j=$("$ina" load --server "127.0.0.1:$port" --json 2>/dev/null)
    used=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d['kv_pages_used'], d['kv_pages_cached'], d['kv_pages_transfer'], d['queued_requests'] + d['running_requests'])" "$j" 2>/dev/null)
    # shellcheck disable=SC2086
    set -- $used
    [ $# = 4 ] && [ "$1" = "$2" ] && [ "$3" = 0 ] && [ "$4" = 0 ] && return 0
    sleep 0.2
  done
  fail "$name: pages not back to baseline after 20 s: used, cached, in transfers, requests = ${used:-no answer}"
}

for i in $(seq 0 31); do prompt_of "$i" >"$tmp/prompt.$i"; done
cmp_waves() { # cmp_waves WHAT A B FIRST LAST
  local what=$1 a=$2 b=$3 n=0
  for i in $(seq "$4" "$5"); do
    local x y
    x=$(grep "^prompt 0:" "$a.$i") y=$(grep "^prompt 0:" "$b.$i")
    if [ -z "$x" ] || [ "$x" != "$y" ]; then
      fail "$what: request $i: decode side '$x' ($(tail -1 "$a.$i")) vs one agent '$y'"
    else
      n=$((n + 1))
    fi
  done
  echo "$what: $n requests equal"
}

common=(--device "$device" --threads 1 --listen 127.0.0.1:0 --max-tokens 8192)
same_rounding=()
[ "$device" = cpu ] || same_rounding=(--prefix-cache-pages 0)

# ---- equal streams over three page-size pairs ------------------------------------------
for pair in "16 16" "1 16" "16 1"; do
  read -r pp dp <<<"$pair"
  start P "$agent" --model tiny "${common[@]}" "${same_rounding[@]}" --role prefill --page-size "$pp" || continue
  start D "$agent" --model tiny "${common[@]}" --role decode --page-size "$dp" --prefill-agent "127.0.0.1:$port_P" || continue
  start B "$agent" --model tiny "${common[@]}" "${same_rounding[@]}" --page-size "$dp" || continue
  run_wave "$port_D" "$tmp/d1" 0 31
  run_wave "$port_D" "$tmp/d2" 0 31 # the shared prefixes are in the decode agent's cache now
  run_wave "$port_B" "$tmp/b" 0 31
  cmp_waves "pages $pp -> $dp, wave 1" "$tmp/d1" "$tmp/b" 0 31
  cmp_waves "pages $pp -> $dp, wave 2" "$tmp/d2" "$tmp/b" 0 31
  hits=0
  for i in $(seq 0 31); do grep -q "([1-9][0-9]* cached)" "$tmp/d2.$i" && hits=$((hits + 1)); done
  [ "$hits" -ge 4 ] || fail "pages $pp -> $dp: only $hits requests of the second wave reused the decode agent's prefix cache"
  echo "pages $pp -> $dp: $hits requests of the second wave started from the decode agent's prefix cache"
  idle_pages D
  idle_pages P
  stop D
  stop P
  stop B
done

# ---- a V3 checkpoint -------------------------------------------------------------------
if start P "$agent" --model "$fixture" "${common[@]}" --role prefill &&
   start D "$agent" --model "$fixture" "${common[@]}" --role decode --prefill-agent "127.0.0.1:$port_P" &&
   start B "$agent" --model "$fixture" "${common[@]}"; then
  vocab=$(python3 -c "import json; print(json.load(open('$fixture/config.json'))['vocab_size'])")
  for i in $(seq 0 7); do
    python3 -c "import random; r = random.Random($i); print(','.join(str(r.randrange($vocab)) for _ in range(1 + 23 * $i)))" \
      >"$tmp/prompt.$((100 + i))"
  done
  run_wave "$port_D" "$tmp/vd" 100 107 6
  run_wave "$port_B" "$tmp/vb" 100 107 6
  cmp_waves "V3 fixture" "$tmp/vd" "$tmp/vb" 100 107
  idle_pages D
  stop D
  stop P
  stop B
fi

# ---- a tensor-parallel prefill agent ----------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tp_fixture=$(dirname "$fixture")/v3_mscale
if [ "$device" != cpu ]; then
  echo "prefill TP 2 -> decode TP 1: left out on $device"
elif start P "$mpiexec" --oversubscribe -np 2 "$agent" --model "$tp_fixture" "${common[@]}" --tp 2 --role prefill &&
   start D "$agent" --model "$tp_fixture" "${common[@]}" --role decode --prefill-agent "127.0.0.1:$port_P" &&
   start B "$agent" --model "$tp_fixture" "${common[@]}"; then
  vocab=$(python3 -c "import json; print(json.load(open('$tp_fixture/config.json'))['vocab_size'])")
  for i in $(seq 0 7); do
    python3 -c "import random; r = random.Random(50 + $i); print(','.join(str(r.randrange($vocab)) for _ in range(2 + 19 * $i)))" \
      >"$tmp/prompt.$((200 + i))"
  done
  run_wave "$port_D" "$tmp/td" 200 207 6
  run_wave "$port_B" "$tmp/tb" 200 207 6
  cmp_waves "prefill TP 2 -> decode TP 1" "$tmp/td" "$tmp/tb" 200 207
  stop D
  stop P
  stop B
fi

# ---- refused pairings -------------------------------------------------------------------
# refused WHAT PATTERN ARGS...: the decode agent must exit non-zero saying PATTERN.
refused() {
  local what=$1 pattern=$2
  shift 2
  timeout 60 "$@" >"$tmp/R.log" 2>&1
  local rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q -- "$pattern" "$tmp/R.log"; then
    fail "$what: exit $rc, expected a refusal naming '$pattern': $(tail -3 "$tmp/R.log")"
  else
    echo "$what: refused: $(grep -m1 -- "$pattern" "$tmp/R.log")"
  fi
}
# Refusals come before any device work: on the CPU whatever DISAGG_DEVICE says.
common=(--device cpu --threads 1 --listen 127.0.0.1:0 --max-tokens 8192)
if start P "$agent" --model tiny "${common[@]}" --role prefill; then
  refused "other weights" "serves model" "$agent" --model tiny --model-seed 1 "${common[@]}" --role decode \
    --prefill-agent "127.0.0.1:$port_P"
  refused "another model" "cannot pair" "$agent" --model random:v3.2-tiny "${common[@]}" --role decode \
    --prefill-agent "127.0.0.1:$port_P"
  refused "a decode agent of two ranks" "one rank" "$mpiexec" --oversubscribe -np 2 "$agent" --model tiny \
    "${common[@]}" --ep 2 --role decode --prefill-agent "127.0.0.1:$port_P"
  stop P
fi
refused "no prefill agent named" "needs --prefill-agent" "$agent" --model tiny "${common[@]}" --role decode

# ---- faults -----------------------------------------------------------------------------
common=(--device "$device" --threads 1 --listen 127.0.0.1:0 --max-tokens 8192)
# one_request PORT OUT: a short request that must succeed.
# one_request PORT OUT: a short request that must succeed, within 5 tries a second apart
# (a restarted prefill agent is reached again after a reconnect).
one_request() {
  for _ in 1 2 3 4 5; do
    "$ina" generate --server "127.0.0.1:$1" --prompt-ids 5,6,7,8,9 --max-new-tokens 3 >"$2" 2>&1 && return 0
    sleep 1
  done
  fail "a request after the fault failed: $(tail -2 "$2")"
}
# expect_errors WHAT OUT FIRST LAST SECONDS: the wave in the background (wave_pid) ended
# within SECONDS, each client with an error.
expect_errors() {
  local what=$1 out=$2 t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$5" ] && kill -0 "$wave_pid" 2>/dev/null; do sleep 0.2; done
  if kill -0 "$wave_pid" 2>/dev/null; then
    fail "$what: the clients still waited $5 s after the fault"
    pkill -KILL -P "$wave_pid" 2>/dev/null
  fi
  wait "$wave_pid" 2>/dev/null
  for i in $(seq "$3" "$4"); do
    if grep -q "^finish: length" "$out.$i"; then
      fail "$what: request $i succeeded"
    elif ! grep -q -e "finish: error" -e "ina generate: " "$out.$i"; then
      fail "$what: request $i did not end with an error: $(tail -2 "$out.$i")"
    fi
  done
  echo "$what: requests $3..$4 ended with errors, e.g. $(grep -h -o -e 'finish: error.*' -e 'ina generate: .*' "$out.$3" | head -1 | cut -c1-200)"
}
bg_wave() {
  run_wave "$@" &
  wave_pid=$!
}

# kill -9 of the prefill agent mid-transfer.
if INA_TEST_KV_STALL_MS=5000 start P "$agent" --model tiny "${common[@]}" --role prefill &&
   start D "$agent" --model tiny "${common[@]}" --role decode --prefill-agent "127.0.0.1:$port_P" \
     --kv-transfer-timeout-ms 3000; then
  bg_wave "$port_D" "$tmp/k1" 3 6
  sleep 1
  kill -KILL "$pid_P"
  expect_errors "prefill agent killed" "$tmp/k1" 3 6 20
  idle_pages D
  INA_TEST_KV_STALL_MS=0 start P "$agent" --model tiny --device "$device" --threads 1 --max-tokens 8192 \
    --listen "127.0.0.1:$port_P" --role prefill && one_request "$port_D" "$tmp/k1.after"
  stop D
  stop P
fi

# kill -9 of the decode agent mid-transfer.
if INA_TEST_KV_STALL_MS=1500 start P "$agent" --model tiny "${common[@]}" --role prefill &&
   start D "$agent" --model tiny "${common[@]}" --role decode --prefill-agent "127.0.0.1:$port_P"; then
  bg_wave "$port_D" "$tmp/k2" 3 6
  sleep 0.7
  kill -KILL "$pid_D"
  expect_errors "decode agent killed" "$tmp/k2" 3 6 20
  idle_pages P
  start D "$agent" --model tiny "${common[@]}" --role decode --prefill-agent "127.0.0.1:$port_P" &&
    one_request "$port_D" "$tmp/k2.after"
  stop D
  stop P
fi

# A transfer stalled past its timeout.
if INA_TEST_KV_STALL_MS=2500 start P "$agent" --model tiny "${common[@]}" --role prefill &&
   start D "$agent" --model tiny "${common[@]}" --role decode --prefill-agent "127.0.0.1:$port_P" \
     --kv-transfer-timeout-ms 1000; then
  bg_wave "$port_D" "$tmp/s" 3 4
  expect_errors "stalled past the timeout" "$tmp/s" 3 4 20
  grep -q -i "timeout\|deadline" "$tmp/s.3" || fail "stalled: the error does not name the timeout: $(tail -1 "$tmp/s.3")"
  idle_pages D
  idle_pages P
  stop D
  stop P
fi

[ "$failed" = 0 ] && echo "test_agent_disagg: passed" || echo "test_agent_disagg: FAILED"
exit $failed
