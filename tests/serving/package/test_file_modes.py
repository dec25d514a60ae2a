"""One file-mode policy for everything mtgate writes, checked as another user (uid 65534).

- A model package is published world-readable, as an installed model is: directories 0755, files 0644, whatever the
  umask of the user who converted it (``serving.package.store``). Another user then translates with it.
- Outputs (reports, batch-score outputs, anything written through ``serving.package.files.atomic_writer``) get
  ``0666 & ~umask``, as any file a program creates: readable by others under the usual umask 022.
- A package this user may not read (one written by an older mtgate: 0700 directory, 0600 manifest) is one line on
  stderr and exit 2 from ``translate`` and ``serve``, also when it is the bundled demo model; never a traceback.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from serving.package import Manifest, open_package, write_package_atomically
from serving.package.files import atomic_write_text, atomic_writer, current_umask
from tests.utils.other_user import need_root, run_as_nobody, shared_workspace

# What `mtgate serve` imports lazily before it opens the packages (the switch to uid 65534 comes after imports).
SERVE_IMPORTS = ("uvicorn", "serving.commands.serve", "serving.server.http", "serving.server.http.connections",
                 "serving.server.logging_config")


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _copy_package(source: Path, target: Path) -> Path:
    """``source``'s files written as a new package at ``target`` through write_package_atomically."""

    def fill(tmp: Path) -> Manifest:
        for path in sorted(source.rglob("*")):
            if path.is_file() and path.name != "manifest.json":
                (tmp / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, tmp / path.relative_to(source))
        return open_package(source, verify=False).manifest

    write_package_atomically(target, fill)
    return target


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077], ids=oct)
def test_outputs_follow_the_umask(tmp_path: Path, mask: int) -> None:
    with umask(mask):
        assert current_umask() == mask
        atomic_write_text(tmp_path / "report.md", "x")
        with atomic_writer(tmp_path / "out.tfrecord", "wb") as f:
            f.write(b"x")
    for name in ("report.md", "out.tfrecord"):
        assert _mode(tmp_path / name) == 0o666 & ~mask, name


def test_a_package_is_world_readable_whatever_the_umask(tiny_onnx_package: Path, tmp_path: Path) -> None:
    with umask(0o077):
        package = _copy_package(tiny_onnx_package, tmp_path / "out" / "package")
    for path in [package, *package.rglob("*")]:
        assert _mode(path) == (0o755 if path.is_dir() else 0o644), path
    assert not [p.name for p in package.parent.iterdir() if p.name != "package"]  # nothing left beside it


def test_another_user_translates_with_a_package_and_reads_the_outputs(tiny_onnx_package: Path) -> None:
    need_root()
    with shared_workspace() as ws, umask(0o022):
        with umask(0o077):  # the converting user's umask does not matter
            package = _copy_package(tiny_onnx_package, ws / "package")
        report = ws / "report.md"
        atomic_write_text(report, "# report\n")
        argv = ["translate", "-m", str(package), "--beam-size", "1", "--max-length", "4", "A dog runs."]
        result = run_as_nobody(argv, warm=argv, read=[report, package / "manifest.json"], cwd=ws)
    assert result.code == 0, result.err
    assert result.out.strip()


def _old_package(source: Path, target: Path) -> Path:
    """A package as an older mtgate wrote it: the directory 0700 and the manifest 0600 (mkdtemp, mkstemp)."""
    shutil.copytree(source, target)
    (target / "manifest.json").chmod(0o600)
    target.chmod(0o700)
    return target


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_an_unreadable_package_is_one_line_and_exit_2(tiny_onnx_package: Path) -> None:
    need_root()
    with shared_workspace() as ws:
        package = _old_package(tiny_onnx_package, ws / "package")
        warm = ["translate", "-m", str(tiny_onnx_package), "--max-length", "2", "A dog."]

        result = run_as_nobody(["translate", "-m", str(package), "A man."], warm=warm, cwd=ws)
        line = _one_line(result.err)
        assert result.code == 2 and line.startswith("mtgate translate: error: ")
        assert f"{package}: permission denied: {package}/manifest.json not readable by this user (uid 65534)" in line
        assert f"chmod -R a+rX {package}" in line

        # The same package as the bundled demo model: translate and serve without -m.
        result = run_as_nobody(["translate", "A man."], warm=warm, demo=package, cwd=ws)
        assert result.code == 2 and "permission denied" in _one_line(result.err)
        result = run_as_nobody(["serve", "--port", "0"], warm=warm, imports=SERVE_IMPORTS, demo=package, cwd=ws)
        assert result.code == 2 and "permission denied" in _one_line(result.err)

        # The directory readable, one graph not: named before anything is loaded.
        package.chmod(0o755)
        (package / "manifest.json").chmod(0o644)
        (package / "onnx" / "decoder.onnx").chmod(0o600)
        result = run_as_nobody(["translate", "-m", str(package), "A man."], warm=warm, cwd=ws)
        line = _one_line(result.err)
        assert result.code == 2 and "permission denied: onnx/decoder.onnx not readable by this user" in line
