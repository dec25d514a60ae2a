"""One-line messages of the command line that say what to do (issue 35): an over-long line names the flag that cuts
it, and a model given as a Hugging Face hub id says that mtgate does not download models and what to run instead.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from serving.commands.main import main

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


HUB_ID = "Helsinki-NLP/opus-mt-en-de"
HINT = ("`huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de`), then `mtgate convert "
        "opus-mt-en-de -o models/opus-mt-en-de`")


@pytest.mark.parametrize("argv", [
    ["translate", "-m", HUB_ID, "Hi."],
    ["score", "-m", HUB_ID, "--source", "s.txt", "--target", "s.txt"],
    ["serve", "-m", HUB_ID],
    ["verify", HUB_ID],
    ["export-triton", HUB_ID, "-o", "triton-repo"],
    ["batch-score", "s.txt", "-m", HUB_ID, "-o", "out.txt"],
    ["loadtest", "--start-server", "-m", HUB_ID, "-t", "1s"],
    ["validate", "-m", HUB_ID],
], ids=lambda argv: argv[0])
def test_a_hub_id_says_mtgate_does_not_download_and_what_to_run(argv: list[str], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.txt").write_text("Hi.\n", encoding="utf-8")
    assert main(argv) == 2
    line = _error(capsys)
    assert HUB_ID in line and "looks like a Hugging Face hub id, and mtgate does not download models" in line, line
    assert HINT in line and line.endswith("and pass -m models/opus-mt-en-de"), line


def test_convert_of_a_hub_id_says_download_it_first(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["convert", HUB_ID, "-o", "models/x"]) == 2
    line = _error(capsys)
    assert "mtgate converts local directories, it downloads nothing" in line and line.endswith(HINT), line


def test_a_mistyped_local_path_gets_no_hub_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # models/en-dee is a typo of a local path, not an owner/name on the hub
    assert main(["translate", "-m", "models/en-dee", "Hi."]) == 2
    assert _error(capsys) == "mtgate translate: error: model package not found: models/en-dee"


def test_export_triton_refuses_to_replace_a_model_unless_asked(tiny_onnx_package: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    assert main(["export-triton", str(tiny_onnx_package), "-o", str(repo), "--model-name", "m"]) == 0
    (repo / "m" / "2").mkdir()  # a version of the model exported before: the export would take it away
    capsys.readouterr()
    assert main(["export-triton", str(tiny_onnx_package), "-o", str(repo), "--model-name", "m"]) == 2
    assert _error(capsys) == (f"mtgate export-triton: error: {repo / 'm'}: already exists (pass --overwrite to "
                              "replace the model, every version of it)")
    assert (repo / "m" / "2").is_dir()
    assert main(["export-triton", str(tiny_onnx_package), "-o", str(repo), "--model-name", "m", "--overwrite"]) == 0
    assert not (repo / "m" / "2").exists() and (repo / "m" / "1" / "model.py").is_file()


@pytest.mark.parametrize(("output", "problem"), [
    ("/proc/pkg", "cannot create directories in /proc ("),
    ("file", "it exists and is not a directory"),
    ("file/pkg", "{tmp}/file is not a directory"),
])
def test_convert_refuses_an_output_it_cannot_write_before_any_work(output: str, problem: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x", encoding="utf-8")
    (tmp_path / "src").mkdir()  # never read: the output is checked first
    assert main(["convert", "src", "-o", output]) == 2
    line = _error(capsys)
    assert line.startswith(f"mtgate convert: error: cannot write the package {output}: "), line
    assert problem.format(tmp=tmp_path) in line and line.endswith("; give another -o"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "src"]  # no staging directory left


def test_convert_says_which_directory_it_created_and_removes_it_on_failure(
        tiny_marian_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import converters.convert
    from converters.base import ConversionError

    monkeypatch.chdir(tmp_path)

    def fails_after_making_its_directory(source: Path, output: Path, **_: object) -> None:
        output.parent.mkdir(parents=True)  # as the package's staging directory does before anything is written
        raise ConversionError("no good")

    with monkeypatch.context() as patched:
        patched.setattr(converters.convert, "convert", fails_after_making_its_directory)
        assert main(["convert", str(tiny_marian_dir), "-o", "new/models/pkg"]) == 2
    assert _error(capsys) == "mtgate convert: error: no good"
    assert not (tmp_path / "new").exists()  # the directories made for the failed package are gone
    assert main(["convert", str(tiny_marian_dir), "-o", "new/models/pkg", "--runtimes", "onnxruntime",
                 "--precisions", "fp32", "--no-verify"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("wrote new/models/pkg (") and first.endswith("; created the directory new"), first
