#!/usr/bin/env bash
# Set up, build, and generate from the built-in `tiny` DeepSeek-V3-architecture model
# (seeded random weights) on the CPU: a batch of two prompts, greedy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$root/build"
"$root/build/tools/ina" generate --model tiny \
  --prompt-ids 1,15,42,7,300 --prompt-ids 9,8,7 --max-new-tokens 24 --ignore-eos
