"""``mtgate translate --stream``: each line's translation printed as it becomes stable, flushed piece by piece, the
output byte for byte that of ``mtgate translate``; stdin translated line by line as it arrives; refused in one line
with the options it cannot apply to."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.commands.main import main
from tests.utils.marian_factory import corpus

TEXTS = corpus("en")[120:126]
ROOT = Path(__file__).resolve().parents[3]


def _command(package: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "serving.commands.main", "translate", "-m", str(package), "--threads", "1", *args]


class _Recorder:
    """A stdout that keeps each write and counts the flushes."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


@pytest.mark.parametrize("beam", ["4", "1"])
def test_stream_prints_each_translation_as_it_grows_and_ends_as_without_it(
    tiny_package: Path, beam: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["translate", "-m", str(tiny_package), "--threads", "1", "--beam-size", beam, *TEXTS]
    assert main(args) == 0
    plain = capsys.readouterr().out
    recorder = _Recorder()
    monkeypatch.setattr("sys.stdout", recorder)
    assert main([*args, "--stream"]) == 0
    assert "".join(recorder.writes) == plain
    # the pieces of each line, written and flushed one by one before the line ends
    lines: list[list[str]] = [[]]
    for piece in recorder.writes:
        lines[-1].append(piece)
        if piece.endswith("\n"):
            lines.append([])
    assert len(lines) == len(TEXTS) + 1 and lines[-1] == []
    assert sum(len(pieces) > 2 for pieces in lines) > 0, "no translation printed before it was done"
    assert recorder.flushes >= len(recorder.writes)


@pytest.mark.parametrize("beam", ["4", "1"])
def test_stream_translates_stdin_line_by_line_as_it_arrives(tiny_package: Path, beam: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lines = [TEXTS[0], "", TEXTS[1], TEXTS[2]]
    assert main(["translate", "-m", str(tiny_package), "--threads", "1", "--beam-size", beam, *lines]) == 0
    plain = capsys.readouterr().out
    expected = plain.split("\n")[:-1]
    process = subprocess.Popen(_command(tiny_package, "--beam-size", beam, "--stream"), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert process.stdin is not None and process.stdout is not None
    out = b""
    try:
        for number, line in enumerate(lines, start=1):
            process.stdin.write(line.encode() + b"\n")  # the next line is sent only once this one is answered
            process.stdin.flush()
            deadline = time.monotonic() + 60
            while out.count(b"\n") < number:
                assert time.monotonic() < deadline, f"line {number} was not answered before stdin went on: {out!r}"
                if select.select([process.stdout], [], [], 1)[0]:
                    piece = os.read(process.stdout.fileno(), 1 << 16)
                    assert piece, process.stderr.read() if process.stderr else ""
                    out += piece
            assert out.decode().split("\n")[number - 1] == expected[number - 1]
        process.stdin.close()
        assert process.wait(timeout=60) == 0
        out += process.stdout.read()
    finally:
        process.kill()
        process.wait()
    assert out.decode() == plain


@pytest.mark.parametrize(("args", "fragment"), [
    (["--num-hypotheses", "2"], "not with --num-hypotheses above 1"),
    (["--split-sentences"], "not with --split-sentences"),
])
def test_stream_refuses_options_it_cannot_apply_in_one_line(tiny_package: Path, args: list[str], fragment: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["translate", "-m", str(tiny_package), "--stream", *args, "Hello."])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and err.startswith("mtgate translate: error: --stream "), err
    assert fragment in err, err
