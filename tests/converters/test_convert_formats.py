"""Every checkpoint format through the real ``mtgate convert`` / ``mtgate verify`` CLI (issue 16 item 6): the reader
is picked from the directory's contents, ``--format`` forces one, each format converts, verifies against its source
and translates; bad input is one error (a header line plus one line per reason), exit 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from converters.readers import FORMATS, READERS, detect_reader
from serving.commands.main import main
from serving.engine.translator import DecodeOptions, Translator
from tests.utils.fairseq_factory import make_fairseq_dir
from tests.utils.fsmt_factory import make_fsmt_dir
from tests.utils.marian_factory import make_marian_dir
from tests.utils.marian_npz_factory import make_marian_npz_dir
from tests.utils.onmt_factory import make_onmt_dir

pytest.importorskip("torch")
pytest.importorskip("transformers")

T2T_CHECKPOINT = Path(__file__).resolve().parents[1] / "data" / "t2t" / "transformer_test_ckpt"
NEW_FORMATS = ("fsmt", "fairseq", "marian-npz", "opennmt-py")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    return {"marian": make_marian_dir(root / "marian", seed=7), "fsmt": make_fsmt_dir(root / "fsmt", seed=7),
            "fairseq": make_fairseq_dir(root / "fairseq", seed=7),
            "marian-npz": make_marian_npz_dir(root / "marian-npz", seed=7),
            "opennmt-py": make_onmt_dir(root / "opennmt-py", seed=7), "t2t": T2T_CHECKPOINT}


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()


def test_every_format_is_recognized_from_its_contents(sources: dict[str, Path]) -> None:
    assert set(FORMATS) == set(sources) and len(READERS) == len(FORMATS)
    for fmt, source in sources.items():
        assert detect_reader(source) is FORMATS[fmt], fmt


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_convert_verify_translate(sources: dict[str, Path], fmt: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pkg"
    assert main(["convert", str(sources[fmt]), "-o", str(out), "--runtimes", "onnxruntime", "--precisions",
                 "fp32"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["verify", str(out), "--checkpoint", str(sources[fmt])]) == 0  # the source read as the same format
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("PASS")
    [result] = Translator.load(out, threads=1).translate(["A man is riding a bike."], DecodeOptions(beam_size=2,
                                                                                                     max_length=8))
    assert 1 <= result.output_tokens <= 8 and result.input_tokens > 2


def test_format_forces_the_reader(sources: dict[str, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pkg"
    lines = _bad(["convert", str(sources["fairseq"]), "-o", str(out), "--format", "opennmt-py"], capsys)
    assert "cannot convert this OpenNMT-py checkpoint" in lines[0]
    assert lines[1:] == ["  checkpoint_best.pt has no generator, vocab, opt (not an OpenNMT-py checkpoint)"]
    lines = _bad(["convert", str(sources["fairseq"]), "-o", str(out), "--format", "nematus"], capsys)
    assert len(lines) == 1 and "unknown format 'nematus' (supported formats: marian, fsmt, fairseq" in lines[0]
    assert not out.exists()


def test_an_unsupported_architecture_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make_fairseq_dir(tmp_path / "src", arch="lightconv_wmt_en_de")
    out = tmp_path / "pkg"
    lines = _bad(["convert", str(source), "-o", str(out)], capsys)
    assert lines[0].startswith("mtgate convert: error:") and "cannot convert this fairseq checkpoint" in lines[0]
    assert len(lines) == 2 and "architecture 'lightconv_wmt_en_de'" in lines[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing half-written


def test_an_unreadable_checkpoint_is_one_error(sources: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    broken = shutil.copytree(sources["opennmt-py"], tmp_path / "src")
    (broken / "model_step_100.pt").write_bytes(b"not a zip, not a pickle")
    lines = _bad(["convert", str(broken), "-o", str(tmp_path / "pkg")], capsys)
    assert len(lines) == 1 and "model_step_100.pt: not a readable torch checkpoint" in lines[0]
    assert not (tmp_path / "pkg").exists()
