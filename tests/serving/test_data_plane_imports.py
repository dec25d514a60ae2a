"""The data plane knows nothing of HTTP: the engine, the batchers and the service import neither ``serving.api``
nor an HTTP framework (parsed, not imported: a lazy import inside a function counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA_PLANE = ["serving/service.py", "serving/runner.py", "serving/repository.py", "serving/versions.py",
              "serving/statistics.py", "serving/engine.py", "serving/request.py", "serving/continuous.py",
              "serving/lane.py", "serving/encoding.py", "serving/scoring.py", "serving/oip.py", "serving/documents.py",
              "serving/batching", "serving/rows",
              "serving/decoding"]
HTTP = ("serving.api", "fastapi", "starlette", "uvicorn", "httpx")


def _modules(entry: str) -> list[Path]:
    path = ROOT / entry
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize("path", [p for entry in DATA_PLANE for p in _modules(entry)], ids=lambda p: p.name)
def test_no_http_in_the_data_plane(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    assert not [m for m in imported if m.split(".")[0] in HTTP or m.startswith("serving.api")], path
