"""benchmarks/mixed_traffic.py (``served_batching --workload mixed``): the seeded mix and Poisson schedule, the
per-class summary from made-up outcomes, the hold rule and issue 38's acceptance check, usage errors, and one short
run of both modes against real servers of the tiny package (real SSE streams, open loop)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from benchmarks import mixed_report, mixed_traffic, served_batching
from benchmarks.mixed_load import Mix, Outcome, percentile, schedule, send_lag_ms, summarize
from loadtest.corpus import read_lines

CORPUS = Path(__file__).resolve().parents[1] / "data" / "multi30k" / "test_2016_flickr.en.gz"


def test_the_schedule_is_seeded_poisson_with_the_mix_asked_for() -> None:
    corpus = read_lines(CORPUS)
    planned = schedule(corpus, 10.0, 2000.0, Mix(), seed=7)
    assert planned == schedule(corpus, 10.0, 2000.0, Mix(), seed=7)  # the same seed, the same requests
    assert planned != schedule(corpus, 10.0, 2000.0, Mix(), seed=8)
    assert planned[:50] != schedule(corpus, 12.0, 2000.0, Mix(), seed=7)[:50]  # each rate its own draw
    times = [p.at_s for p in planned]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 2000.0
    assert abs(len(planned) - 20_000) < 4 * 20_000 ** 0.5  # Poisson: mean rate x duration, sd its square root
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.1, rel=0.05)  # exponential: sd = mean
    long = [p for p in planned if p.kind == "long"]
    assert len(long) / len(planned) == pytest.approx(0.25, abs=0.015)
    assert {p.sentences for p in long} == {4, 5, 6, 7, 8}
    assert {p.sentences for p in planned if p.kind == "short"} == {1}
    lines = [s.strip() for s in corpus]
    paragraphs = {(n, " ".join(lines[i:i + n])) for n in range(4, 9) for i in range(len(lines) - n + 1)}
    assert all((p.sentences, p.text) in paragraphs for p in long)  # consecutive sentences, one text, joined by spaces
    assert all(p.text in {s.strip() for s in corpus} for p in planned[:200] if p.kind == "short")
    other = schedule(corpus, 10.0, 200.0, Mix(long_fraction=0.5, min_sentences=2, max_sentences=3), seed=1)
    assert len([p for p in other if p.kind == "long"]) / len(other) == pytest.approx(0.5, abs=0.06)
    assert {p.sentences for p in other if p.kind == "long"} == {2, 3}
    assert {p.kind for p in schedule(corpus, 10.0, 50.0, Mix(long_fraction=0.0), seed=1)} == {"short"}


def test_the_summary_per_class_from_made_up_outcomes() -> None:
    outcomes = [Outcome("short", "200", latency_s=0.1 * (i + 1), first_text_s=0.01 * (i + 1), lag_s=0.001 * i,
                        input_tokens=10, output_tokens=12) for i in range(10)]
    outcomes += [Outcome("short", "503"), Outcome("short", "timeout")]
    outcomes += [Outcome("long", "200", latency_s=2.0, first_text_s=None, input_tokens=90, output_tokens=80,
                         truncated=True),
                 Outcome("long", "200", latency_s=4.0, first_text_s=0.5, input_tokens=110, output_tokens=100)]
    summary = summarize(outcomes, elapsed_s=5.0)
    short, long = summary["short"], summary["long"]
    assert (short.requests, short.ok, short.achieved_rps) == (12, 10, 2.0)
    assert short.latency_ms == {"p50": 500.0, "p95": 1000.0, "p99": 1000.0}
    assert short.first_text_ms == {"p50": 50.0, "p95": 100.0, "p99": 100.0}
    assert short.errors == {"503": 1, "timeout": 1} and short.without_text == 0 and short.truncated == 0
    assert (short.input_tokens_mean, short.output_tokens_mean) == (10.0, 12.0)
    assert (long.requests, long.ok, long.without_text, long.truncated, long.errors) == (2, 2, 1, 1, {})
    assert long.latency_ms == {"p50": 2000.0, "p95": 4000.0, "p99": 4000.0}
    assert long.first_text_ms["p95"] == 500.0 and long.input_tokens_mean == 100.0
    assert send_lag_ms(outcomes)["max"] == 9.0
    empty = summarize([], elapsed_s=1.0)["long"]
    assert empty.requests == 0 and empty.latency_ms == {"p50": None, "p95": None, "p99": None}
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([], 95) is None


def _run(rate: float, short_p95: float, long_p95: float = 2000.0, errors: dict[str, int] | None = None,
         holds: bool = True) -> dict[str, Any]:
    def cls(p95: float, errs: dict[str, int]) -> dict[str, Any]:
        return {"requests": 10, "ok": 10, "achieved_rps": rate, "latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95},
                "first_text_ms": {"p50": 10.0, "p95": 20.0, "p99": 30.0}, "without_text": 0, "errors": errs,
                "truncated": 0, "input_tokens_mean": 14.0, "output_tokens_mean": 13.0}
    return {"rate": rate, "planned": 20, "elapsed_s": 20.5, "send_lag_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
            "classes": {"short": cls(short_p95, errors or {}), "long": cls(long_p95, {})}, "holds": holds,
            "reasons": [] if holds else ["short p95 high"]}


def test_the_hold_rule_and_the_acceptance_check() -> None:
    limits = {"short": 1000.0, "long": 5000.0}
    assert mixed_traffic.judge(_run(2, 999)["classes"], limits) == []
    assert mixed_traffic.judge(_run(2, 1000)["classes"], limits) == ["short p95 1000 ms >= 1000 ms"]
    assert mixed_traffic.judge(_run(2, 10, 6000, {"timeout": 2, "503": 1})["classes"], limits) == [
        "long p95 6000 ms >= 5000 ms", "failed: 1 x 503, 2 x timeout"]
    request = {"mode": "request", "highest_rate_held": 2.0,
               "rates": [_run(1, 400), _run(2, 900), _run(4, 3000, holds=False)]}
    step = {"mode": "step", "highest_rate_held": 4.0, "rates": [_run(1, 150), _run(2, 450), _run(4, 700)]}
    check = mixed_report.acceptance([request, step], 1000.0)
    assert check == {"short_p95_ratio_by_rate": {"1": 0.38, "2": 0.5}, "ratios_pass": True,
                     "step_holds_request_rate": True, "passes": True}
    step["rates"][1] = _run(2, 460)
    assert mixed_report.acceptance([request, step], 1000.0)["passes"] is False
    step["highest_rate_held"] = 1.0
    assert mixed_report.acceptance([request, step], 1000.0)["step_holds_request_rate"] is False
    assert mixed_report.acceptance([request], 1000.0) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--long-fraction", "1.5"], "--long-fraction must be between 0 and 1"),
    (["--paragraph", "8-4"], "expected 1 <= MIN <= MAX"),
    (["--paragraph", "x"], "expected MIN-MAX sentences"),
    (["--short-p95-ms", "0"], "--short-p95-ms must be a positive number"),
    (["--rates", "4,2"], "the rates must increase"),
    (["--modes", "request,batch"], "unknown mode batch"),
    (["--corpus", "/nonexistent.txt"], "/nonexistent.txt"),
])
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert served_batching.main(["--workload", "mixed", *argv, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("served_batching: error: ") and message in err
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_both_modes_stream_an_open_loop_mix_from_real_servers(tiny_onnx_package: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workload", "mixed", "-m", str(tiny_onnx_package), "--corpus", str(CORPUS), "--precision", "fp32",
            "--rates", "4", "--duration", "2s", "--long-fraction", "0.5", "--seed", "3", "--short-p95-ms", "60000",
            "--long-p95-ms", "60000", "--name", "mixed", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "w")]
    assert served_batching.main(argv) == 0
    data = json.loads((tmp_path / "mixed.json").read_text(encoding="utf-8"))
    assert data["complete"] and data["command"].startswith("python -m benchmarks.served_batching --workload mixed")
    assert data["load"]["route"] == "/v1/translate/stream" and data["load"]["mix"]["long_fraction"] == 0.5
    planned = schedule(read_lines(CORPUS), 4.0, 2.0, Mix(long_fraction=0.5), seed=3)
    assert [m["mode"] for m in data["modes"]] == ["request", "step"]
    for mode in data["modes"]:
        assert mode["error"] is None and mode["reported_batching"] == mode["mode"]
        [run] = mode["rates"]
        assert run["planned"] == len(planned) and run["holds"] and mode["highest_rate_held"] == 4
        for kind in ("short", "long"):
            c = run["classes"][kind]
            assert c["requests"] == c["ok"] == sum(1 for p in planned if p.kind == kind) and c["errors"] == {}
            if c["ok"]:
                assert 0 < c["first_text_ms"]["p50"] <= c["latency_ms"]["p50"] <= c["latency_ms"]["p95"]
                assert c["without_text"] == 0 and c["input_tokens_mean"] > 1
    assert data["acceptance"]["short_p95_ratio_by_rate"].keys() == {"4"}
    markdown = (tmp_path / "mixed.md").read_text(encoding="utf-8")
    assert "## Per rate, modes side by side" in markdown and "| step / request short p95 |" in markdown
    assert markdown in capsys.readouterr().out
