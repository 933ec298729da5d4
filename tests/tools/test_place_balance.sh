#!/bin/bash
# `ina place --balance` against the real ina-agent (tiny model: 8 experts; CPU; an admin
# token):
#   1. one rank (ep 1), after a few generations: --slots-per-rank 9 (more than the 8
#      experts) and 7 (too few to hold them) exit 2 naming the range, and so do --balance
#      with --file or --show, --slots-per-rank without --balance and --expected-generation
#      with --balance; without the admin token the agent refuses (UNAUTHENTICATED, exit
#      1). --dry-run with the default slot count prints a line per MoE layer and leaves
#      the generation; then --balance --out applies the plan (generation + 1), which
#      `ina place --show` reports. With one rank every map is even, so every layer keeps
#      its map and the placement shown equals the one before. Greedy tokens of a fixed
#      prompt are unchanged.
#   2. four ranks under mpirun (--ep): prompts of one repeated token route most of the
#      first MoE layer's tokens to two experts, each far above the mean rank load, so
#      --balance --slots-per-rank 3 must replicate (the plan file holds an expert on two
#      ranks or more), moves weights, and `--show` reports the plan. Greedy tokens equal
#      one rank's `ina generate` before and after.
# Prompts, the one-rank model seed and the token are random: TEST_SEED=N replays a run.
# usage: test_place_balance.sh INA_AGENT INA MPIEXEC
set -u
agent=$1 ina=$2 mpiexec=${3:-}
python=$(command -v python3) || { echo "SKIP: python3 (to read JSON) not found"; exit 77; }
seed=${TEST_SEED:-$(((RANDOM << 15) | RANDOM))}
echo "test_place_balance: seed $seed (TEST_SEED=$seed replays it)"
RANDOM=$seed

tmp=$(mktemp -d)
agent_pid= mpi_pid= rank_pids=
# Ends what this test started, by process id: the one-rank agent, mpirun and its ranks.
cleanup() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -KILL "$agent_pid"
    wait "$agent_pid" 2>/dev/null
  fi
  if [ -n "$mpi_pid" ] && kill -0 "$mpi_pid" 2>/dev/null; then
    kill -TERM "$mpi_pid"
    for _ in $(seq 50); do kill -0 "$mpi_pid" 2>/dev/null || break; sleep 0.1; done
    for pid in $rank_pids $mpi_pid; do kill -KILL "$pid" 2>/dev/null; done
    wait "$mpi_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# fail, check and json (tests/shell_checks.sh).
. "$(dirname "$0")/../shell_checks.sh"

# Valid for the agent and the same slots as a second file (generation aside).
same_placement='
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
key = lambda d: (d["layout"], d["slots_per_rank"],
                 [sorted((s["ep_rank"], s["slot"], s["logical_expert"]) for s in l["slots"])
                  for l in d["layers"]])
assert key(a) == key(b), "the placements differ"'

# wait_serving LOG PID: waits until the agent logs "serving" (or its process ends).
wait_serving() {
  for _ in $(seq 1200); do
    grep -q "serving$" "$1" 2>/dev/null && break
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "serving$" "$1" 2>/dev/null
}

echo "$RANDOM-$RANDOM" >"$tmp/token"

# ---- one rank -----------------------------------------------------------------------------
"$agent" --model tiny --model-seed "$RANDOM" --device cpu --listen 127.0.0.1:0 --threads 2 \
  --admin-token-file "$tmp/token" >"$tmp/agent.log" 2>&1 &
agent_pid=$!
if ! wait_serving "$tmp/agent.log" "$agent_pid"; then
  echo "FAIL: ina-agent did not start serving:"
  cat "$tmp/agent.log"
  exit 1
fi
server=127.0.0.1:$(grep -o "listening on 127.0.0.1:[0-9]*" "$tmp/agent.log" | grep -o "[0-9]*$")
echo "ina-agent at $server (pid $agent_pid)"
model=$("$ina" info --server "$server" 2>&1 | grep "^model: ")
vocab=$(sed -n 's/.* vocab \([0-9]*\),.*/\1/p' <<<"$model")
moe_layers=$(sed -n 's/.* (\([0-9]*\) MoE).*/\1/p' <<<"$model")
experts=$(sed -n 's/.*, \([0-9]*\) experts (top [0-9]*).*/\1/p' <<<"$model")
if [ -z "$vocab" ] || [ -z "$moe_layers" ] || [ -z "$experts" ]; then
  echo "FAIL: cannot read the model's sizes from ina info: $model"
  exit 1
fi
echo "model: vocab $vocab, $moe_layers MoE layers, $experts experts"

prompt="$((4 + RANDOM % (vocab - 4))),$((4 + RANDOM % (vocab - 4))),$((4 + RANDOM % (vocab - 4)))"
greedy() {
  "$ina" generate --server "$server" --prompt-ids "$prompt" --max-new-tokens 8 --ignore-eos 2>&1 |
    grep '^prompt '
}
before=$(greedy)
for _ in 1 2; do # more counted tokens, from other prompts
  "$ina" generate --server "$server" --prompt-ids "$((4 + RANDOM % (vocab - 4))),$((4 + RANDOM % (vocab - 4)))" \
    --max-new-tokens 6 --ignore-eos >/dev/null 2>&1 || fail "a generation failed"
done

range="outside [$experts, $experts] for the agent's $experts experts over ep 1"
check "--balance --slots-per-rank $((experts + 1)): more slots than experts" 2 \
  "--slots-per-rank $((experts + 1)): $range" \
  "$ina" place --server "$server" --balance --slots-per-rank $((experts + 1)) --dry-run \
  --admin-token-file "$tmp/token"
check "--balance --slots-per-rank $((experts - 1)): too few slots" 2 "--slots-per-rank $((experts - 1)): $range" \
  "$ina" place --server "$server" --balance --slots-per-rank $((experts - 1)) --admin-token-file "$tmp/token"
check "--balance --file" 2 "give one of --show and --file (or --balance)" \
  "$ina" place --server "$server" --balance --file "$tmp/none.json"
check "--balance --show" 2 "give one of --show and --file (or --balance)" \
  "$ina" place --server "$server" --balance --show
check "--slots-per-rank without --balance" 2 "--slots-per-rank goes with --balance" \
  "$ina" place --server "$server" --show --slots-per-rank 4
check "--balance --expected-generation" 2 "--expected-generation goes with --file" \
  "$ina" place --server "$server" --balance --expected-generation 1
check "--balance --slots-per-rank 0" 2 "--slots-per-rank" \
  "$ina" place --server "$server" --balance --slots-per-rank 0
check "--balance without the admin token" 1 "ApplyPlacement: UNAUTHENTICATED" \
  "$ina" place --server "$server" --balance
check "place --help names --balance" 0 "--slots-per-rank S" "$ina" place --help

"$ina" place --server "$server" --show --out "$tmp/before.json" >/dev/null 2>&1
generation=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["generation"])' \
  "$tmp/before.json")
check "--balance --dry-run (default slots)" 0 "dry run: the agent accepts the placement; generation $generation stays in force" \
  "$ina" place --server "$server" --balance --dry-run --admin-token-file "$tmp/token"
for l in $(seq 0 $((moe_layers - 1))); do
  grep -q "^moe layer $l: [0-9]* tokens, max/mean rank load 1.000, $experts replicas: kept" "$tmp/out" ||
    fail "--balance --dry-run: no 'kept' line for moe layer $l"
done
grep -qF "balance: $moe_layers MoE layers of $experts experts over ep 1, $experts -> $experts slots per rank" \
  "$tmp/out" || fail "--balance --dry-run: no summary line"
grep -qF "plan: 0 of $moe_layers MoE layers change" "$tmp/out" || fail "--balance --dry-run: no plan line"
"$ina" place --server "$server" --show --out "$tmp/dry.json" >/dev/null 2>&1
json "--dry-run changed nothing" "$same_placement"'
assert json.load(open(sys.argv[1]))["generation"] == json.load(open(sys.argv[2]))["generation"]' \
  "$tmp/dry.json" "$tmp/before.json"

check "--balance --out: applied" 0 "applied: generation $generation -> $((generation + 1))" \
  "$ina" place --server "$server" --balance --admin-token-file "$tmp/token" --out "$tmp/plan.json"
grep -qF "planned placement written to $tmp/plan.json" "$tmp/out" || fail "--balance --out: no 'written' line"
"$ina" place --server "$server" --show --out "$tmp/after.json" >/dev/null 2>&1
json "--show after --balance: the plan, at generation $((generation + 1))" "$same_placement"'
assert json.load(open(sys.argv[1]))["generation"] == int(sys.argv[3])' \
  "$tmp/after.json" "$tmp/plan.json" "$((generation + 1))"
json "one rank: every layer kept its map" "$same_placement" "$tmp/after.json" "$tmp/before.json"
after=$(greedy)
if [ -n "$before" ] && [ "$before" = "$after" ]; then
  echo "ok: one rank: greedy tokens unchanged: $after"
else
  fail "one rank: greedy tokens changed: '$before' then '$after'"
fi
kill -TERM "$agent_pid"
for _ in $(seq 600); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
wait "$agent_pid" || fail "ina-agent exited with status $? after SIGTERM"
agent_pid=

# ---- four ranks ---------------------------------------------------------------------------
if [ -z "$mpiexec" ] || ! [ -x "$mpiexec" ]; then
  echo "note: no mpiexec given: the four-rank part is left out"
  [ "$failed" = 0 ] && echo "test_place_balance: all checks passed"
  exit $failed
fi
"$mpiexec" --oversubscribe -np 4 "$agent" --ep --model tiny --device cpu --listen 127.0.0.1:0 \
  --threads 1 --admin-token-file "$tmp/token" >"$tmp/mpi.log" 2>&1 &
mpi_pid=$!
if ! wait_serving "$tmp/mpi.log" "$mpi_pid"; then
  echo "FAIL: 4 ranks did not start serving:"
  grep -v -i -e pmix -e Perhaps "$tmp/mpi.log" | tail -20
  exit 1
fi
rank_pids=$(grep -o "rank [0-9]* of 4 .*(pid [0-9]*)" "$tmp/mpi.log" | grep -o "pid [0-9]*" | grep -o "[0-9]*")
pid0=$(grep -o "rank 0 of 4 .*(pid [0-9]*)" "$tmp/mpi.log" | grep -o "pid [0-9]*" | grep -o "[0-9]*")
server=127.0.0.1:$(grep -o "listening on 127.0.0.1:[0-9]*" "$tmp/mpi.log" | grep -o "[0-9]*$")
echo "4 ranks at $server (mpirun pid $mpi_pid, ranks $(echo $rank_pids))"

token_id=$((4 + RANDOM % (vocab - 4)))
repeated=$token_id
for _ in $(seq 23); do repeated+=",$token_id"; done
args=(--prompt-ids "$repeated" --prompt-ids "$repeated" --prompt-ids "$prompt" --max-new-tokens 8 --ignore-eos)
want=$("$ina" generate --model tiny --device cpu "${args[@]}" 2>&1 | grep '^prompt ')
"$ina" load --server "$server" --reset >/dev/null 2>&1 || fail "4 ranks: ina load --reset failed"
got=$("$ina" generate --server "$server" "${args[@]}" 2>&1 | grep '^prompt ')
if [ -n "$want" ] && [ "$got" = "$want" ]; then
  echo "ok: 4 ranks: greedy tokens equal one rank's before balancing"
else
  fail "4 ranks: greedy tokens differ from one rank's before balancing: '$got', want '$want'"
fi
check "4 ranks: --balance --slots-per-rank 3: applied" 0 "applied: generation 1 -> 2" \
  "$ina" place --server "$server" --balance --slots-per-rank 3 --admin-token-file "$tmp/token" \
  --out "$tmp/plan4.json"
grep -q " 0 bytes of expert weights moved" "$tmp/out" && fail "4 ranks: --balance moved no weights"
grep -q "^moe layer 0: .* -> .*replicas" "$tmp/out" || fail "4 ranks: moe layer 0 kept its map"
json "4 ranks: the plan replicates an expert of moe layer 0" '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["slots_per_rank"] == 3 and d["layout"]["ep"] == 4, d["layout"]
ranks = {}
for s in d["layers"][0]["slots"]:
    ranks.setdefault(s["logical_expert"], set()).add(s["ep_rank"])
assert sorted(ranks) == list(range(int(sys.argv[2]))), ranks
assert max(len(r) for r in ranks.values()) >= 2, ranks' "$tmp/plan4.json" "$experts"
"$ina" place --server "$server" --show --out "$tmp/after4.json" >/dev/null 2>&1
json "4 ranks: --show reports the plan" "$same_placement" "$tmp/after4.json" "$tmp/plan4.json"
got=$("$ina" generate --server "$server" "${args[@]}" 2>&1 | grep '^prompt ')
if [ -n "$want" ] && [ "$got" = "$want" ]; then
  echo "ok: 4 ranks: greedy tokens equal one rank's after balancing"
else
  fail "4 ranks: greedy tokens differ from one rank's after balancing: '$got', want '$want'"
fi

kill -TERM "$pid0"
for _ in $(seq 300); do kill -0 "$mpi_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$mpi_pid" 2>/dev/null; then
  fail "4 ranks: mpirun still runs 30 s after SIGTERM to rank 0"
else
  wait "$mpi_pid"
  rc=$?
  [ "$rc" = 0 ] && echo "ok: 4 ranks: drained and stopped" || fail "4 ranks: mpirun ended with status $rc"
  mpi_pid=
fi
[ "$failed" = 0 ] && echo "test_place_balance: all checks passed"
exit $failed
