"""``mtgate score`` on the shared tiny package: one JSON line per pair (what ``Translator.score`` computes), the
corpus summary on stderr, and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from serving.commands.main import main
from serving.engine.translator import Translator
from tests.utils.marian_factory import corpus

SOURCES = corpus("en")[:6]
TARGETS = corpus("de")[:6]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["score", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_scores_each_pair_and_summarizes(tiny_package: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    source, target = _write(tmp_path / "s.en", SOURCES), _write(tmp_path / "t.de", TARGETS)
    code, out, err = run(["-m", str(tiny_package), "--source", str(source), "--target", str(target), "--threads", "1"],
                         capsys)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    expected = Translator.load(tiny_package, threads=1).score(SOURCES, TARGETS)
    assert [line["index"] for line in lines] == list(range(len(SOURCES)))
    for line, score in zip(lines, expected, strict=True):
        assert line["tokens"] == score.tokens == len(line["token_log_probs"])
        assert line["log_prob"] == pytest.approx(score.log_prob, abs=1e-5)
        assert line["perplexity"] == pytest.approx(math.exp(-line["mean_log_prob"]))
    tokens = sum(s.tokens for s in expected)
    mean = sum(s.log_prob for s in expected) / tokens
    assert err.startswith(f"scored {len(SOURCES)} pairs: {tokens} tokens, ")
    assert f"perplexity {math.exp(-mean):.4f}" in err and len(err.splitlines()) == 1

    output = tmp_path / "scores.jsonl"
    code, out, err = run(["-m", str(tiny_package), "--source", str(source), "--target", str(target), "--threads", "1",
                          "-o", str(output)], capsys)
    assert (code, out) == (0, "")
    assert [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()] == lines


def test_bad_input_is_one_line_and_exit_2(tiny_package: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    source, target = _write(tmp_path / "s.en", SOURCES), _write(tmp_path / "t.de", TARGETS)
    short = _write(tmp_path / "short.de", TARGETS[:2])
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"Ein Hund.\nx \xff y\n")
    long = _write(tmp_path / "long.de", ["kurz", " ".join(["Wort"] * 600)])
    model = ["-m", str(tiny_package), "--threads", "1"]
    cases = {
        "missing file": (["--source", str(tmp_path / "nope.en"), "--target", str(target)],
                         "--source " + str(tmp_path / "nope.en") + ": cannot read it"),
        "line counts": (["--source", str(source), "--target", str(short)], "has 6 lines but --target"),
        "not UTF-8": (["--source", str(_write(tmp_path / "two.en", SOURCES[:2])),
                       "--target", str(bad)], "line 2 is not valid UTF-8 (byte 0xff at byte 2 of the line)"),
        "too long": (["--source", str(tmp_path / "two.en"), "--target", str(long)],
                     f"--target {long} line 2 has"),
        "no package": (["-m", str(tmp_path / "nowhere"), "--source", str(source), "--target", str(target)],
                       "model package not found"),
        "no --target": (["--source", str(source)], "the following arguments are required: --target"),
    }
    for name, (args, message) in cases.items():
        code, out, err = run([*model, *args], capsys)
        assert code == 2, name
        assert out == "", name
        assert len(err.splitlines()) == 1 and message in err, (name, err)
        assert "Traceback" not in err
