#!/usr/bin/env bash
# Creates .venv-zentorch with AMD's zentorch and the torch it supports (from PyPI), once, for
# bench/peers.py's zentorch peer; a venv of its own, since zentorch pins a torch other than
# .venv's. On a CPU that is not AMD's it makes nothing and says so (zentorch serves AMD EPYC).
# Prints the venv's python on success.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! grep -q '^vendor_id.*AuthenticAMD' /proc/cpuinfo; then
  echo "zentorch-env: not an AMD CPU, no zentorch venv" >&2
  exit 0
fi
requirements=requirements/bench-zentorch.txt
stamp=.venv-zentorch/.installed
if [ ! -x .venv-zentorch/bin/python ]; then
  python3 -m venv .venv-zentorch
fi
if ! cmp -s "$requirements" "$stamp"; then
  .venv-zentorch/bin/python -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi
echo .venv-zentorch/bin/python
