#!/usr/bin/env bash
# Creates .venv with the Python packages the tests and benchmarks use (from PyPI), once.
# Usage: scripts/python-env.sh [extra requirement files...]
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=(requirements/test.txt "$@")
stamp=.venv/.installed
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
want="$(cat "${requirements[@]}" | sort -u)"
if [ -f "$stamp" ] && [ -z "$(comm -23 <(echo "$want") <(sort -u "$stamp"))" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check $(for r in "${requirements[@]}"; do echo -r "$r"; done)
{ [ -f "$stamp" ] && cat "$stamp"; echo "$want"; } | sort -u > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
