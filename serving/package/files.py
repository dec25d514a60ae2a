"""Atomic file writing, used by every writer in the project (packages, batch outputs and state, reports).

A file is written to a temporary name in the same directory, flushed and fsynced, renamed over the target, and the
directory is fsynced, so a reader sees the old file or the new one, never half of one, even after a crash. On any
error (a full disk included) the temporary file is removed and the error propagates: nothing is left behind.

File modes: a written file gets ``0666 & ~umask``, as any file a program creates with ``open()`` (the temporary
file's private 0600 would otherwise be what is renamed into place); model packages are published world-readable
by ``serving.package.store``, whatever the umask, as installed files are.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload


def current_umask() -> int:
    """This process's umask, read without changing it where Linux reports it (``os.umask`` sets it to read it, which
    another thread creating a file at that moment would see)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (some filesystems refuse directory fsync: ignored there)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@overload
def atomic_writer(path: Path, mode: Literal["w"] = "w", *, encoding: str = "utf-8",
                  newline: str | None = None) -> contextlib.AbstractContextManager[IO[str]]: ...


@overload
def atomic_writer(path: Path, mode: Literal["wb"], *, encoding: str = "utf-8",
                  newline: str | None = None) -> contextlib.AbstractContextManager[IO[bytes]]: ...


def atomic_writer(path: Path, mode: str = "w", *, encoding: str = "utf-8",
                  newline: str | None = None) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file object whose content replaces ``path`` when the ``with`` block ends without an error; the file's mode is
    ``0666 & ~umask``, as for a file created with :func:`open`.

    Arguments:
        path: the file to write (its directory must exist).
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        encoding: text encoding (text mode).
        newline: as for :func:`open` (text mode).

    Raises:
        OSError: the file could not be written (the temporary file is removed; ``path`` is unchanged).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    return _atomic_writer(Path(path), mode, encoding, newline)


@contextlib.contextmanager
def _atomic_writer(path: Path, mode: str, encoding: str, newline: str | None) -> Iterator[IO[Any]]:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        binary = mode == "wb"
        with open(fd, mode, encoding=None if binary else encoding, newline=None if binary else newline) as f:
            os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 is for the temporary name, not for the output
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: Path, text: str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, "w", encoding=encoding) as f:
        f.write(text)
