"""``mtgate translate`` end to end on a converted tiny Marian package (onnxruntime and openvino)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import serving.server.settings
from serving.commands import translate as translate_cli
from serving.commands.main import main
from serving.engine.translator import DecodeOptions, Translator
from serving.package import RUNTIMES
from tests.utils.marian_factory import corpus

TEXTS = corpus("en")[100:106]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def package(tiny_package: Path) -> Path:
    """The shared tiny package (tests/conftest.py: onnxruntime and openvino fp32); tests that alter it copy it."""
    return tiny_package


@pytest.fixture(scope="module")
def expected(package: Path) -> dict[str, list[str]]:
    translator = Translator.load(package, threads=1)
    return {
        "default": [t.text for t in translator.translate(TEXTS)],
        "greedy": [t.text for t in translator.translate(TEXTS, DecodeOptions(beam_size=1))],
        "short": [t.text for t in translator.translate(TEXTS, DecodeOptions(beam_size=1, max_length=2))],
    }


def run(args: list[str], capsys: pytest.CaptureFixture[str], stdin: str | None = None,
        monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, list[str], str]:
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["translate", *args])
    out, err = capsys.readouterr()
    return code, out.split("\n")[:-1], err


def test_arguments(package: Path, expected: dict[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = run(["-m", str(package), "--threads", "1", *TEXTS], capsys)
    assert (code, err) == (0, "")
    assert lines == expected["default"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stdin_lines_keep_empty_lines(
    package: Path, expected: dict[str, list[str]], runtime: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if runtime == "openvino":
        pytest.importorskip("openvino")
    stdin = "\n".join([TEXTS[0], "", TEXTS[1], "   ", *TEXTS[2:]]) + "\r\n"
    code, lines, _ = run(["-m", str(package), "--runtime", runtime, "--beam-size", "1", "--threads", "1"], capsys,
                         stdin, monkeypatch)
    greedy = expected["greedy"]
    assert code == 0
    assert lines == [greedy[0], "", greedy[1], "", *greedy[2:]]


def test_max_length(package: Path, expected: dict[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(["-m", str(package), "--beam-size", "1", "--max-length", "2", *TEXTS], capsys)
    assert code == 0 and lines == expected["short"]


def test_stdin_is_read_in_chunks(package: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(translate_cli, "_CHUNK_LINES", 2)
    code, lines, _ = run(["-m", str(package), "--beam-size", "1", "--max-length", "3"], capsys,
                         "\n".join(["a", "", "b", "c", ""]) + "\n", monkeypatch)
    assert code == 0 and len(lines) == 5 and lines[1] == lines[4] == ""


def _one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("mtgate translate: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_input(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, lines, err = run(["-m", str(tmp_path / "nope"), "x"], capsys)
    _one_line_error(code, err, "model package not found", "nope")
    code, lines, err = run(["-m", str(tmp_path), "x"], capsys)
    _one_line_error(code, err, "not an mtgate model package")
    code, lines, err = run(["-m", str(package), "--beam-size", "0", "x"], capsys)
    _one_line_error(code, err, "--beam-size: must be from 1 to 8, got 0")
    code, lines, err = run(["-m", str(package), "--precision", "int8", "x"], capsys)
    _one_line_error(code, err, "no onnxruntime/int8 artifact", "onnxruntime/fp32")
    code, lines, err = run(["-m", str(package), "--beam-size", "1"], capsys, "fine\n" + "word " * 300 + "\n",
                           monkeypatch)
    _one_line_error(code, err, "line 2:", "the model accepts at most 128")
    monkeypatch.setattr(serving.server.settings, "DEFAULT_MODEL_DIR", tmp_path / "models" / "demo-en-de")
    code, lines, err = run(["hello"], capsys)
    _one_line_error(code, err, "bundled demo model is not built", str(tmp_path / "models" / "demo-en-de"))


def test_tampered_package_is_refused(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    decoder = next(a["files"]["decoder"] for a in manifest["artifacts"] if a["runtime"] == "onnxruntime")
    with (copy / decoder).open("ab") as f:
        f.write(b"\0")
    code, _, err = run(["-m", str(copy), "x"], capsys)
    _one_line_error(code, err, decoder, "sha256 mismatch")


def _translate_process(package: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "serving.commands.main", "translate", "-m", str(package), "--threads", "1",
                           *args], input=stdin, capture_output=True, timeout=120, cwd=ROOT)


def test_text_that_is_not_unicode_is_one_line_and_exit_2(package: Path) -> None:
    # Not UTF-8 on stdin: refused with the line's number, after every line before it is translated and written.
    result = _translate_process(package, "--beam-size", "1", stdin=b"A good line.\nA man \xff is riding.\nnever\n")
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("mtgate translate: error: line 2 is not valid UTF-8 (byte 0xff"), err
    good = _translate_process(package, "--beam-size", "1", "A good line.").stdout
    assert good and result.stdout == good  # the line before the bad one, in the same chunk
    # An argument with an undecodable byte (argv decodes with surrogateescape) or a lone surrogate.
    for args in ([b"ok", b"A \xff man"], [b"A \xed\xa0\x80 man"]):
        result = subprocess.run([sys.executable, "-m", "serving.commands.main", "translate", "-m", str(package), *args],
                                capture_output=True, timeout=120, cwd=ROOT)
        err = result.stderr.decode()
        assert result.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"argument {len(args)} holds a lone surrogate" in err, err


def test_options_out_of_range_name_the_range(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from serving.server.settings import ServingSettings

    cap = ServingSettings.model_fields["max_beam_size"].default  # the server's cap, one setting
    for args, fragment in ((["--beam-size", "100"], f"--beam-size: must be from 1 to {cap}, got 100"),
                           (["--beam-size", "0"], f"must be from 1 to {cap}, got 0"),
                           (["--max-length", "100000"], "--max-length: must be from 1 to 512")):
        code, _, err = run(["-m", str(package), *args, "x"], capsys)
        _one_line_error(code, err, fragment)
    code, lines, _ = run(["-m", str(package), "--beam-size", str(cap), "--max-length", "3", "x"], capsys)
    assert code == 0 and len(lines) == 1


def test_truncate_and_split_sentences(package: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    translator = Translator.load(package, threads=1)
    options = DecodeOptions(beam_size=1, max_length=3, truncate=True)
    too_long = " ".join(["word"] * 300)
    base = ["-m", str(package), "--beam-size", "1", "--max-length", "3"]
    code, lines, err = run([*base, "--truncate"], capsys, f"fine\n{too_long}\n", monkeypatch)
    assert (code, err) == (0, "") and lines == [t.text for t in translator.translate(["fine", too_long], options)]
    # A line of several sentences: each translated, joined with the line's spaces; an over-long one is refused by its
    # line and sentence, after the lines before it are written.
    line = "A man is riding a bicycle.  Two dogs play."
    alone = [t.text for t in translator.translate(["A man is riding a bicycle.", "Two dogs play."], options)]
    code, lines, err = run([*base, "--split-sentences"], capsys, f"{line}\n\nGood. {too_long}\n", monkeypatch)
    assert lines == [f"{alone[0]}  {alone[1]}", ""]
    _one_line_error(code, err, "line 3: sentence 1 is ", "the model takes at most 128")
    code, lines, err = run([*base, "--split-sentences", "--truncate", line], capsys)
    assert (code, lines) == (0, [f"{alone[0]}  {alone[1]}"])
