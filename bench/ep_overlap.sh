#!/bin/bash
# Two-batch overlap on CPU ranks: `ina generate --ep --dp N` (the dispatch exchange) with
# and without --two-batch-overlap, in turn (A B A B ...), so that a drift of the machine
# reaches both alike. Before timing, the greedy streams of the two must be equal (the
# overlap changes the schedule, never a bit of the logits). Per run it reads the decode
# time and rank 0's time blocked in the exchanges (ina generate's "waited" line); it
# prints each one's min / median / max over the runs and the ratios B / A run by run.
#
# usage: bench/ep_overlap.sh INA RANKS [RUNS [PROMPTS [NEW_TOKENS [THREADS [MODEL [DTYPE]]]]]]
#   INA      the ina binary (build/tools/ina)
#   RANKS    mpirun ranks, each with its share of the experts and its own sequences
#   RUNS     runs of each (default 7), PROMPTS prompts of 3 tokens (default 64, spread
#            over the ranks by the engine), NEW_TOKENS greedy tokens each (default 32),
#            THREADS per rank (default 1), MODEL (default tiny), DTYPE of its weights
#            (default bf16; f32 spares the linears their conversion of bf16 weights, which
#            each micro-batch repeats)
set -u
if [ $# -lt 2 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -ge 2 ] && exit 0 || exit 2
fi
ina=$1 ranks=$2 runs=${3:-7} prompts=${4:-64} new=${5:-32} threads=${6:-1} model=${7:-tiny} dtype=${8:-bf16}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=()
for i in $(seq 1 "$prompts"); do args+=(--prompt-ids "$((i % 50 + 1)),$((i % 7 + 2)),$((i % 13 + 3))"); done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

one() { # OUT FLAGS...: one job; its output in OUT
  local out=$1; shift
  mpirun --oversubscribe -np "$ranks" "$ina" generate --model "$model" --device cpu --dtype "$dtype" --ep --dp "$ranks" \
    --threads "$threads" --max-new-tokens "$new" --ignore-eos "${args[@]}" "$@" >"$out" 2>&1
}

# The check: both schedules give the same streams.
one "$tmp/a" || { echo "ep_overlap: the job without overlap failed:"; tail -5 "$tmp/a"; exit 1; }
one "$tmp/b" --two-batch-overlap || { echo "ep_overlap: the job with overlap failed:"; tail -5 "$tmp/b"; exit 1; }
if ! cmp -s <(grep '^prompt ' "$tmp/a") <(grep '^prompt ' "$tmp/b"); then
  echo "ep_overlap: the streams with two-batch overlap differ from those without"
  exit 1
fi
[ "$(grep -c '^prompt ' "$tmp/a")" = "$prompts" ] || { echo "ep_overlap: expected $prompts streams"; exit 1; }
echo "ep_overlap: $ranks ranks x $threads thread(s), $model ($dtype), $prompts prompts x $new tokens: streams equal ($(grep '^prompt ' "$tmp/a" | md5sum | cut -c1-12))"

decode_s() { sed -n 's/^decode: .* steps, \([0-9.]*\) s .*/\1/p' "$1"; }
wait_s() { sed -n 's/^ep exchange: .* waited \([0-9.]*\) s .*/\1/p' "$1"; }
: >"$tmp/rows"
for r in $(seq 1 "$runs"); do
  one "$tmp/a" && one "$tmp/b" --two-batch-overlap || { echo "ep_overlap: run $r failed"; exit 1; }
  echo "$(decode_s "$tmp/a") $(wait_s "$tmp/a") $(decode_s "$tmp/b") $(wait_s "$tmp/b")" >>"$tmp/rows"
done
python3 - "$tmp/rows" "$ranks" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
def mmm(xs): return "%.4f / %.4f / %.4f" % (min(xs), statistics.median(xs), max(xs))
cols = list(zip(*rows))
print("runs: %d; seconds as min / median / max" % len(rows))
print("decode, one batch:         " + mmm(cols[0]))
print("decode, two-batch overlap: " + mmm(cols[2]))
print("ratio overlap / one batch: " + mmm([b / a for a, b in zip(cols[0], cols[2])]))
print("rank 0 blocked in the exchanges, one batch:         " + mmm(cols[1]))
print("rank 0 blocked in the exchanges, two-batch overlap: " + mmm(cols[3]))
EOF
