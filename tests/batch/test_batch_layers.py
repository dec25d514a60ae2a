"""batch/ is a one-way pipeline: each module imports only the modules before it in LAYERS (docs/architecture.md
draws the same list), and nothing of serving's HTTP layer."""

from __future__ import annotations

import ast
from pathlib import Path

BATCH = Path(__file__).resolve().parents[2] / "batch"
LAYERS = ["commands", "errors", "example", "framing", "inputs", "schema", "records", "job", "outputs", "state", "scoring",
          "assembly", "workers", "remote", "resources", "run_loop", "ray_session", "ray_runner", "tensorboard", "report",
          "engines", "cli"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "batch":
                names.update(f"batch.{a.name}" for a in node.names)
            else:
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_every_module_imports_only_earlier_layers() -> None:
    modules = sorted(p.stem for p in BATCH.glob("*.py") if p.stem != "__init__")
    assert modules == sorted(LAYERS), "a module was added or removed: place it in LAYERS and docs/architecture.md"
    for position, name in enumerate(LAYERS):
        imported = _imports(BATCH / f"{name}.py")
        inside = {m.split(".")[1] for m in imported if m.startswith("batch.")}
        later = inside - set(LAYERS[:position])
        assert not later, f"batch/{name}.py imports {sorted(later)}, which come after it"
        assert not any(m.startswith(("serving.server.http", "fastapi", "uvicorn", "loadtest")) for m in imported), name
