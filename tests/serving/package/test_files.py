"""serving.package.files: atomic writes leave the old file or the new one, and no temporary file on any error."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.package.files import atomic_write_bytes, atomic_write_text, atomic_writer


def test_write_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    atomic_write_bytes(target, b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_an_error_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_missing_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "missing" / "out.txt", "x")
    assert list(tmp_path.iterdir()) == []
