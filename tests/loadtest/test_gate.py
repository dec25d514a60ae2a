"""stats.py and gate.py on recorded Locust runs (tests/loadtest/data/README.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadtest.gate import evaluate, format_table, passed
from loadtest.stats import StatsError, read_run
from loadtest.targets import Targets

DATA = Path(__file__).resolve().parent / "data"


def test_read_mixed_run() -> None:
    run = read_run(DATA / "mixed")
    assert [e.label for e in run.entries] == [
        "POST /v1/translate", "POST /v1/translate (bulk)", "POST /v1/translate/stream", "TTFE /v1/translate/stream",
        "V2 /v2/models/stub/infer"]
    assert [e.label for e in run.first_event_entries] == ["TTFE /v1/translate/stream"]
    assert run.aggregated.requests == 774
    bulk = run.entries[1]
    assert (bulk.requests, bulk.failures, bulk.percentile("95%"), bulk.percentile("99.99%")) == (32, 0, 110.0, 110.0)
    assert run.tokens is not None and run.tokens.output_tokens == 12521
    assert run.history and {h.name for h in run.history} >= {"Aggregated", "/v1/translate"}


def test_gate_on_mixed_run_uses_the_slowest_entry_and_exact_sums() -> None:
    run = read_run(DATA / "mixed")
    targets = Targets(p50_ms=100, p95_ms=100, p99_ms=200, ttfe_p95_ms=20, ttfe_p99_ms=30, min_rps=230,
                      min_tokens_per_s=3600)
    checks = {c.key: c for c in evaluate("mixed", targets, run)}
    assert checks["successful_requests"].measured == 216 + 32 + 80 + 365  # TTFE rows are not requests
    assert (checks["p50_ms"].measured, checks["p50_ms"].passed) == (89.0, True)
    assert (checks["p95_ms"].measured, checks["p95_ms"].passed) == (110.0, False)
    assert checks["p95_ms"].detail == "POST /v1/translate (bulk)"
    assert (checks["p99_ms"].measured, checks["p99_ms"].passed) == (110.0, True)
    assert (checks["ttfe_p95_ms"].measured, checks["ttfe_p95_ms"].passed) == (14.0, True)
    assert (checks["ttfe_p99_ms"].measured, checks["ttfe_p99_ms"].passed) == (36.0, False)
    assert (checks["max_error_rate"].measured, checks["max_error_rate"].passed) == (0.0, True)
    rps = 71.9455215986735 + 10.658595792396072 + 26.64648948099018 + 121.5746082570177
    assert checks["min_rps"].measured == pytest.approx(rps) and checks["min_rps"].passed
    tokens_per_s = 12521 / (1796235197.6242628 - 1796235194.0631742)
    assert checks["min_tokens_per_s"].measured == pytest.approx(tokens_per_s)
    assert not checks["min_tokens_per_s"].passed  # 3516 < 3600
    assert not passed(list(checks.values()))


def test_gate_on_failing_run() -> None:
    run = read_run(DATA / "failing")
    [f1, f2] = run.failures
    assert (f1.error, f1.occurrences) == ("CatchResponseError('wrong answer: translation 0 is empty')", 17)
    assert (f2.error, f2.occurrences) == ("CatchResponseError('HTTP 503: queue full')", 38)
    strict = {c.key: c for c in evaluate("f", Targets(), run)}
    assert strict["max_error_rate"].measured == pytest.approx(55 / 285)
    assert not strict["max_error_rate"].passed
    assert strict["max_error_rate"].detail == "55 of 285 requests failed"
    lenient = evaluate("f", Targets(max_error_rate=0.2, p95_ms=18), run)
    assert passed(lenient)


def test_targets_without_data_fail() -> None:
    run = read_run(DATA / "failing")  # no streaming entries
    checks = {c.key: c for c in evaluate("f", Targets(ttfe_p95_ms=1000), run)}
    assert checks["ttfe_p95_ms"].measured is None and not checks["ttfe_p95_ms"].passed
    assert checks["ttfe_p95_ms"].measured_text == "no data"


def test_a_run_without_successful_requests_fails(tmp_path: Path) -> None:
    stats = (DATA / "failing_stats.csv").read_text(encoding="utf-8").splitlines()
    header = stats[0]
    zero = ",Aggregated,0,0,0,0,0,0,0,0,0," + ",".join(["N/A"] * 11)
    (tmp_path / "run_stats.csv").write_text(f"{header}\n{zero}\n", encoding="utf-8")
    run = read_run(tmp_path / "run")
    assert run.entries == [] and run.tokens is None and run.history == []
    checks = evaluate("empty", Targets(max_error_rate=1.0), run)
    assert [c.key for c in checks] == ["successful_requests", "max_error_rate"]
    assert not passed(checks)


def test_table() -> None:
    table = format_table(evaluate("stream", Targets(ttfe_p95_ms=50, p95_ms=10), read_run(DATA / "stream")))
    lines = table.splitlines()
    assert lines[0].split() == ["scenario", "target", "measured", "result"]
    assert "p95 time to first event <= 50 ms" in table and "pass" in table
    assert any(line.startswith("stream") and line.endswith("FAIL") and "p95 latency <= 10 ms" in line
               for line in lines)


def test_malformed_stats_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StatsError, match="no such file"):
        read_run(tmp_path / "none")
    (tmp_path / "x_stats.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(StatsError, match="not a Locust stats file"):
        read_run(tmp_path / "x")
    shutil.copy(DATA / "failing_stats.csv", tmp_path / "y_stats.csv")
    (tmp_path / "y_tokens.json").write_text("{}", encoding="utf-8")
    with pytest.raises(StatsError, match="not a token-count file"):
        read_run(tmp_path / "y")
    text = (DATA / "failing_stats.csv").read_text(encoding="utf-8").replace("285,55", "many,55", 1)
    (tmp_path / "z_stats.csv").write_text(text, encoding="utf-8")
    with pytest.raises(StatsError, match="'Request Count' has 'many'"):
        read_run(tmp_path / "z")
