#!/bin/bash
# Serving benchmark of the OpenAI-compatible HTTP API: starts `ina-agent --model tiny
# --device cpu --http-listen 127.0.0.1:0` with an API key, waits for "serving", runs
# bench/serving_bench.py at each concurrency in turn (streamed /v1/completions, random
# token-id prompts of uniform 16..128 tokens, max_tokens uniform 16..64 with ignore_eos,
# greedy, 4 warm-up requests each, a seed of its own per concurrency so that no prompt repeats
# into the agent's prefix cache), sends SIGTERM and checks that the agent exits 0, and
# prints one table row per concurrency. The benchmark checks every answer (usage counts,
# finish_reason) before it reports timings; any failure fails the script. Builds nothing.
#
# usage: bench/serving.sh [BUILD [THREADS [PROMPTS [CONCURRENCIES [JSON_DIR]]]]]
#   BUILD          the build directory with agent/ina-agent (default build)
#   THREADS        the agent's --threads (default: all CPUs, nproc)
#   PROMPTS        measured requests per concurrency (default 64)
#   CONCURRENCIES  requests in flight, quoted list (default "1 4 16")
#   JSON_DIR       keep serving_bench's --json results there as cC.json (default: not kept)
# Extra serving_bench.py options go in SERVING_BENCH_ARGS (e.g. "--request-rate 20").
# SERVING_MODEL and SERVING_DEVICE replace the agent's --model tiny and --device cpu (e.g.
# random:v2-lite and cuda on a GPU machine); SERVING_TOKENIZER gives the agent --tokenizer
# (a built-in without a tokenizer of its own: bench/filler_tokenizer.py writes one).
set -u
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
build=${1:-build} threads=${2:-$(nproc)} prompts=${3:-64} concs=${4:-1 4 16} json_dir=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
agent=$build/agent/ina-agent
[ -x "$agent" ] || { echo "serving: no $agent (build first, or give the build directory)"; exit 2; }
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
echo "serving-bench-key-$$-$RANDOM" >"$tmp/key"

model=${SERVING_MODEL:-tiny}
"$agent" --model "$model" --device "${SERVING_DEVICE:-cpu}" --threads "$threads" --http-listen 127.0.0.1:0 \
  --served-model-name "$model" --api-key-file "$tmp/key" ${SERVING_TOKENIZER:+--tokenizer "$SERVING_TOKENIZER"} \
  >"$tmp/agent.log" 2>&1 &
pid=$!
port=
for _ in $(seq 1 600); do # up to 60 s
  port=$(sed -n 's/.*HTTP API on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/agent.log" | head -1)
  [ -n "$port" ] && grep -q 'serving$' "$tmp/agent.log" && break
  kill -0 "$pid" 2>/dev/null || break
  port=
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "serving: the agent did not start serving its HTTP API:"
  tail -20 "$tmp/agent.log"
  exit 1
fi
echo "serving: ina-agent (pid $pid, $threads threads) on 127.0.0.1:$port; $prompts prompts per concurrency"

fail=0
run=0
for c in $concs; do
  run=$((run + 1)) # each run its own seed: the agent's prefix cache would serve repeated prompts
  # shellcheck disable=SC2086
  python3 "$here/serving_bench.py" --port "$port" --api-key-file "$tmp/key" --model "$model" --num-prompts "$prompts" \
    --concurrency "$c" --input-len-dist uniform:16:128 --output-len-dist uniform:16:64 --seed "$run" --warmup 4 \
    --json "$tmp/c$c.json" ${SERVING_BENCH_ARGS:-} >"$tmp/c$c.out" 2>"$tmp/c$c.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "serving: concurrency $c failed (exit $rc):"
    cat "$tmp/c$c.out"
    grep -v '^serving_bench: .* done, ' "$tmp/c$c.err"
    fail=1
  fi
done

kill -TERM "$pid"
wait "$pid"
agent_rc=$?
pid=
if [ $agent_rc -ne 0 ]; then
  echo "serving: the agent exited $agent_rc after SIGTERM (expected 0):"
  tail -20 "$tmp/agent.log"
  fail=1
fi
[ -n "$json_dir" ] && mkdir -p "$json_dir" && cp "$tmp"/c*.json "$json_dir"/ 2>/dev/null

python3 - "$tmp" $concs <<'EOF'
import json, os, sys
tmp, concs = sys.argv[1], sys.argv[2:]
print("| concurrency | requests | failed | duration s | req/s | output tok/s | total tok/s "
      "| TTFT ms mean / p50 / p90 / p99 | ITL ms mean / p50 / p90 / p99 | TPOT ms mean / p50 / p90 / p99 "
      "| E2E ms mean / p50 / p90 / p99 | cached prompt tokens |")
print("|---" * 12 + "|")
for c in concs:
    p = os.path.join(tmp, f"c{c}.json")
    if not os.path.exists(p):
        print(f"| {c} | (no result) |" + " |" * 10)
        continue
    r = json.load(open(p))
    if "duration_s" not in r:
        print(f"| {c} | {r['num_prompts']} | {r['failed']} (+{r['failed_checks']} wrong) |" + " |" * 9)
        continue
    q = lambda k: " / ".join("%.2f" % r[k][s] for s in ("mean", "p50", "p90", "p99"))
    print(f"| {c} | {r['completed']} | {r['failed']} | {r['duration_s']:.2f} | {r['request_throughput']:.2f} "
          f"| {r['output_throughput']:.0f} | {r['total_token_throughput']:.0f} | {q('ttft_ms')} | {q('itl_ms')} "
          f"| {q('tpot_ms')} | {q('e2e_ms')} | {r['cached_prompt_tokens']} |")
for c in concs:
    p = os.path.join(tmp, f"c{c}.json")
    r = json.load(open(p)) if os.path.exists(p) else {}
    if "content_chunks" in r:
        print(f"concurrency {c}: {r['content_chunks']} content chunks for {r['total_output_tokens']} output tokens "
              f"(ITL's tokens per chunk: {r['token_counts']}), max in flight {r['max_in_flight']}, "
              f"{r['connections_opened']} connections opened")
EOF
[ $fail -eq 0 ] && echo "serving: all requests succeeded and checked; the agent exited 0 after SIGTERM"
exit $fail
