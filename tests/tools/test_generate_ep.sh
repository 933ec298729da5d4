#!/bin/bash
# `ina generate --ep` under mpirun (2 and 3 ranks, even and uneven expert shares) prints the
# same tokens as one rank, for the built-in tiny model and a golden fixture, greedy and
# sampled; and --ep refuses a GPU device.
# usage: test_generate_ep.sh MPIEXEC INA FIXTURE_DIR
set -u
mpiexec=$1 ina=$2 fixture=$3
failed=0
tokens() { grep '^prompt ' | sort; }
for model in tiny "$fixture"; do
  for sampling in "" "--temperature 0.8 --top-k 20 --seed 5"; do
    args=(generate --model "$model" --prompt-ids 1,2,3,4,5 --prompt-ids 7 --prompt-ids 9,8
          --max-new-tokens 12 --ignore-eos $sampling)
    want=$("$ina" "${args[@]}" --device cpu | tokens)
    if [ -z "$want" ]; then echo "FAIL: one rank printed no tokens ($model $sampling)"; failed=1; continue; fi
    for np in 2 3; do
      got=$("$mpiexec" --oversubscribe -np $np "$ina" "${args[@]}" --ep 2>/dev/null | tokens)
      if [ "$got" != "$want" ]; then
        echo "FAIL: $np ranks ($model $sampling):"; echo "$got"; echo "want:"; echo "$want"; failed=1
      else
        echo "ok: $np ranks, $model ${sampling:-greedy}"
      fi
    done
  done
done
out=$("$ina" generate --model tiny --prompt-ids 1 --ep --device cuda 2>&1)
if [ $? -ne 2 ] || ! grep -q "runs on the CPU" <<<"$out"; then
  echo "FAIL: --ep --device cuda was not refused: $out"; failed=1
fi
exit $failed
