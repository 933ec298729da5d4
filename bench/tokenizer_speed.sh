#!/bin/bash
# Encode speed of the tokenizer on English text, one thread: builds a corpus of English
# prose (Debian's license texts, the Python documentation's topics from pydoc_data, this
# repository's README and docs), trains a byte-level BPE on it with Hugging Face
# `tokenizers` (DeepSeek-V3's pre-tokenizer, tokenizer/make_builtin.py's, up to VOCAB
# tokens), then runs `tokenize_driver --bench` over the corpus (best of REPEAT encodes of
# the whole text on one thread, MB/s = bytes / time) and, for scale, one `encode_batch`
# of the same text through `tokenizers` itself. Builds nothing.
#
# usage: bench/tokenizer_speed.sh [BUILD [VOCAB [REPEAT]]]
#   BUILD   the build directory with tests/tokenizer/tokenize_driver (default build)
#   VOCAB   the BPE's vocabulary size at most (default 32000; the corpus gives fewer)
#   REPEAT  encodes of the whole corpus, best reported (default 5)
set -eu
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
build=${1:-build} vocab=${2:-32000} repeat=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
driver=$build/tests/tokenizer/tokenize_driver
[ -x "$driver" ] || { echo "tokenizer_speed: no $driver (build first, or give the build directory)"; exit 2; }
python3 -c "import tokenizers" 2>/dev/null || { echo "tokenizer_speed: python3 cannot import tokenizers (scripts/install-torch.sh)"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat /usr/share/common-licenses/* "$root"/README.md "$root"/docs/*.md > "$tmp/english.txt" 2>/dev/null || true
python3 -c "import pydoc_data.topics as t; print('\n'.join(t.topics.values()))" >> "$tmp/english.txt"
python3 - "$root" "$tmp" "$vocab" <<'EOF'
import sys, time
root, tmp, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root + "/tokenizer")
import make_builtin
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
text = open(tmp + "/english.txt", encoding="utf-8", errors="replace").read()
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = make_builtin.deepseek_v3_pre_tokenizer()
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text.split("\n"), trainer=trainers.BpeTrainer(
    vocab_size=vocab, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(tmp + "/tokenizer.json")
data = text.encode("utf-8")
best = min((lambda t0: (tok.encode_batch([text]), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(3))
print(f"corpus: {len(data)} bytes; BPE vocabulary {tok.get_vocab_size()}")
print(f"hf tokenizers encode_batch([text]): best of 3: {best:.3f} s, {len(data) / 1e6 / best:.2f} MB/s")
EOF
"$driver" --bench "$tmp/tokenizer.json" "$tmp/english.txt" "$repeat"
