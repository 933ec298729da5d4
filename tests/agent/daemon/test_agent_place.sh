#!/bin/bash
# `ina load` and `ina place` against the real ina-agent (tiny model, CPU, an admin token):
#   1. load: nothing queued or running once serving; the expert counters reset, then one
#      generation of 5 tokens from a 3-token prompt: every MoE layer's counts sum to
#      (3 + 5 - 1) x n_experts_per_token (the last token is sampled, never fed back);
#      --reset, then a second call reads zeros.
#   2. place --show: JSON that parses (stdout and --out alike) and maps every logical
#      expert once per MoE layer. Fed back with --file: without the admin token or with a
#      wrong one UNAUTHENTICATED (exit 1); --dry-run changes nothing; with the token the
#      placement applies (generation 2), and a shuffled one too (generation 3), after
#      which --show reports it and a greedy generation gives the same tokens as before;
#      a stale --expected-generation is FAILED_PRECONDITION, an expert left without a
#      slot INVALID_ARGUMENT naming the layer, another layout FAILED_PRECONDITION.
#      Malformed files (wrong type, unknown key, missing key, not JSON) exit 2 naming the
#      key path, before any call (even with no agent at the address); the agent still
#      serves afterwards.
#   3. A dense-only model (the v3_dense fixture, no routed experts) in a second agent: load
#      --experts, place --show and --file, then a generation, and a clean stop.
#   4. An agent started without an admin token refuses place --file (PERMISSION_DENIED,
#      exit 1, the message saying how to give a token); with --allow-unauthenticated-admin
#      it logs a warning at start and applies place --file from a client without a token.
#      That flag together with a token is a usage error (exit 2); --help names it.
#   5. SIGTERM: the agent drains, exits 0 and leaves no process behind.
# Prompt, model seed and token are random: TEST_SEED=N replays a run.
# usage: test_agent_place.sh INA_AGENT INA
set -u
agent=$1 ina=$2
python=$(command -v python3) || { echo "SKIP: python3 (to read JSON) not found"; exit 77; }
seed=${TEST_SEED:-$(((RANDOM << 15) | RANDOM))}
echo "test_agent_place: seed $seed (TEST_SEED=$seed replays it)"
RANDOM=$seed

tmp=$(mktemp -d)
agent_pid=
cleanup() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -KILL "$agent_pid"
    wait "$agent_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# fail, check and json (tests/shell_checks.sh).
. "$(dirname "$0")/../../shell_checks.sh"

token="admin-$RANDOM$RANDOM"
echo "$token" >"$tmp/token"

# start_agent LOG ARGS...: an ina-agent on a free loopback port with the admin options in
# the array auth (by default the admin token), its output in LOG; waits until it serves
# (at most 120 s). Sets started_pid, and started_port (empty when it did not come up).
auth=(--admin-token-file "$tmp/token")
start_agent() {
  local log=$1
  shift
  "$agent" "$@" --device cpu --listen 127.0.0.1:0 --threads 2 --max-tokens 4096 \
    "${auth[@]}" >"$log" 2>&1 &
  started_pid=$!
  for _ in $(seq 1200); do
    grep -q "serving$" "$log" && break
    kill -0 "$started_pid" 2>/dev/null || break
    sleep 0.1
  done
  started_port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
  grep -q "serving$" "$log" || started_port=
}

start_agent "$tmp/agent.log" --model tiny --model-seed "$RANDOM"
agent_pid=$started_pid port=$started_port
if [ -z "$port" ]; then
  echo "FAIL: ina-agent did not start serving:"
  cat "$tmp/agent.log"
  exit 1
fi
server=127.0.0.1:$port
echo "ina-agent at $server (pid $agent_pid)"

# The model's sizes, from the agent itself.
"$ina" info --server "$server" >"$tmp/info" 2>&1
model=$(grep "^model: " "$tmp/info")
vocab=$(sed -n 's/.* vocab \([0-9]*\),.*/\1/p' <<<"$model")
moe_layers=$(sed -n 's/.* (\([0-9]*\) MoE).*/\1/p' <<<"$model")
experts=$(sed -n 's/.*, \([0-9]*\) experts (top [0-9]*).*/\1/p' <<<"$model")
top_k=$(sed -n 's/.* experts (top \([0-9]*\)).*/\1/p' <<<"$model")
if [ -z "$vocab" ] || [ -z "$moe_layers" ] || [ -z "$experts" ] || [ -z "$top_k" ]; then
  echo "FAIL: cannot read the model's sizes from ina info:"
  cat "$tmp/info"
  exit 1
fi
echo "model: vocab $vocab, $moe_layers MoE layers, $experts experts, top $top_k"

# ---- ina load -----------------------------------------------------------------------------
check "load --help" 0 "usage: ina load" "$ina" load --help
check "load: nothing queued or running" 0 "requests: 0 queued, 0 running" "$ina" load --server "$server"
"$ina" load --server "$server" --json >"$tmp/idle.json" 2>&1
json "load --json: idle, no expert counts unasked" '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["queued_requests"] == 0 and d["running_requests"] == 0, d
assert d["kv_pages_free"] > 0 and d["kv_page_size"] > 0, d
assert "expert_load" not in d, d' "$tmp/idle.json"
# The warm-up generation counted too: start a fresh window.
check "load --experts --reset (warm-up counts)" 0 "moe layer 0:" "$ina" load --server "$server" --experts --reset

# Prompt ids >= 4 share no prefix with the agent's warm-up prompt (1,2,3).
prompt="$((4 + RANDOM % (vocab - 4))),$((4 + RANDOM % (vocab - 4))),$((4 + RANDOM % (vocab - 4)))"
check "generate 5 tokens from prompt $prompt" 0 "finish: length" \
  "$ina" generate --server "$server" --prompt-ids "$prompt" --max-new-tokens 5 --ignore-eos
want=$(((3 + 5 - 1) * top_k))
"$ina" load --server "$server" --experts --json >"$tmp/load.json" 2>&1
json "load --experts --json: $moe_layers layers of $experts counts, each summing to $want" '
import json, sys
d = json.load(open(sys.argv[1]))
layers, experts, want = map(int, sys.argv[2:5])
load = d["expert_load"]
assert [e["moe_layer"] for e in load] == list(range(layers)), load
for e in load:
    assert len(e["tokens"]) == experts, e
    assert sum(e["tokens"]) == want == e["total_tokens"], (e, want)
    assert abs(e["max_over_mean"] - max(e["tokens"]) * experts / want) < 1e-6, e
assert d["expert_load_seconds"] > 0, d' "$tmp/load.json" "$moe_layers" "$experts" "$want"
check "load --experts: a table per layer" 0 "moe layer $((moe_layers - 1)): $want tokens, max" \
  "$ina" load --server "$server" --experts
grep -q "max/mean" "$tmp/out" || fail "load --experts: no max/mean imbalance in the table"
check "load --reset" 0 "moe layer 0: $want tokens" "$ina" load --server "$server" --reset
"$ina" load --server "$server" --experts --json >"$tmp/zero.json" 2>&1
json "load after --reset: every count 0" '
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["expert_load"]) == int(sys.argv[2]), d
for e in d["expert_load"]:
    assert e["tokens"] == [0] * int(sys.argv[3]) and e["max_over_mean"] is None, e' \
  "$tmp/zero.json" "$moe_layers" "$experts"

# ---- ina place ----------------------------------------------------------------------------
check "place --help" 0 "usage: ina place" "$ina" place --help
check "place without --show or --file" 2 "give one of --show and --file" "$ina" place --server "$server"
check "place --show --out" 0 "written to $tmp/placement.json" \
  "$ina" place --server "$server" --show --out "$tmp/placement.json"
"$ina" place --server "$server" --show >"$tmp/stdout.json" 2>&1
json "place --show: every expert once per layer, stdout and --out alike" '
import json, sys
d = json.load(open(sys.argv[1]))
assert d == json.load(open(sys.argv[2])), "stdout and --out differ"
layers, experts = int(sys.argv[3]), int(sys.argv[4])
lay = d["layout"]
assert min(lay["tp"], lay["dp"], lay["ep"]) >= 1 and d["generation"] >= 1, d
assert [l["moe_layer"] for l in d["layers"]] == list(range(layers)), d["layers"]
for l in d["layers"]:
    pairs = sorted((s["ep_rank"], s["slot"]) for s in l["slots"])
    want = [(r, s) for r in range(lay["ep"]) for s in range(d["slots_per_rank"])]
    assert pairs == want, ("slots", l)
    assert sorted(s["logical_expert"] for s in l["slots"]) == list(range(experts)), ("experts", l)' \
  "$tmp/placement.json" "$tmp/stdout.json" "$moe_layers" "$experts"
generation=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["generation"])' \
  "$tmp/placement.json")

check "place --file without a token" 1 "ApplyPlacement: UNAUTHENTICATED" \
  "$ina" place --server "$server" --file "$tmp/placement.json"
check "place --file with a wrong token" 1 "ApplyPlacement: UNAUTHENTICATED" \
  "$ina" place --server "$server" --file "$tmp/placement.json" --admin-token "x$token"

# The token ids of one greedy generation, to compare across placement changes.
greedy() {
  "$ina" generate --server "$server" --prompt-ids "$prompt" --max-new-tokens 8 --ignore-eos 2>&1 |
    grep '^prompt '
}
before=$(greedy)
check "place --file --dry-run" 0 "dry run" "$ina" place --server "$server" --file "$tmp/placement.json" \
  --admin-token-file "$tmp/token" --dry-run
check "place --file with the admin token file: applied" 0 "generation $generation -> $((generation + 1))" \
  "$ina" place --server "$server" --file "$tmp/placement.json" --admin-token-file "$tmp/token"
check "place --file --expected-generation $generation: stale" 1 "ApplyPlacement: FAILED_PRECONDITION" \
  "$ina" place --server "$server" --file "$tmp/placement.json" --admin-token "$token" \
  --expected-generation "$generation"
"$python" - "$tmp" "$RANDOM" <<'EOF'
import json, random, sys
tmp = sys.argv[1]
random.seed(int(sys.argv[2]))
d = json.load(open(tmp + "/placement.json"))
for layer in d["layers"]:  # every layer's experts in a new order over the slots
    experts = [s["logical_expert"] for s in layer["slots"]]
    random.shuffle(experts)
    for s, x in zip(layer["slots"], experts):
        s["logical_expert"] = x
json.dump(d, open(tmp + "/shuffled.json", "w"))
d["layers"][-1]["slots"] = [s for s in d["layers"][-1]["slots"] if s["logical_expert"] != 0]
json.dump(d, open(tmp + "/lost.json", "w"))
d = json.load(open(tmp + "/shuffled.json"))
d["layout"]["ep"] = 2
json.dump(d, open(tmp + "/layout.json", "w"))
EOF
check "place --file shuffled: applied" 0 "generation $((generation + 1)) -> $((generation + 2))" \
  "$ina" place --server "$server" --file "$tmp/shuffled.json" --admin-token "$token"
"$ina" place --server "$server" --show >"$tmp/now.json" 2>&1
json "place --show after: the shuffled placement at generation $((generation + 2))" '
import json, sys
now, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert now["generation"] == int(sys.argv[3]), now["generation"]
key = lambda l: sorted((s["ep_rank"], s["slot"], s["logical_expert"]) for s in l["slots"])
assert [key(l) for l in now["layers"]] == [key(l) for l in want["layers"]], "slots differ"' \
  "$tmp/now.json" "$tmp/shuffled.json" "$((generation + 2))"
after=$(greedy)
if [ -n "$before" ] && [ "$before" = "$after" ]; then
  echo "ok: greedy tokens unchanged by the placement changes: $after"
else
  fail "greedy tokens changed with the placement: '$before' then '$after'"
fi
check "place --file: an expert without a slot" 1 \
  "INVALID_ARGUMENT: placement.layers[$((moe_layers - 1))]: logical expert 0 has no slot" \
  "$ina" place --server "$server" --file "$tmp/lost.json" --admin-token "$token"
check "place --file: another layout" 1 "FAILED_PRECONDITION: placement.layout" \
  "$ina" place --server "$server" --file "$tmp/layout.json" --admin-token "$token"

# Malformed copies of the placement, each broken at a random layer and slot.
layer=$((RANDOM % moe_layers)) slot=$((RANDOM % experts))
"$python" - "$tmp" "$layer" "$slot" <<'EOF'
import json, sys
tmp, layer, slot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def broken(name, edit):
    d = json.load(open(tmp + "/placement.json"))
    edit(d)
    json.dump(d, open(tmp + "/" + name, "w"), indent=1)
def rename(d):
    s = d["layers"][layer]["slots"][slot]
    s["logical_exprt"] = s.pop("logical_expert")
broken("type.json", lambda d: d["layers"][layer]["slots"][slot].update(logical_expert="x"))
broken("key.json", rename)
broken("missing.json", lambda d: d["layers"][layer].pop("moe_layer"))
broken("negative.json", lambda d: d.update(slots_per_rank=-1))
text = open(tmp + "/placement.json").read()
open(tmp + "/notjson.json", "w").write(text[: len(text) // 2])
EOF
path="layers[$layer].slots[$slot]"
for server_at in "$server" 127.0.0.1:1; do # 127.0.0.1:1: no agent there, nothing is called
  check "malformed: wrong type (server $server_at)" 2 \
    "$tmp/type.json: $path.logical_expert: expected a non-negative integer, got \"x\"" \
    "$ina" place --server "$server_at" --file "$tmp/type.json" --admin-token "$token"
done
check "malformed: unknown key" 2 "$tmp/key.json: $path.logical_exprt: unknown key" \
  "$ina" place --server "$server" --file "$tmp/key.json" --admin-token "$token"
check "malformed: missing key" 2 "$tmp/missing.json: layers[$layer].moe_layer: missing" \
  "$ina" place --server "$server" --file "$tmp/missing.json" --admin-token "$token"
check "malformed: negative value" 2 "$tmp/negative.json: slots_per_rank: expected a non-negative integer, got -1" \
  "$ina" place --server "$server" --file "$tmp/negative.json" --admin-token "$token"
check "malformed: not JSON" 2 "$tmp/notjson.json:" \
  "$ina" place --server "$server" --file "$tmp/notjson.json" --admin-token "$token"
grep -q "invalid JSON" "$tmp/out" || fail "malformed: not JSON: the message does not say invalid JSON"
check "health after all that" 0 "health: SERVING" "$ina" health --server "$server"

# stop_agent WHAT PID LOG: SIGTERM, then the agent must exit 0 within 60 s.
stop_agent() {
  local what=$1 pid=$2 log=$3 rc
  kill -TERM "$pid"
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    fail "$what: ina-agent still runs 60 s after SIGTERM"
  fi
  wait "$pid"
  rc=$?
  [ "$rc" = 0 ] || fail "$what: ina-agent exited with status $rc (log: $(tail -5 "$log"))"
}

# ---- a dense-only model -------------------------------------------------------------------
# No routed experts: GetLoad with expert load answers no layers, the placement it shows has
# no MoE layers and applies back, and the agent keeps serving.
dense_dir=$(cd "$(dirname "$0")/../../golden/fixtures/v3_dense" && pwd)
start_agent "$tmp/dense.log" --model "$dense_dir"
dense_pid=$started_pid dense_port=$started_port
if [ -z "$dense_port" ]; then
  fail "dense: ina-agent did not start serving: $(tail -5 "$tmp/dense.log")"
else
  dense=127.0.0.1:$dense_port
  check "dense: load --experts" 0 "requests: 0 queued, 0 running" "$ina" load --server "$dense" --experts --reset
  check "dense: place --show" 0 "written to $tmp/dense.json" "$ina" place --server "$dense" --show --out "$tmp/dense.json"
  check "dense: place --file" 0 "" "$ina" place --server "$dense" --file "$tmp/dense.json" --admin-token "$token"
  check "dense: generate after them" 0 "finish: length" \
    "$ina" generate --server "$dense" --prompt-ids 1,2,3 --max-new-tokens 4
  stop_agent dense "$dense_pid" "$tmp/dense.log"
fi

# ---- admin calls without an admin token ---------------------------------------------------
check "ina-agent --help names --allow-unauthenticated-admin" 0 "--allow-unauthenticated-admin" "$agent" --help
check "--allow-unauthenticated-admin with a token: usage error" 2 \
  "--allow-unauthenticated-admin contradicts --admin-token" \
  "$agent" --model tiny --admin-token-file "$tmp/token" --allow-unauthenticated-admin
auth=()
start_agent "$tmp/closed.log" --model tiny --model-seed "$RANDOM"
closed_pid=$started_pid
if [ -z "$started_port" ]; then
  fail "no token: ina-agent did not start serving: $(tail -5 "$tmp/closed.log")"
else
  closed=127.0.0.1:$started_port
  "$ina" place --server "$closed" --show --out "$tmp/closed.json" >/dev/null 2>&1
  check "no token: place --file refused" 1 "ApplyPlacement: PERMISSION_DENIED" \
    "$ina" place --server "$closed" --file "$tmp/closed.json"
  grep -qF "ina-agent was started without an admin token; restart it with --admin-token-file" "$tmp/out" ||
    fail "no token: the refusal does not say how to give a token: $(cat "$tmp/out")"
  check "no token: place --file with some token refused too" 1 "ApplyPlacement: PERMISSION_DENIED" \
    "$ina" place --server "$closed" --file "$tmp/closed.json" --admin-token "$token"
  check "no token: place --show still answers" 0 "" "$ina" place --server "$closed" --show
  ! grep -q "open to any client" "$tmp/closed.log" || fail "no token: a warning about open admin calls"
  stop_agent "no token" "$closed_pid" "$tmp/closed.log"
fi
auth=(--allow-unauthenticated-admin)
start_agent "$tmp/open.log" --model tiny --model-seed "$RANDOM"
open_pid=$started_pid
if [ -z "$started_port" ]; then
  fail "--allow-unauthenticated-admin: ina-agent did not start serving: $(tail -5 "$tmp/open.log")"
else
  open=127.0.0.1:$started_port
  grep -q "^ina warn \[agent\] admin calls (ApplyPlacement) are open to any client" "$tmp/open.log" ||
    fail "--allow-unauthenticated-admin: no warning at start: $(cat "$tmp/open.log")"
  "$ina" place --server "$open" --show --out "$tmp/open.json" >/dev/null 2>&1
  check "--allow-unauthenticated-admin: place --file without a token applies" 0 "generation 1 -> 2" \
    "$ina" place --server "$open" --file "$tmp/open.json"
  stop_agent "--allow-unauthenticated-admin" "$open_pid" "$tmp/open.log"
fi

# ---- stop ---------------------------------------------------------------------------------
kill -TERM "$agent_pid"
for _ in $(seq 600); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$agent_pid" 2>/dev/null; then
  fail "ina-agent still runs 60 s after SIGTERM"
else
  wait "$agent_pid"
  rc=$?
  if [ "$rc" != 0 ] || ! grep -q "ina-agent: stopped" "$tmp/agent.log"; then
    fail "ina-agent exited with status $rc after SIGTERM"
    tail -20 "$tmp/agent.log"
  else
    echo "ok: SIGTERM: ina-agent stopped with status 0"
  fi
  agent_pid=
fi
if pgrep -f -- "--admin-token-file $tmp/token" >/dev/null; then
  fail "a process of this test is left: $(pgrep -a -f -- "--admin-token-file $tmp/token")"
fi
[ -z "$(jobs -p)" ] || fail "background jobs left: $(jobs -p)"
[ "$failed" = 0 ] && echo "test_agent_place: all checks passed"
exit $failed
