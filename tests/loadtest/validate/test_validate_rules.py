"""validate.py's rules without a model: quality checks, the paired bootstrap, cost, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu

from loadtest.targets import QualityTargets
from loadtest.validate.command import (
    Check,
    Comparison,
    Outcome,
    SystemScore,
    compare,
    estimate_cost,
    quality_checks,
    write_outcome,
)

REFS = ["a man is riding a red bicycle down the street .", "two dogs play in the snow .",
        "a woman in a blue dress is singing on stage .", "children are jumping into a lake .",
        "an old man reads a newspaper on a bench .", "a group of people stand outside a shop ."] * 5


def _system(bleu: float, chrf: float) -> SystemScore:
    return SystemScore("pkg", bleu, chrf, "BLEU|sig", "chrF|sig", 30, 300, 2.0)


def _comparison(metric: str, candidate: float, baseline: float, p: float) -> Comparison:
    return Comparison(metric, candidate, baseline, candidate - baseline, p, candidate, 1.0, baseline, 1.0)


def test_a_drop_rejects_only_when_significant_and_beyond_the_allowance() -> None:
    rules = QualityTargets(max_bleu_drop=0.5, alpha=0.05)
    [significant] = quality_checks(_system(20, 50), [_comparison("BLEU", 20.0, 21.0, 0.01)], rules)
    assert not significant.passed and "delta -1.00, p = 0.0100" in significant.detail
    [noise] = quality_checks(_system(20, 50), [_comparison("BLEU", 20.0, 21.0, 0.30)], rules)
    assert noise.passed
    [allowed] = quality_checks(_system(20, 50), [_comparison("BLEU", 20.6, 21.0, 0.01)], rules)
    assert allowed.passed
    [better] = quality_checks(_system(20, 50), [_comparison("chrF", 60.0, 50.0, 0.001)], rules)
    assert better.passed


def test_floors() -> None:
    checks = quality_checks(_system(19.9, 50.0), [], QualityTargets(min_bleu=20, min_chrf=50))
    assert [(c.name, c.passed) for c in checks] == [("BLEU >= 20", False), ("chrF >= 50", True)]


def test_compare_is_sacrebleus_paired_bootstrap() -> None:
    worse = [r.replace("a ", "the ", 1).split(" .")[0] for r in REFS]
    [bleu, chrf] = compare(REFS, worse, REFS)
    assert bleu.candidate == pytest.approx(100.0)
    assert bleu.baseline == pytest.approx(sacrebleu.corpus_bleu(worse, [REFS]).score)
    assert chrf.baseline == pytest.approx(sacrebleu.corpus_chrf(worse, [REFS]).score)
    assert bleu.delta == pytest.approx(100.0 - bleu.baseline)
    assert bleu.p_value < 0.05 and chrf.p_value < 0.05
    assert 0 < bleu.baseline_ci and bleu.candidate_ci == pytest.approx(0.0)
    # Identical systems: no drop, so never a regression (sacrebleu's p-value is degenerate here: every resampled
    # difference is 0).
    [same, _] = compare(REFS, REFS, REFS)
    assert same.delta == 0
    assert all(c.passed for c in quality_checks(_system(100, 100), [same], QualityTargets()))


def test_identical_systems_are_no_difference_with_p_one() -> None:
    """sacrebleu alone says p = 1/1001 for two identical systems (reads as significant); validate says p = 1."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.significance import PairedTest

    worse = [r.replace("a ", "the ", 1) for r in REFS]
    _, raw = PairedTest([("baseline", worse), ("candidate", worse)], {"BLEU": BLEU(references=[REFS])},
                        references=None, test_type="bs", n_samples=1000)()
    assert raw["BLEU"][1].p_value == pytest.approx(1 / 1001)  # the degenerate value this fixes
    comparisons = compare(worse, worse, REFS)
    assert [(c.metric, c.delta, c.p_value, c.identical) for c in comparisons] == [
        ("BLEU", 0.0, 1.0, True), ("chrF", 0.0, 1.0, True)]
    [check, _] = quality_checks(_system(50, 50), comparisons, QualityTargets())
    assert check.passed and "delta +0.00, p = 1.0000: identical translations: no difference" in check.detail
    # Different systems keep sacrebleu's p-value, and say in words what it means.
    [different, _] = compare(REFS, worse, REFS)
    assert not different.identical and different.significance(0.05).startswith("significant gain (p = ")
    noise = _comparison("BLEU", 20.0, 20.3, 0.4)
    assert noise.significance(0.05) == "no significant difference (p = 0.4000)"


def test_cost() -> None:
    # 2 cores at 0.05 per core-hour = 0.1 per hour; 1000 tokens/s = 3.6M tokens per hour -> 0.1 / 3.6 per million
    assert estimate_cost(1000.0, 2, 0.05) == pytest.approx(0.1 / 3.6)
    assert estimate_cost(0.0, 2, 0.05) is None


def test_report(tmp_path: Path) -> None:
    outcome = Outcome(candidate={"path": "cand"}, baseline={"path": "base"},
                      testset={"source": "s", "reference": "r", "sentences": 30})
    outcome.quality = {"candidate": _system(30, 60), "baseline": _system(20, 50)}
    outcome.comparisons = [_comparison("BLEU", 30, 20, 0.001)]
    outcome.checks = [Check("candidate checksums", True, "ok"), Check("BLEU not worse than baseline", True, "x")]
    outcome.cost = {"price_per_core_hour": 0.05, "cores": 2, "tokens_per_s": 150.0, "throughput_source": "test set",
                    "per_million_tokens": estimate_cost(150.0, 2, 0.05)}
    data, page = write_outcome(tmp_path, outcome)
    report = json.loads(data.read_text(encoding="utf-8"))
    assert report["verdict"] == "PROMOTE"
    assert report["reasons"] == ["candidate checksums: ok", "BLEU not worse than baseline: x"]
    assert report["quality"]["candidate"]["tokens_per_s"] == 150.0
    assert report["comparison"][0]["delta"] == 10
    assert report["load"] is None
    outcome.checks.append(Check("load scenario s", False, "missed: p95"))
    data, page = write_outcome(tmp_path, outcome)
    report = json.loads(data.read_text(encoding="utf-8"))
    assert (report["verdict"], report["reasons"]) == ("REJECT", ["load scenario s: missed: p95"])
    text = page.read_text(encoding="utf-8")
    assert "REJECT" in text and "30.00" in text and "+10.00" in text


def test_report_header_names_each_package_with_its_artifact(tmp_path: Path) -> None:
    summary = {"path": "models/en-de", "name": "opus-mt-en-de", "version": "1", "source": "marian",
               "runtime": "onnxruntime"}
    outcome = Outcome(candidate={**summary, "precision": "int8"}, baseline={**summary, "precision": "fp32"},
                      testset={"source": "s", "reference": "r", "sentences": 30})
    outcome.checks = [Check("candidate checksums", True, "ok")]
    _, page = write_outcome(tmp_path, outcome)
    text = page.read_text(encoding="utf-8")
    assert ("Candidate <code>models/en-de (opus-mt-en-de 1, onnxruntime/int8)</code>, baseline "
            "<code>models/en-de (opus-mt-en-de 1, onnxruntime/fp32)</code>") in text
