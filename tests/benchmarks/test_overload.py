"""benchmarks/overload: what a phase did, from the clients' records and a server's JSON batch log (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.overload import CheckoutResult, UsageError, parse_args, verdict
from benchmarks.overload_phase import Phase, Sent, batches_logged, summarize


def _line(ts: str, size: int, rids: list[str], infer_ms: float = 500.0) -> str:
    message = (f"batch model=demo batch_size={size} padded_tokens=99 queue_ms=1.0 infer_ms={infer_ms} ok=True "
               f"request_ids={','.join(rids)}")
    return json.dumps({"ts": ts, "level": "INFO", "logger": "serving.metrics", "message": message})


def test_late_sentences_are_counted_from_the_batch_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        "not json",
        json.dumps({"ts": "2026-12-06T10:00:00.000Z", "message": "settings: ..."}),
        _line("2026-12-06T10:00:05.000Z", 16, ["a", "b"]),  # both in time
        _line("2026-12-06T10:00:40.000Z", 16, ["c", "d"]),  # both late: the whole batch
        _line("2026-12-06T10:00:41.500Z", 16, ["e", "c"]),  # c late, e in time: at least 1
    ]) + "\n", encoding="utf-8")
    batches = batches_logged(log, 0)
    assert [(size, rids) for _, size, rids, _ in batches] == [(16, ["a", "b"]), (16, ["c", "d"]), (16, ["e", "c"])]
    start = batches[0][0] - 5.0  # 10:00:00
    sent = [Sent("a", start, 5.0, "200", None), Sent("b", start, 5.0, "200", None),
            Sent("c", start, 41.0, "504", None), Sent("d", start + 9.9, 30.0, "504", None),
            Sent("e", start + 12.0, 29.5, "200", None), Sent("f", start, 0.01, "503", 7.0)]
    phase = summarize("overload", 1, 100, 30.0, sent, 8, 30.0, batches, None)
    assert phase.statuses == {"200": 3, "504": 2, "503": 1}
    assert phase.late_sentences_log == 16 + 1
    assert phase.computed_sentences == 48 and phase.useful_sentences == 24 and phase.engine_s == pytest.approx(1.5)
    assert phase.ok_rps == pytest.approx(0.1) and phase.retry_after_median_s == 7.0


def test_the_verdict_is_the_median_ratio_of_the_rounds_and_no_late_sentence() -> None:
    result = CheckoutResult("new", ".")
    for round_, (reference, overload) in enumerate([(2.0, 1.8), (2.0, 1.0), (1.0, 0.9)], start=1):
        result.phases += [Phase("reference", round_, 8, 30.0, ok_rps=reference),
                          Phase("overload", round_, 100, 30.0, ok_rps=overload, late_sentences_metric=0.0)]
    assert verdict(result).startswith("yes: 90% of the reference's rate (rounds: 90%, 50%, 90%), 0 late")
    result.phases[-1].late_sentences_log = 3
    assert verdict(result).startswith("no: ")


def test_a_checkout_must_be_a_checkout() -> None:
    with pytest.raises(UsageError, match="NAME=PATH"):
        parse_args(["--checkout", "main=/nonexistent"])


def test_the_refusal_cost_report_and_its_options() -> None:
    from benchmarks import overload_refusals

    with pytest.raises(UsageError, match="--queue"):
        overload_refusals.parse_args(["--queue", "4"])
    with pytest.raises(UsageError, match="--checkout"):
        overload_refusals.parse_args(["--checkout", "nowhere=/nonexistent"])
    data = {"name": "t", "command": "c", "started": "s", "finished": None, "complete": False,
            "machine": {"cpu_count": 2, "usable_cpus": 2, "cpu_model": None, "load_average_start": [1.0]},
            "model": "m", "queue": 16, "clients": 32, "sentences": 8, "duration_s": 15.0,
            "checkouts": {"new": {"statuses": {"503": 600, "200": 2}, "refusals_per_s": 40.0,
                                  "loop_cpu_ms_per_answer": 0.47, "client_cpu_ms_per_answer": 3.19},
                          "old": {"error": "server of x not ready"}}}
    text = overload_refusals.to_markdown(data)
    assert "| new | 200: 2, 503: 600 | 40.0 | 0.47 | 3.19 |" in text and "| old | error: server of x" in text
    assert "(**incomplete run**)" in text
