#!/usr/bin/env bash
# Set up and build, then serve the built-in `tiny` DeepSeek-V3-architecture model (seeded
# random weights) with ina-agent: two ranks that split the routed experts on the CPU (one
# rank on the GPU when there is one). Shows the node, streams two generations through the
# gRPC API, shows the load they put on each expert, rebalances the experts from that load
# (replicas of the hot ones, weights moved between the ranks; the CPU ranks only),
# generates again with the new placement, sends text through the OpenAI-compatible HTTP
# API (a completion and a streamed chat), and stops the agent cleanly.
#
# usage: scripts/run-demo.sh [--model tiny|v3.2-tiny] [BUILD_DIR]
#   --model     the built-in model to serve (default tiny). v3.2-tiny is DeepSeek-V3.2
#               (the lightning indexer and sparse attention over each query's top 8
#               tokens, fewer than the demo's sequences hold); the GPU engine has no
#               sparse attention kernels yet, so it is served by the two CPU ranks on any
#               machine.
#   BUILD_DIR   default: build/ at the top of the repository
#
# It checks what it shows and exits non-zero, naming the step, when something is not so:
# the agent serves; each stream ends normally with every requested token; the balance
# moves the placement to the next generation and the streams after it equal those before
# (a placement change does not change tokens); SIGTERM drains the agent, every rank exits
# 0 and rank 0 says "stopped". Every wait is bounded, and on any exit the agent's
# processes are stopped (killed if they do not stop).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=tiny build=''
while [ $# -gt 0 ]; do
  case $1 in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  --model)
    [ $# -ge 2 ] || { echo "run-demo: --model needs a value (tiny or v3.2-tiny)" >&2; exit 2; }
    model=$2; shift 2 ;;
  --model=*) model=${1#--model=}; shift ;;
  -*) echo "run-demo: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  *) [ -z "$build" ] || { echo "run-demo: one BUILD_DIR only" >&2; exit 2; }
     build=$1; shift ;;
  esac
done
case $model in
tiny | v3.2-tiny) ;;
*) echo "run-demo: --model must be tiny or v3.2-tiny, not '$model'" >&2; exit 2 ;;
esac
build=${build:-$root/build}
"$root/scripts/setup.sh" "$build"
ina=$build/tools/ina
work=$(mktemp -d)
log=$work/agent.log token=$work/token
launcher='' stopped=0 # the agent's launcher (mpirun, or the GPU agent itself); a clean stop

# Kills the ranks that still run: the pids they printed ("... (pid N)"), each checked to
# be an ina-agent still (a pid may be reused once its process ended).
kill_ranks() {
  local pid
  for pid in $(grep -o "(pid [0-9]*)" "$log" 2>/dev/null | grep -o "[0-9]*"); do
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q "ina-agent" && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}
# shellcheck disable=SC2317 # run by the trap below
cleanup() {
  local status=$?
  if [ -n "$launcher" ] && kill -0 "$launcher" 2>/dev/null; then
    echo "demo: stopping the agent (launcher pid $launcher)" >&2
    kill -TERM "$launcher" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$launcher" 2>/dev/null || true
  fi
  [ -z "$launcher" ] || [ "$stopped" = 1 ] || kill_ranks
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
  echo "demo: FAILED: $*" >&2
  [ -s "$log" ] && { echo "demo: the agent's log ends with:" >&2; tail -n 20 "$log" | sed 's/^/  | /' >&2; }
  exit 1
}
# step WHAT CMD...: runs CMD (at most 2 minutes), prints its output, which it also keeps
# in $work/out; fails the demo when CMD fails.
step() {
  local what=$1 rc=0
  shift
  timeout 120 "$@" >"$work/out" 2>&1 || rc=$?
  cat "$work/out"
  [ "$rc" != 124 ] || fail "$what: no answer within 2 minutes"
  [ "$rc" = 0 ] || fail "$what: exit status $rc"
}
# streamed WHAT TOKENS: $work/out holds `ina generate --server` output for two prompts:
# each a "prompt N:" line of TOKENS token ids and a "finish: length" line.
streamed() {
  local what=$1 want=$2 i n
  for i in 0 1; do
    n=$(sed -n "s/^prompt $i://p" "$work/out" | tr ',' ' ' | wc -w)
    [ "$n" = "$want" ] || fail "$what: prompt $i streamed $n tokens, not $want"
  done
  n=$(grep -c "^finish: length, .* $want generated" "$work/out" || true)
  [ "$n" = 2 ] || fail "$what: $n of 2 streams ended with 'finish: length' and $want tokens"
}

: >"$log" # the agent's background job may open it after the first grep below
echo "demo-$RANDOM$RANDOM" >"$token"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [ "$model" = tiny ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "demo: one ina-agent rank on the GPU serving $model"
  "$build/agent/ina-agent" --model "$model" --admin-token-file "$token" --http-listen 127.0.0.1:0 >"$log" 2>&1 &
  gpu=1
else
  echo "demo: two ina-agent ranks on the CPU serving $model, each holding half of the routed experts"
  mpirun --oversubscribe -np 2 "$build/agent/ina-agent" --ep --device cpu --model "$model" \
    --admin-token-file "$token" --http-listen 127.0.0.1:0 >"$log" 2>&1 &
  gpu=0
fi
launcher=$!
for _ in $(seq 1200); do
  grep -q -e "serving$" -e "^ina-agent: .*rror" "$log" && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
cat "$log"
grep -q "serving$" "$log" || fail "the agent did not start serving within 2 minutes"
server=127.0.0.1:$(grep -o "listening on 127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
# Rank 0 serves: its pid is printed with several ranks, else it is the launched process.
rank0=$(grep -o "rank 0 of .*(pid [0-9]*)" "$log" | grep -o "[0-9]*)" | tr -d ')' || true)
rank0=${rank0:-$launcher}

prompts=(--prompt-ids "1,15,42,7,300" --prompt-ids "9,8,7" --max-new-tokens 24 --ignore-eos)
step "ina info" "$ina" info --server "$server"
if [ "$model" = v3.2-tiny ]; then
  grep -q "(DeepseekV32ForCausalLM)" "$work/out" || fail "ina info does not name DeepseekV32ForCausalLM"
  grep -q "^sparse attention: each query attends to its top 8 " "$work/out" ||
    fail "ina info does not show the sparse attention's top 8"
fi
step "ina generate" "$ina" generate --server "$server" "${prompts[@]}"
streamed "ina generate" 24
before=$(grep "^prompt " "$work/out")
# Text in and out: a prompt as text over gRPC (the client tokenizes it with the model's
# tokenizer), then the OpenAI-compatible HTTP API, whole and streamed.
step "ina generate --prompt" "$ina" generate --server "$server" --prompt "The expert placement" --max-new-tokens 12 \
  --ignore-eos
grep -q "^text 0: " "$work/out" || fail "ina generate --prompt printed no text"
http=127.0.0.1:$(grep -o "HTTP API on 127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
echo "demo: POST http://$http/v1/completions"
step "POST /v1/completions" curl -sS --fail-with-body "http://$http/v1/completions" -H "Content-Type: application/json" \
  -d "{\"model\": \"$model\", \"prompt\": \"The expert placement\", \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}"
echo
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 12, r' \
  "$work/out" || fail "/v1/completions did not answer 12 tokens with finish_reason length"
echo "demo: POST http://$http/v1/chat/completions, streamed"
step "POST /v1/chat/completions" curl -sS -N --fail-with-body "http://$http/v1/chat/completions" -H "Content-Type: application/json" \
  -d "{\"model\": \"$model\", \"messages\": [{\"role\": \"user\", \"content\": \"Where do the experts live?\"}], \"max_tokens\": 8, \"temperature\": 0, \"stream\": true}"
tail -n 1 "$work/out" | grep -q "^data: \[DONE\]$" || grep -q "^data: \[DONE\]" "$work/out" || fail "the chat stream did not end with data: [DONE]"
if [ "$gpu" = 0 ]; then
  step "ina load" "$ina" load --server "$server" --experts
  echo "demo: rebalancing the experts from that load (5 slots per rank: room for replicas)"
  step "ina place --balance" "$ina" place --server "$server" --balance --slots-per-rank 5 --admin-token-file "$token"
  grep -q "^applied: generation 1 -> 2 " "$work/out" || fail "ina place --balance did not apply generation 2"
  step "ina place --show" "$ina" place --server "$server" --show --out "$work/placement.json"
  grep -q "^placement generation 2 " "$work/out" || fail "the agent does not show placement generation 2"
  head -n 12 "$work/placement.json"
  step "ina generate (new placement)" "$ina" generate --server "$server" "${prompts[@]}"
  streamed "ina generate (new placement)" 24
  [ "$(grep "^prompt " "$work/out")" = "$before" ] ||
    fail "the streams after the placement change differ from those before it"
  echo "demo: the same tokens with the new placement"
else
  # The GPU engine counts no tokens per expert and keeps its placement for now.
  step "ina place --show" "$ina" place --server "$server" --show --out "$work/placement.json"
  head -n 12 "$work/placement.json"
fi

echo "demo: SIGTERM to rank 0 (pid $rank0): it drains, then every rank exits"
kill -TERM "$rank0"
for _ in $(seq 600); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "the agent still runs a minute after SIGTERM"
status=0
wait "$launcher" || status=$?
tail -n 1 "$log"
[ "$status" = 0 ] || fail "the agent exited with status $status"
grep -q "ina-agent: stopped$" "$log" || fail "rank 0 did not print 'ina-agent: stopped'"
stopped=1
echo "demo: done, the agent stopped cleanly"
