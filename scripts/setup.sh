#!/usr/bin/env bash
# Install what building ina needs from Debian's packages (once per machine), then
# configure and build. Usage: scripts/setup.sh [BUILD_DIR [extra cmake options...]]
# The CUDA parts build when nvcc is found (/usr/local/cuda/bin or PATH); a line says
# whether they do, and why.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true

packages="cmake make gcc pkg-config libjansson-dev libopenmpi-dev openmpi-bin libucx-dev libprotobuf-c-dev protobuf-c-compiler libgrpc-dev libmicrohttpd-dev python3-grpcio python3-protobuf protobuf-compiler clang libclang-rt-14-dev libpcre2-dev libutf8proc-dev curl openssl"
missing=""
for p in $packages; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing >/dev/null
fi

# Configure quietly (the output goes to BUILD/configure.log), then say in one line whether
# the CUDA parts build and why, by cmake/cuda.cmake's rule: INA_CUDA=OFF turns them off;
# otherwise they build when a CUDA compiler is found (/usr/local/cuda/bin/nvcc, or nvcc
# on PATH). A build without CUDA while nvcc is there is called out: its GPU tests would
# only skip.
mkdir -p "$build"
configure_log=$build/configure.log
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$configure_log" 2>&1; then
  tail -n 40 "$configure_log"
  echo "setup: configuring $build failed (all of cmake's output: $configure_log)" >&2
  exit 1
fi
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }
nvcc=/usr/local/cuda/bin/nvcc
[ -x "$nvcc" ] || nvcc=$(command -v nvcc || true)
cuda_switch=$(cached INA_CUDA)
cuda_compiler=$(cached CMAKE_CUDA_COMPILER)
if grep -q "^-- ina: CUDA ON" "$configure_log"; then
  # What enable_language(CUDA) recorded: the compiler's path and version.
  recorded=$(cat "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null || true)
  path=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' <<<"$recorded" | head -n 1)
  version=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")$/\1/p' <<<"$recorded" | head -n 1)
  echo "setup: CUDA on (nvcc${version:+ $version} at ${path:-$cuda_compiler}) in $build"
elif [ "$cuda_switch" = OFF ]; then
  echo "setup: CUDA off (INA_CUDA=OFF given) in $build${nvcc:+; $nvcc is not used}"
elif [ -z "$nvcc" ]; then
  echo "setup: CUDA off (no nvcc in /usr/local/cuda/bin or on PATH) in $build: GPU code is not built, GPU tests skip"
else
  echo "setup: WARNING: CUDA off in $build although $nvcc exists: cmake found no working CUDA" \
    "compiler (CMAKE_CUDA_COMPILER=${cuda_compiler:-unset} in $build/CMakeCache.txt; see" \
    "$configure_log, or remove that cache); GPU code is not built, GPU tests skip" >&2
fi
cmake --build "$build" -j"$(nproc)"
