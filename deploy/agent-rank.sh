#!/usr/bin/env bash
# Starts the ina-agent of one rank, on the GPU and port that belong to its local rank.
# Run by a launcher (mpirun, srun), once per process:
#
#   deploy/agent-rank.sh --model M [more ina-agent options]
#
# The local rank (the process's index on its node) comes from the launcher:
# OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun), MPI_LOCALRANKID
# (MPICH / Intel MPI), or INA_LOCAL_RANK to force it. From it:
#   GPU    CUDA_VISIBLE_DEVICES becomes the local rank's GPU, and the agent gets
#          --device cuda:0 (the only device it sees). When the launcher already set
#          CUDA_VISIBLE_DEVICES to a list, the local rank picks its entry; a single
#          entry is kept as it is (srun --gpus-per-task=1 binds each task already).
#   port   --listen $INA_LISTEN_HOST:$((INA_BASE_PORT + local rank)).
#
# Environment (exported to every rank by the launcher):
#   INA_AGENT_BIN    the agent binary (default: ina-agent on PATH)
#   INA_BASE_PORT    port of local rank 0 (default 50051)
#   INA_LISTEN_HOST  address to listen on (default 0.0.0.0: every interface)
#   INA_DEVICE       cuda (default: one GPU per rank) or cpu (no GPU; for trying the
#                    launchers on a machine without one)
#
# Today every rank is a complete, independent single-rank agent serving the whole
# model; the rank number chooses only the GPU and the port.
set -euo pipefail

die() { echo "agent-rank.sh: $*" >&2; exit 2; }

local_rank=${INA_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-}}}}
[[ -n $local_rank ]] || die "no local rank: run under mpirun or srun (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or MPI_LOCALRANKID), or set INA_LOCAL_RANK"
[[ $local_rank =~ ^[0-9]+$ ]] || die "local rank '$local_rank' is not a non-negative integer"

base_port=${INA_BASE_PORT:-50051}
[[ $base_port =~ ^[0-9]+$ ]] || die "INA_BASE_PORT '$base_port' is not a port number"
port=$((base_port + local_rank))
((port >= 1 && port <= 65535)) || die "port $port (INA_BASE_PORT $base_port + local rank $local_rank) is outside 1..65535"
host=${INA_LISTEN_HOST:-0.0.0.0}

agent=${INA_AGENT_BIN:-ina-agent}
command -v "$agent" >/dev/null 2>&1 || die "agent binary '$agent' not found on $(hostname) (set INA_AGENT_BIN)"

device_args=()
case ${INA_DEVICE:-cuda} in
cuda)
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    if ((${#visible[@]} > 1)); then
      ((local_rank < ${#visible[@]})) ||
        die "local rank $local_rank has no GPU: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists ${#visible[@]} on $(hostname)"
      export CUDA_VISIBLE_DEVICES=${visible[local_rank]}
    fi
  else
    export CUDA_VISIBLE_DEVICES=$local_rank
  fi
  device_args=(--device cuda:0)
  ;;
cpu) device_args=(--device cpu) ;;
*) die "INA_DEVICE '${INA_DEVICE}': expected cuda or cpu" ;;
esac

exec "$agent" "${device_args[@]}" --listen "$host:$port" "$@"
