#!/bin/bash
# `ina tokenize` / `ina detokenize` and `ina generate --prompt TEXT`, locally and against a
# running ina-agent (--server): text round-trips through the built-in tokenizer; a text
# prompt generates what its token ids generate; the agent streams the same tokens and text
# as the local engine (same model, seed and dtype); refusals name what is wrong.
# usage: test_text_cli.sh INA INA_AGENT
set -u
ina=$1 agent=$2
failed=0
fail() { echo "FAIL: $*"; failed=1; }

text="The paged latent cache holds 512 + 64 values per token."
ids=$("$ina" tokenize --model tiny "$text") || fail "tokenize exit $?"
[ -n "$ids" ] || fail "tokenize printed nothing"
back=$("$ina" detokenize --model tiny "$ids") || fail "detokenize exit $?"
[ "$back" = "$text" ] || fail "round trip: '$back' != '$text'"
nobos=$("$ina" tokenize --model tiny --no-special "$text")
[ "${ids#*,}" = "$nobos" ] || fail "with BOS '$ids' is not BOS + '$nobos'"
kept=$("$ina" detokenize --model tiny --keep-special "$ids")
case $kept in "<｜begin▁of▁sentence｜>$text") ;; *) fail "--keep-special: '$kept'" ;; esac

# A text prompt generates what its ids generate.
by_text=$("$ina" generate --model tiny --device cpu --prompt "$text" --max-new-tokens 12 --ignore-eos | grep "^prompt 0:")
by_ids=$("$ina" generate --model tiny --device cpu --prompt-ids "$ids" --max-new-tokens 12 --ignore-eos | grep "^prompt 0:")
[ -n "$by_text" ] && [ "$by_text" = "$by_ids" ] || fail "--prompt '$by_text' != --prompt-ids '$by_ids'"
local_text=$("$ina" generate --model tiny --device cpu --prompt "$text" --max-new-tokens 12 --ignore-eos | grep "^text 0:")
[ -n "$local_text" ] || fail "no text line"

# The same against the agent, whose tokenizer the client takes from GetNodeInfo's model name.
log=$(mktemp)
"$agent" --model tiny --device cpu --listen 127.0.0.1:0 --threads 2 >"$log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "serving$" "$log" && break; sleep 0.1; done
port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
remote=$("$ina" generate --server "127.0.0.1:$port" --prompt "$text" --max-new-tokens 12 --ignore-eos)
[ "$(grep "^prompt 0:" <<<"$remote")" = "$by_text" ] || fail "--server tokens: $remote"
[ "$(grep "^text 0:" <<<"$remote")" = "$local_text" ] || fail "--server text: $remote"
kill -TERM "$pid"
wait "$pid" || fail "the agent exited $?"
rm -f "$log"

# Refusals.
out=$("$ina" tokenize --model /no/such/dir x 2>&1) && fail "a missing model was accepted"
grep -q "no tokenizer for model '/no/such/dir'" <<<"$out" || fail "missing model message: $out"
out=$("$ina" detokenize --model tiny 1,99999 2>&1) && fail "an id out of range was accepted"
grep -qi "99999" <<<"$out" || fail "out-of-range id message: $out"
"$ina" tokenize --help | grep -q "usage: ina tokenize" || fail "tokenize --help"

[ "$failed" = 0 ] && echo "test_text_cli: passed"
exit "$failed"
