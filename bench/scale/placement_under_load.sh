#!/usr/bin/env bash
# Expert placement changes while generation requests stream, on one expert-parallel
# ina-agent job (mpirun -np N ina-agent --ep): N GPUs (random:v3-layers by default), or
# N CPU ranks with --cpu (the built-in tiny model), so the same script runs anywhere.
#
#   1. start the job; wait for "serving", health SERVING and `ina info` listing N ranks
#   2. calibrate: K concurrent probe requests give the per-stream decode rate at batch K,
#      from which each client's token count is chosen so the clients outlast the moves
#   3. K clients (`ina generate --server`, one prompt each, --ignore-eos) in the
#      background; a sampler logs `ina load` (decode tokens/s, running requests) each second
#   4. while they run: the expert counts (`ina load --experts`), then two timed moves:
#      `ina place --balance` with spare slots (replicas of the hot experts), and a
#      rotation (every EP rank's slots go to the next rank: every expert moves)
#   5. every client must exit 0 with its full token count (finish "length")
#   6. SIGTERM to rank 0: mpirun must exit 0 and no rank process may be left
#
# Exit status: 0 every check passed, 1 a check failed, 2 bad usage or a missing binary,
# 77 skipped (fewer GPUs than ranks). Logs and summary.txt go to --out.
set -u

usage() {
  cat <<'USAGE'
usage: bench/scale/placement_under_load.sh --out DIR [--gpus N | --cpu [--ranks N]] [options]

  --out DIR          where every log goes (created)
  --gpus N           N GPU ranks (default: every GPU nvidia-smi lists)
  --cpu              run the agent on the CPU engine (default model tiny, 2 ranks)
  --ranks N          ranks of the job (the same as --gpus N; with --cpu default 2)
  --build DIR        build directory holding agent/ina-agent and tools/ina (default build)
  --model M          model (default: random:v3-layers on GPUs, tiny with --cpu)
  --dtype D          random weights' dtype: bf16 (default) or fp8
  --clients K        concurrent client processes (default 8 on GPUs, 4 with --cpu)
  --tokens T         tokens per client (default: calibrated so the clients run --seconds)
  --seconds S        how long the clients should stream (default 60 on GPUs, 20 with --cpu)
  --before S         seconds of streaming before the first move (default 8 / 4)
  --extra-slots X    spare expert slots per rank for --balance (default slots/8, at least 1)
  --control          the same streams with no move: what before/after look like without one
                     (later tokens attend longer contexts, so "after" is slower by itself)
  --timeout S        hard limit for the whole script, agent included (default 330 / 240)
  --ready-timeout S  how long the agent may take to serve (default 240 / 60)
  --agent-args "A"   more ina-agent options (split on spaces)
  -h, --help         this help

Environment: INA_MPIRUN_ARGS adds mpirun options (split on spaces).
USAGE
}

die() { echo "placement_under_load.sh: $*" >&2; exit 2; }

ranks="" cpu=0 out="" build=build model="" dtype=bf16 clients="" tokens="" seconds="" before=""
extra_slots="" limit="" ready_timeout="" agent_extra="" control=0
while (($#)); do
  case $1 in
  --out | --gpus | --ranks | --build | --model | --dtype | --clients | --tokens | --seconds | \
    --before | --extra-slots | --timeout | --ready-timeout | --agent-args)
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
    --out) out=$2 ;;
    --gpus | --ranks) ranks=$2 ;;
    --build) build=$2 ;;
    --model) model=$2 ;;
    --dtype) dtype=$2 ;;
    --clients) clients=$2 ;;
    --tokens) tokens=$2 ;;
    --seconds) seconds=$2 ;;
    --before) before=$2 ;;
    --extra-slots) extra_slots=$2 ;;
    --timeout) limit=$2 ;;
    --ready-timeout) ready_timeout=$2 ;;
    --agent-args) agent_extra=$2 ;;
    esac
    shift 2 ;;
  --cpu) cpu=1; shift ;;
  --control) control=1; shift ;;
  -h | --help) usage; exit 0 ;;
  *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ -n $out ]] || die "--out DIR is required (see --help)"
for pair in "ranks:$ranks" "clients:$clients" "tokens:$tokens" "seconds:$seconds" "before:$before" \
  "extra-slots:$extra_slots" "timeout:$limit" "ready-timeout:$ready_timeout"; do
  [[ -z ${pair#*:} || ${pair#*:} =~ ^[0-9]+$ ]] || die "--${pair%%:*} '${pair#*:}': expected a whole number"
done
[[ $dtype == bf16 || $dtype == fp8 ]] || die "--dtype '$dtype': expected bf16 or fp8"

# Defaults by device: the GPU run loads a 72 GB model and moves tens of GB, the CPU run a
# few MB, so waits and limits differ by an order of magnitude.
if ((cpu)); then
  device=cpu
  : "${ranks:=2}" "${model:=tiny}" "${clients:=4}" "${seconds:=20}" "${before:=4}"
  : "${limit:=240}" "${ready_timeout:=60}"
  max_tokens=65536
else
  device=cuda
  : "${model:=random:v3-layers}" "${clients:=8}" "${seconds:=60}" "${before:=8}"
  : "${limit:=330}" "${ready_timeout:=240}"
  # MLA keeps 576 values per token and layer: 256k tokens of v3-layers are ~1.2 GB.
  max_tokens=262144
fi
((clients >= 1)) || die "--clients must be at least 1"

agent=$build/agent/ina-agent ina=$build/tools/ina
[[ -x $agent ]] || die "'$agent' is missing (build the ina-agent target, or pass --build)"
[[ -x $ina ]] || die "'$ina' is missing (build the ina target, or pass --build)"
mpirun_bin=$(command -v mpirun) || die "mpirun not found on PATH (source .device/env.sh on the GPU machine)"
mkdir -p "$out" || die "cannot create '$out'"
out=$(cd "$out" && pwd)

t0=$(date +%s.%N)
deadline=$(awk -v a="$t0" -v l="$limit" 'BEGIN { printf "%.0f", a + l }')
# secs: seconds since the start, one decimal.
secs() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# left: whole seconds until the deadline (0 when past).
left() { local n; n=$(($(date +%s) < deadline ? deadline - $(date +%s) : 0)); echo "$n"; }
# within S: S, or what is left before the deadline when that is less (at least 1).
within() { local l; l=$(left); ((l < $1)) && { echo $((l > 1 ? l : 1)); return; }; echo "$1"; }
say() { printf '[place %6ss] %s\n' "$(secs)" "$*" | tee -a "$out/progress.log" >&2; }
summary=$out/summary.txt
: >"$summary"
: >"$out/progress.log"
note() { echo "$*" >>"$summary"; }
failures=0
fail() { failures=$((failures + 1)); note "FAIL: $*"; say "FAIL: $*"; }

# GPU mode needs a GPU per rank: without them the agent would fall back or fail late,
# and a 72 GB random model must never be built in host memory.
if ((!cpu)); then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  : "${ranks:=$gpus}"
  if ((gpus == 0 || gpus < ranks)); then
    note "status: skipped (no GPU: $gpus visible, $ranks needed)"
    say "skipped: $gpus GPU(s) visible, $ranks needed"
    cat "$summary"
    exit 77
  fi
fi
if [[ ! $ranks =~ ^[0-9]+$ ]] || ((ranks < 2)); then
  die "expert parallelism needs at least 2 ranks (--ranks/--gpus)"
fi

note "placement under load: $ranks $device ranks, model $model ($dtype), $clients clients"
say "out $out; $ranks $device rank(s), model $model, $clients clients, limit ${limit}s"

token_file=$out/admin-token
(umask 077 && echo "scale-$RANDOM$RANDOM$RANDOM" >"$token_file")

# ---- processes this script starts, and their cleanup ----------------------------------
# is_rank PID: PID is still an ina-agent (a pid reused by another program is not ours).
is_rank() { [[ $(cat "/proc/$1/comm" 2>/dev/null) == ina-agent ]]; }
agent_pid="" pid0="" rank_pids=() client_pids=() sampler_pid="" stopped=0
# cleanup: ends whatever of ours still runs, by pid: the clients and the sampler, then the
# agent (SIGTERM to rank 0 drains; past that, timeout's SIGTERM to mpirun, then SIGKILL).
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local pid
  touch "$out/.sampler-stop" 2>/dev/null
  for pid in "${client_pids[@]}" $sampler_pid; do kill -TERM "$pid" 2>/dev/null; done
  if ((!stopped)) && [[ -n $agent_pid ]] && kill -0 "$agent_pid" 2>/dev/null; then
    [[ -z $pid0 ]] || kill -TERM "$pid0" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.2; done
    kill -TERM "$agent_pid" 2>/dev/null
    for _ in $(seq 25); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$agent_pid" 2>/dev/null
  fi
  for pid in "${rank_pids[@]}"; do is_rank "$pid" && kill -KILL "$pid" 2>/dev/null; done
  rm -f "$out/.sampler-stop"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

finish() { # prints the summary and exits with the result
  if ((failures)); then note "status: FAILED ($failures check(s))"; else note "status: ok"; fi
  note "elapsed: $(secs) s"
  cat "$summary"
  ((failures == 0))
  exit $?
}

# ---- 1. the agent ----------------------------------------------------------------------
extra_mpirun=()
[[ -z ${INA_MPIRUN_ARGS:-} ]] || read -r -a extra_mpirun <<<"$INA_MPIRUN_ARGS"
agent_args=()
[[ -z $agent_extra ]] || read -r -a agent_args <<<"$agent_extra"
# --bind-to none: a rank's gRPC, scheduler and (CPU) engine threads must not share one core.
cmd=("$mpirun_bin" --oversubscribe --bind-to none -np "$ranks" "${extra_mpirun[@]}"
  "$agent" --model "$model" --dtype "$dtype" --ep --device "$device" --listen 127.0.0.1:0
  --max-tokens "$max_tokens" --admin-token-file "$token_file" --drain-grace-ms 20000 "${agent_args[@]}")
echo "${cmd[*]}" >"$out/agent.cmd"
say "starting: ${cmd[*]}"
# timeout makes its own process group: on the deadline it ends mpirun and its ranks.
timeout --kill-after=15 "$(within "$limit")" "${cmd[@]}" >"$out/agent.log" 2>&1 &
agent_pid=$!

ready_by=$(($(date +%s) + $(within "$ready_timeout")))
while (($(date +%s) < ready_by)) && kill -0 "$agent_pid" 2>/dev/null; do
  grep -q "serving$" "$out/agent.log" 2>/dev/null && break
  sleep 0.5
done
port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$out/agent.log" | head -1 | grep -o "[0-9]*$")
pid0=$(grep -o "rank 0 of .*(pid [0-9]*)" "$out/agent.log" | head -1 | grep -o "[0-9]*)$" | tr -d ')')
if ! grep -q "serving$" "$out/agent.log" || [[ -z $port || -z $pid0 ]]; then
  if kill -0 "$agent_pid" 2>/dev/null; then
    fail "the agent did not serve within ${ready_timeout}s (see agent.log)"
  else
    rc=0
    wait "$agent_pid" || rc=$?
    fail "the agent job ended (exit $rc) before serving (see agent.log)"
  fi
  tail -20 "$out/agent.log" | sed 's/^/  | /' >&2
  finish
fi
server=127.0.0.1:$port
note "agent: serving on $server after $(secs) s (rank 0 pid $pid0)"
say "serving on $server (rank 0 pid $pid0)"

# cli CMD ARGS...: `ina CMD --server ... ARGS` under a timeout.
cli() { timeout --kill-after=5 "$(within 60)" "$ina" "$1" --server "$server" "${@:2}"; }

cli health >"$out/health.txt" 2>&1 || fail "health is not SERVING: $(head -1 "$out/health.txt")"
cli info >"$out/info.txt" 2>&1 || fail "ina info failed: $(tail -1 "$out/info.txt")"
grep -q "ranks: $ranks of world size $ranks" "$out/info.txt" ||
  fail "ina info does not list $ranks ranks: $(grep ranks: "$out/info.txt")"
mapfile -t rank_pids < <(grep -o "^  rank [0-9]*: .*pid [0-9]*" "$out/info.txt" | grep -o "[0-9]*$")
max_context=$(grep -o "max context [0-9]*" "$out/info.txt" | grep -o "[0-9]*$")
experts=$(grep -o "[0-9]* experts (top" "$out/info.txt" | grep -o "^[0-9]*")
note "agent: $(grep '^model:' "$out/info.txt")"
note "agent: $(grep '^build:' "$out/info.txt")"
((failures == 0)) || finish

# ---- 2. calibration: the per-stream rate at K streams ----------------------------------
# Prompt i: 12 + i%8 ids in 2..999, valid for every built-in vocabulary, distinct per
# client so that their tokens reach different experts.
prompt() {
  local i=$1 n=$((12 + $1 % 8)) j ids=()
  for ((j = 0; j < n; j++)); do ids+=($(((i * 7919 + j * 104729 + j * j * 31) % 998 + 2))); done
  local IFS=,
  echo "${ids[*]}"
}

# client_stats FILE: "streamed generated first_ms total_ms finish" of one client's output.
client_stats() {
  awk '/^prompt 0:/ { s = substr($0, 10); gsub(/[ \t]/, "", s); n = s == "" ? 0 : split(s, a, ",") }
       /^finish:/ { f = $2; sub(/,$/, "", f)
                    for (i = 1; i <= NF; i++) {
                      if ($(i + 1) == "generated,") g = $i
                      if ($i == "token") fm = $(i + 1)
                      if ($i == "total") t = $(i + 1) } }
       END { printf "%d %d %s %s %s\n", n, g, fm == "" ? 0 : fm, t == "" ? 0 : t, f == "" ? "none" : f }' "$1"
}

probe_tokens=64
mkdir -p "$out/calibrate"
for round in warmup measure; do
  pids=()
  for ((i = 0; i < clients; i++)); do
    cli generate --prompt-ids "$(prompt $((i + 100)))" --max-new-tokens "$probe_tokens" --ignore-eos \
      >"$out/calibrate/$round-$i.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || fail "calibration ($round): a probe request failed"; done
done
((failures == 0)) || finish
# decode tokens/s of one stream = (generated - 1) / (total - first token); the mean.
rate=$(for ((i = 0; i < clients; i++)); do client_stats "$out/calibrate/measure-$i.txt"; done |
  awk '$4 > $3 && $2 > 1 { r += ($2 - 1) / (($4 - $3) / 1000); n++ } END { printf "%.1f", n ? r / n : 0 }')
prompt_max=20 page=64
cap=$((max_tokens / clients - prompt_max - 2 * page))
[[ -z $max_context ]] || ((max_context - prompt_max - 8 >= cap)) || cap=$((max_context - prompt_max - 8))
if [[ -z $tokens ]]; then
  tokens=$(awk -v r="$rate" -v s="$seconds" -v c="$cap" \
    'BEGIN { t = int(r * s); if (t < 256) t = 256; if (t > c) t = c; print t }')
fi
((tokens <= cap)) || say "warning: --tokens $tokens exceeds the KV capacity per client ($cap): requests may be preempted"
expected_s=$(awk -v r="$rate" -v t="$tokens" 'BEGIN { printf "%.0f", (r > 0 ? t / r : 0) }')
note "calibration: $clients concurrent streams decode $rate tokens/s each; $tokens tokens per client (~${expected_s} s)"
say "calibrated: $rate tokens/s per stream at $clients streams -> $tokens tokens per client (~${expected_s} s)"

# ---- 3. clients and the load sampler ---------------------------------------------------
# sampler: every second, `ina load`: "epoch window_s decode_tps running queued".
sampler() {
  local line t
  while [[ ! -e $out/.sampler-stop ]]; do
    if line=$(timeout 10 "$ina" load --server "$server" --timeout-ms 5000 2>/dev/null); then
      t=$(date +%s.%N)
      awk -v t="$t" '/^requests:/ { run = $4; q = $2 }
                     /^throughput:/ { d = $6; w = $(NF - 1) }
                     END { if (d != "") print t, w, d, run, q }' <<<"$line"
    fi
    sleep 1
  done
}
rm -f "$out/.sampler-stop"
sampler >"$out/load-samples.txt" &
sampler_pid=$!

client_limit=$(within $((expected_s * 4 + 120)))
clients_start=$(date +%s.%N)
for ((i = 0; i < clients; i++)); do
  timeout --kill-after=5 "$client_limit" "$ina" generate --server "$server" --prompt-ids "$(prompt "$i")" \
    --max-new-tokens "$tokens" --ignore-eos >"$out/client-$i.txt" 2>"$out/client-$i.err" &
  client_pids+=($!)
done
say "$clients clients streaming $tokens tokens each (limit ${client_limit}s)"
running_clients() { local n=0 pid; for pid in "${client_pids[@]}"; do kill -0 "$pid" 2>/dev/null && n=$((n + 1)); done; echo "$n"; }

sleep "$before"
note "clients running at the first move: $(running_clients) of $clients"

# ---- 4. the moves ----------------------------------------------------------------------
cli load --experts >"$out/expert-load-before.txt" 2>&1 || fail "ina load --experts failed"
grep "^moe layer" "$out/expert-load-before.txt" | sed 's/^/expert load: /' >>"$summary"
cli place --show --out "$out/placement-0.json" >/dev/null 2>&1 || fail "ina place --show failed"
json_int() { grep -o "\"$1\"[[:space:]]*:[[:space:]]*[0-9]*" "$2" | head -1 | grep -o "[0-9]*$"; }
slots=$(json_int slots_per_rank "$out/placement-0.json")
ep=$(json_int ep "$out/placement-0.json")
[[ -n $slots && -n $ep ]] || { fail "no slots_per_rank/ep in placement-0.json"; finish; }
note "placement in force: ep $ep, $slots slots per rank"

# place NAME ARGS...: one timed `ina place` call; its output in place-NAME.txt, a summary
# line in the summary; fails unless it applied a new generation.
moves_start="" moves_end=""
place() {
  local name=$1 a b rc applied
  shift
  a=$(date +%s.%N)
  [[ -n $moves_start ]] || moves_start=$a
  timeout --kill-after=5 "$(within 300)" "$ina" place --server "$server" --admin-token-file "$token_file" \
    "$@" >"$out/place-$name.txt" 2>&1
  rc=$?
  b=$(date +%s.%N)
  moves_end=$b
  applied=$(grep "^applied:" "$out/place-$name.txt")
  local wall; wall=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.0f", (b - a) * 1000 }')
  note "move $name: ina place took $wall ms (exit $rc), running clients $(running_clients)/$clients: ${applied:-no 'applied' line}"
  say "move $name: $wall ms: ${applied:-exit $rc, $(tail -1 "$out/place-$name.txt")}"
  if ((rc != 0)) || [[ -z $applied ]]; then
    fail "move $name: ina place exit $rc: $(tail -2 "$out/place-$name.txt" | tr '\n' ' ')"
    return 1
  fi
  local from to
  read -r from to < <(awk '{ print $3, $5 }' <<<"$applied")
  ((to == from + 1)) || fail "move $name: generation $from -> $to, expected $((from + 1))"
  local ms
  read -r ms bytes < <(awk '{ for (i = 1; i <= NF; i++) { if ($(i + 1) == "ms,") m = $i
                                                       if ($(i + 1) == "bytes") b = $i }
                              print m + 0, b + 0 }' <<<"$applied")
  note "move $name: $(awk -v b="$bytes" -v m="$ms" 'BEGIN { printf "%.4g GB in %d ms applied (%.3g GB/s)", b / 1e9, m, (m > 0 ? b / 1e6 / m : 0) }')"
  return 0
}

# moves: the balance, then the rotation.
moves() {
  # Balance: spare slots on every rank hold replicas of the hot experts.
  if [[ -z $extra_slots ]]; then extra_slots=$((slots / 8)); ((extra_slots >= 1)) || extra_slots=1; fi
  target=$((slots + extra_slots))
  [[ -z $experts ]] || ((target <= experts)) || target=$experts
  bytes=0
  if place balance --balance --slots-per-rank "$target" --out "$out/placement-1-planned.json"; then
    grep -E "^(moe layer|plan:)" "$out/place-balance.txt" | sed 's/^/balance: /' >>"$summary"
  fi

  # Rotation: every slot's expert goes to the next EP rank (a permutation of whole ranks, so
  # no rank holds an expert twice): every expert's weights move.
  cli place --show --out "$out/placement-1.json" >/dev/null 2>&1 || fail "ina place --show (after balance) failed"
  awk -v ep="$ep" '{
      out = ""
      while (match($0, /"ep_rank"[ \t]*:[ \t]*[0-9]+/)) {
        m = substr($0, RSTART, RLENGTH); n = m; sub(/.*:[ \t]*/, "", n)
        out = out substr($0, 1, RSTART - 1) "\"ep_rank\": " (n + 1) % ep
        $0 = substr($0, RSTART + RLENGTH)
      }
      print out $0
    }' "$out/placement-1.json" >"$out/placement-2-rotated.json"
  bytes=0
  if place rotation --file "$out/placement-2-rotated.json"; then
    ((bytes > 0)) || fail "move rotation: 0 bytes of expert weights moved"
  fi
  cli place --show --out "$out/placement-final.json" >/dev/null 2>&1 || fail "ina place --show (final) failed"
}

if ((control)); then
  moves_start=$(date +%s.%N) moves_end=$moves_start
  note "control run: no move"
else
  moves
fi
note "clients running after the moves: $(running_clients) of $clients"
(($(running_clients) > 0)) || say "warning: every client ended before the moves did: raise --seconds or --tokens"

# ---- 5. every client complete ----------------------------------------------------------
for ((i = 0; i < clients; i++)); do
  rc=0
  wait "${client_pids[i]}" || rc=$?
  read -r streamed generated first_ms total_ms finish_reason < <(client_stats "$out/client-$i.txt")
  tps=$(awk -v g="$generated" -v t="$total_ms" 'BEGIN { printf "%.1f", (t > 0 ? g / (t / 1000) : 0) }')
  note "client $i: exit $rc, finish $finish_reason, $streamed streamed / $generated generated of $tokens, first token $first_ms ms, total $total_ms ms ($tps tokens/s)"
  if ((rc != 0)) || [[ $finish_reason != length ]] || ((streamed != tokens || generated != tokens)); then
    fail "client $i: exit $rc, finish $finish_reason, $streamed streamed, $generated generated, want $tokens$(
      [[ -s $out/client-$i.err ]] && echo ": $(tail -1 "$out/client-$i.err")")"
  fi
done
client_pids=()
clients_end=$(date +%s.%N)
touch "$out/.sampler-stop"
wait "$sampler_pid" 2>/dev/null
sampler_pid=""

# Decode tokens/s by phase, time-weighted over the sampler's windows: before the first move
# and after the last one (only windows with every client running), and any window that
# overlaps the moves.
awk -v ms="$moves_start" -v me="$moves_end" -v k="$clients" '
  { t = $1; w = $2; d = $3; r = $4; s = t - w
    if (t <= ms) { if (r >= k) { bw += w; bt += d * w } }
    else if (s >= me) { if (r >= k) { aw += w; at += d * w } }
    else { dw += w; dt += d * w } }
  function show(name, tok, w) {
    if (w > 0) printf "decode tokens/s %s the moves: %.1f (over %.1f s sampled)\n", name, tok / w, w
    else printf "decode tokens/s %s the moves: no sample\n", name }
  END { show("before", bt, bw); show("during", dt, dw); show("after", at, aw) }' \
  "$out/load-samples.txt" >>"$summary"
awk -v a="$moves_start" -v b="$moves_end" -v c="$clients_start" -v d="$clients_end" \
  'BEGIN { printf "timeline: moves from %.1f s to %.1f s of the clients'"'"' %.1f s\n", a - c, b - c, d - c }' >>"$summary"

# The moves must not change tokens: client 0's prompt again, alone, on the final
# placement, for as many tokens as client 0 had streamed past the moves. The CPU engine
# is batch-invariant, so there they must be equal; on GPUs another batch size may round
# differently and flip a near-tie, so there it is reported only.
recheck=$(awk -v r="$rate" -v a="$clients_start" -v b="$moves_end" -v t="$tokens" \
  'BEGIN { n = int(r * (b - a)) + 64; print (n < t ? n : t) }')
cli generate --prompt-ids "$(prompt 0)" --max-new-tokens "$recheck" --ignore-eos >"$out/recheck-0.txt" 2>&1
first_ids() { awk -v n="$2" '/^prompt 0:/ { s = substr($0, 10); gsub(/[ \t]/, "", s); m = split(s, a, ",")
                                             for (i = 1; i <= n && i <= m; i++) printf "%s%s", (i > 1 ? "," : ""), a[i] }' "$1"; }
if [[ -n $(first_ids "$out/recheck-0.txt" 1) && $(first_ids "$out/recheck-0.txt" "$recheck") == $(first_ids "$out/client-0.txt" "$recheck") ]]; then
  note "tokens: client 0's first $recheck tokens (across the moves) equal a fresh request's on the final placement"
elif ((cpu)); then
  fail "tokens: client 0's first $recheck tokens differ from a fresh request's on the final placement (recheck-0.txt)"
else
  note "tokens: client 0's first $recheck tokens differ from a fresh request's on the final placement (GPU: reported only)"
fi

cli load --experts >"$out/expert-load-after.txt" 2>&1
cli health >"$out/health-after.txt" 2>&1 || fail "health after the moves is not SERVING"

# ---- 6. stop ---------------------------------------------------------------------------
say "stopping: SIGTERM to rank 0 (pid $pid0)"
kill -TERM "$pid0" 2>/dev/null
stop_by=$(($(date +%s) + $(within 60)))
while (($(date +%s) < stop_by)) && kill -0 "$agent_pid" 2>/dev/null; do sleep 0.2; done
if kill -0 "$agent_pid" 2>/dev/null; then
  fail "mpirun still running 60 s after SIGTERM to rank 0"
  kill -TERM "$agent_pid" 2>/dev/null
  sleep 5
  kill -KILL "$agent_pid" 2>/dev/null
fi
agent_rc=0
wait "$agent_pid" || agent_rc=$?
stopped=1
note "stop: mpirun exit $agent_rc"
((agent_rc == 0)) || fail "mpirun exited $agent_rc after SIGTERM to rank 0 (see agent.log)"
grep -q "ina-agent: stopped" "$out/agent.log" || fail "agent.log has no 'ina-agent: stopped'"
sleep 1
left_pids=()
for pid in "${rank_pids[@]}"; do
  if is_rank "$pid"; then left_pids+=("$pid"); fi
done
if ((${#left_pids[@]})); then
  fail "rank process(es) left after mpirun ended: ${left_pids[*]}"
else
  note "stop: no ina-agent process left (ranks ${rank_pids[*]})"
fi
finish
