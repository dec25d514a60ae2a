"""report.py: Markdown + HTML with matplotlib SVG charts, from recorded runs."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from loadtest.charts import Axes, Series, panels
from loadtest.gate import evaluate
from loadtest.report import ScenarioResult, throughput_series, write_report
from loadtest.stats import read_run
from loadtest.targets import parse_targets

DATA = Path(__file__).resolve().parent / "data"
SVG = "{http://www.w3.org/2000/svg}"


def _result(name: str, users: dict[str, int], **targets: float) -> ScenarioResult:
    [scenario] = parse_targets({"scenarios": [{"name": name, "users": users, "targets": targets}]}).scenarios
    run = read_run(DATA / name)
    return ScenarioResult(scenario, run, evaluate(name, scenario.targets, run))


def test_report_files(tmp_path: Path) -> None:
    mixed = _result("mixed", {"TranslateUser": 2, "BulkUser": 1, "StreamUser": 1, "TritonUser": 1}, p95_ms=500)
    failing = _result("failing", {"TranslateUser": 1}, p95_ms=500)
    md, page = write_report(tmp_path, "http://127.0.0.1:8000", [mixed, failing])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["failing-latency.svg", "failing-throughput.svg", "mixed-latency.svg", "mixed-throughput.svg",
                     "report.html", "report.md"]  # no server chart: these runs have no /metrics samples
    for svg in tmp_path.glob("*.svg"):
        assert ET.parse(svg).getroot().tag == f"{SVG}svg"
    text = md.read_text(encoding="utf-8")
    assert text.startswith("# Load test: FAIL")
    assert "## Scenario mixed: pass" in text and "## Scenario failing: FAIL" in text
    assert "| error rate <= 0 % | 19.30 % | FAIL | 55 of 285 requests failed |" in text
    assert "| POST /v1/translate (bulk) | 32 | 0 | 89 | 110 | 110 | 115 | 10.7 |" in text
    assert "![mixed-latency.svg](mixed-latency.svg)" in text
    html = page.read_text(encoding="utf-8")
    assert html.count("<svg") == 4 and "Scenario failing" in html
    assert html.count('<figure class="chart" data-chart="latency">') == 2
    assert "<script" not in html and "http://" not in html.replace("http://127.0.0.1:8000", "").replace(
        "http://www.w3.org/", "")  # self-contained: nothing to fetch
    assert "CatchResponseError(&#x27;HTTP 503: queue full&#x27;)" in html  # escaped


def test_throughput_comes_from_cumulative_counts() -> None:
    run = read_run(DATA / "mixed")
    requests, failures, tokens = throughput_series(run)
    rows = [h for h in run.history if h.type not in ("TTFE", "") and h.name != "Aggregated"]
    stamps = sorted({h.timestamp for h in rows})
    totals = [sum(h.total_requests for h in rows if h.timestamp == t) for t in stamps]
    expected = [(b - a) / (t1 - t0) for a, b, t0, t1 in zip(totals, totals[1:], stamps, stamps[1:], strict=False)]
    assert [v for _, v in requests[1]] == pytest.approx(expected)
    assert all(v == 0 for _, v in failures[1])
    assert tokens[0] == "output tokens/s" and all(v > 0 for _, v in tokens[1])


def test_chart_without_data_and_with_markup_in_labels() -> None:
    empty = ET.fromstring(panels([Axes("t", "y")]))
    assert "no data" in "".join(empty.itertext())
    svg = panels([Axes("<b>", "y", [Series("a&b", [0.0, 1.0], [1.0, 3.0])])])
    root = ET.fromstring(svg)
    assert "<b>" in "".join(root.itertext()) and "a&b" in "".join(root.itertext())
    assert root.find(f".//{SVG}path") is not None
