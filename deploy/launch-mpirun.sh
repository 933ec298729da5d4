#!/usr/bin/env bash
# Starts one ina-agent per GPU on every host of an MPI hostfile, through mpirun and
# deploy/agent-rank.sh. Run with --help for the options.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")

usage() {
  cat <<USAGE
usage: deploy/launch-mpirun.sh --hostfile FILE --model M [options] [-- agent options]

Runs mpirun with one process per GPU (--map-by ppr:N:node, --bind-to numa). Each
process runs deploy/agent-rank.sh, which gives local rank R the GPU R
(CUDA_VISIBLE_DEVICES=R, --device cuda:0) and the port BASE+R (--listen 0.0.0.0:BASE+R).
Today every rank is an independent single-rank agent serving the whole model.
SIGTERM to this script (it becomes mpirun) reaches every agent: they drain and exit.

  --hostfile FILE      Open MPI hostfile, one host per line ("node1 slots=8")
  --model M            checkpoint directory (same path on every host), tiny or random:NAME
  --gpus-per-node N    processes (GPUs) per host (default 8)
  --base-port P        port of local rank 0 on each host (default 50051)
  --agent PATH         ina-agent binary, same path on every host (default: \$INA_AGENT_BIN,
                       else ina-agent on PATH, else $root/build/agent/ina-agent)
  --cpu                run the agents on the CPU instead (no GPU; for trying this out)
  --dry-run            print the mpirun command instead of running it
  -h, --help           this help
  -- ARGS              passed to every ina-agent (e.g. --tls-cert F --tls-key F
                       --admin-token T --drain-grace-ms N --max-tokens N)

Environment: INA_MPIRUN_ARGS adds mpirun options (split on spaces), e.g.
"--allow-run-as-root" or "--mca btl_tcp_if_include eth0". INA_LOG and INA_NUM_THREADS
are passed to the agents.
USAGE
}

die() { echo "launch-mpirun.sh: $*" >&2; exit 2; }

hostfile="" model="" gpus_per_node=8 base_port=50051 agent="${INA_AGENT_BIN:-}" device=cuda dry_run=0
agent_args=()
while (($#)); do
  case $1 in
  --hostfile | --model | --gpus-per-node | --base-port | --agent)
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
    --hostfile) hostfile=$2 ;;
    --model) model=$2 ;;
    --gpus-per-node) gpus_per_node=$2 ;;
    --base-port) base_port=$2 ;;
    --agent) agent=$2 ;;
    esac
    shift 2 ;;
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
[[ $base_port =~ ^[1-9][0-9]*$ ]] || die "--base-port '$base_port': expected a port number"
((base_port + gpus_per_node - 1 <= 65535)) ||
  die "--base-port $base_port + --gpus-per-node $gpus_per_node runs past port 65535"

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

extra_mpirun=()
[[ -z ${INA_MPIRUN_ARGS:-} ]] || read -r -a extra_mpirun <<<"$INA_MPIRUN_ARGS"

# mpirun -x exports a variable of this environment to every rank.
export INA_AGENT_BIN=$agent INA_BASE_PORT=$base_port INA_DEVICE=$device
exports=(-x INA_AGENT_BIN -x INA_BASE_PORT -x INA_DEVICE)
for var in INA_LISTEN_HOST INA_LOG INA_NUM_THREADS; do
  [[ -z ${!var:-} ]] || exports+=(-x "$var")
done
cmd=("$mpirun_bin" --hostfile "$hostfile"
  -np $((${#hosts[@]} * gpus_per_node)) --map-by "ppr:$gpus_per_node:node" --bind-to numa
  --tag-output "${exports[@]}" "${extra_mpirun[@]}"
  "$wrapper" --model "$model" "${agent_args[@]}")

echo "launch-mpirun.sh: ${#hosts[@]} host(s) x $gpus_per_node rank(s), endpoints:" >&2
for host in "${hosts[@]}"; do
  echo "  $host:$base_port..$((base_port + gpus_per_node - 1))" >&2
done
if ((dry_run)); then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
