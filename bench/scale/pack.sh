#!/usr/bin/env bash
# Copies the binaries that bench/scale/run.sh runs out of a build directory into a small
# one with the same layout, so that it can be carried to the GPU machine (a whole build/
# is far larger than what a device call carries). The copies are stripped of debug
# information unless --keep-debug is given.
#   bench/scale/pack.sh [--build build] [--dest build-scale] [--keep-debug]
# then: run.sh --build build-scale ... (build-* is ignored by git).
set -u

build=build dest=build-scale strip=1
while (($#)); do
  case $1 in
  --build | --dest)
    (($# >= 2)) || { echo "pack.sh: $1 needs a value" >&2; exit 2; }
    [[ $1 == --build ]] && build=$2 || dest=$2
    shift 2 ;;
  --keep-debug) strip=0; shift ;;
  -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
  *) echo "pack.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done

binaries=(bench/bench_custom_ar tests/comm/test_custom_ar bench/bench_decode_parallel agent/ina-agent tools/ina)
missing=0
for b in "${binaries[@]}"; do
  if [[ ! -x $build/$b ]]; then
    echo "pack.sh: $build/$b is missing (run.sh will report its step missing)" >&2
    missing=$((missing + 1))
    continue
  fi
  mkdir -p "$dest/$(dirname "$b")"
  cp -p "$build/$b" "$dest/$b" || exit 1
  # Debug sections are most of a RelWithDebInfo binary and nothing the run needs.
  if ((strip)) && command -v strip >/dev/null; then strip --strip-debug "$dest/$b" || exit 1; fi
done
du -sh "$dest" | awk '{ print "pack.sh: " $2 " holds " $1 " (carry it with .device)" }'
((missing == 0))
