"""The arrows between the top-level folders run one way: ``converters`` -> ``serving`` <- ``batch``, ``loadtest``.

Every module under ``serving/`` is parsed (nothing is imported, so a lazy import inside a function counts as much
as one at the top) and none may import ``converters``, ``batch`` or ``loadtest``. ``converters`` writes packages
through ``serving.package``; ``serving`` reads them knowing nothing of how they were made. Rerun it with
``pytest tests/test_import_contract.py``; ``python tests/test_import_contract.py`` prints every import between
the folders (the whole import graph, one line per arrow).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("serving", "converters", "batch", "loadtest")
FORBIDDEN = {"serving": {"converters", "batch", "loadtest"}}
"""folder -> the folders its modules may not import."""


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every ``import x`` / ``from x import y`` in a file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.lineno, node.module


def arrows() -> Iterator[tuple[str, int, str]]:
    """(module file, line, imported module) for every import from one top-level folder into another."""
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in imports(path):
                top = module.split(".")[0]
                if top in FOLDERS and top != folder:
                    yield path.relative_to(ROOT).as_posix(), line, module


def test_serving_imports_nothing_from_converters_batch_or_loadtest() -> None:
    wrong = [f"{file}:{line}: imports {module}" for file, line, module in arrows()
             if module.split(".")[0] in FORBIDDEN.get(file.split("/")[0], set())]
    assert wrong == [], "serving must not depend on converters, batch or loadtest:\n" + "\n".join(wrong)


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import converters.spec\nfrom batch import cli\n\ndef f():\n    from loadtest.stats import x\n"
                      "    import os\nfrom . import sibling\n", encoding="utf-8")
    assert sorted(name for _, name in imports(module)) == ["batch", "converters.spec", "loadtest.stats", "os"]


def test_serving_is_walked() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "serving").rglob("*.py")}
    assert {"serving/engine.py", "serving/package/manifest.py", "serving/backends/base.py"} <= files


if __name__ == "__main__":
    for file, line, module in arrows():
        sys.stdout.write(f"{file}:{line} -> {module}\n")
