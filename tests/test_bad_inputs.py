"""Every subcommand answers bad input and a bad environment the same way: exit 2, at most three lines on stderr, no
traceback, and nothing written.

One table of cases, each run through the real console script in a subprocess, in a workspace directory whose content
is compared before and after. The bad inputs are the ones a new user or a tester produces: non-UTF-8 bytes on stdin
and in files, missing paths, a directory where a file is expected (and a file where a directory is), a path under a
file, an output under a missing directory or under ``/sys`` (which even root cannot write), a busy port, and values
out of range. (Unreadable files cannot be made for root, which CI runs as: a directory or a path under a file stands
in for them.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
NOT_UTF8 = b"A man \xff is riding.\n"


@dataclass(frozen=True)
class Case:
    """``argv`` with ``{ws}`` (the workspace), ``{pkg}`` (a model package) and ``{port}`` (a busy port) filled in."""

    name: str
    argv: tuple[str, ...]
    stdin: bytes = b""


CASES = [
    # translate
    Case("translate-stdin-not-utf8", ("mtgate", "translate", "-m", "{pkg}"), stdin=NOT_UTF8),
    Case("translate-missing-model", ("mtgate", "translate", "-m", "{ws}/nope", "x")),
    Case("translate-model-is-a-file", ("mtgate", "translate", "-m", "{ws}/file.txt", "x")),
    Case("translate-model-not-a-package", ("mtgate", "translate", "-m", "{ws}/dir", "x")),
    Case("translate-beam-0", ("mtgate", "translate", "-m", "{pkg}", "--beam-size", "0", "x")),
    Case("translate-beam-100", ("mtgate", "translate", "-m", "{pkg}", "--beam-size", "100", "x")),
    Case("translate-threads-0", ("mtgate", "translate", "-m", "{pkg}", "--threads", "0", "x")),
    # serve
    Case("serve-busy-port", ("mtgate", "serve", "-m", "{pkg}", "--port", "{port}")),
    Case("serve-missing-model", ("mtgate", "serve", "-m", "{ws}/nope", "--port", "0")),
    Case("serve-model-not-a-package", ("mtgate", "serve", "-m", "{ws}/dir", "--port", "0")),
    Case("serve-port-out-of-range", ("mtgate", "serve", "-m", "{pkg}", "--port", "70000")),
    Case("serve-batch-size-0", ("mtgate", "serve", "-m", "{pkg}", "--port", "0", "--max-batch-size", "0")),
    # convert and verify
    Case("convert-missing-source", ("mtgate", "convert", "{ws}/nope", "-o", "{ws}/out")),
    Case("convert-source-is-a-file", ("mtgate", "convert", "{ws}/file.txt", "-o", "{ws}/out")),
    Case("convert-source-not-a-checkpoint", ("mtgate", "convert", "{ws}/dir", "-o", "{ws}/out")),
    Case("convert-existing-output", ("mtgate", "convert", "{ws}/dir", "-o", "{ws}/dir")),
    Case("verify-missing", ("mtgate", "verify", "{ws}/nope")),
    Case("verify-a-file", ("mtgate", "verify", "{ws}/file.txt")),
    Case("verify-not-a-package", ("mtgate", "verify", "{ws}/dir")),
    # batch-score
    Case("batch-missing-input", ("batch-score", "{ws}/nope.txt", "-m", "{pkg}", "-o", "{ws}/out.txt")),
    Case("batch-input-is-a-directory", ("batch-score", "{ws}/dir", "-m", "{pkg}", "-o", "{ws}/out.txt")),
    Case("batch-output-missing-dir", ("batch-score", "{ws}/good.txt", "-m", "{pkg}", "-o", "{ws}/nodir/out.txt")),
    Case("batch-output-read-only", ("batch-score", "{ws}/good.txt", "-m", "{pkg}", "-o", "/sys/mtgate-out.txt")),
    Case("batch-output-is-a-directory", ("batch-score", "{ws}/good.txt", "-m", "{pkg}", "-o", "{ws}/dir")),
    Case("batch-output-under-a-file", ("batch-score", "{ws}/good.txt", "-m", "{pkg}", "-o", "{ws}/file.txt/out")),
    Case("batch-batch-size-0", ("batch-score", "{ws}/good.txt", "-m", "{pkg}", "--max-batch-size", "0")),
    Case("batch-model-not-a-package", ("batch-score", "{ws}/good.txt", "-m", "{ws}/dir", "-o", "{ws}/out.txt")),
    # loadtest, validate, sweep
    Case("loadtest-missing-targets", ("mtgate", "loadtest", "--host", "http://127.0.0.1:{port}",
                                      "--targets", "{ws}/nope.yaml")),
    Case("loadtest-targets-not-utf8", ("mtgate", "loadtest", "--host", "http://127.0.0.1:{port}",
                                       "--targets", "{ws}/bad.txt")),
    Case("loadtest-users-0", ("mtgate", "loadtest", "--host", "http://127.0.0.1:{port}", "-u", "0", "-t", "1s")),
    Case("loadtest-csv-read-only", ("mtgate", "loadtest", "--host", "http://127.0.0.1:{port}", "-u", "1", "-t", "1s",
                                    "--csv", "/sys/mtgate-stats")),
    Case("validate-missing-model", ("mtgate", "validate", "-m", "{ws}/nope")),
    Case("validate-testset-missing", ("mtgate", "validate", "-m", "{pkg}", "--testset", "{ws}/nope", "{ws}/nope")),
    Case("validate-testset-not-utf8", ("mtgate", "validate", "-m", "{pkg}", "--testset", "{ws}/bad.txt",
                                       "{ws}/bad.txt")),
    Case("sweep-missing-file", ("mtgate", "sweep", "{ws}/nope.yaml")),
    Case("sweep-file-not-utf8", ("mtgate", "sweep", "{ws}/bad.txt")),
    Case("sweep-a-directory", ("mtgate", "sweep", "{ws}/dir")),
    # export-triton
    Case("export-missing-package", ("mtgate", "export-triton", "{ws}/nope", "-o", "{ws}/repo")),
    Case("export-output-read-only", ("mtgate", "export-triton", "{pkg}", "-o", "/sys/mtgate-repo")),
    Case("export-output-under-a-file", ("mtgate", "export-triton", "{pkg}", "-o", "{ws}/file.txt/repo")),
    Case("export-batch-size-0", ("mtgate", "export-triton", "{pkg}", "-o", "{ws}/repo", "--max-batch-size", "0")),
]


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port something listens on (nothing answers HTTP there)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def _workspace(root: Path) -> Path:
    root.mkdir()
    (root / "file.txt").write_text("a file, not a directory\n", encoding="utf-8")
    (root / "good.txt").write_text("A man is riding a bike.\n", encoding="utf-8")
    (root / "bad.txt").write_bytes(NOT_UTF8)
    (root / "dir").mkdir()
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (b"" if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    case: Case, tmp_path: Path, tiny_onnx_package: Path, busy_port: int
) -> None:
    ws = _workspace(tmp_path / "ws")
    before = _snapshot(ws)
    argv = [a.format(ws=ws, pkg=tiny_onnx_package, port=busy_port) for a in case.argv]
    argv[0] = str(BIN / argv[0])
    env = {**os.environ, "MTGATE_LOG_LEVEL": "WARNING"}
    proc = subprocess.run(argv, input=case.stdin, capture_output=True, cwd=ws, env=env, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}, stderr:\n{err}"
    assert "Traceback" not in err, err
    assert 1 <= len(lines) <= 3, f"{len(lines)} lines on stderr:\n{err}"
    assert _snapshot(ws) == before, "the command wrote into its workspace"
    assert not Path("/sys/mtgate-out.txt").exists() and not Path("/sys/mtgate-repo").exists()


def test_batch_score_rejects_a_line_that_is_not_utf8_and_names_it(tmp_path: Path, tiny_onnx_package: Path) -> None:
    """Data errors are not usage errors: batch-score keeps going, writes the line to its rejects file with the
    reason, and exits 1 (``--allow-rejects`` accepts them), in one line and without a traceback."""
    ws = _workspace(tmp_path / "ws")
    proc = subprocess.run([str(BIN / "batch-score"), "bad.txt", "-m", str(tiny_onnx_package), "-o", "out.txt",
                           "--no-progress"], capture_output=True, cwd=ws, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    rejects = (ws / "out.rejects.jsonl").read_text(encoding="utf-8")
    assert "UTF-8" in rejects or "utf-8" in rejects, rejects
