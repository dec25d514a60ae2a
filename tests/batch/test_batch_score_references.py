"""``batch-score --score-references``: each translated record's reference scored by the model (what
``Translator.score`` gives), in JSONL and TFRecord output and in the summary; outputs without the flag unchanged;
references missing, or a server, refused in one line with exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from batch.cli import main
from batch.example import example_class
from batch.framing import encode_items, scan_tfrecord
from serving.engine import Translator
from tests.utils.marian_factory import corpus

SOURCES = corpus("en")[:5]
REFERENCES = corpus("de")[:5]
FAST = ["--workers", "1", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def expected(tiny_onnx_package: Path) -> list[Any]:
    return Translator.load(tiny_onnx_package, threads=1).score(SOURCES, REFERENCES)


def run(args: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _check_summary(summary: dict[str, Any], expected: list[Any]) -> None:
    figures = summary["reference_scores"]
    tokens = sum(s.tokens for s in expected)
    log_prob = sum(s.log_prob for s in expected)
    assert (figures["references_scored"], figures["tokens"]) == (len(expected), tokens)
    assert figures["log_prob"] == pytest.approx(log_prob, abs=1e-4)
    assert figures["perplexity"] == pytest.approx(math.exp(-log_prob / tokens), rel=1e-5)


def test_jsonl_records_get_their_reference_scores(tmp_path: Path, tiny_onnx_package: Path, expected: list[Any],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in zip(SOURCES, REFERENCES,
                                                                                          strict=True)))
    plain, scored = tmp_path / "plain.jsonl", tmp_path / "scored.jsonl"
    assert run([source, "-m", tiny_onnx_package, "-o", plain, *FAST], capsys)[0] == 0
    code, out, err = run([source, "-m", tiny_onnx_package, "-o", scored, "--score-references", *FAST], capsys)
    assert code == 0, err
    assert "; references: perplexity " in out
    records = [json.loads(line) for line in scored.read_text().splitlines()]
    without = [json.loads(line) for line in plain.read_text().splitlines()]
    for record, plain_record, score in zip(records, without, expected, strict=True):
        assert {k: v for k, v in record.items() if not k.startswith("ref_")} == plain_record
        assert "ref_log_prob" not in plain_record
        assert record["ref_tokens"] == score.tokens
        assert record["ref_log_prob"] == pytest.approx(score.log_prob, abs=1e-5)
        assert record["ref_perplexity"] == pytest.approx(score.perplexity, rel=1e-5)
    _check_summary(json.loads((tmp_path / "scored.summary.json").read_text()), expected)
    assert "reference_scores" not in json.loads((tmp_path / "plain.summary.json").read_text())


def test_tfrecord_and_text_outputs(tmp_path: Path, tiny_onnx_package: Path, expected: list[Any],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    example = example_class()
    items = []
    for s, t in zip(SOURCES, REFERENCES, strict=True):
        record = example()
        record.features.feature["inputs"].bytes_list.value.append(s.encode())
        record.features.feature["targets"].bytes_list.value.append(t.encode())
        items.append(record.SerializeToString())
    source = tmp_path / "in.tfrecord"
    source.write_bytes(encode_items(items, "tfrecord"))
    out = tmp_path / "out.tfrecord"
    code, _, err = run([source, "-m", tiny_onnx_package, "-o", out, "--score-references", *FAST], capsys)
    assert code == 0, err
    for entry, score in zip(scan_tfrecord(out, 0, lambda _i: True), expected, strict=True):
        features = example.FromString(entry.data).features.feature
        assert features["ref_tokens"].int64_list.value == [score.tokens]
        assert features["ref_log_prob"].float_list.value[0] == pytest.approx(score.log_prob, abs=1e-4)
        assert features["ref_perplexity"].float_list.value[0] == pytest.approx(score.perplexity, rel=1e-4)

    # Text output has no room for per-record figures: the same bytes as without the flag, the summary has them.
    (tmp_path / "in.txt").write_text("".join(f"{s}\n" for s in SOURCES))
    (tmp_path / "ref.txt").write_text("".join(f"{t}\n" for t in REFERENCES))
    text_args = [tmp_path / "in.txt", "--references", tmp_path / "ref.txt", "-m", tiny_onnx_package, *FAST]
    assert run([*text_args, "-o", tmp_path / "plain.txt"], capsys)[0] == 0
    assert run([*text_args, "-o", tmp_path / "scored.txt", "--score-references"], capsys)[0] == 0
    assert (tmp_path / "plain.txt").read_bytes() == (tmp_path / "scored.txt").read_bytes()
    _check_summary(json.loads((tmp_path / "scored.summary.json").read_text()), expected)


def test_without_references_or_with_a_server_is_one_line_and_exit_2(tmp_path: Path, tiny_onnx_package: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.txt").write_text("".join(f"{s}\n" for s in SOURCES))
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"source": s}) + "\n" for s in SOURCES))
    cases = [
        ([tmp_path / "in.txt", "-m", tiny_onnx_package], "the inputs have no references", "--references FILE"),
        ([source, "-m", tiny_onnx_package], "the inputs have no references", "--reference-key KEY"),
        ([source, "--server", "http://127.0.0.1:9"], "needs a local model package (-m), not --server", ""),
    ]
    for args, *needles in cases:
        code, out, err = run([*args, "--score-references", *FAST], capsys)
        assert code == 2 and out == "", err
        assert len(err.splitlines()) == 1 and all(n in err for n in needles), err
    assert not list(tmp_path.glob("*.scored*"))
