#!/usr/bin/env bash
# Starts ina-agent on every host of an MPI hostfile through one mpirun and
# deploy/agent-rank.sh: either one independent single-rank agent per GPU, or (--tp/--ep)
# one multi-rank job whose rank 0 serves, on the GPUs or with --cpu on the CPUs. Run with
# --help.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")

usage() {
  cat <<USAGE
usage: deploy/launch-mpirun.sh --hostfile FILE --model M [--tp T] [--ep] [options]
                               [-- agent options]

Runs one mpirun with N processes per host (--map-by ppr:N:node, --bind-to numa), each
running deploy/agent-rank.sh, in one of two modes:

  independent (default)  every rank is a complete single-rank agent serving the whole
                         model: local rank R takes GPU R (CUDA_VISIBLE_DEVICES=R,
                         --device cuda:0) and port BASE+R (--listen 0.0.0.0:BASE+R).
  job (--tp T, --ep)     the ranks are ONE model instance: every rank runs
                         ina-agent --tp T [--ep]; they bootstrap through MPI, form
                         tensor-parallel groups of T consecutive ranks, and with --ep
                         the (all ranks / T) groups split the routed experts. Global
                         rank 0 (first host of the hostfile) listens on BASE and serves;
                         the other ranks follow its steps. With GPUs, each rank uses
                         the GPU of its local rank and sees the node's others (NCCL and
                         the custom all-reduce between them); --cpu runs the job on the
                         CPU engine.

Stopping: SIGTERM or SIGINT to this script drains: it sends SIGUSR1 to mpirun (again
after 3, 6, 12... s, for ranks that start late), which forwards it to every rank, and
agent-rank.sh turns it into the serving agents' SIGTERM (rank 0 alone in job mode; the
followers stop with it). The agents finish running generations for up to
--drain-grace-ms, exit 0, and so does this script. A second SIGTERM/SIGINT sends
SIGTERM to mpirun, which kills the ranks within seconds. mpirun runs in its own
session, so a terminal's Ctrl-C reaches this script only. A stop while the ranks are
still starting may end the job non-zero instead (nothing serves yet).

  --hostfile FILE      Open MPI hostfile, one host per line ("node1 slots=8")
  --model M            checkpoint directory (same path on every host), tiny or random:NAME
  --gpus-per-node N    processes per host: GPUs, or CPU ranks with --cpu (default 8)
  --tp T               job mode: tensor parallelism over T ranks (the ranks in all,
                       hosts x N, must be a multiple of T; without --ep exactly T)
  --ep [E]             job mode: expert parallelism over the groups of T ranks (E, when
                       given, must be their number: hosts x N / T)
  --base-port P        independent: port of local rank 0 on each host; job: the port of
                       rank 0 (default 50051). 0: every serving agent takes a free port,
                       printed in its "ina-agent: listening on HOST:PORT" line
  --agent PATH         ina-agent binary, same path on every host (default: \$INA_AGENT_BIN,
                       else ina-agent on PATH, else $root/build/agent/ina-agent)
  --cpu                run on the CPU engine instead of one GPU per rank
  --dry-run            print the mpirun command (with the variables it exports) and exit
  -h, --help           this help
  -- ARGS              passed to every ina-agent (e.g. --tls-cert F --tls-key F
                       --admin-token T --drain-grace-ms N --max-tokens N); give --tp and
                       --ep before --, to this script

Environment: INA_MPIRUN_ARGS adds mpirun options (split on spaces), e.g.
"--allow-run-as-root", "--oversubscribe" or "--mca btl_tcp_if_include eth0".
INA_LISTEN_HOST (default 0.0.0.0), INA_LOG, INA_NUM_THREADS and INA_PREFILL_AGENT (decode
agents' prefill agents, see deploy/agent-rank.sh) are passed to the agents.
USAGE
}

die() { echo "launch-mpirun.sh: $*" >&2; exit 2; }

hostfile="" model="" gpus_per_node=8 base_port=50051 agent="${INA_AGENT_BIN:-}" device=cuda dry_run=0
tp="" ep=0 ep_degree=""
agent_args=()
while (($#)); do
  case $1 in
  --hostfile | --model | --gpus-per-node | --base-port | --agent | --tp)
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
    --hostfile) hostfile=$2 ;;
    --model) model=$2 ;;
    --gpus-per-node) gpus_per_node=$2 ;;
    --base-port) base_port=$2 ;;
    --agent) agent=$2 ;;
    --tp) tp=$2 ;;
    esac
    shift 2 ;;
  --ep)
    ep=1; shift
    # An optional degree, checked against the layout below: --ep E.
    if [[ ${1:-} =~ ^[0-9]+$ ]]; then ep_degree=$1; shift; fi ;;
  --ep=*) ep=1; ep_degree=${1#--ep=}; shift ;;
  --cpu) device=cpu; shift ;;
  --dry-run) dry_run=1; shift ;;
  -h | --help) usage; exit 0 ;;
  --) shift; agent_args=("$@"); break ;;
  *) die "unknown option '$1' (agent options go after --; see --help)" ;;
  esac
done

[[ -n $hostfile ]] || die "--hostfile FILE is required (see --help)"
[[ -n $model ]] || die "--model M is required (see --help)"
[[ -r $hostfile ]] || die "--hostfile '$hostfile': not a readable file"
[[ $gpus_per_node =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node '$gpus_per_node': expected a positive integer"
[[ $base_port =~ ^(0|[1-9][0-9]*)$ ]] || die "--base-port '$base_port': expected a port number"
[[ -z $tp || $tp =~ ^[1-9][0-9]*$ ]] || die "--tp '$tp': expected a positive integer"
[[ -z $ep_degree || $ep_degree =~ ^[1-9][0-9]*$ ]] || die "--ep '$ep_degree': expected a positive integer"
for arg in "${agent_args[@]}"; do
  case $arg in
  --tp | --tp=* | --ep | --ep=*) die "'$arg' after --: give --tp and --ep to launch-mpirun.sh itself, before --" ;;
  esac
done

# Job mode by the agent's own rule: --ep, or --tp above 1.
job=$ep
[[ -z $tp ]] || ((tp == 1)) || job=1

mpirun_bin=$(command -v mpirun) || die "mpirun not found on PATH (Debian: apt-get install openmpi-bin)"
if [[ -z $agent ]]; then
  agent=$(command -v ina-agent || true)
  [[ -n $agent ]] || agent=$root/build/agent/ina-agent
fi
[[ -x $agent ]] || die "agent binary '$agent' not found or not executable (build it, or pass --agent PATH)"
agent=$(cd "$(dirname "$agent")" && pwd)/$(basename "$agent")
wrapper=$here/agent-rank.sh
[[ -x $wrapper ]] || die "'$wrapper' is missing or not executable"

# Hosts of the hostfile (first word of each line that is not blank or a comment).
hosts=()
while read -r host _ || [[ -n $host ]]; do
  [[ -z $host || $host == \#* ]] || hosts+=("$host")
done <"$hostfile"
((${#hosts[@]})) || die "--hostfile '$hostfile' lists no host"
np=$((${#hosts[@]} * gpus_per_node))

layout_args=()
if ((job)); then
  tp=${tp:-1}
  ((np % tp == 0)) || die "--tp $tp: the $np ranks (${#hosts[@]} host(s) x $gpus_per_node) do not split into groups of $tp"
  ((ep || np == tp)) ||
    die "--tp $tp without --ep needs exactly $tp ranks, not $np (${#hosts[@]} host(s) x $gpus_per_node): add --ep to split the experts over $((np / tp)) groups"
  [[ -z $ep_degree ]] || ((ep_degree == np / tp)) ||
    die "--ep $ep_degree: the $np ranks (${#hosts[@]} host(s) x $gpus_per_node) form $((np / tp)) group(s) of --tp $tp, and expert parallelism runs over all of them (--ep $((np / tp)), or --ep alone)"
  layout_args=(--tp "$tp")
  ((!ep)) || layout_args+=(--ep ${ep_degree:+"$ep_degree"})
else
  ((base_port == 0 || base_port + gpus_per_node - 1 <= 65535)) ||
    die "--base-port $base_port + --gpus-per-node $gpus_per_node runs past port 65535"
  [[ -z $tp ]] || layout_args=(--tp "$tp")
fi
((base_port <= 65535)) || die "--base-port $base_port: past port 65535"

extra_mpirun=()
[[ -z ${INA_MPIRUN_ARGS:-} ]] || read -r -a extra_mpirun <<<"$INA_MPIRUN_ARGS"

# mpirun -x exports a variable of this environment to every rank.
export INA_AGENT_BIN=$agent INA_BASE_PORT=$base_port INA_DEVICE=$device
exported=(INA_AGENT_BIN INA_BASE_PORT INA_DEVICE)
for var in INA_LISTEN_HOST INA_LOG INA_NUM_THREADS INA_PREFILL_AGENT; do
  [[ -z ${!var:-} ]] || exported+=("$var")
done
exports=()
for var in "${exported[@]}"; do exports+=(-x "$var"); done
cmd=("$mpirun_bin" --hostfile "$hostfile"
  -np "$np" --map-by "ppr:$gpus_per_node:node" --bind-to numa
  --tag-output "${exports[@]}" "${extra_mpirun[@]}"
  "$wrapper" --model "$model" "${layout_args[@]}" "${agent_args[@]}")

if ((job)); then
  ep_size=1
  ((!ep)) || ep_size=$((np / tp))
  endpoint=${hosts[0]}:$base_port
  ((base_port)) || endpoint="${hosts[0]}, a free port (see its 'listening on' line)"
  echo "launch-mpirun.sh: one job of $np rank(s) on ${#hosts[@]} host(s), tensor parallel $tp," \
    "expert parallel $ep_size; rank 0 serves on $endpoint" >&2
else
  echo "launch-mpirun.sh: ${#hosts[@]} host(s) x $gpus_per_node independent agent(s), endpoints:" >&2
  for host in "${hosts[@]}"; do
    if ((base_port == 0)); then
      echo "  $host: free ports (see the 'listening on' lines)" >&2
    else
      echo "  $host:$base_port..$((base_port + gpus_per_node - 1))" >&2
    fi
  done
fi
if ((dry_run)); then
  for var in "${exported[@]}"; do printf '%s=%q ' "$var" "${!var}"; done
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi

# mpirun runs in its own session (no terminal's SIGINT reaches it: that would kill the
# ranks); this script turns SIGTERM/SIGINT into the drain described in --help. The trap
# is set first so that no stop is lost; $! names mpirun as soon as it is started.
stops=0
# shellcheck disable=SC2317 # run by the trap below
stop() {
  local pid=${mpirun_pid:-$!}
  [[ -n $pid ]] || exit 143 # nothing started yet
  stops=$((stops + 1))
  if ((stops == 1)); then
    echo "launch-mpirun.sh: draining (SIGUSR1 to mpirun $pid; signal again to kill the ranks)" >&2
  else
    echo "launch-mpirun.sh: stopping the ranks (SIGTERM to mpirun $pid)" >&2
    kill -TERM "$pid" 2>/dev/null || true
  fi
}
mpirun_pid=
trap stop TERM INT
# setsid execs mpirun in place (this script's children are never process group leaders).
setsid -w "${cmd[@]}" &
mpirun_pid=$!

# catches PID SIGNAL: whether process PID has a handler for SIGNAL (a number) yet; when
# that cannot be read (no /proc), yes. Read with builtins, as agent-rank.sh does: a
# terminal's SIGINT reaches this script's process group, helpers included.
catches() {
  local key value mask=''
  while read -r key value; do
    [[ $key != SigCgt: ]] || { mask=$value; break; }
  done 2>/dev/null <"/proc/$1/status"
  [[ -n $mask ]] || return 0
  (((16#$mask >> ($2 - 1)) & 1))
}

# A trapped signal interrupts wait. While draining: SIGUSR1 goes to mpirun once it
# handles it (before that it would kill mpirun), and again after 3, 6, 12... s (at most
# every minute), because mpirun forwards it only to the ranks already started
# (agent-rank.sh takes a repeated stop as the same one). The last wait returns mpirun's
# status (bash keeps it after the child is reaped).
ticks=0 sent=-1 gap=6 # in ticks of 0.5 s
while kill -0 "$mpirun_pid" 2>/dev/null; do
  if ((stops == 1)); then
    if ((sent < 0 || ticks - sent >= gap)) && catches "$mpirun_pid" 10; then
      kill -USR1 "$mpirun_pid" 2>/dev/null || true
      ((sent < 0)) || gap=$((gap < 60 ? gap * 2 : 120))
      sent=$ticks
    fi
    sleep 0.5 &
    wait $! || true
    ticks=$((ticks + 1))
  else
    wait "$mpirun_pid" || true
  fi
done
status=0
wait "$mpirun_pid" || status=$?
exit "$status"
