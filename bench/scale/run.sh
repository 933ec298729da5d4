#!/usr/bin/env bash
# The multi-GPU measurements in one call, on a machine with N GPUs where the project is
# built in build/ (binaries only) and `source .device/env.sh` was done:
#   comm    bench_custom_ar at N ranks (custom bf16 / FP8 all-reduce against NCCL, fused
#           all-reduce + residual + RMSNorm) and test_custom_ar at N ranks (correctness,
#           FP8 error against its bound)
#   decode  bench_decode_parallel on random:v3-layers, bf16: one GPU, TP N, EP N,
#           attention DP N + EP N, batch 1/64/256, context 1024; greedy hashes compared
#           with the one-GPU run's
#   tokens  the decode runs again with steps that return greedy tokens (--token-steps:
#           no logits to the host, as a server with greedy requests steps)
#   place   placement_under_load.sh: expert moves while K clients stream (EP N agent)
#   fp8     the same decode runs in fp8 for one GPU, EP N and DP N + EP N
# Each step runs under `timeout` and within the --budget; a failed or skipped step is
# recorded and the next one runs. Progress goes to stderr, the summary to stdout, every
# log under --out. Exit status: 0 when no step failed or missed its binary (skipped ones
# are fine), 1 otherwise.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<'USAGE'
usage: bench/scale/run.sh --gpus N --out DIR [--build build] [--quick] [options]

  --gpus N         GPUs (ranks) of the multi-GPU runs: 2, 4 or 8
  --out DIR        where every log goes (created)
  --build DIR      build directory (default build)
  --quick          leave out the fp8 decode runs
  --parts LIST     comma-separated steps to run, in this order: comm,decode,tokens,place,fp8
                   (default all of them; with --quick comm,decode,tokens,place)
  --budget S       seconds for the whole run (default 540: a device call may last 600);
                   a step that no longer fits is recorded as "skipped (time budget)"
  --steps N        timed decode steps per batch (default: the bench's, 20)
  --greedy P,G     greedy check of the decode runs (default: the bench's, 8,32)
  --place-args "A" more placement_under_load.sh options (split on spaces), e.g.
                   "--clients 16 --dtype fp8", or "--cpu" to try the step without GPUs
  -h, --help       this help

Environment: INA_MPIRUN_ARGS adds mpirun options (split on spaces).
USAGE
}

die() { echo "run.sh: $*" >&2; exit 2; }

gpus="" out="" build=build quick=0 parts="" budget=540 steps="" greedy="" place_args=""
while (($#)); do
  case $1 in
  --gpus | --out | --build | --parts | --budget | --steps | --greedy | --place-args)
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
    --gpus) gpus=$2 ;;
    --out) out=$2 ;;
    --build) build=$2 ;;
    --parts) parts=$2 ;;
    --budget) budget=$2 ;;
    --steps) steps=$2 ;;
    --greedy) greedy=$2 ;;
    --place-args) place_args=$2 ;;
    esac
    shift 2 ;;
  --quick) quick=1; shift ;;
  -h | --help) usage; exit 0 ;;
  *) die "unknown option '$1' (see --help)" ;;
  esac
done
if [[ ! $gpus =~ ^[1-9][0-9]*$ ]] || ((gpus < 2)); then die "--gpus N (2, 4 or 8) is required"; fi
[[ -n $out ]] || die "--out DIR is required"
[[ $budget =~ ^[0-9]+$ ]] || die "--budget '$budget': expected seconds"
[[ -z $steps || $steps =~ ^[1-9][0-9]*$ ]] || die "--steps '$steps': expected a positive number"
[[ -z $greedy || $greedy =~ ^[0-9]+,[0-9]+$ ]] || die "--greedy '$greedy': expected P,G"
if [[ -z $parts ]]; then
  parts=comm,decode,tokens,place,fp8
  ((!quick)) || parts=comm,decode,tokens,place
fi
for p in ${parts//,/ }; do
  [[ $p =~ ^(comm|decode|tokens|place|fp8)$ ]] || die "--parts: unknown step '$p' (comm, decode, tokens, place, fp8)"
done
wants() { [[ ,$parts, == *,$1,* ]]; }
[[ -d $build ]] || die "build directory '$build' not found (--build)"
mpirun_bin=$(command -v mpirun) || die "mpirun not found on PATH (source .device/env.sh first)"
mkdir -p "$out" || die "cannot create '$out'"
out=$(cd "$out" && pwd)

start=$(date +%s)
deadline=$((start + budget))
left() { local n=$((deadline - $(date +%s))); echo $((n > 0 ? n : 0)); }
say() { printf '[scale %4ss] %s\n' "$(($(date +%s) - start))" "$*" | tee -a "$out/progress.log" >&2; }
: >"$out/progress.log"
status_file=$out/status.txt
: >"$status_file"
failed_steps=0 missing_steps=0
declare -A step_status=()
# record NAME STATUS SECONDS LOG: one row of the status table.
record() {
  step_status[$1]=$2
  printf '%-18s %-44s %5s  %s\n' "$1" "$2" "$3" "$4" >>"$status_file"
  case $2 in
  ok | skipped*) ;;
  missing*) missing_steps=$((missing_steps + 1)) ;;
  *) failed_steps=$((failed_steps + 1)) ;;
  esac
}

step_pid=""
# A step runs in the background under timeout (its own process group, which a terminal's
# Ctrl-C does not reach), so an interrupt here ends it explicitly.
trap 'say "interrupted"; [[ -z $step_pid ]] || kill -TERM "$step_pid" 2>/dev/null; exit 130' INT TERM

# run_step NAME LOG LIMIT MIN CMD...: CMD under timeout (LIMIT seconds, or what is left
# of the budget) with stdout and stderr in LOG; not started when less than MIN seconds
# are left. Records ok, skipped (REASON) for exit 77, timed out, or failed (exit N).
run_step() {
  local name=$1 log=$2 limit=$3 min=$4 t rc reason
  shift 4
  if (($(left) < min)); then
    say "$name: skipped (time budget: $(left) s left, $min needed)"
    record "$name" "skipped (time budget)" 0 "-"
    return
  fi
  ((limit <= $(left))) || limit=$(left)
  say "$name: ${*#"$PWD"/} (limit ${limit}s) > ${log#"$out"/}"
  echo "# $*" >"$log"
  t=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" >>"$log" 2>&1 &
  step_pid=$!
  rc=0
  wait "$step_pid" || rc=$?
  step_pid=""
  t=$(($(date +%s) - t))
  case $rc in
  0) reason=ok ;;
  77)
    # The binaries say why: "skipped (no CUDA device)", "no CUDA device, skipped", ...
    reason=$(grep -o -m1 -E 'skipped \([^)]*\)|no CUDA device|fewer GPUs than ranks[^)]*' "$log" | head -1)
    case $reason in
    *"no CUDA device"* | "") reason="skipped (no GPU)" ;;
    skipped*) ;;
    *) reason="skipped ($reason)" ;;
    esac ;;
  124 | 137) reason="timed out after ${limit}s" ;;
  2 | 3)
    # a bad option or, from placement_under_load.sh, a missing binary
    reason=$(grep -o -m1 "'[^']*' is missing" "$log" | cut -d"'" -f2)
    reason=${reason:+missing (${reason##*/})}
    : "${reason:=failed (exit $rc)}" ;;
  *) reason="failed (exit $rc)" ;;
  esac
  say "$name: $reason in ${t}s"
  record "$name" "$reason" "$t" "${log#"$out"/}"
}

# need NAME BINARY: records NAME as missing unless BINARY is an executable.
need() {
  [[ -x $2 ]] && return 0
  say "$1: missing ($2)"
  record "$1" "missing (${2##*/})" 0 "-"
  return 1
}

extra_mpirun=()
[[ -z ${INA_MPIRUN_ARGS:-} ]] || read -r -a extra_mpirun <<<"$INA_MPIRUN_ARGS"
# mpi NP: sets `launch` to the mpirun prefix of NP ranks; --oversubscribe only so that a
# machine with fewer cores than ranks (a test without GPUs) still starts the job.
launch=()
mpi() { launch=("$mpirun_bin" --oversubscribe -np "$1" "${extra_mpirun[@]}"); }

# ---- the machine -----------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(hostname), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
    [[ -n $(git -C "$here" status --porcelain 2>/dev/null | head -1) ]] && echo " (working tree modified)")"
  echo "command: $0 --gpus $gpus --out $out --build $build --parts $parts --budget $budget${steps:+ --steps $steps}${greedy:+ --greedy $greedy}${place_args:+ --place-args \"$place_args\"}"
  echo "mpirun: $("$mpirun_bin" --version 2>&1 | head -1)"
  env | grep -E '^(NCCL_|CUDA_VISIBLE|OMPI_MCA|INA_)' | sort
  echo "--- nvidia-smi -L"
  nvidia-smi -L 2>&1 || true
  echo "--- nvidia-smi topo -m"
  nvidia-smi topo -m 2>&1 || true
  echo "--- binaries"
  for b in bench/bench_custom_ar tests/comm/test_custom_ar bench/bench_decode_parallel agent/ina-agent tools/ina; do
    if [[ -e $build/$b ]]; then ls -l --time-style=+%Y-%m-%dT%H:%M "$build/$b"; else echo "$build/$b: missing"; fi
  done
} >"$out/env.txt" 2>&1
visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
say "$gpus GPU run, $visible GPU(s) visible, parts $parts, budget ${budget}s, logs in $out"
((visible >= gpus)) || say "fewer GPUs visible than --gpus $gpus: the GPU steps will report skipped"

# ---- comm ------------------------------------------------------------------------------
comm() {
  mpi "$gpus"
  if need comm-bench "$build/bench/bench_custom_ar"; then
    run_step comm-bench "$out/comm.txt" 300 60 "${launch[@]}" "$build/bench/bench_custom_ar"
  fi
  if need comm-test "$build/tests/comm/test_custom_ar"; then
    run_step comm-test "$out/comm-test.txt" 180 30 "${launch[@]}" "$build/tests/comm/test_custom_ar"
  fi
}

# comm_tables: the bench's figures as two tables (µs): plain all-reduce by size, and the
# fused epilogue by tokens.
comm_tables() {
  awk '
    $3 == "us" && $1 ~ /_latency$/ {
      n = $1; sub(/_latency$/, "", n)
      if (match(n, /_[0-9]+(KiB|MiB)$/)) {
        size = substr(n, RSTART + 1); v = substr(n, 1, RSTART - 1)
        if (!(size in seen)) { seen[size] = 1; sizes[++ns] = size }
        lat[v, size] = $2
      } else if (match(n, /_[0-9]+tok$/)) {
        tok = substr(n, RSTART + 1); v = substr(n, 1, RSTART - 1)
        if (!(tok in tseen)) { tseen[tok] = 1; toks[++nt] = tok }
        lat[v, tok] = $2
      }
    }
    $1 ~ /^nccl_bf16_.*_busbw$/ { b = $1; sub(/^nccl_bf16_/, "", b); sub(/_busbw$/, "", b); bus[b] = $2 }
    $1 == "floor_empty_kernel_latency" { floor = $2 }
    function cell(v, k) { return ((v, k) in lat) ? sprintf("%.2f", lat[v, k]) : "-" }
    END {
      if (floor != "") printf "floor: an empty kernel of the all-reduce grid, graph-replayed: %.2f us\n\n", floor
      if (ns) {
        print "| bf16 bytes | NCCL (busbw GB/s) | LL | one-shot | two-shot | FP8 two-shot | NCCL / best bf16 | NCCL / FP8 |"
        print "|---|---|---|---|---|---|---|---|"
        for (i = 1; i <= ns; i++) {
          s = sizes[i]; best = 0
          split("custom_bf16_ll custom_bf16_oneshot custom_bf16_twoshot", vs, " ")
          for (j = 1; j <= 3; j++) if ((vs[j], s) in lat && (best == 0 || lat[vs[j], s] < best)) best = lat[vs[j], s]
          nc = ((("nccl_bf16", s) in lat) ? lat["nccl_bf16", s] : 0)
          fp = ((("custom_fp8_twoshot", s) in lat) ? lat["custom_fp8_twoshot", s] : 0)
          printf "| %s | %s (%s) | %s | %s | %s | %s | %s | %s |\n", s, cell("nccl_bf16", s),
                 (s in bus) ? sprintf("%.0f", bus[s]) : "-", cell("custom_bf16_ll", s),
                 cell("custom_bf16_oneshot", s), cell("custom_bf16_twoshot", s), cell("custom_fp8_twoshot", s),
                 (nc && best) ? sprintf("%.2fx", nc / best) : "-", (nc && fp) ? sprintf("%.2fx", nc / fp) : "-"
        }
      }
      if (nt) {
        print ""
        print "| tokens x 7168 | fused bf16 | fused, FP8 transport | custom AR + norm | NCCL + norm | fused vs AR + norm |"
        print "|---|---|---|---|---|---|"
        for (i = 1; i <= nt; i++) {
          k = toks[i]; f = lat["fused_bf16", k]; u = lat["unfused_custom", k]
          printf "| %s | %s | %s | %s | %s | %s |\n", k, cell("fused_bf16", k), cell("fused_fp8", k),
                 cell("unfused_custom", k), cell("unfused_nccl", k), (f && u) ? sprintf("%.2fx", u / f) : "-"
        }
      }
    }' "$out/comm.txt"
}

# ---- decode ----------------------------------------------------------------------------
decode_bin=$build/bench/bench_decode_parallel
decode_common=(--batch "1,64,256" --context 1024)
[[ -z $steps ]] || decode_common+=(--steps "$steps")
[[ -z $greedy ]] || decode_common+=(--greedy "$greedy")
decode_runs=() # the layouts run, for the tables: NAME:DTYPE

# decode_run NAME DTYPE NP ARGS...: one bench_decode_parallel job into decode-NAME-DTYPE.txt.
# DTYPE bf16-tokens: bf16 with --token-steps.
decode_run() {
  local name=$1 dtype=$2 np=$3
  shift 3
  decode_runs+=("$name:$dtype")
  need "decode-$name-$dtype" "$decode_bin" || return
  mpi "$np"
  local mode=(--dtype "$dtype")
  [[ $dtype != bf16-tokens ]] || mode=(--dtype bf16 --token-steps)
  run_step "decode-$name-$dtype" "$out/decode-$name-$dtype.txt" 240 45 \
    "${launch[@]}" "$decode_bin" "${mode[@]}" "${decode_common[@]}" "$@"
}

decode() { # DTYPE: the one-GPU reference, then the layouts of N GPUs
  local dtype=$1
  decode_run gpu1 "$dtype" 1
  [[ $dtype == fp8 ]] || decode_run "tp$gpus" "$dtype" "$gpus" --tp "$gpus"
  decode_run "ep$gpus" "$dtype" "$gpus" --ep
  decode_run "ep${gpus}dp$gpus" "$dtype" "$gpus" --ep --dp
}

# decode_tables: tokens/s per layout and batch (ratio to one GPU of the same dtype), then
# the greedy hashes against the one-GPU run's.
decode_tables() {
  local run name dtype log ref hash refhash
  echo "decode tokens/s (batch/median step time), context 1024; (x) = vs one GPU, same dtype"
  printf '%-16s %18s %18s %18s\n' layout b1 b64 b256
  for run in "${decode_runs[@]}"; do
    name=${run%%:*} dtype=${run#*:}
    log=$out/decode-$name-$dtype.txt ref=$out/decode-gpu1-$dtype.txt
    if ! grep -q '^decode_tokens_per_s\[' "$log" 2>/dev/null; then
      printf '%-16s %s\n' "$name-$dtype" "${step_status[decode-$name-$dtype]:-not run}"
      continue
    fi
    awk -v name="$name-$dtype" -v ref="$ref" '
      function batch(s) { return match(s, /,b[0-9]+,/) ? substr(s, RSTART + 2, RLENGTH - 3) : "" }
      BEGIN { while ((getline l < ref) > 0) { split(l, f, " ")
                if (f[1] ~ /^decode_tokens_per_s\[/ && f[3] == "tokens/s") r[batch(f[1])] = f[2] } }
      $1 ~ /^decode_tokens_per_s\[/ && $3 == "tokens/s" { v[batch($1)] = $2 }
      END { printf "%-16s", name
            split("1 64 256", bs, " ")
            for (i = 1; i <= 3; i++) {
              b = bs[i]
              if (!(b in v)) { printf " %18s", "-"; continue }
              c = sprintf("%.1f", v[b])
              if (name !~ /^gpu1-/ && (b in r) && r[b] > 0) c = c sprintf(" (%.2fx)", v[b] / r[b])
              printf " %18s", c }
            printf "\n" }' "$log"
  done
  echo
  echo "greedy tokens (greedy_tokens_hash) against one GPU's, same dtype:"
  for run in "${decode_runs[@]}"; do
    name=${run%%:*} dtype=${run#*:}
    [[ $name != gpu1 ]] || continue
    hash=$(grep -m1 '^greedy_tokens_hash ' "$out/decode-$name-$dtype.txt" 2>/dev/null | cut -d' ' -f2-)
    refhash=$(grep -m1 '^greedy_tokens_hash ' "$out/decode-gpu1-$dtype.txt" 2>/dev/null | cut -d' ' -f2-)
    local expect="may differ: partial sums added in another order flip near-ties"
    [[ $name == *dp* ]] && expect="may differ: each rank runs its own batch shapes"
    [[ $name == ep$gpus ]] && expect="expected equal: expert parallelism combines rows in one GPU's order"
    if [[ -z $hash || -z $refhash ]]; then
      if [[ -z $hash ]]; then
        printf '  %-16s no hash (this run: %s)\n' "$name-$dtype" "${step_status[decode-$name-$dtype]:-not run}"
      else
        printf '  %-16s no hash (one-GPU run: %s)\n' "$name-$dtype" "${step_status[decode-gpu1-$dtype]:-not run}"
      fi
    elif [[ $hash == "$refhash" ]]; then
      printf '  %-16s EQUAL to one GPU (%s)\n' "$name-$dtype" "$hash"
    elif [[ $name == ep$gpus ]]; then
      printf '  %-16s DIFFERS from one GPU (%s vs %s): unexpected, %s\n' "$name-$dtype" "$hash" "$refhash" "$expect"
    else
      printf '  %-16s differs from one GPU (%s vs %s): %s\n' "$name-$dtype" "$hash" "$refhash" "$expect"
    fi
  done
}

# ---- place -----------------------------------------------------------------------------
place() {
  # The script's own limit (agent, clients, moves, stop) ends 20 s before the step's, so
  # that it stops the agent itself.
  local limit=$(($(left) - 20)) args=()
  [[ -z $place_args ]] || read -r -a args <<<"$place_args"
  ((limit <= 400)) || limit=400
  ((limit > 0)) || limit=1
  # Its progress lines (the long step's) are shown as they come.
  mkdir -p "$out/place"
  : >"$out/place/progress.log"
  tail -n 0 -F "$out/place/progress.log" >&2 2>/dev/null &
  local tail_pid=$!
  run_step place "$out/place.txt" 420 150 \
    "$here/placement_under_load.sh" --gpus "$gpus" --out "$out/place" --build "$build" --timeout "$limit" "${args[@]}"
  sleep 0.5
  kill "$tail_pid" 2>/dev/null
  wait "$tail_pid" 2>/dev/null
}

# ---- run -------------------------------------------------------------------------------
if wants comm; then comm; fi
if wants decode; then decode bf16; fi
if wants tokens; then decode bf16-tokens; fi
if wants place; then place; fi
if wants fp8; then decode fp8; fi

# ---- summary ---------------------------------------------------------------------------
{
  echo "== ina scale run: $gpus GPUs ($visible visible), $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep '^commit:' "$out/env.txt") =="
  echo "logs: $out"
  echo
  printf '%-18s %-44s %5s  %s\n' step status s log
  cat "$status_file"
  if wants comm && [[ -s $out/comm.txt ]] && grep -q '_latency ' "$out/comm.txt"; then
    echo
    echo "custom all-reduce vs NCCL at $gpus GPUs (us; graph-replayed, median, slowest rank):"
    comm_tables | tee "$out/comm-table.md"
  fi
  if wants comm && [[ -s $out/comm-test.txt ]]; then
    echo
    echo "test_custom_ar at $gpus ranks:"
    grep -E "^test_custom_ar|CHECK failed" "$out/comm-test.txt" | head -14 | sed 's/^/  /'
  fi
  if ((${#decode_runs[@]})); then
    echo
    decode_tables | tee "$out/decode-table.txt"
  fi
  if wants place && [[ -s $out/place/summary.txt ]]; then
    echo
    echo "placement under load ($out/place):"
    grep -v -E "^(expert load|balance): " "$out/place/summary.txt" | sed 's/^/  /'
  fi
  echo
  echo "total: $(($(date +%s) - start)) s; $failed_steps step(s) failed, $missing_steps missing"
} | tee "$out/summary.txt"
((failed_steps == 0 && missing_steps == 0))
