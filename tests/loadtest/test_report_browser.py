"""The reports render in headless Chromium with the network blocked: each chart is there and drawn (its box has a
size), and the page's screenshot is a real picture. Built from recorded runs and synthetic numbers (no server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadtest.quality import analyse
from loadtest.report import write_report
from loadtest.scrape import Histogram, Sample, ServerMetrics
from loadtest.sweep.config import Point, load_sweep
from loadtest.sweep.report import write_sweep_report
from loadtest.sweep.results import PointResult, ScenarioSummary, cheapest
from loadtest.validate.command import Check, Outcome, SystemScore, compare, write_outcome
from tests.loadtest.test_report import _result

CHROMIUM = "/usr/bin/chromium"


def _server(start: float) -> ServerMetrics:
    samples = []
    for i in range(6):
        n = float(10 * i)
        samples.append(Sample(start + i, Histogram({0.001: n / 2, 0.01: n, float("inf"): n}, n * 0.002, n),
                              Histogram({4.0: n / 4, float("inf"): n / 3}, n, n / 3),
                              Histogram({float("inf"): 0.0}, 0.0, 0.0), float(i % 3)))
    return ServerMetrics(samples)


def _load_report(directory: Path) -> Path:
    mixed = _result("mixed", {"TranslateUser": 2, "BulkUser": 1, "StreamUser": 1, "TritonUser": 1}, p95_ms=500,
                    ttfe_p95_ms=100)
    history = min(h.timestamp for h in mixed.run.history)
    with_server = type(mixed)(mixed.scenario, mixed.run, mixed.checks, _server(history))
    _, page = write_report(directory, "http://127.0.0.1:8000", [with_server])
    return page


def _validate_report(directory: Path) -> Path:
    sources = [f"a sentence of {n} words " + "x " * n for n in range(1, 30)]
    references = [s.upper() for s in sources]
    candidate = [s if i % 3 else s.upper() for i, s in enumerate(sources)]
    baseline = [s.upper() if i % 4 == 0 else s for i, s in enumerate(sources)]
    outcome = Outcome(candidate={"path": "cand", "precision": "int8"}, baseline={"path": "base"},
                      testset={"source": "s", "reference": "r", "sentences": len(sources)})
    outcome.quality = {"candidate": SystemScore("cand", 30, 60, "BLEU|sig", "chrF|sig", 29, 300, 2.0),
                       "baseline": SystemScore("base", 28, 58, "BLEU|sig", "chrF|sig", 29, 300, 2.0)}
    outcome.comparisons = compare(candidate, baseline, references)
    outcome.analysis = analyse(sources, references, {"candidate": candidate, "baseline": baseline})
    outcome.checks = [Check("candidate checksums", True, "ok")]
    _, page = write_outcome(directory, outcome)
    return page


def _sweep_report(directory: Path) -> Path:
    (directory / "pkg").mkdir(parents=True)
    (directory / "pkg" / "manifest.json").write_text("{}", encoding="utf-8")
    sweep_file = directory / "sweep.yaml"
    sweep_file.write_text('{"models": ["pkg"], "scenarios": [{"name": "s", "users": {"TranslateUser": 1}, '
                          '"targets": {"p95_ms": 500}}], "capacity": {"load": {"peak_rps": 10}, '
                          '"prices": {"cloud_per_core_hour": 0.1}}}', encoding="utf-8")
    sweep = load_sweep(sweep_file)
    results = []
    for i, (p95, tokens) in enumerate([(120, 90), (200, 300), (450, 420), (700, 480), (260, 250)]):
        point = Point(directory / "pkg", "onnxruntime", "int8", 1, 1, "request", 4 << i, 1000)
        summary = ScenarioSummary("s", p95 < 500, [], p95 >= 500, p95, 5.0, tokens, 20.0, 0.0, 3.0, 8.0, 1.0)
        results.append(PointResult(point, f"k{i}", "measured", scenarios=[summary], rss_mb=400))
    page, _ = write_sweep_report(directory, sweep, results, cheapest(sweep, results))
    return page


def test_reports_render_offline(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("chromium is not installed")
    from playwright.sync_api import sync_playwright

    pages = {
        "loadtest": (_load_report(tmp_path / "load"), ["latency", "throughput", "server"]),
        "validate": (_validate_report(tmp_path / "validate"), ["chrf-distribution", "length-buckets"]),
        "sweep": (_sweep_report(tmp_path / "sweep"), ["pareto"]),
    }
    requested: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                    args=["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run",
                                          "--disable-background-networking", "--disable-component-update"])
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900}, offline=True)
            context.route("**/*", lambda route: (requested.append(route.request.url), route.abort())
                          if not route.request.url.startswith("file://") else route.continue_())
            for name, (path, charts) in pages.items():
                page = context.new_page()
                page.goto(path.as_uri())
                for chart in charts:
                    box = page.locator(f'figure[data-chart="{chart}"] svg').first.bounding_box()
                    assert box is not None and box["width"] > 300 and box["height"] > 150, (name, chart, box)
                assert page.locator("figure.chart").count() >= len(charts)
                shot = tmp_path / f"{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                size = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
                assert size[0] >= 1000 and size[1] > 900, (name, size)
                assert shot.stat().st_size > 50_000, name  # a picture with content, not a blank page
                if name == "validate":
                    assert page.locator("table.examples").count() == 2  # losses and gains, side by side
                if name == "sweep":
                    assert "cheapest" in page.inner_text("h1")
                page.close()
        finally:
            browser.close()
    assert requested == []  # nothing but the file itself was asked for
