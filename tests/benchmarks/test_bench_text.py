"""The bench's real-text mode (``python -m benchmarks.bench --text``, benchmarks/bench/text.py): the measuring loop
and the analysis on fakes, the options, then a short run on the demo model with real engine processes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench.cli import DEMO_CHECKPOINT, DEMO_PACKAGE, build_parser, main, make_plan
from benchmarks.bench.measure import Case, measure_text
from benchmarks.bench.text import analyze_text, summarize_text_case
from benchmarks.bench.text_report import render_text_markdown
from benchmarks.bench.workload import DEFAULT_REFERENCES


def test_measure_text_translates_the_same_batches_and_counts_sentences_and_tokens() -> None:
    calls: list[tuple[int, int]] = []

    def translate(texts: list[str], beam: int) -> list[tuple[str, int]]:
        calls.append((len(texts), beam))
        return [(t.upper(), len(t)) for t in texts]

    sentences = ["ab", "cde", "f", "gh", "ijk"]
    (row,) = measure_text(translate, sentences, [Case(beam=4, batch=2)], repeats=2, warmup_sentences=3)
    assert calls == [(2, 4), (1, 4)] + [(2, 4), (2, 4), (1, 4)] * 2  # warm-up 2 + 1, then two passes
    assert row["sentences"] == 5 and row["tokens"] == 11 and row["lengths"] == [2, 3, 1, 2, 3]
    assert row["outputs"] == ["AB", "CDE", "F", "GH", "IJK"] and len(row["seconds"]) == 2


def _entry(engine_id: str, family: str, rounds_seconds: list[float]) -> dict[str, Any]:
    raw = {"beam": 1, "batch": 1, "tokens": 40, "seconds": rounds_seconds, "cpu_seconds": rounds_seconds,
           "round_seconds": [[s] for s in rounds_seconds]}
    return {"id": engine_id, "label": engine_id, "family": family, "status": "ok",
            "cases": [summarize_text_case(raw, sentences=4)]}


def test_analysis_pairs_mtgate_with_the_best_ctranslate2_round_by_round_and_scores_every_engine() -> None:
    # round 1 ran on a slow machine (everyone took twice as long): paired, mtgate is 2x CTranslate2 int8 both times
    engines = [_entry("mtgate-onnxruntime-int8", "mtgate", [1.0, 0.5]),
               _entry("ct2-int8", "peer", [2.0, 1.0]),
               _entry("ct2-float32", "peer", [4.0, 2.0]),
               _entry("transformers-fp32", "peer", [8.0, 8.0])]
    references = ["ein Hund läuft .", "eine Katze schläft .", "zwei Männer gehen .", "ein Kind spielt ."]
    outputs = {
        "mtgate-onnxruntime-int8": {"greedy b1": references[:3] + ["ein Kind rennt ."]},
        "ct2-int8": {"greedy b1": ["ein Hund rennt ."] * 4},
        "ct2-float32": {"greedy b1": references},
        "transformers-fp32": {"greedy b1": references},
    }
    analysis = analyze_text(engines, outputs, [Case(1, 1)], references)
    (row,) = analysis["comparison"]
    assert row["best_mtgate"] == "mtgate-onnxruntime-int8" and row["best_ct2"] == "ct2-int8"
    assert row["vs_ct2"] == 2.0 and row["vs_ct2_rounds"] == [2.0, 2.0] and row["target_ok"]
    assert row["best_peer"] == "ct2-int8"
    by_id = {e["id"]: e["cases"][0] for e in engines}
    assert by_id["ct2-float32"]["bleu"] == by_id["transformers-fp32"]["bleu"] == 100.0
    assert by_id["mtgate-onnxruntime-int8"]["identical_to_transformers"] == 0.75
    assert by_id["ct2-int8"]["identical_to_transformers"] == 0.0
    assert by_id["ct2-float32"]["vs_best_ct2"] == 0.5
    assert analysis["targets_met"] and analysis["reference"] == "transformers-fp32"
    markdown = render_text_markdown({"created": "now", "command": "cmd", "machine": {
        "cpu": "cpu", "cores": 2, "load_start": [0.0]}, "workload": {
        "cases": [{"beam": 1, "batch": 1}], "threads": 2, "sentences": 4, "sentences_from": "f", "rounds": 2,
        "interleave": "case", "model": "m", "package": "p", "references_from": "r"}, "engines": engines,
        "analysis": analysis})
    assert "| mtgate-onnxruntime-int8 | 5.3 / 53 / " in markdown  # the medians of the passes: 0.75 s
    assert "| greedy b1 | mtgate-onnxruntime-int8 | ct2-int8 | 2.00x (2.00, 2.00) |" in markdown


def test_analysis_misses_the_target_below_one_and_a_half_times_ctranslate2() -> None:
    engines = [_entry("mtgate-onnxruntime-int8", "mtgate", [1.0]), _entry("ct2-int8", "peer", [1.2])]
    outputs = {e["id"]: {"greedy b1": ["x"] * 4} for e in engines}
    analysis = analyze_text(engines, outputs, [Case(1, 1)], None)
    assert analysis["comparison"][0]["vs_ct2"] == pytest.approx(1.2, abs=0.01) and not analysis["targets_met"]
    assert "bleu" not in engines[0]["cases"][0]


def test_text_mode_defaults_to_the_demo_model_and_its_package() -> None:
    plan = make_plan(build_parser().parse_args(["--text"]))
    assert plan.text and plan.checkpoint == DEMO_CHECKPOINT and plan.package == DEMO_PACKAGE
    assert plan.references_file == DEFAULT_REFERENCES and plan.num_sentences == 256
    assert [(c.beam, c.batch) for c in plan.cases] == [(1, 1), (1, 32), (4, 1), (4, 32)]
    plan = make_plan(build_parser().parse_args(["--text", "--engines", "ct2-int8_float32"]))
    assert plan.engine_ids == ["ct2-int8_float32"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "ct2-int8_float32"], "unknown engine(s) ct2-int8_float32"),  # a text-mode engine
        (["--text", "--package", "/nonexistent/package"], "not an mtgate package"),
        (["--text", "--references", "/nonexistent/refs.de"], "no such file"),
    ],
)
def test_bad_text_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--cache-dir", str(tmp_path), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("mtgate bench: error:")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="the transformers peer needs torch + transformers (test extra)")
def test_a_short_text_run_translates_with_mtgate_and_transformers(tmp_path: Path) -> None:
    """Real engine processes on the demo model: mtgate's package and transformers on its checkpoint (the peers'
    script run with this interpreter), text to text, scored and compared."""
    code = main(["--text", "-n", "4", "--beams", "1", "--batch-sizes", "2", "--rounds", "1", "--threads", "1",
                 "--engines", "mtgate-onnxruntime-fp32,transformers-fp32", "--peer-python", sys.executable,
                 "--cache-dir", str(tmp_path / "cache"), "-o", str(tmp_path), "--name", "text"])
    assert code == 0
    report = json.loads((tmp_path / "text.json").read_text(encoding="utf-8"))
    engines = {e["id"]: e for e in report["engines"]}
    assert all(e["status"] == "ok" for e in engines.values()), [e.get("error") for e in engines.values()]
    mine, theirs = engines["mtgate-onnxruntime-fp32"]["cases"][0], engines["transformers-fp32"]["cases"][0]
    assert mine["sentences"] == theirs["sentences"] == 4 and mine["tokens"] > 4 and mine["sentences_per_s"] > 0
    assert mine["bleu"] is not None and mine["bleu"] > 10  # translations, not token ids
    assert mine["identical_to_transformers"] == 1.0  # fp32: the same translations as transformers' generate
    outputs = report["outputs"]["mtgate-onnxruntime-fp32"]["greedy b2"]
    assert len(outputs) == 4 and all(isinstance(t, str) and t for t in outputs)
    assert report["analysis"]["comparison"][0]["best_ct2"] is None
    assert (tmp_path / "text.md").read_text(encoding="utf-8").startswith("# mtgate bench, real text")
