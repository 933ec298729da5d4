#!/bin/bash
# deploy/launch-mpirun.sh and deploy/agent-rank.sh on this machine (CPU, Open MPI):
#   1. --dry-run over a hostfile of random size (hosts x ranks per host): the mpirun
#      command has -np, --map-by ppr:N:node, the exported INA_* values and the agent
#      options of both modes (independent: no --tp/--ep; job: --tp T --ep, on the CPU
#      or the GPUs). Refusals exit 2 with a message, before mpirun: ranks that do not
#      split into groups of T, --tp without --ep over more than T ranks, --ep after --,
#      and an --ep E that is not the number of groups (a matching E is passed on).
#   2. agent-rank.sh with a stand-in agent that prints its arguments: an independent
#      rank listens on BASE + local rank, every rank of a job on BASE (what rank 0 uses);
#      --device follows INA_DEVICE (a GPU job rank gets --device cuda and the node's
#      GPUs, an independent GPU rank --device cuda:0 and its own). With stand-ins
#      that handle SIGTERM late: SIGUSR1 reaches a serving agent as SIGTERM only once it
#      handles it (it drains, exit 0); a following rank ignores SIGUSR1. Through the
#      launcher and mpirun, SIGTERM while 2 stand-ins still load (mpirun sends SIGUSR1
#      to each rank's process group, the launcher repeats it): both drain, status 0.
#   3. A real 2-rank CPU job (launch-mpirun.sh --cpu --gpus-per-node 2 --ep, tiny model,
#      a free port): health SERVING, ina info lists 2 ranks, ina generate --server equals
#      ina generate on one rank; SIGTERM to the launcher while a long generation runs:
#      the generation finishes whole, every process exits, the launcher with status 0.
#   4. Independent mode for real: 2 CPU agents on free ports both serve; SIGTERM to the
#      launcher stops both, status 0, nothing left behind.
# Model seed and prompts are random: TEST_SEED=N replays a run.
# usage: test_deploy_launch.sh INA_AGENT INA
set -u
agent=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ina=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
launcher=$root/deploy/launch-mpirun.sh
wrapper=$root/deploy/agent-rank.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found"; exit 77; }
seed=${TEST_SEED:-$(((RANDOM << 15) | RANDOM))}
echo "test_deploy_launch: seed $seed (TEST_SEED=$seed replays it)"
RANDOM=$seed

tmp=$(mktemp -d)
launcher_pid=
procs=() # the launcher's descendants as PID:START, gathered while they run

# start_time PID: when process PID started (clock ticks after boot); nothing when gone
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  read -r -a stat <<<"${stat##*) }" # the fields after "PID (COMM) ", from the 3rd
  echo "${stat[19]}"                # the 22nd: starttime
}
# alive PID:START: that very process still runs (a pid is reused once its process ends;
# the start time tells the two apart)
alive() { [ "$(start_time "${1%%:*}")" = "${1#*:}" ]; }
# kill_alive PID:START...: SIGKILL to those of them that still run
kill_alive() {
  local p
  for p in "$@"; do alive "$p" && kill -KILL "${p%%:*}" 2>/dev/null; done
  return 0
}
# shellcheck disable=SC2317 # run by the trap below
cleanup() {
  [ -z "$launcher_pid" ] || kill -KILL "$launcher_pid" 2>/dev/null # a child not yet waited for
  kill_alive "${procs[@]}"
  rm -rf "$tmp"
}
trap cleanup EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
ok() { echo "ok: $*"; }

# check WHAT WANT_RC COMMAND...: runs COMMAND (stdout and stderr into $tmp/out); wants
# exit status WANT_RC.
check_rc() {
  local what=$1 want_rc=$2 rc
  shift 2
  "$@" >"$tmp/out" 2>&1
  rc=$?
  if [ "$rc" != "$want_rc" ]; then
    fail "$what: exit $rc (want $want_rc)"
    sed 's/^/  | /' "$tmp/out" | tail -20
    return 1
  fi
}
# has WHAT TEXT...: every TEXT is a fixed string of $tmp/out.
has() {
  local what=$1 text
  shift
  for text in "$@"; do
    if ! grep -qF -- "$text" "$tmp/out"; then
      fail "$what: the output lacks '$text'"
      sed 's/^/  | /' "$tmp/out" | tail -20
      return
    fi
  done
  ok "$what"
}

export INA_MPIRUN_ARGS="--oversubscribe" INA_LISTEN_HOST=127.0.0.1 INA_NUM_THREADS=1
unset INA_AGENT_BIN INA_BASE_PORT INA_DEVICE

# ---- 1. dry runs ----------------------------------------------------------------------
nhosts=$((1 + RANDOM % 3)) per_node=$((1 + RANDOM % 4)) base=$((20000 + RANDOM % 40000))
np=$((nhosts * per_node))
: >"$tmp/hosts"
for h in $(seq "$nhosts"); do echo "node$h slots=$per_node" >>"$tmp/hosts"; done
dry=("$launcher" --hostfile "$tmp/hosts" --model tiny --gpus-per-node "$per_node"
  --base-port "$base" --agent "$agent" --dry-run)
echo "dry runs: $nhosts host(s) x $per_node, base port $base"

if check_rc "dry run, independent" 0 "${dry[@]}" -- --max-tokens 512; then
  has "dry run, independent: mpirun command" "-np $np " "--map-by ppr:$per_node:node" \
    "INA_DEVICE=cuda" "INA_BASE_PORT=$base" "INA_AGENT_BIN=$agent" "--oversubscribe" \
    "-x INA_DEVICE" "-x INA_LISTEN_HOST" "$wrapper --model tiny --max-tokens 512" \
    "node$nhosts:$base..$((base + per_node - 1))"
  grep -q -e "--tp" -e "--ep" "$tmp/out" && fail "dry run, independent: --tp/--ep in the command"
fi
if check_rc "dry run, job" 0 "${dry[@]}" --cpu --tp "$per_node" --ep -- --max-tokens 512; then
  has "dry run, job: mpirun command" "-np $np " "--map-by ppr:$per_node:node" "INA_DEVICE=cpu" \
    "$wrapper --model tiny --tp $per_node --ep --max-tokens 512" \
    "one job of $np rank(s)" "expert parallel $nhosts" "rank 0 serves on node1:$base"
fi
if check_rc "dry run, job without --tp" 0 "${dry[@]}" --cpu --ep; then
  has "dry run, job without --tp" "$wrapper --model tiny --tp 1 --ep" "expert parallel $np"
fi
check_rc "GPU job (no --cpu)" 0 "${dry[@]}" --tp "$per_node" --ep &&
  has "GPU job: mpirun command" "INA_DEVICE=cuda" "$wrapper --model tiny --tp $per_node --ep"
check_rc "--tp not dividing the ranks" 2 "${dry[@]}" --cpu --tp $((np + 1)) --ep &&
  has "--tp not dividing the ranks: exit 2" "do not split into groups of $((np + 1))"
check_rc "--tp 1 without --cpu (independent)" 0 "${dry[@]}" --tp 1 &&
  has "--tp 1 without --ep stays independent" "independent agent(s)" "INA_DEVICE=cuda"
echo "localhost slots=4" >"$tmp/localhost"
fixed=("$launcher" --hostfile "$tmp/localhost" --model tiny --gpus-per-node 4 --agent "$agent" --dry-run --cpu)
check_rc "--tp 2 without --ep over 4 ranks" 2 "${fixed[@]}" --tp 2 &&
  has "--tp 2 without --ep over 4 ranks: exit 2" "needs exactly 2 ranks, not 4" "add --ep"
check_rc "--tp 4 without --ep over 4 ranks" 0 "${fixed[@]}" --tp 4 &&
  has "--tp 4 without --ep over 4 ranks" "-np 4 " "$wrapper --model tiny --tp 4 "
check_rc "--ep after --" 2 "${dry[@]}" --cpu -- --ep && has "--ep after --: exit 2" "before --"
check_rc "--ep 2 over 4 ranks in groups of 2" 0 "${fixed[@]}" --tp 2 --ep 2 &&
  has "--ep 2: passed on" "$wrapper --model tiny --tp 2 --ep 2 "
check_rc "--ep=4 over 4 ranks in groups of 2" 2 "${fixed[@]}" --tp 2 --ep=4 &&
  has "--ep=4 over 2 groups: exit 2" "form 2 group(s) of --tp 2" "(--ep 2, or --ep alone)"

# ---- 2. agent-rank.sh with a stand-in agent ---------------------------------------------
cat >"$tmp/fake-agent" <<'EOF'
#!/bin/sh
printf 'arg %s\n' "$@"
EOF
chmod +x "$tmp/fake-agent"
# rank WANT_RC LOCAL GLOBAL DEVICE ARGS...: agent-rank.sh as that rank (output in $tmp/out)
rank() {
  local want_rc=$1 lr=$2 gr=$3 dev=$4
  shift 4
  check_rc "agent-rank.sh as rank $gr (local $lr, $dev) $*" "$want_rc" env \
    INA_AGENT_BIN="$tmp/fake-agent" INA_BASE_PORT="$base" INA_DEVICE="$dev" INA_LOCAL_RANK="$lr" \
    INA_RANK="$gr" CUDA_VISIBLE_DEVICES='' "$wrapper" --model tiny "$@"
}
lr=$((1 + RANDOM % 7))
rank 0 "$lr" "$lr" cpu --max-tokens 64 &&
  has "agent-rank.sh: independent rank $lr" "arg 127.0.0.1:$((base + lr))" "arg --device" "arg cpu"
rank 0 "$lr" "$lr" cpu --tp 2 --ep && has "agent-rank.sh: job rank $lr listens where rank 0 does" \
  "arg 127.0.0.1:$base" "arg --tp" "arg --ep"
rank 0 "$lr" $((lr + 8)) cpu --tp=3 &&
  has "agent-rank.sh: job (--tp=3) rank $((lr + 8))" "arg 127.0.0.1:$base"
rank 0 0 0 cpu --ep && has "agent-rank.sh: job rank 0" "arg 127.0.0.1:$base"
rank 0 "$lr" "$lr" cuda && has "agent-rank.sh: independent GPU rank" \
  "arg 127.0.0.1:$((base + lr))" "arg cuda:0"
rank 0 "$lr" "$lr" cuda --ep && has "agent-rank.sh: GPU job rank" "arg 127.0.0.1:$base" "arg cuda" "arg --ep"
grep -q "arg cuda:0" "$tmp/out" && fail "agent-rank.sh: a GPU job rank must pick its GPU itself (no cuda:0)"

# Stops: a stand-in agent that handles SIGTERM only after a while (as ina-agent does once
# its model is loaded). SIGUSR1 to a serving rank's agent-rank.sh before then must wait
# for that handler (an earlier SIGTERM would kill the agent): the agent drains, exit 0.
# A following rank ignores SIGUSR1 and runs to its end.
cat >"$tmp/slow-agent" <<'AGENT'
#!/bin/sh
: >"$SLOW_AGENT_DIR/started"
sleep 1
trap 'echo drained; exit 0' TERM
while :; do sleep 0.05; done
AGENT
cat >"$tmp/follower-agent" <<'AGENT'
#!/bin/sh
: >"$SLOW_AGENT_DIR/started"
sleep 1
echo followed
AGENT
chmod +x "$tmp/slow-agent" "$tmp/follower-agent"
# catches PID SIGNAL: whether process PID has a handler for SIGNAL (a number)
catches() {
  local mask
  mask=$(awk '$1 == "SigCgt:" { print $2 }' "/proc/$1/status" 2>/dev/null)
  [ -n "$mask" ] && (((16#$mask >> ($2 - 1)) & 1))
}
# stop_early WHAT AGENT WANT_LINE GLOBAL_RANK ARGS...: agent-rank.sh running AGENT gets
# SIGUSR1 once AGENT runs (and a serving rank's script handles SIGUSR1 again: it
# ignores it while starting the agent); it must exit 0 within 10 s, having printed
# WANT_LINE.
stop_early() {
  local what=$1 fake=$2 want=$3 gr=$4 pid rc
  shift 4
  rm -f "$tmp/started"
  SLOW_AGENT_DIR=$tmp INA_AGENT_BIN=$tmp/$fake INA_BASE_PORT=$base INA_DEVICE=cpu \
    INA_LOCAL_RANK=0 INA_RANK=$gr "$wrapper" --model tiny "$@" >"$tmp/out" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    [ -e "$tmp/started" ] && { [ "$fake" = follower-agent ] || catches "$pid" 10; } && break
    sleep 0.05
  done
  kill -USR1 "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  wait "$pid"
  rc=$?
  if [ "$rc" = 0 ] && grep -qx "$want" "$tmp/out"; then
    ok "agent-rank.sh: $what"
  else
    fail "agent-rank.sh: $what: exit $rc"
    sed 's/^/  | /' "$tmp/out"
  fi
}
stop_early "SIGUSR1 before the agent handles SIGTERM: it drains" slow-agent drained 0
stop_early "SIGUSR1 to a job's serving rank 0: it drains" slow-agent drained 0 --ep
stop_early "SIGUSR1 to a following rank: ignored" follower-agent followed 1 --ep

# ---- 3, 4. real launches on this host -----------------------------------------------------

# descendants PID: every process below PID, as PID:START
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    echo "$child:$(start_time "$child")"
    descendants "$child"
  done
}

# launch LOG ARGS...: launch-mpirun.sh in the background until the log shows
# $serving_lines "serving" lines (default 1); sets launcher_pid, procs, ports.
launch() {
  local log=$1
  shift
  : >"$log" # the background job may open it after the first grep below
  "$launcher" --hostfile "$tmp/localhost" --agent "$agent" --base-port 0 "$@" >"$log" 2>&1 &
  launcher_pid=$!
  for _ in $(seq 900); do
    [ "$(grep -c "serving$" "$log")" -ge "${serving_lines:-1}" ] && break
    kill -0 "$launcher_pid" 2>/dev/null || break
    sleep 0.1
  done
  mapfile -t procs < <(descendants "$launcher_pid")
  ports=$(grep -o "listening on 127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
  [ "$(grep -c "serving$" "$log")" -ge "${serving_lines:-1}" ] && [ -n "$ports" ]
}

# stopped LOG WHAT: SIGTERM was sent to the launcher: it must end with status 0 within
# a minute and leave none of its processes behind. Those left are killed here.
stopped() {
  local log=$1 what=$2 rc p left=()
  for _ in $(seq 600); do kill -0 "$launcher_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher_pid" 2>/dev/null; then
    fail "$what: the launcher still runs a minute after SIGTERM"
    tail -20 "$log"
    kill -KILL "$launcher_pid" 2>/dev/null
    kill_alive "${procs[@]}"
    wait "$launcher_pid"
    launcher_pid='' procs=()
    return
  fi
  wait "$launcher_pid"
  rc=$?
  for p in "${procs[@]}"; do alive "$p" && left+=("${p%%:*}"); done
  if [ "$rc" != 0 ] || ((${#left[@]})); then
    # 137 and the like: a signal from outside the test (it sends the launcher SIGTERM only).
    ((rc <= 128)) || echo "note: status $rc: the launcher, or the rank whose status mpirun passed on, died of signal $((rc - 128))"
    fail "$what: launcher status $rc, ${#left[@]} process(es) left (${left[*]})"; tail -20 "$log"
    kill_alive "${procs[@]}"
  else
    ok "$what: SIGTERM to the launcher: status 0, all ${#procs[@]} processes gone"
  fi
  launcher_pid='' procs=()
}

# A stop while the agents still load, through the launcher and mpirun (stand-in agents
# that handle SIGTERM after 5 s): mpirun passes SIGUSR1 to each rank's whole process
# group, again when the launcher repeats it 3 s later, while agent-rank.sh still waits
# for its agent to handle SIGTERM. Its helper processes must survive that: both agents
# drain once they handle SIGTERM, and the launcher exits 0.
cat >"$tmp/loading-agent" <<'AGENT'
#!/bin/sh
echo loading
sleep 5
trap 'echo drained; exit 0' TERM
echo loaded
i=0
while [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
echo "not stopped"
AGENT
chmod +x "$tmp/loading-agent"
: >"$tmp/loading.log"
"$launcher" --hostfile "$tmp/localhost" --agent "$tmp/loading-agent" --base-port 0 --model tiny \
  --cpu --gpus-per-node 2 >"$tmp/loading.log" 2>&1 &
launcher_pid=$!
for _ in $(seq 200); do
  [ "$(grep -c "loading$" "$tmp/loading.log")" -ge 2 ] && break
  kill -0 "$launcher_pid" 2>/dev/null || break
  sleep 0.05
done
mapfile -t procs < <(descendants "$launcher_pid")
kill -TERM "$launcher_pid"
stopped "$tmp/loading.log" "a stop while the agents load"
if [ "$(grep -c "drained$" "$tmp/loading.log")" = 2 ]; then
  ok "a stop while the agents load: both drain once they handle SIGTERM"
else
  fail "a stop while the agents load: $(grep -c "drained$" "$tmp/loading.log") of 2 agents drained"
  sed 's/^/  | /' "$tmp/loading.log" | tail -20
fi
# The repeat is what matters; under heavy load it may come after the loading ended.
forwards=$(sed '/loaded$/q' "$tmp/loading.log" | grep -c "Forwarding signal 10")
((forwards >= 2)) || echo "note: $forwards SIGUSR1 forwarded while the agents loaded (the repeat went untested)"

model_seed=$RANDOM
prompt=$((2 + RANDOM % 1000)),$((2 + RANDOM % 1000)),$((2 + RANDOM % 1000)),$((2 + RANDOM % 1000))
short=(--prompt-ids "1,2,3" --max-new-tokens 5 --ignore-eos)
long=(--prompt-ids "$prompt" --max-new-tokens 1500 --ignore-eos)
echo "job: model seed $model_seed, long prompt $prompt"
if ! launch "$tmp/job.log" --model tiny --cpu --gpus-per-node 2 --ep -- --model-seed "$model_seed" \
    --drain-grace-ms 120000 --threads 1; then
  fail "the 2-rank job did not start serving"; tail -20 "$tmp/job.log"
else
  server=127.0.0.1:$ports
  check_rc "job: ina health" 0 "$ina" health --server "$server" && has "job: health" "SERVING"
  check_rc "job: ina info" 0 "$ina" info --server "$server" &&
    has "job: ina info lists 2 ranks" "ranks: 2 of world size 2" "rank 1: "
  if grep -q "rank 1 of 2 following rank 0" "$tmp/job.log"; then
    ok "job: rank 1 follows"
  else
    fail "job: no 'rank 1 of 2 following rank 0' line"
  fi
  # same_as_one_rank WHAT RC GOT ARGS...: GOT (a "prompt 0:" line, from a generation that
  # exited RC) must equal one rank's generation with ARGS.
  same_as_one_rank() {
    local what=$1 rc=$2 got=$3 want
    shift 3
    want=$("$ina" generate --model tiny --model-seed "$model_seed" --device cpu --threads 1 "$@" |
      grep '^prompt 0:')
    if [ -z "$want" ] || [ "$got" != "$want" ] || [ "$rc" != 0 ]; then
      fail "job: $what (exit $rc) differs from one rank's"
      echo "got:  ${got:0:200}"; echo "want: ${want:0:200}"
    else
      ok "job: $what equals one rank's (${#want} characters)"
    fi
  }
  got=$("$ina" generate --server "$server" "${short[@]}" 2>&1 | grep '^prompt 0:')
  same_as_one_rank "ina generate --server ${short[*]}" "${PIPESTATUS[0]}" "$got" "${short[@]}"

  # A long generation runs while the launcher gets SIGTERM: it must still finish whole.
  "$ina" generate --server "$server" "${long[@]}" >"$tmp/gen" 2>&1 &
  gen_pid=$!
  # SIGTERM once the agent runs it (sent earlier, the request would be refused).
  running=0
  for _ in $(seq 400); do
    kill -0 "$gen_pid" 2>/dev/null || break
    "$ina" load --server "$server" 2>/dev/null | grep -q "queued, [1-9][0-9]* running" &&
      { running=1; break; }
    sleep 0.05
  done
  kill -TERM "$launcher_pid"
  wait "$gen_pid"
  gen_rc=$?
  stopped "$tmp/job.log" "job"
  ((running)) || echo "note: the long generation ended before SIGTERM; the drain went untested"
  same_as_one_rank "a generation drained by SIGTERM" "$gen_rc" "$(grep '^prompt 0:' "$tmp/gen")" "${long[@]}"
  grep -q "ina-agent: stopped" "$tmp/job.log" || fail "job: rank 0 did not print 'stopped'"
fi

serving_lines=2
if ! launch "$tmp/independent.log" --model tiny --cpu --gpus-per-node 2 -- --threads 1; then
  fail "2 independent agents did not start serving"; tail -20 "$tmp/independent.log"
else
  n=0
  for port in $ports; do
    "$ina" health --server "127.0.0.1:$port" | grep -q SERVING && n=$((n + 1))
  done
  if [ "$n" = 2 ]; then
    ok "independent: 2 agents serving on their own ports"
  else
    fail "independent: $n of 2 agents serving (ports $ports)"
  fi
  kill -TERM "$launcher_pid"
  stopped "$tmp/independent.log" "independent"
fi
exit $failed
