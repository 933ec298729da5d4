#!/usr/bin/env bash
# Install the Python packages of the golden tests' reference side (tests/golden/:
# check_random_configs.py, make_fixtures.py, hf_logits.py) from PyPI, at the versions the
# fixtures were made with: torch, transformers, safetensors and numpy; and the official
# `openai` client that tests/agent/e2e/test_agent_openai.py drives the HTTP API with. PyPI's Linux torch
# wheel brings NVIDIA's CUDA libraries along (about 4 GB installed); the tests run it on
# the CPU.
#
# Usage: scripts/install-torch.sh [PYTHON]   (default: python3 on PATH, as ctest runs it)
# Does nothing when PYTHON already imports the pinned versions; prints nothing unless it
# fails, and then pip's output.
set -euo pipefail
python=${1:-python3}
pins=(torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6 openai==3.57.0)

# 0 when every pin is installed at its version and imports.
have_pins() {
  "$python" - "${pins[@]}" <<'EOF' >/dev/null 2>&1
import importlib, importlib.metadata, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if importlib.metadata.version(name) != version:
        sys.exit(1)
    importlib.import_module(name)
EOF
}

have_pins && exit 0

command -v "$python" >/dev/null || { echo "install-torch: no $python" >&2; exit 1; }
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "install-torch: $python has no pip (Debian: apt-get install python3-pip)" >&2
  exit 1
fi
extra=()
# A distribution's own Python (PEP 668) refuses pip installs unless told.
if "$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  extra+=(--break-system-packages)
fi
[ "$(id -u)" -eq 0 ] && extra+=(--root-user-action=ignore)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$python" -m pip install --quiet --disable-pip-version-check --no-input "${extra[@]}" "${pins[@]}" \
    >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-torch: pip install ${pins[*]} failed" >&2
  exit 1
fi
if ! have_pins; then
  cat "$log" >&2
  echo "install-torch: installed, but $python does not import ${pins[*]}" >&2
  exit 1
fi
