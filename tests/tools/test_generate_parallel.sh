#!/bin/bash
# `ina generate` over several ranks of an mpirun job prints the same tokens as one rank:
# --ep on 2 and 3 ranks (even and uneven expert shares; the built-in tiny model and a
# golden fixture), --tp 2 on 2 ranks and --tp 2 --ep on 4 (a fixture with 4 heads), and
# with attention data parallelism (--dp), greedy and sampled; DeepSeek-V3.2 too. Bad layouts and a GPU device
# are refused.
# usage: test_generate_parallel.sh MPIEXEC INA FIXTURES_DIR
set -u
mpiexec=$1 ina=$2 fixtures=$3
failed=0
tokens() { grep '^prompt ' | sort; }

# compare MODEL "NP FLAGS" ...: each NP/FLAGS run must print one rank's tokens
compare() {
  local model=$1; shift
  for sampling in "" "--temperature 0.8 --top-k 20 --seed 5"; do
    local args=(generate --model "$model" --prompt-ids 1,2,3,4,5 --prompt-ids 7 --prompt-ids 9,8
                --max-new-tokens 12 --ignore-eos $sampling)
    local want got
    want=$("$ina" "${args[@]}" --device cpu | tokens)
    if [ -z "$want" ]; then echo "FAIL: one rank printed no tokens ($model $sampling)"; failed=1; continue; fi
    for layout in "$@"; do
      read -r np flags <<<"$layout"
      got=$("$mpiexec" --oversubscribe -np "$np" "$ina" "${args[@]}" $flags 2>/dev/null | tokens)
      if [ "$got" != "$want" ]; then
        echo "FAIL: $np ranks $flags ($model $sampling):"; echo "$got"; echo "want:"; echo "$want"
        failed=1
      else
        echo "ok: $np ranks $flags, $(basename "$model") ${sampling:-greedy}"
      fi
    done
  done
}

compare tiny "2 --ep" "3 --ep" "2 --ep --dp" "3 --ep --dp"
compare "$fixtures/v3_sigmoid" "2 --ep" "3 --ep"
compare "$fixtures/v3_mscale" "2 --tp 2" "4 --tp 2 --ep" "2 --ep" "4 --tp 2 --ep --dp"
# DeepSeek-V3.2: sparse attention over each query's top 8 (v3.2-tiny) or 6 (v32_bf16)
# tokens, fewer than these sequences hold.
compare v3.2-tiny "2 --ep" "3 --ep --dp"
compare "$fixtures/v32_bf16" "2 --tp 2" "4 --tp 2 --ep --dp"

# --dp with a long and a short prompt on 3 ranks: a prompt's pages all come from its
# group's stripe of the pool, which must hold the long one whole.
long_args=(generate --model tiny --prompt-ids "$(seq -s, 1 100)" --prompt-ids 5 --max-new-tokens 8 --ignore-eos)
want=$("$ina" "${long_args[@]}" --device cpu | tokens)
got=$("$mpiexec" --oversubscribe -np 3 "$ina" "${long_args[@]}" --device cpu --ep --dp 2>/dev/null | tokens)
if [ -z "$want" ] || [ "$got" != "$want" ]; then
  echo "FAIL: 3 ranks --ep --dp, a 100-token prompt:"; echo "$got"; echo "want:"; echo "$want"; failed=1
else
  echo "ok: 3 ranks --ep --dp, a 100-token prompt and a 1-token one"
fi

refused() { # EXPECTED_TEXT CMD...: exit status 2 (usage) and the text on stderr
  local text=$1; shift
  local out; out=$("$@" 2>&1)
  local rc=$?
  if [ $rc -eq 0 ] || ! grep -q "$text" <<<"$out"; then
    echo "FAIL: not refused ($rc): $*"; echo "$out" | head -5; failed=1
  else
    echo "ok: refused: $text"
  fi
}
# A GPU job needs a GPU on every rank (here: none).
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  refused "need a CUDA device" "$ina" generate --model tiny --prompt-ids 1 --ep --device cuda
fi
refused "must be exactly --tp" "$mpiexec" --oversubscribe -np 4 "$ina" generate --model "$fixtures/v3_mscale" --prompt-ids 1 --tp 2
refused "needs --ep" "$ina" generate --model tiny --prompt-ids 1 --dp
refused "not divisible by tp_size 2" "$mpiexec" --oversubscribe -np 2 "$ina" generate --model tiny --prompt-ids 1 --tp 2
exit $failed
