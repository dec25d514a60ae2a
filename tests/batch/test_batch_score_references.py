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
from serving.engine.errors import InputTooLong
from serving.engine.translator import Translator
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


def test_truncate_scores_the_reference_against_the_cut_source(tmp_path: Path, tiny_onnx_package: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """--truncate translates an over-long source cut to the model's positions; its reference is scored against
    that cut source (as translated), not refused, so the record is kept; without --truncate the record is a reject
    and nothing is scored for it."""
    translator = Translator.load(tiny_onnx_package, threads=1)
    long = " ".join(["the man rides a bike"] * 40)
    [long_ids] = translator.encode([long])
    limit = translator.info.max_input_tokens
    assert len(long_ids) > limit
    [cut] = translator.score_ids([long_ids[: limit - 1]], [REFERENCES[1]])  # what was translated: limit - 1 ids, EOS
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"source": s, "target": t}) + "\n"
                              for s, t in [(SOURCES[0], REFERENCES[0]), (long, REFERENCES[1])]))
    out = tmp_path / "out.jsonl"
    code, _, err = run([source, "-m", tiny_onnx_package, "-o", out, "--score-references", "--truncate", *FAST],
                       capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["source"] for r in records] == [SOURCES[0], long]
    assert records[1]["ref_tokens"] == cut.tokens and records[1]["ref_log_prob"] == pytest.approx(cut.log_prob,
                                                                                                  abs=1e-5)
    [first] = translator.score(SOURCES[:1], REFERENCES[:1])
    assert records[0]["ref_log_prob"] == pytest.approx(first.log_prob, abs=1e-5)
    assert not (tmp_path / "out.rejects.jsonl").exists() or not (tmp_path / "out.rejects.jsonl").read_text()
    # the engine: a source is cut only when asked; a target never is
    assert translator.score([long], [REFERENCES[1]], truncate=True)[0].log_prob == pytest.approx(cut.log_prob,
                                                                                                  abs=1e-5)
    with pytest.raises(InputTooLong, match=r"source\[0\]"):
        translator.score([long], [REFERENCES[1]])
    with pytest.raises(InputTooLong, match=r"target\[0\]"):
        translator.score([SOURCES[0]], [long], truncate=True)

    code, _, _ = run([source, "-m", tiny_onnx_package, "-o", tmp_path / "refused.jsonl", "--score-references",
                      *FAST], capsys)
    assert code == 1  # the over-long record is a reject
    assert [json.loads(line)["source"] for line in (tmp_path / "refused.jsonl").read_text().splitlines()] == \
        [SOURCES[0]]


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
