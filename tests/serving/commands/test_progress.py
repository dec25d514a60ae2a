"""Progress where work takes more than a couple of seconds: ``mtgate translate`` over stdin, ``mtgate convert``'s
stages and validate's test-set step show it on a terminal (``serving.commands.progress``), and nothing elsewhere.

The terminal is a text stream that says it is one; the delay before a bar shows is set to 0 so that the tiny
model's few seconds of work show it.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

import serving.commands.progress
from serving.commands.main import main


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _terminal(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """stderr is a terminal (stdout stays a pipe); progress shows at once. Set in the test itself: pytest puts its
    own streams back between a fixture's setup and the test."""
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(serving.commands.progress, "DELAY_S", 0.0)
    monkeypatch.setattr(serving.commands.progress, "MININTERVAL_S", 0.0)  # every update drawn, however fast
    return stream


LINES = [f"A dog number {i} runs in the park." for i in range(600)]


def test_translate_over_stdin_shows_lines_done(tiny_onnx_package: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _terminal(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in LINES)))
    assert main(["translate", "-m", str(tiny_onnx_package), "--beam-size", "1", "--max-length", "4"]) == 0
    out = sys.stdout.getvalue()  # type: ignore[attr-defined]
    assert len(out.splitlines()) == len(LINES)
    shown = terminal.getvalue()
    assert "translate: 256 lines" in shown and "translate: 600 lines" in shown and "lines/s" in shown, shown
    assert shown.endswith("\r"), "the bar's line is cleared at the end"


def test_translate_shows_nothing_in_a_pipe_or_for_arguments(tiny_onnx_package: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _terminal(monkeypatch)
    assert main(["translate", "-m", str(tiny_onnx_package), "--max-length", "4", "A dog runs."]) == 0
    assert terminal.getvalue() == ""
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    monkeypatch.setattr(sys, "stdin", io.StringIO("A dog runs.\n" * 300))
    assert main(["translate", "-m", str(tiny_onnx_package), "--max-length", "4"]) == 0
    assert pipe.getvalue() == ""


def test_convert_names_its_stages(tiny_marian_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _terminal(monkeypatch)
    code = main(["convert", str(tiny_marian_dir), "-o", str(tmp_path / "package"), "--runtimes", "onnxruntime",
                 "--precisions", "fp32,int8"])
    assert code == 0, terminal.getvalue()
    shown = terminal.getvalue()
    for stage in (f"convert: reading {tiny_marian_dir}", "convert: emitting ONNX", "convert: quantizing ONNX to int8",
                  "convert: checking parity"):
        assert stage in shown, shown


def test_validate_shows_the_test_set_being_translated(tiny_onnx_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _terminal(monkeypatch)
    from loadtest.validate.command import _quality_pass
    from serving.engine.translator import DecodeOptions, Translator

    translator = Translator.load(tiny_onnx_package, threads=1)
    done = _quality_pass("candidate", translator, LINES[:40], DecodeOptions(beam_size=1, max_length=4), 16)
    assert len(done.hypotheses) == 40
    shown = terminal.getvalue()
    assert "translating (candidate): " in shown and "/40 [" in shown and "sentences/s" in shown, shown
