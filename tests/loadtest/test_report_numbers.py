"""Load-test numbers as they can be trusted (issue 35): no percentile above the entry's max, milliseconds without a
decimal Locust does not have, p95 visible beside p99 when they are equal, and the latency chart saying what each
point covers. On the recorded runs of tests/loadtest/data."""

from __future__ import annotations

from pathlib import Path

from loadtest.gate import evaluate, format_table
from loadtest.report import ScenarioResult, _latency_series, latency_chart, window_text
from loadtest.stats import read_run
from loadtest.targets import Targets, parse_targets

DATA = Path(__file__).resolve().parent / "data"


def test_no_percentile_is_above_the_max() -> None:
    for name in ("mixed", "stream"):
        for entry in [*read_run(DATA / name).entries, read_run(DATA / name).aggregated]:
            assert entry.max_ms is not None
            shown = [v for v in entry.percentiles.values() if v is not None]
            assert all(v <= entry.max_ms for v in shown), (name, entry.label, entry.percentiles, entry.max_ms)
    stream = {e.label: e for e in read_run(DATA / "mixed").entries}["POST /v1/translate/stream"]
    assert stream.percentile("99%") == stream.max_ms < 110  # Locust wrote 110 beside a max of 108.8


def test_milliseconds_are_whole() -> None:
    checks = evaluate("mixed", Targets(p50_ms=100, p95_ms=100, ttfe_p95_ms=20), read_run(DATA / "mixed"))
    texts = {c.key: c.measured_text for c in checks}
    assert (texts["p50_ms"], texts["p95_ms"], texts["ttfe_p95_ms"]) == ("89 ms", "110 ms", "14 ms")
    assert ".0 ms" not in format_table(checks)


def _result(name: str, duration: str) -> ScenarioResult:
    [scenario] = parse_targets({"scenarios": [{"name": name, "users": {"TranslateUser": 1}, "duration": duration,
                                               "targets": {"p95_ms": 500}}]}).scenarios
    run = read_run(DATA / name)
    return ScenarioResult(scenario, run, evaluate(name, scenario.targets, run))


def test_each_percentile_has_its_own_pattern() -> None:
    series = _latency_series(read_run(DATA / "stream"), False)
    assert [s.label for s in series] == ["p50", "p95", "p99"]
    patterns = {(s.style, s.marker) for s in series}
    assert len(patterns) == 3  # equal values (Locust rounds them) still show every line


def test_the_chart_says_what_each_point_covers() -> None:
    assert window_text(8) == "each point: the run so far"
    assert window_text(30) == "each point: the last 10 s"
    assert "Latency over time (each point: the run so far)" in latency_chart(_result("stream", "8s"))
    assert "10 s window" not in latency_chart(_result("stream", "8s"))
    assert "(each point: the last 10 s)" in latency_chart(_result("stream", "30s"))
