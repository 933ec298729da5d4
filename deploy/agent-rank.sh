#!/usr/bin/env bash
# Starts the ina-agent of one rank. Run by a launcher (mpirun, srun), once per process:
#
#   deploy/agent-rank.sh --model M [--tp T] [--ep] [more ina-agent options]
#
# Two modes, told apart by the agent's own rule (its options hold --ep, or --tp above 1):
#
#   independent (no --tp/--ep)  every rank is a complete single-rank agent serving the
#       whole model; the local rank R (the process's index on its node) chooses its GPU
#       and its port, INA_BASE_PORT + R.
#   job (--tp T and/or --ep)    the ranks are one model instance: ina-agent bootstraps
#       them through MPI, global rank 0 listens and serves, the others follow its steps
#       (they never open the --listen address). Every rank gets the address rank 0 uses,
#       INA_LISTEN_HOST:INA_BASE_PORT.
#
# The local rank comes from OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun),
# MPI_LOCALRANKID (MPICH / Intel MPI), or INA_LOCAL_RANK to force it; the global rank
# (job mode) from OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK, or INA_RANK.
#   GPU    (INA_DEVICE=cuda) independent mode: CUDA_VISIBLE_DEVICES becomes the local
#          rank's GPU and the agent gets --device cuda:0 (the only device it sees). When
#          the launcher already set CUDA_VISIBLE_DEVICES to a list, the local rank picks
#          its entry; a single entry is kept as it is (srun --gpus-per-task=1 binds each
#          task already). Job mode: CUDA_VISIBLE_DEVICES is left alone and the agent
#          gets --device cuda: it takes the GPU of its local rank itself, and must see
#          the node's other GPUs for the intra-node all-reduce.
#   port   --listen $INA_LISTEN_HOST:PORT, PORT = INA_BASE_PORT (+ R when independent);
#          INA_BASE_PORT=0 lets every serving agent take a free port, printed in its
#          "ina-agent: listening on HOST:PORT" line.
#
# Signals: a serving agent (every rank when independent, rank 0 in a job) runs as this
# script's child, and SIGUSR1, SIGTERM or SIGINT to the script become its SIGTERM, once
# the agent handles SIGTERM (after loading the model): it drains for --drain-grace-ms
# and exits 0, and so does this script; further stops are not passed on. SIGUSR1 is
# the stop launch-mpirun.sh sends,
# because mpirun forwards SIGUSR1 to every rank as it is, whereas a SIGTERM to mpirun
# kills the ranks within seconds. A following rank replaces this script (exec) with
# SIGUSR1 ignored (ina-agent ignores SIGTERM and SIGINT there itself): it stops when
# rank 0 does. Only a SIGUSR1 that comes in the few milliseconds before this script
# sets its trap kills it (the default action): a stop sent while the ranks are being
# started may end the job non-zero instead of draining it (nothing serves yet then).
#
# Environment (exported to every rank by the launcher):
#   INA_AGENT_BIN    the agent binary (default: ina-agent on PATH)
#   INA_BASE_PORT    port of local rank 0, or of the job's rank 0 (default 50051)
#   INA_LISTEN_HOST  address to listen on (default 0.0.0.0: every interface)
#   INA_DEVICE       cuda (default: one GPU per rank) or cpu (the CPU engine, e.g. for
#                    trying the launchers on a machine without a GPU)
#   INA_PREFILL_AGENT  HOST:PORT of the prefill agents, for decode agents (--role decode):
#                    independent mode pairs local rank R with the prefill agent on
#                    HOST:PORT+R (a prefill host started with the same launcher and ranks
#                    per host, base port PORT); a job's rank 0 gets HOST:PORT as it is.
set -euo pipefail
# A stop is noted here and handed to the serving agent at the end of this script.
stop_pending=0
trap 'stop_pending=1' USR1 TERM INT

die() { echo "agent-rank.sh: $*" >&2; exit 2; }

# Job mode exactly when ina-agent itself will start one: --ep, or --tp above 1 (a --tp
# value that is not a number is left to ina-agent to reject).
tp=1 ep=0 prev=
for arg in "$@"; do
  if [[ $prev == --tp ]]; then
    tp=$arg
  else
    case $arg in
    --ep | --ep=*) ep=1 ;;
    --tp=*) tp=${arg#--tp=} ;;
    esac
  fi
  prev=$arg
done
job=$ep
[[ ! $tp =~ ^[0-9]+$ ]] || ((10#$tp <= 1)) || job=1

local_rank=${INA_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-}}}}
[[ -n $local_rank ]] || die "no local rank: run under mpirun or srun (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or MPI_LOCALRANKID), or set INA_LOCAL_RANK"
[[ $local_rank =~ ^[0-9]+$ ]] || die "local rank '$local_rank' is not a non-negative integer"
rank=0
if ((job)); then
  rank=${INA_RANK:-${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-${PMI_RANK:-}}}}
  [[ -n $rank ]] || die "--tp/--ep: no global rank: run under mpirun or srun (OMPI_COMM_WORLD_RANK, SLURM_PROCID or PMI_RANK), or set INA_RANK"
  [[ $rank =~ ^[0-9]+$ ]] || die "global rank '$rank' is not a non-negative integer"
fi

base_port=${INA_BASE_PORT:-50051}
[[ $base_port =~ ^[0-9]+$ ]] || die "INA_BASE_PORT '$base_port' is not a port number"
port=$base_port
((job || base_port == 0)) || port=$((base_port + local_rank))
((port <= 65535)) || die "port $port (INA_BASE_PORT $base_port + local rank $local_rank) is outside 0..65535"
host=${INA_LISTEN_HOST:-0.0.0.0}

agent=${INA_AGENT_BIN:-ina-agent}
command -v "$agent" >/dev/null 2>&1 || die "agent binary '$agent' not found on $(hostname) (set INA_AGENT_BIN)"

device_args=()
case ${INA_DEVICE:-cuda} in
cuda)
  if ((job)); then
    device_args=(--device cuda)
  elif [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    if ((${#visible[@]} > 1)); then
      ((local_rank < ${#visible[@]})) ||
        die "local rank $local_rank has no GPU: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists ${#visible[@]} on $(hostname)"
      export CUDA_VISIBLE_DEVICES=${visible[local_rank]}
    fi
  else
    export CUDA_VISIBLE_DEVICES=$local_rank
  fi
  ((job)) || device_args=(--device cuda:0)
  ;;
cpu) device_args=(--device cpu) ;;
*) die "INA_DEVICE '${INA_DEVICE}': expected cuda or cpu" ;;
esac

prefill_args=()
if [[ -n ${INA_PREFILL_AGENT:-} ]]; then
  prefill_host=${INA_PREFILL_AGENT%:*} prefill_port=${INA_PREFILL_AGENT##*:}
  [[ $prefill_host != "$INA_PREFILL_AGENT" && $prefill_port =~ ^[0-9]+$ ]] ||
    die "INA_PREFILL_AGENT '$INA_PREFILL_AGENT': expected HOST:PORT"
  ((job)) || prefill_port=$((prefill_port + local_rank))
  ((prefill_port <= 65535)) || die "prefill port $prefill_port is outside 0..65535"
  prefill_args=(--prefill-agent "$prefill_host:$prefill_port")
fi

# Later options win, so a --listen among the arguments overrides this one.
cmd=("$agent" "${device_args[@]}" --listen "$host:$port" "${prefill_args[@]}" "$@")

if ((job && rank > 0)); then
  # A follower stops when rank 0 does: it ignores SIGUSR1 (whose default action would
  # kill it) from here on, and SIGTERM and SIGINT by itself.
  trap '' USR1
  exec "${cmd[@]}"
fi

# The serving agent starts with SIGUSR1 ignored (the launcher may signal the whole
# process group), so it is ignored here while the agent is started; a stop lost in that
# moment comes again (launch-mpirun.sh repeats it). This script hands SIGUSR1, SIGTERM
# and SIGINT to the agent as SIGTERM.
trap '' USR1
"${cmd[@]}" &
agent_pid=$!
trap 'stop_pending=1' USR1

# Whether the agent catches SIGTERM yet: it installs its handler once the model is
# loaded, and a SIGTERM before that would kill it (in a job, rank 0 dying so aborts
# every rank instead of draining them). Unknown (no /proc): yes. Read with builtins:
# mpirun passes SIGUSR1 to this script's whole process group, and would kill a helper
# process (awk) in the middle, whose empty answer would then read as yes.
catches_term() {
  local key value mask=''
  while read -r key value; do
    [[ $key != SigCgt: ]] || { mask=$value; break; }
  done 2>/dev/null <"/proc/$agent_pid/status"
  [[ -n $mask ]] || return 0
  (((16#$mask >> 14) & 1)) # bit N-1: signal N (SIGTERM is 15)
}

# A trapped signal interrupts wait. The agent gets one SIGTERM: it drains from there,
# and later stops (launch-mpirun.sh repeats its own) change nothing, except that one
# reaching the agent as it exits would find its handler still installed. The last wait
# returns the agent's exit status (bash keeps it after the child is reaped).
handed_over=0
while kill -0 "$agent_pid" 2>/dev/null; do
  if ((!stop_pending || handed_over)); then
    wait "$agent_pid" || true
  elif catches_term; then
    handed_over=1
    kill -TERM "$agent_pid" 2>/dev/null || true
  else
    # The sleep ignores SIGUSR1: the launcher's repeated stop reaches the whole process
    # group, and would kill it (a message in the log; under set -e, this script too).
    (trap '' USR1 && exec sleep 0.2) || true
  fi
done
status=0
wait "$agent_pid" || status=$?
exit "$status"
