"""What validate and sweep say (issue 35): validate's comparison names its p-value once; a sweep report's title is
a verdict, not a configuration string; costs carry their currency; the Kubernetes patch does not set the memory
limit to what a seconds-long point measured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from loadtest.capacity import describe, plan_rows
from loadtest.quality import Comparison, SystemScore
from loadtest.sweep.config import load_sweep
from loadtest.sweep.report import write_sweep_report
from loadtest.sweep.results import cheapest, kubernetes_patch
from loadtest.targets import QualityTargets
from loadtest.validate.command import quality_checks
from tests.loadtest.sweep.test_sweep import _measured, _package, _point, _write


def test_validate_names_the_p_value_once() -> None:
    comparison = Comparison("BLEU", 20.0, 21.0, -1.0, 0.01, 20.0, 1.0, 21.0, 1.0)
    [check] = quality_checks(SystemScore("pkg", 20, 50, "BLEU|sig", "chrF|sig", 30, 300, 2.0), [comparison],
                             QualityTargets(max_bleu_drop=0.5, alpha=0.05))
    assert check.detail.count("p = ") == 1, check.detail
    assert check.detail == ("candidate 20.00 vs baseline 21.00 (delta -1.00, p = 0.0100: significant drop; a drop "
                            "over 0.5 with p < 0.05 rejects)")


def _sweep(tmp_path: Path, **prices: object) -> tuple[object, list[object], object]:
    _package(tmp_path)
    sweep = load_sweep(_write(tmp_path, capacity={"load": {"peak_rps": 10},
                                                  "prices": {"cloud_per_core_hour": 0.1, **prices}}))
    results = [_measured(_point(4), 50, 100), dataclasses.replace(_measured(_point(8), 80, 300), seconds=9.0)]
    return sweep, results, cheapest(sweep, results)  # type: ignore[arg-type]


def test_the_sweep_title_is_a_verdict_and_costs_carry_their_currency(tmp_path: Path) -> None:
    sweep, results, winner = _sweep(tmp_path, currency="EUR")
    page, _ = write_sweep_report(tmp_path / "report", sweep, results, winner)  # type: ignore[arg-type]
    html = page.read_text(encoding="utf-8")
    title = html.split("<h1>", 1)[1].split("</h1>", 1)[0]
    assert "#2 is the cheapest that meets every target" in title and "onnxruntime" not in title, title
    assert "cost/month (EUR)" in html and "per month (EUR)" in html
    plan = winner[1]  # type: ignore[index]
    assert " EUR per month, " in describe(plan) and " EUR per million tokens, " in describe(plan)
    assert plan_rows(plan)[0][1:] == ["per month (EUR)", "per million output tokens (EUR)", "three years (EUR)"]
    (tmp_path / "default").mkdir()
    default, _, _ = _sweep(tmp_path / "default")
    assert default.file.capacity.prices.currency == "USD"  # type: ignore[attr-defined]


def test_the_kubernetes_memory_limit_leaves_room(tmp_path: Path) -> None:
    _, _, winner = _sweep(tmp_path)
    text = kubernetes_patch(*winner)  # type: ignore[misc]
    resources = yaml.safe_load(text)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] == "384Mi" and resources["limits"]["memory"] == "768Mi"
    assert text.startswith("# From mtgate sweep, point ") and "the peak RSS of a 9 s run (300 MiB) + 25 %" in text
