"""loadtest.stats.merge_runs: runs side by side against replicas merge their Locust response-time histograms, so the
merged percentiles are those of all their requests (not the worst replica's), computed as Locust computes its own."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from loadtest.stats import (
    HISTOGRAMS,
    PERCENTILE_FRACTIONS,
    PERCENTILES,
    Entry,
    Histogram,
    RunStats,
    merge_runs,
    read_run,
)

DATA = Path(__file__).with_name("data")


def _entry(counts: dict[int, int] | None, requests: int, p95: float) -> Entry:
    times = sorted(counts) if counts else [0]
    histogram = Histogram(counts, requests, min(times), max(times)) if counts is not None else None
    return Entry(type="POST", name="/v1/translate", requests=requests, failures=0, median_ms=float(times[0]),
                 average_ms=float(times[0]), min_ms=float(min(times)), max_ms=float(max(times)), average_size=10.0,
                 rps=1.0, failures_per_s=0.0, percentiles=dict.fromkeys(PERCENTILES, p95) | {"95%": p95},
                 histogram=histogram)


def _run(entry: Entry) -> RunStats:
    return RunStats(entries=[entry], aggregated=entry, history=[], failures=[], tokens=None)


def test_replicas_merge_into_the_percentiles_of_all_their_requests() -> None:
    fast = _entry({10: 100}, 100, 10.0)  # one replica: 100 requests of 10 ms
    slow = _entry({1000: 5}, 5, 1000.0)  # the other: 5 requests of a second
    [merged] = merge_runs([_run(fast), _run(slow)]).entries
    together = Histogram({10: 100, 1000: 5}, 105, 10, 1000)
    assert merged.requests == 105 and merged.histogram == together
    # 5 of 105 requests (4.8 %) took a second: p95 is 10 ms, p99 a second (the worst replica's p95 said a second)
    assert merged.percentile("95%") == 10.0 and merged.percentile("99%") == 1000.0 and merged.median_ms == 10.0
    assert merged.percentiles == {p: float(together.percentile(f)) for p, f in PERCENTILE_FRACTIONS.items()}


def test_runs_without_histograms_keep_the_worst_replica_s_percentiles() -> None:
    [merged] = merge_runs([_run(_entry(None, 100, 10.0)), _run(_entry(None, 5, 1000.0))]).entries
    assert merged.percentile("95%") == 1000.0 and merged.histogram is None


def test_the_histograms_file_is_read_with_the_run(tmp_path: Path) -> None:
    for suffix in ("_stats.csv", "_stats_history.csv", "_failures.csv"):
        (tmp_path / f"run{suffix}").write_bytes((DATA / f"mixed{suffix}").read_bytes())
    run = read_run(tmp_path / "run")
    assert run.aggregated.histogram is None and all(e.histogram is None for e in run.entries)
    locust = [{"method": e.type, "name": e.name, "num_requests": e.requests, "num_none_requests": 1,
               "min_response_time": 3, "max_response_time": 41, "response_times": {"3": 1, "41": e.requests - 2}}
              for e in [*run.entries, run.aggregated]]
    (tmp_path / f"run{HISTOGRAMS}").write_text(json.dumps(locust), encoding="utf-8")
    run = read_run(tmp_path / "run")
    for e in [*run.entries, run.aggregated]:
        assert e.histogram == Histogram({3: 1, 41: e.requests - 2}, e.requests - 1, 3.0, 41.0), e.label


def test_percentiles_are_locust_s_own() -> None:
    """Histogram.percentile and median against locust.stats on random histograms (in a subprocess: importing
    locust monkey-patches the process with gevent)."""
    rng = random.Random(7)
    cases = []
    for _ in range(200):
        counts = {rng.choice([1, 2, 5, 9, 10, 11, 50, 99, 150, 990, 1500, 59000]): rng.randint(1, 40)
                  for _ in range(rng.randint(1, 8))}
        requests = sum(counts.values())
        cases.append({"counts": counts, "requests": requests, "min": min(counts) - rng.choice([0, 1]),
                      "max": max(counts) + rng.choice([0, 3])})
    script = """
import json, sys
from locust.stats import PERCENTILES_TO_REPORT, RequestStats, StatsEntry, calculate_response_time_percentile
out = []
for case in json.load(sys.stdin):
    counts = {int(k): v for k, v in case["counts"].items()}
    entry = StatsEntry(RequestStats(), "x", "GET")
    entry.response_times.update(counts)
    entry.num_requests, entry.min_response_time, entry.max_response_time = case["requests"], case["min"], case["max"]
    out.append([[calculate_response_time_percentile(counts, case["requests"], p) for p in PERCENTILES_TO_REPORT],
                entry.median_response_time])
json.dump(out, sys.stdout)
"""
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=120, check=True)
    assert json.loads(subprocess.run([sys.executable, "-c", "import json; from locust.stats import PERCENTILES_TO_REPORT "
                                      "as p; print(json.dumps(p))"], capture_output=True, text=True, timeout=120,
                                     check=True).stdout) == list(PERCENTILE_FRACTIONS.values())
    for case, (percentiles, median) in zip(cases, json.loads(proc.stdout), strict=True):
        histogram = Histogram({int(k): v for k, v in case["counts"].items()}, case["requests"], case["min"],
                              case["max"])
        assert [histogram.percentile(f) for f in PERCENTILE_FRACTIONS.values()] == percentiles, case
        assert histogram.median() == median, case
