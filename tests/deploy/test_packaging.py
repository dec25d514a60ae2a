"""What a user installs: the wheel holds only the product, and each extra brings what its commands import.

- The wheel, built from a copy of the checkout, holds ``serving``, ``converters``, ``batch`` and ``loadtest`` and
  nothing of ``benchmarks/``, ``tests/`` or ``models/``; none of its modules imports them.
- ``serving/commands/main.py``'s ``EXTRAS`` table (the modules each extra provides, used to tell a user which extra a command
  needs) agrees with pyproject.toml: each listed module comes with its extra and not with the plain install, and
  every requirement of the extra provides one of them. The resolution is uv's (``uv pip compile``, offline when its
  cache can answer).

The plain install itself (what it holds, that it serves, that each command needing an extra answers with one line
naming it) is checked in test_image_install.py, on the image's own install replayed in a fresh venv.
"""

from __future__ import annotations

import ast
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
