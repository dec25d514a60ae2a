"""The arrows between the top-level folders run one way, and ``serving/`` is four rooms that run one way too.

- ``converters``, ``batch``, ``loadtest`` and ``benchmarks`` use ``serving``; ``serving`` names none of them: no import
  (at any depth: a lazy import inside a function counts as much as one at the top) and no string that names one of
  their modules (``importlib.import_module("converters.x")`` would hide an arrow). The commands those packages add
  to ``mtgate`` are registered as entry points in ``pyproject.toml`` (``serving.commands.registry``).
- No cycle between the top-level packages, and none between the modules of one package.
- ``serving/`` holds nothing at its top but ``__init__.py`` (and ``__main__.py``): the rooms ``package`` (the model
  package contract), ``engine`` (translation, knowing nothing of servers), ``server`` (the data plane and its HTTP
  and gRPC transports) and ``commands`` (the CLIs), each importing only the rooms before it.

Everything is parsed, nothing imported. ``python tests/test_import_contract.py`` prints every import between the
folders; ``python benchmarks/import_graph.py`` draws the graph (its module walk and cycle search are the ones
used here).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from benchmarks.import_graph import cycles, modules

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("serving", "converters", "batch", "loadtest", "benchmarks")
ABOVE_SERVING = {"converters", "batch", "loadtest", "benchmarks"}
ROOMS = ("serving.package", "serving.engine", "serving.server", "serving.commands")
"""serving's rooms, in order: each may import only those before it."""
_DOTTED = re.compile(r"^(?:" + "|".join(sorted(ABOVE_SERVING)) + r")(?:\.\w+)+(?::\w+)?$")


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every ``import x`` / ``from x import y`` in a file, at any depth (``from x import
    y`` also yields ``x.y``: y may be a module). Imports under ``if TYPE_CHECKING:`` never run and are left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
               for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.lineno, node.module


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_names() -> dict[str, Path]:
    """Dotted name -> file of every module of the folders."""
    return modules(ROOT, FOLDERS)


def arrows() -> Iterator[tuple[str, int, str]]:
    """(module file, line, imported module) for every import from one top-level folder into another."""
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in imports(path):
                top = module.split(".")[0]
                if top in FOLDERS and top != folder:
                    yield path.relative_to(ROOT).as_posix(), line, module


def test_serving_imports_nothing_above_it() -> None:
    wrong = [f"{file}:{line}: imports {module}" for file, line, module in arrows()
             if file.startswith("serving/") and module.split(".")[0] in ABOVE_SERVING]
    assert wrong == [], "serving must not depend on converters, batch, loadtest or benchmarks:\n" + "\n".join(wrong)


def names_above_serving(path: Path) -> list[tuple[int, str]]:
    """String constants of a file that are the dotted name of a module above serving (``"converters.convert_cli"``,
    ``"batch.cli:main"``): an import by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.match(node.value)]


def test_serving_names_no_module_above_it_even_as_a_string() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line}: {value!r}" for path in sorted((ROOT / "serving").rglob("*.py"))
             for line, value in names_above_serving(path)]
    assert wrong == [], "an import by name hides an arrow (register commands as entry points):\n" + "\n".join(wrong)


def test_the_string_check_sees_an_import_by_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('import importlib\nimportlib.import_module("converters.convert_cli")\nx = "batch.cli:main"\n'
                      'y = "see converters/spec.py"\nz = "batch"\n', encoding="utf-8")
    assert sorted(value for _, value in names_above_serving(module)) == ["batch.cli:main", "converters.convert_cli"]


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import converters.spec\nfrom batch import cli\n\ndef f():\n    from loadtest.stats import x\n"
                      "    import os\nfrom . import sibling\nif TYPE_CHECKING:\n    import benchmarks\n",
                      encoding="utf-8")
    assert sorted(name for _, name in imports(module)) == ["batch", "converters.spec", "loadtest.stats", "os"]


def test_serving_is_walked() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "serving").rglob("*.py")}
    assert {"serving/engine/translator.py", "serving/package/manifest.py", "serving/engine/backends/base.py"} <= files


def test_no_cycle_between_top_level_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for file, _, module in arrows():
        graph[file.split("/")[0]].add(module.split(".")[0])
    assert cycles(graph) == []


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from package import name`` resolved to the module ``name`` when
    there is one, else to the package)."""
    names = module_names()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in names.items():
        for _, module in imports(path):
            target = module if module in names else None
            if target is None:
                parent = module.rsplit(".", 1)[0] if "." in module else module
                target = parent if parent in names else None
            if target is not None and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def test_no_cycle_between_modules() -> None:
    """No two modules import each other, directly or around a circle (a package's ``__init__`` that re-exports its
    modules is not part of a circle through them: a module importing its own package's parts is an arrow down)."""
    assert cycles(module_graph()) == []


def test_serving_has_nothing_at_its_top_but_its_rooms() -> None:
    top = sorted(p.name for p in (ROOT / "serving").glob("*.py"))
    assert set(top) <= {"__init__.py", "__main__.py"}, top
    rooms = sorted(p.name for p in (ROOT / "serving").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == sorted(room.split(".")[1] for room in ROOMS)


def _room(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def test_the_rooms_of_serving_import_only_the_rooms_before_them() -> None:
    wrong = []
    for name, path in module_names().items():
        room = _room(name)
        if room is None:
            continue
        allowed = set(ROOMS[: ROOMS.index(room) + 1])
        for line, module in imports(path):
            target = _room(module)
            if target is not None and target not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {room} imports {module}")
    assert wrong == [], "\n".join(wrong)


def test_registered_commands_live_in_the_package_that_registers_them() -> None:
    """``mtgate``'s dispatcher finds the commands above serving through these entry points; each registration and
    each command module it names belong to the package named by the entry point."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    registered = pyproject["project"]["entry-points"]["mtgate.commands"]
    assert set(registered) == {"converters", "batch", "loadtest"}
    for package, target in registered.items():
        module, _, attribute = target.partition(":")
        assert module.split(".")[0] == package and attribute == "COMMANDS"
        path = ROOT / Path(*module.split(".")).with_suffix(".py")
        commands = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Command"]
        assert commands, f"{path}: no Command(...)"
        for call in commands:
            command_module = call.args[1].value  # type: ignore[attr-defined]
            assert command_module.split(".")[0] == package, f"{path}: {command_module}"
            assert (ROOT / Path(*command_module.split(".")).with_suffix(".py")).exists(), command_module


def test_every_command_is_registered_once() -> None:
    from serving.commands.registry import all_commands

    names = [command.name for command in all_commands()]
    assert sorted(names) == sorted(set(names))
    assert set(names) == {"convert", "verify", "translate", "score", "serve", "batch-score", "loadtest", "validate",
                          "sweep", "export-triton"}


if __name__ == "__main__":
    for file, line, module in arrows():
        sys.stdout.write(f"{file}:{line} -> {module}\n")
