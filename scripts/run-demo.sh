#!/usr/bin/env bash
# Set up and build, then serve the built-in `tiny` DeepSeek-V3-architecture model (seeded
# random weights) with ina-agent: two ranks that split the routed experts on the CPU (one
# rank on the GPU when there is one). Shows the node, streams two generations through the
# gRPC API, shows the load they put on each expert, rebalances the experts from that load
# (replicas of the hot ones, weights moved between the ranks; the CPU ranks only),
# generates again with the new placement, and stops the agent cleanly.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$root/build"
bin=$root/build
log=$(mktemp)
token=$(mktemp)
trap 'rm -f "$log" "$token"' EXIT
echo "demo-$RANDOM$RANDOM" >"$token"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "demo: one ina-agent rank on the GPU"
  "$bin/agent/ina-agent" --model tiny --admin-token-file "$token" >"$log" 2>&1 &
  gpu=1
else
  echo "demo: two ina-agent ranks on the CPU, each holding half of the routed experts"
  mpirun --oversubscribe -np 2 "$bin/agent/ina-agent" --ep --model tiny --admin-token-file "$token" >"$log" 2>&1 &
  gpu=0
fi
launcher=$!
for _ in $(seq 600); do grep -q -e "serving$" -e "^ina-agent: .*rror" "$log" && break; sleep 0.1; done
cat "$log"
grep -q "serving$" "$log" || { echo "demo: the agent did not start"; exit 1; }
server=127.0.0.1:$(grep -o "listening on 127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
# Rank 0 serves: its pid is printed with several ranks, else it is the launched process.
rank0=$(grep -o "rank 0 of .*(pid [0-9]*)" "$log" | grep -o "[0-9]*)" | tr -d ')' || true)
rank0=${rank0:-$launcher}

"$bin/tools/ina" info --server "$server"
"$bin/tools/ina" generate --server "$server" \
  --prompt-ids 1,15,42,7,300 --prompt-ids 9,8,7 --max-new-tokens 24 --ignore-eos
if [ "$gpu" = 0 ]; then
  "$bin/tools/ina" load --server "$server" --experts
  echo "demo: rebalancing the experts from that load (5 slots per rank: room for replicas)"
  "$bin/tools/ina" place --server "$server" --balance --slots-per-rank 5 --admin-token-file "$token"
  "$bin/tools/ina" place --server "$server" --show | head -n 12
  "$bin/tools/ina" generate --server "$server" \
    --prompt-ids 1,15,42,7,300 --prompt-ids 9,8,7 --max-new-tokens 24 --ignore-eos
else
  # The GPU engine counts no tokens per expert and keeps its placement for now.
  "$bin/tools/ina" place --server "$server" --show | head -n 12
fi

kill -TERM "$rank0"
wait "$launcher"
tail -n 1 "$log"
