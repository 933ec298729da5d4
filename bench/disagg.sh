#!/bin/bash
# Prefill/decode disaggregation on the CPU, mixed workload: many short-prompt streams decoding
# while long prompts land. Runs the same workload against (a) one `ina-agent --role both` with
# THREADS threads and (b) a `--role prefill` agent plus a `--role decode --prefill-agent` agent
# on the same machine, both `--model tiny --device cpu`, and prints both side by side.
# Threads, the same CPU budget in both setups: the pair's prefill agent gets floor(T/2)
# threads, its decode agent the rest (T=2: 1 + 1; T=3: 1 + 2): the decode agent works all the
# time (every stream, every step) while the prefill agent works only while a prompt runs, so
# an odd thread goes to decode. T=1 gives each of them 1 (2 threads on a budget of 1: noted in
# the output). Agents run with their defaults otherwise (page size 16, 64 running).
# Workload (bench/serving_bench.py, one client process, streamed /v1/completions, random token
# ids, greedy, ignore_eos, every answer checked): PROMPTS "short" requests, prompt uniform
# 16..32 tokens, max_tokens uniform 64..128, CONCURRENCY in flight (4 warm-up requests first);
# alongside them "long" requests (serving_bench's side class), prompt uniform 1024..2048
# tokens (tiny's context is 4096), max_tokens uniform 8..16, arriving as a Poisson process of
# LONG_RATE per second from the start until the last short request is done or LONG_MAX were
# sent (a cap, so that a setup that falls behind is not fed without end: more arrivals make
# it slower, which makes more arrivals).
# Both setups get the same seed, so the same prompts and arrival times; each setup's agents
# start fresh (empty prefix caches). Reported per setup: short requests' TTFT p50/p99, ITL
# p50/p99 (and p90, max), output tok/s; ITL split into samples whose gap overlaps a long
# prompt's window (its send -> its first token) and the rest; long requests' TTFT p50/p99;
# each agent's CPU seconds. The agents stop with SIGTERM and must exit 0; any failed
# request, wrong answer or agent exit fails the script (exit 1). Builds nothing.
#
# usage: bench/disagg.sh [BUILD [THREADS [PROMPTS [CONCURRENCY [LONG_RATE [LONG_MAX [JSON_DIR]]]]]]]
#   BUILD        the build directory with agent/ina-agent (default build)
#   THREADS      the CPU thread budget T of each setup (default: all CPUs, nproc)
#   PROMPTS      measured short-prompt requests (default 512)
#   CONCURRENCY  short-prompt requests in flight (default 16)
#   LONG_RATE    long-prompt arrivals per second (default 0.75)
#   LONG_MAX     at most this many long-prompt requests (default 40)
#   JSON_DIR     keep serving_bench's --json results there as both.json, pair.json
# The agents' logs stay in $DISAGG_LOGS when it is set (default: a temporary directory,
# removed at exit; its logs' last lines are printed when something fails). Extra
# serving_bench.py options go in SERVING_BENCH_ARGS. An agent still running STOP_WAIT_S seconds
# (default 60) after SIGTERM is killed, and the script fails.
set -u
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
build=${1:-build} threads=${2:-$(nproc)} prompts=${3:-512} conc=${4:-16} long_rate=${5:-0.75} long_max=${6:-40}
json_dir=${7:-}
here=$(cd "$(dirname "$0")" && pwd)
agent=$build/agent/ina-agent
[ -x "$agent" ] || { echo "disagg: no $agent (build first, or give the build directory)"; exit 2; }
case $threads in '' | *[!0-9]* | 0) echo "disagg: THREADS must be a positive integer"; exit 2 ;; esac
pre_threads=$((threads / 2))
[ $pre_threads -lt 1 ] && pre_threads=1
dec_threads=$((threads - threads / 2))
tmp=$(mktemp -d)
logs=${DISAGG_LOGS:-$tmp/logs}
mkdir -p "$logs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
tck=$(getconf CLK_TCK)
fail=0

# start NAME ARGS...: starts the agent, logs to $logs/NAME.log, waits for "serving" (up to
# 60 s); sets $started_pid, $grpc_port, $http_port (empty without --http-listen).
start() {
  local name=$1
  shift
  "$agent" --model tiny --device cpu "$@" >"$logs/$name.log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
  grpc_port= http_port=
  for _ in $(seq 1 600); do
    if grep -q 'serving$' "$logs/$name.log"; then
      grpc_port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$logs/$name.log" | head -1)
      http_port=$(sed -n 's/.*HTTP API on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$logs/$name.log" | head -1)
      return 0
    fi
    kill -0 "$started_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "disagg: the $name agent did not start serving:"
  tail -20 "$logs/$name.log"
  return 1
}

# cpu_s PID: the process's user + system CPU seconds so far (all its threads).
cpu_s() {
  awk -v t="$tck" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' "/proc/$1/stat" 2>/dev/null || echo "?"
}

# stop NAME PID: SIGTERM, waits (SIGKILL after STOP_WAIT_S, default 60 s: the agents' drain
# grace is 30 s), checks exit 0; records its CPU seconds in $tmp/NAME.cpu.
stop() {
  cpu_s "$2" >"$tmp/$1.cpu"
  kill -TERM "$2"
  (
    sleep "${STOP_WAIT_S:-60}"
    kill -0 "$2" 2>/dev/null || exit 0
    echo "disagg: the $1 agent (pid $2) is still running ${STOP_WAIT_S:-60} s after SIGTERM: SIGKILL" >&2
    kill -KILL "$2"
  ) &
  local watchdog=$!
  wait "$2"
  local rc=$?
  kill "$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  if [ $rc -ne 0 ]; then
    echo "disagg: the $1 agent exited $rc after SIGTERM (expected 0):"
    tail -20 "$logs/$1.log"
    fail=1
  fi
}

# bench SETUP PORT: the workload against the HTTP API on PORT.
bench() {
  # shellcheck disable=SC2086
  python3 "$here/serving_bench.py" --port "$2" --model tiny --num-prompts "$prompts" --concurrency "$conc" \
    --input-len-dist uniform:16:32 --output-len-dist uniform:64:128 --seed 1 --warmup 4 \
    --side-num-prompts "$long_max" --side-request-rate "$long_rate" \
    --side-input-len-dist uniform:1024:2048 --side-output-len-dist uniform:8:16 \
    --json "$tmp/$1.json" ${SERVING_BENCH_ARGS:-} >"$tmp/$1.out" 2>"$tmp/$1.err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "disagg: the $1 setup's benchmark failed (exit $rc):"
    cat "$tmp/$1.out"
    grep -v '^serving_bench: .* done, ' "$tmp/$1.err"
    fail=1
  elif ! python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["side"]["sent"] == 0)' "$tmp/$1.json"; then
    echo "disagg: the $1 setup: no long prompt arrived while the short requests ran (raise PROMPTS or LONG_RATE)"
    fail=1
  fi
}

echo "disagg: $(nproc) CPU cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)); thread budget $threads:" \
  "both $threads, pair prefill $pre_threads + decode $dec_threads" \
  "$([ "$threads" -lt 2 ] && echo "(2 threads on a budget of 1: the pair has more)")"
echo "disagg: $prompts short requests (prompt 16..32, output 64..128) at concurrency $conc;" \
  "long requests (prompt 1024..2048, output 8..16) at Poisson $long_rate/s while they run (at most $long_max)"

# (a) one agent, --role both
if start both --threads "$threads" --http-listen 127.0.0.1:0; then
  both_pid=$started_pid
  echo "disagg: both: load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "disagg: both: ina-agent --role both --threads $threads (pid $both_pid), HTTP 127.0.0.1:$http_port"
  bench both "$http_port"
  stop both "$both_pid"
else
  fail=1
fi

# (b) a prefill agent and a decode agent
if start prefill --role prefill --threads "$pre_threads" --listen 127.0.0.1:0; then
  pre_pid=$started_pid pre_port=$grpc_port
  if start decode --role decode --prefill-agent "127.0.0.1:$pre_port" --threads "$dec_threads" \
    --http-listen 127.0.0.1:0; then
    dec_pid=$started_pid
    echo "disagg: pair: load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "disagg: pair: ina-agent --role prefill --threads $pre_threads (pid $pre_pid, gRPC 127.0.0.1:$pre_port)" \
      "+ --role decode --threads $dec_threads (pid $dec_pid), HTTP 127.0.0.1:$http_port"
    bench pair "$http_port"
    stop decode "$dec_pid" # the front end first, then the agent it uses
  else
    fail=1
  fi
  stop prefill "$pre_pid"
else
  fail=1
fi
pids=()

# Anything the agents logged beyond their start and stop lines.
for n in both prefill decode; do
  [ -f "$logs/$n.log" ] || continue
  extra=$(grep -v -e '^ina-agent: listening on ' -e '^ina-agent: HTTP API on ' -e '^ina-agent: serving$' \
    -e '^ina-agent: stopped$' "$logs/$n.log")
  [ -n "$extra" ] && printf 'disagg: the %s agent logged:\n%s\n' "$n" "$extra"
done
[ -n "$json_dir" ] && mkdir -p "$json_dir" && cp "$tmp"/both.json "$tmp"/pair.json "$json_dir"/ 2>/dev/null

python3 - "$tmp" "$threads" "$pre_threads" "$dec_threads" <<'EOF'
import json, os, sys
tmp, t, tp, td = sys.argv[1:]
res = {}
for s in ("both", "pair"):
    p = os.path.join(tmp, s + ".json")
    res[s] = json.load(open(p)) if os.path.exists(p) else None
def cpu(n):
    p = os.path.join(tmp, n + ".cpu")
    return open(p).read().strip() if os.path.exists(p) else "?"
def f(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"
def row(name, get):
    cells = []
    for s in ("both", "pair"):
        r = res[s]
        try:
            cells.append(get(r) if r is not None else "(no result)")
        except (KeyError, TypeError):
            cells.append("-")
    print(f"| {name} | {cells[0]} | {cells[1]} |")
pq = lambda k, ks=("p50", "p99"): (lambda r: " / ".join(f(r[k][q]) for q in ks))
sq = lambda k, ks=("p50", "p99"): (lambda r: " / ".join(f(r["side"][k][q]) for q in ks))
print()
print(f"| tiny, CPU, {os.cpu_count()} cores | (a) both, {t} threads | (b) prefill {tp} + decode {td} threads |")
print("|---|---|---|")
row("short: requests ok / failed (wrong)", lambda r: f"{r['completed']} / {r['failed']} ({r['failed_checks']})")
row("short: duration s", lambda r: f(r["duration_s"], 2))
row("short: output tok/s", lambda r: f(r["output_throughput"], 0))
row("short: TTFT ms p50 / p99", pq("ttft_ms"))
row("short: ITL ms p50 / p99", pq("itl_ms"))
row("short: ITL ms p90 / max", pq("itl_ms", ("p90", "max")))
row("short: TPOT ms p50 / p99", pq("tpot_ms"))
row("short: ITL ms p50 / p99 during long prompts (n)",
    lambda r: sq("itl_ms_during_side_prompts")(r) + f" ({r['side']['itl_ms_during_side_prompts']['n']})")
row("short: ITL ms p50 / p99 outside them (n)",
    lambda r: sq("itl_ms_outside_side_prompts")(r) + f" ({r['side']['itl_ms_outside_side_prompts']['n']})")
row("long: requests ok / sent (failed)", lambda r: f"{r['side']['completed']} / {r['side']['sent']} ({r['side']['failed']})")
row("long: prompt tokens", lambda r: str(r["side"]["total_input_tokens"]))
row("long: TTFT ms p50 / p99", sq("ttft_ms"))
row("long: TTFT ms max", lambda r: f(r["side"]["ttft_ms"]["max"]))
row("long prompts' windows cover % of duration", lambda r: f(100 * r["side"]["side_prompt_time_fraction"]))
row("cached prompt tokens (short + long)",
    lambda r: f"{r['cached_prompt_tokens']} + {r['side']['cached_prompt_tokens']}")
row("agent CPU s", lambda r: f"{cpu('both')}" if r is res["both"] else f"prefill {cpu('prefill')} + decode {cpu('decode')}")
EOF
[ $fail -eq 0 ] && echo "disagg: all requests succeeded and checked; every agent exited 0 after SIGTERM"
exit $fail
