"""The peers' processes (``benchmarks/peers.py``) run in the peers' venv, which has none of mtgate's dependencies:
what they import must need nothing of mtgate's install (a regression: ``serving.package`` needs pydantic)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules of mtgate's own install that the peers' venv does not have; importing one of them fails there.
MTGATE_ONLY = ("serving", "pydantic", "pydantic_settings", "fastapi", "onnxruntime", "openvino", "tensorflow")


def test_the_peer_worker_imports_nothing_of_mtgate_install() -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in MTGATE_ONLY)
    code = f"import sys; {blocked}; sys.path.insert(0, {str(ROOT)!r}); import benchmarks.peers"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
