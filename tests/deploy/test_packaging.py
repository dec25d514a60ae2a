"""What a user installs: the wheel holds only the product, and each extra brings what its commands import.

- The wheel, built from a copy of the checkout, holds ``serving``, ``converters``, ``batch`` and ``loadtest`` and
  nothing of ``benchmarks/``, ``tests/`` or ``models/``; none of its modules imports them.
- ``serving/commands/registry.py``'s ``EXTRAS`` table (the modules each extra provides, used to tell a user which extra a
  command needs) agrees with pyproject.toml: each listed module comes with its extra and not with the plain install, and
  every requirement of the extra provides one of them. The resolution is uv's (``uv pip compile``, offline when its
  cache can answer).

The plain install itself (what it holds, that it serves, that each command needing an extra answers with one line
naming it) is checked in test_image_install.py, on the image's own install replayed in a fresh venv.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from serving.commands.registry import EXTRAS, all_commands, missing_extra

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PRODUCT = {"serving", "converters", "batch", "loadtest"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).is_file():
        pytest.skip("uv is not installed (it is in the test extra)")
    return found


def resolve(extra: str | None) -> set[str]:
    """The distributions a fresh install of ``mtgate`` (or ``mtgate[extra]``) gets, as uv resolves pyproject.toml."""
    command = [uv(), "pip", "compile", str(ROOT / "pyproject.toml"), "--quiet", "--no-header", "--no-annotate",
               "--python", sys.executable]
    if extra is not None:
        command += ["--extra", extra]
    proc = subprocess.run([*command, "--offline"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if proc.returncode != 0:  # uv's cache cannot answer: ask the index
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return {normalize(line.split("==")[0]) for line in proc.stdout.splitlines() if "==" in line}


def provided_by(module: str) -> set[str]:
    """The installed distributions that provide the top-level module ``module`` (this venv has every extra)."""
    found = {normalize(d) for d in importlib.metadata.packages_distributions().get(module, [])}
    assert found, f"{module}: not installed here (the test extra installs every extra)"
    return found


# ---------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of a copy of the checkout (benchmarks/, tests/ and models/recipe included, as in a clone)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.onnx", "*.bin", "*.xml", "*.safetensors", "*.gz",
                                    "results", "demo-en-de*", "data")
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in (*PRODUCT, "benchmarks", "tests", "models", "deploy", "docs"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
    out = base / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = out.glob("mtgate-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_holds_only_what_users_run(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == PRODUCT
    assert "serving/bench.py" not in names  # the benchmark harness lives in benchmarks/bench (a checkout only)
    assert {"serving/server/http/static/index.html", "loadtest/targets/smoke.yaml"} <= set(names)  # package data
    entry_points = wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "mtgate = serving.commands.main:main" in entry_points and "batch-score = batch.cli:main" in entry_points


def test_an_editable_install_prints_no_banner(tmp_path: Path) -> None:
    """``make serve`` and ``make test`` install the checkout in editable mode: the build backend says nothing about it
    (setuptools' meta path finder strategy printed a '!!' banner through pip, even with --quiet) and the checkout
    itself is on sys.path. The extension's build is left out (``wheel.cmake``): it is not what is checked here."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "CMakeLists.txt"):
        shutil.copy2(ROOT / name, source / name)
    for name in PRODUCT:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    hook = (f"from scikit_build_core import build; "
            f"print(build.build_editable({str(tmp_path / 'out')!r}, {{'wheel.cmake': 'false'}}))")
    (tmp_path / "out").mkdir()
    proc = subprocess.run([sys.executable, "-W", "always", "-c", hook], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    [wheel_name] = proc.stdout.split()[-1:]
    assert "Warning" not in proc.stderr and "!!" not in proc.stderr, proc.stderr
    with zipfile.ZipFile(tmp_path / "out" / wheel_name) as wheel:
        [pth] = [n for n in wheel.namelist() if n.endswith(".pth")]
        assert str(source) in wheel.read(pth).decode().split()  # the checkout itself on sys.path


def test_no_module_of_the_wheel_imports_the_repository_tooling(wheel: zipfile.ZipFile) -> None:
    offenders = []
    for name in wheel.namelist():
        if not name.endswith(".py"):
            continue
        tree = ast.parse(wheel.read(name), filename=name)
        for node in ast.walk(tree):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            offenders += [f"{name}: {m}" for m in modules if m.split(".")[0] in ("benchmarks", "tests", "models")]
    assert offenders == []


# ---------------------------------------------------------------- the extras


def test_every_command_outside_the_plain_install_names_a_known_extra() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    needed = {command.extra for command in all_commands() if command.extra is not None}
    assert needed <= set(EXTRAS) <= extras
    assert {command.name for command in all_commands() if command.extra is None} == {
        "translate", "score", "serve", "export-triton"}


def test_this_venv_has_every_extra() -> None:
    # the test extra installs every extra, so no command here answers "install the extra"
    assert {extra: missing_extra(extra) for extra in EXTRAS} == dict.fromkeys(EXTRAS)


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_brings_the_modules_its_commands_need(extra: str) -> None:
    plain, full = resolve(None), resolve(extra)
    for module in EXTRAS[extra]:
        dists = provided_by(module)
        assert dists & full, f"{module} ({dists}) does not come with mtgate[{extra}]"
        assert not dists & plain, f"{module} comes with the plain install: it says nothing about mtgate[{extra}]"
    # and the table is complete: every requirement of the extra provides one of the modules listed
    listed = set().union(*(provided_by(m) for m in EXTRAS[extra]))
    for requirement in PYPROJECT["project"]["optional-dependencies"][extra]:
        name = normalize(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])
        assert name in listed, f"mtgate[{extra}] requires {name}, which no module of EXTRAS[{extra!r}] comes from"


def test_tensorboard_events_need_no_tensorflow() -> None:
    # --tensorboard (batch-score, loadtest, validate, sweep) writes through tensorboardX; tensorflow comes only with
    # the t2t extra (reading a tensor2tensor checkpoint)
    for extra in ("batch", "loadtest"):
        resolved = resolve(extra)
        assert "tensorboardx" in resolved and not {"tensorflow", "tensorflow-cpu", "tensorboard"} & resolved, extra
    assert "tensorflow-cpu" in resolve("t2t")


# ---------------------------------------------------------------- every import declared

# Imports a command makes only behind an option that needs another extra (the command names it when missing).
OPTIONAL_EXTRAS: dict[str, dict[str, str]] = {
    "convert": {"torch": "torch", "tensorflow": "t2t"},  # fairseq / OpenNMT-py / pytorch_model.bin; tensor2tensor
    "verify": {"torch": "torch", "tensorflow": "t2t"},  # --source of those formats
    "batch-score": {"ray": "ray", "pyarrow": "ray"},  # --ray
    "serve": {"grpc": "grpc", "tritonclient": "grpc", "sacrebleu": "shadow"},  # --grpc-port; --shadow's chrF/BLEU
}
# Provided where the code runs, not by any install of mtgate: Triton's Python backend runs export-triton's model.py.
HOSTED = {"triton_python_backend_utils"}
# Imported only by a function no command calls, which names what to install when it is missing:
# batch.tensorboard.read_events (for tests and for reading runs back: pip install tensorboard).
NOT_FOR_COMMANDS = {"tensorboard"}
# A declared distribution's own other half, pinned by it to one version (pydantic requires pydantic-core==X): it comes
# with every install of the declared one (mtgate imports pydantic_core.ErrorDetails, pydantic's error type).
COMPANIONS = {"pydantic": {"pydantic-core"}}


def _module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(name: str) -> list[str]:
    """Every module ``name`` imports, at module level or inside a function (``TYPE_CHECKING`` blocks excepted)."""
    path = _module_file(name)
    assert path is not None, name
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            found += [base, *(f"{base}.{a.name}" for a in node.names)]
    return found


def third_party_imports(start: str) -> set[str]:
    """The third-party modules a command's module can import, following the product's own modules."""
    seen: set[str] = set()
    found: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imported in _imports(name):
            top = imported.split(".")[0]
            if top in PRODUCT:
                parts = imported.split(".")
                todo += [m for i in range(1, len(parts) + 1) if _module_file(m := ".".join(parts[:i])) is not None]
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.add(imported)
    return found


@functools.cache
def _top_level_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def distributions_of(module: str) -> frozenset[str]:
    """The installed distributions that provide ``module`` (for a namespace such as ``google``, its sub-package)."""
    top = module.split(".")[0]
    candidates = _top_level_distributions().get(top, [])
    if len(set(candidates)) > 1:
        prefix = "/".join(module.split(".")[:2])
        candidates = [d for d in candidates
                      if any(str(f).startswith(prefix) for f in importlib.metadata.distribution(d).files or [])]
    return frozenset(normalize(d) for d in candidates)


def declared(extra: str | None) -> set[str]:
    """The distributions pyproject.toml names for the plain install plus ``extra`` (its mtgate[...] included)."""
    project = PYPROJECT["project"]
    names: set[str] = set()
    todo = list(project["dependencies"]) + (list(project["optional-dependencies"][extra]) if extra else [])
    while todo:
        requirement = todo.pop()
        name = normalize(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])
        if name == "mtgate":
            inner = re.search(r"\[(.*?)\]", requirement)
            todo += [r for e in (inner.group(1).split(",") if inner else []) for r in
                     project["optional-dependencies"][e.strip()]]
        else:
            names.add(name)
    return names | {c for name in names for c in COMPANIONS.get(name, ())}


COMMANDS = {command.name: command for command in all_commands()}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_third_party_import_of_a_command_is_declared_by_its_extra(command: str) -> None:
    """What a command imports is named in pyproject.toml: by the plain install, by the extra the command asks for
    (``serving.commands.registry``), or by the extra of the option that needs it; not merely pulled in by another
    package."""
    module, extra = COMMANDS[command].module, COMMANDS[command].extra
    optional = OPTIONAL_EXTRAS.get(command, {})
    missing: dict[str, list[str]] = {}
    for imported in sorted(i for i in third_party_imports(module) - HOSTED if i.split(".")[0] not in NOT_FOR_COMMANDS):
        dists = distributions_of(imported)
        assert dists, f"{command}: {imported} is not installed here (the test extra installs every extra)"
        allowed = declared(extra) | (declared(optional[top]) if (top := imported.split(".")[0]) in optional else set())
        if not dists & allowed:
            missing.setdefault(", ".join(sorted(dists)), []).append(imported)
    where = f"mtgate[{extra}]" if extra else "the plain install"
    assert missing == {}, f"mtgate {command} imports what {where} does not declare: " + "; ".join(
        f"{dists} (for {', '.join(modules)})" for dists, modules in missing.items())
