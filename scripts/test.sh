#!/usr/bin/env bash
# Set up, build and run every test: the normal build (CUDA code included where nvcc
# exists; GPU tests report skipped without a GPU), then the CPU tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer, then the agent's message decoders under
# libFuzzer for a bounded time (clang; INA_FUZZ_SECONDS per target, default 20).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)

"$root/scripts/setup.sh" "$root/build"
ctest --test-dir "$root/build" --output-on-failure -j"$jobs"

"$root/scripts/setup.sh" "$root/build-asan" -DINA_CUDA=OFF -DINA_SANITIZE=ON
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$root/build-asan" -L cpu --output-on-failure -j"$jobs"

cmake -S "$root" -B "$root/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DINA_CUDA=OFF -DINA_FUZZ=ON >/dev/null
cmake --build "$root/build-fuzz" -j"$jobs" --target ina_fuzz
ctest --test-dir "$root/build-fuzz" -L fuzz --output-on-failure -j"$jobs"
