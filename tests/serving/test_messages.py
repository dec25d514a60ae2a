"""One-line messages of the command line that say what to do (issue 35): an over-long line names the flag that cuts
it, and a model given as a Hugging Face hub id says that mtgate does not download models and what to run instead.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from serving.cli import main

LONG = " ".join(["word"] * 400)


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_an_over_long_line_names_truncate(tiny_onnx_package: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["translate", "-m", str(tiny_onnx_package), "--max-length", "4", "Hi.", LONG]) == 2
    line = _error(capsys)
    assert line.startswith("mtgate translate: error: argument 2: ") and "the model accepts at most" in line, line
    assert line.endswith("--truncate cuts it to the model's positions"), line
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"Hi.\n{LONG}. Bye.\n"))
    assert main(["translate", "-m", str(tiny_onnx_package), "--max-length", "4", "--split-sentences"]) == 2
    line = _error(capsys)
    assert line.startswith("mtgate translate: error: line 2: sentence 0 is "), line
    assert line.endswith("--truncate cuts it to the model's positions"), line
    assert main(["translate", "-m", str(tiny_onnx_package), "--max-length", "4", "--truncate", LONG]) == 0
