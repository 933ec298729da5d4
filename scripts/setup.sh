#!/usr/bin/env bash
# Install what building ina needs from Debian's packages (once per machine), then
# configure and build. Usage: scripts/setup.sh [BUILD_DIR [extra cmake options...]]
# The CUDA parts build when nvcc is found (/usr/local/cuda/bin or PATH).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true

packages="cmake make gcc pkg-config libjansson-dev libopenmpi-dev openmpi-bin libucx-dev libprotobuf-c-dev protobuf-c-compiler libgrpc-dev libmicrohttpd-dev python3-grpcio python3-protobuf protobuf-compiler clang libclang-rt-14-dev"
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

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
