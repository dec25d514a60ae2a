#!/usr/bin/env bash
# Build the peers' venv for `mtgate bench` (default build/bench-venv, where the harness looks for it).
# torch goes first (the CPU wheel, pinned) so that nothing pulls another build; then the peers, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-build/bench-venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet torch==2.13.0
"$venv/bin/pip" install --quiet -r benchmarks/requirements-peers.txt
"$venv/bin/python" benchmarks/peers.py versions
