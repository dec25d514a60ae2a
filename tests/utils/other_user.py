"""Running an ``mtgate`` command as another user (uid 65534, ``nobody``), to check what that user can read.

The suite runs as root in CI, and root reads every file whatever its mode, so a permission test must switch users.
A child Python process starts as root, imports what the command needs (the interpreter's own library may live where
``nobody`` cannot read, e.g. under ``/root``), optionally runs a warm-up command as root, then drops to uid/gid 65534
with ``os.setuid`` and runs the command under test. Everything it reads after that is read as ``nobody``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

NOBODY = 65534
MARKER = "--- as uid 65534 ---"
CANNOT_SWITCH = 77
ROOT = Path(__file__).resolve().parents[2]

_CHILD = f"""
import importlib, json, os, sys
spec = json.loads(sys.argv[1])
for name in spec["imports"]:
    importlib.import_module(name)
import serving.server.settings
if spec["demo"] is not None:
    serving.server.settings.DEFAULT_MODEL_DIR = __import__("pathlib").Path(spec["demo"])
from serving.commands.main import main
if spec["warm"] is not None:
    main(spec["warm"])
import serving.package.store
serving.package.store._VERIFIED.clear()  # read every file again, as the other user
sys.stdout.flush(); sys.stderr.flush()
try:
    os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
except OSError as e:  # no CAP_SETUID (a restricted container): the caller skips
    sys.stderr.write(f"cannot switch to uid {NOBODY}: {{e}}\\n"); sys.exit({CANNOT_SWITCH})
sys.stdout.write({MARKER!r} + "\\n"); sys.stderr.write({MARKER!r} + "\\n")
code = main(spec["argv"]) if spec["argv"] is not None else 0
for path in spec["read"]:
    with open(path, "rb") as f:
        f.read()
sys.exit(code)
"""


@dataclass(frozen=True)
class Result:
    """What the command did as the other user (the warm-up's output left out)."""

    code: int
    out: str
    err: str


def need_root() -> None:
    """Skip unless this process may switch users (root, as CI runs the suite)."""
    if os.geteuid() != 0:
        pytest.skip("switching to uid 65534 needs root (CI runs the suite as root); as another user the modes are "
                    "not checked here")


@contextmanager
def shared_workspace() -> Iterator[Path]:
    """A fresh directory under the system's temporary directory that every user may search (pytest's ``tmp_path``
    is under a 0700 directory), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="mtgate-other-user-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_as_nobody(argv: Sequence[str] | None, *, warm: Sequence[str] | None = None, imports: Sequence[str] = (),
                  demo: Path | None = None, read: Sequence[Path] = (), cwd: Path | None = None) -> Result:
    """Run ``mtgate ARGV`` (``serving.commands.main.main``) as uid 65534 and, after it, read each of ``read``.

    Arguments:
        argv: the command (None: only read the files).
        warm: a command run as root first, so that every module it imports is loaded before the switch.
        imports: modules to import as root first (those the command imports lazily and ``warm`` does not).
        demo: the bundled demo model's path for the command (``serving.server.settings.DEFAULT_MODEL_DIR``).
        read: files to read as the other user; a PermissionError is a traceback and exit 1.
        cwd: the working directory (must be searchable by everyone).
    """
    spec = {"argv": list(argv) if argv is not None else None, "warm": list(warm) if warm is not None else None,
            "imports": list(imports), "demo": str(demo) if demo is not None else None,
            "read": [str(p) for p in read]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd or "/", stdin=subprocess.DEVNULL)
    if done.returncode == CANNOT_SWITCH and MARKER not in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    if MARKER not in done.stderr:
        raise AssertionError(f"the child did not reach the switch to uid {NOBODY}:\n{done.stderr}")
    return Result(done.returncode, done.stdout.split(MARKER + "\n", 1)[-1], done.stderr.split(MARKER + "\n", 1)[-1])
