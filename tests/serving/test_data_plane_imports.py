"""The data plane knows nothing of its transports: nothing under ``serving/engine/`` or ``serving/server/`` but the
transports themselves (``serving/server/http/``, ``serving/server/grpc/``) imports them, an HTTP framework or gRPC
(parsed, not imported: a lazy import inside a function counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = ("serving/server/http", "serving/server/grpc")
DATA_PLANE = sorted(path for room in ("serving/engine", "serving/server") for path in (ROOT / room).rglob("*.py")
                    if not path.relative_to(ROOT).as_posix().startswith(TRANSPORTS))
FORBIDDEN = ("serving.server.http", "serving.server.grpc", "fastapi", "starlette", "uvicorn", "httpx", "grpc")


def test_the_data_plane_is_walked() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in DATA_PLANE}
    assert {"serving/server/service.py", "serving/server/batching/queue.py", "serving/engine/translator.py"} <= names
    assert not any(name.startswith(TRANSPORTS) for name in names)


@pytest.mark.parametrize("path", DATA_PLANE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_transport_in_the_data_plane(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    assert not [m for m in imported if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN[:2])], path


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_transports_do_not_import_each_other(transport: str) -> None:
    other = next(t for t in TRANSPORTS if t != transport).replace("/", ".")
    for path in sorted((ROOT / transport).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        assert not [m for m in imported if m.startswith(other)], path
