"""benchmarks/served_offline.py: bad arguments are one line and exit 2; the /metrics parsing; one very short run end to
end against the bundled demo package (the engine in-process, then real ``mtgate serve`` under real headless Locust)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import BenchmarkError
from benchmarks.served_offline import ModeResult, main, parse_metrics, server_threads
from serving.server.settings import demo_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "message"), [
    (["--modes", "request,batch"], "unknown mode batch (modes: request, step)"),
    (["--duration", "0s"], "duration must be more than 0 s"),
    (["--warmup", "soon"], "--warmup: duration 'soon' is not a number of seconds"),
    (["--users", "0"], "--users must be at least 1"),
    (["--passes", "0"], "--passes must be at least 1"),
    (["--sentences", "-1"], "--sentences must be 0 (all)"),
    (["--server-env", "MTGATE_MAX_BATCH_SIZE=8"], "set by this script (use --batch-size"),
    (["--server-env", "MTGATE_BATCHING=step"], "set by this script"),
    (["-m", "/nonexistent/package"], "not a directory"),
    (["--name", "bad name"], "--name 'bad name': use letters, digits"),
])
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main([*argv, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert message in err
    assert not list(tmp_path.iterdir())


def test_parse_metrics_sums_label_sets_and_splits_request_statuses() -> None:
    text = "\n".join([
        "# TYPE mtgate_output_tokens counter",
        'mtgate_output_tokens_total{model="a"} 100.0',
        'mtgate_output_tokens_total{model="b"} 20.0',
        "# TYPE mtgate_sentences counter",
        'mtgate_sentences_total{model="a"} 7.0',
        "# TYPE mtgate_requests counter",
        'mtgate_requests_total{route="/v1/translate",method="POST",status="200"} 6.0',
        'mtgate_requests_total{route="/v1/translate",method="POST",status="503"} 2.0',
        'mtgate_requests_total{route="/metrics",method="GET",status="200"} 9.0',
        "# TYPE mtgate_queue_depth gauge",
        'mtgate_queue_depth{model="a"} 3.0',
        "# TYPE mtgate_inflight_requests gauge",
        "mtgate_inflight_requests 5.0",
        "# TYPE mtgate_batch_size histogram",
        'mtgate_batch_size_bucket{model="a",le="+Inf"} 2.0',
        'mtgate_batch_size_count{model="a"} 2.0',
        'mtgate_batch_size_sum{model="a"} 7.0',
        "",
    ])
    scrape = parse_metrics(text, 12.5)
    assert (scrape.time, scrape.output_tokens, scrape.sentences) == (12.5, 120.0, 7.0)
    assert (scrape.requests_ok, scrape.requests_failed, scrape.queue_depth, scrape.inflight) == (6.0, 2.0, 3.0, 5.0)
    assert (scrape.batch_sum, scrape.batch_count, scrape.step_count) == (7.0, 2.0, 0.0)
    # before its first translation the server declares the counter without a sample: zero, not an error
    assert parse_metrics("# TYPE mtgate_output_tokens counter\n", 0.0).output_tokens == 0.0
    with pytest.raises(BenchmarkError, match="no mtgate_output_tokens_total"):
        parse_metrics("# TYPE other counter\nother_total 1.0\n", 0.0)


@pytest.mark.parametrize(("fill", "queues", "saturated"), [
    ((32.0, None), [3, 1, 2], True),
    ((31.0, None), [3, 0, 2, 5, 4, 6, 7, 8, 9, 1], True),  # 97% full, queued at 90% of the scrapes
    ((30.0, None), [3, 1, 2], False),  # batches under 95% full: the engine waited for work
    ((32.0, None), [3, 0, 2], False),  # nothing queued at a third of the scrapes
    ((1.0, 32.0), [3, 1, 2], True),  # step batching: sentences in flight per step count, not chunk sizes
    ((None, None), [], None),  # not measured
])
def test_saturation_rule(fill: tuple[float | None, float | None], queues: list[float], saturated: bool | None) -> None:
    mode = ModeResult("request", batch_size=32, mean_batch_size=fill[0], mean_step_sentences=fill[1],
                      queue_depths=queues)
    assert mode.saturated is saturated


@pytest.mark.timeout(60)
def test_server_threads_are_deltas_over_the_window_busiest_first() -> None:
    before = {100: (1.0, 10, 2), 101: (5.0, 0, 40), 102: (0.0, 0, 0), 103: (2.0, 1, 1)}
    after = {100: (1.5, 60, 4), 101: (9.0, 0, 240), 102: (0.02, 5, 0), 104: (3.0, 0, 0)}  # 103 ended, 104 is new
    threads = server_threads(100, before, after, 5.0)
    assert [(t.tid, t.role) for t in threads] == [(101, "thread"), (100, "event loop")]  # 102: under 1% of a core
    assert threads[0].cores == pytest.approx(0.8) and threads[0].involuntary_per_s == pytest.approx(40)
    assert threads[1].cores == pytest.approx(0.1) and threads[1].voluntary_per_s == pytest.approx(10)


def test_one_short_run_end_to_end(tmp_path: Path) -> None:
    package = demo_model()
    if package is None:
        pytest.skip("the bundled demo model is not built (make demo)")
    command = [sys.executable, "-m", "benchmarks.served_offline", "--modes", "request", "--sentences", "16",
               "--batch-size", "8", "--users", "12", "--warmup", "1s", "--duration", "3s", "--name", "e2e",
               "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=55, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "e2e.json").read_text(encoding="utf-8"))
    assert data["complete"] and data["model"]["package"] == str(package) and data["model"]["name"] == "demo-en-de"
    assert data["engine"] == {"runtime": "onnxruntime", "precision": "int8", "threads": 2, "beam_size": None,
                              "batch_size": 8}
    assert data["machine"]["cpu_model"] is not None and len(data["machine"]["load_average_end"]) == 3

    offline = data["offline"]
    assert offline["error"] is None and offline["sentences"] == 16 and offline["batches"] == 2
    assert offline["beam_size"] == 4  # the package's, as the server resolves it
    assert [p["slot"] for p in offline["passes"]] == ["before request", "after request"]
    assert len({p["output_tokens"] for p in offline["passes"]}) == 1  # the same translations both times
    assert offline["tokens_per_s"] > 0 and offline["sentences_per_s"] > 0 and offline["seconds"] > 0
    rates = [p["tokens_per_s"] for p in offline["passes"]]
    assert offline["spread"] == pytest.approx((max(rates) - min(rates)) / offline["tokens_per_s"])

    served = data["served"]
    assert served["server_env"] == {"MTGATE_MAX_BATCH_SIZE": "8"} and served["users"] == 12
    [mode] = served["modes"]
    assert mode["mode"] == "request" and mode["error"] is None and mode["reported_batching"] == "request"
    assert 2.9 < mode["window_s"] < 3.5 and mode["failed_responses"] == 0 and mode["locust_failures"] == 0
    # one sentence per request: the server's sentence and request counts agree
    assert mode["sentences"] == mode["requests"] > 0 and mode["output_tokens"] > 0
    assert mode["tokens_per_s"] == pytest.approx(mode["output_tokens"] / mode["window_s"])
    assert len(mode["queue_depths"]) == 4 and mode["queued_share"] == sum(q > 0 for q in mode["queue_depths"]) / 4
    assert mode["fill"] == pytest.approx(mode["mean_batch_size"] / 8) and mode["mean_step_sentences"] is None
    assert mode["saturated"] is (mode["fill"] >= 0.95 and mode["queued_share"] >= 0.9)
    assert mode["locust_cpu_s"] > 0 and mode["server_cpu_s"] > 0 and 0 < mode["p50_ms"] <= mode["p95_ms"]
    if sys.platform.startswith("linux"):  # the server's threads, from /proc: the event loop served every request
        roles = [t["role"] for t in mode["server_threads"]]
        assert roles.count("event loop") == 1 and all(t["cores"] >= 0.01 for t in mode["server_threads"])
        assert sum(t["cores"] for t in mode["server_threads"]) <= mode["server_cpu_s"] / mode["window_s"] + 0.1

    [row] = data["summary"]
    assert row["mode"] == "request" and row["offline_tokens_per_s"] == offline["tokens_per_s"]
    assert row["ratio"] == pytest.approx(mode["tokens_per_s"] / offline["tokens_per_s"])
    markdown = (tmp_path / "e2e.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Served vs offline throughput: e2e") and "## Offline" in markdown
    assert markdown in proc.stdout  # the same report is printed
    assert ("**The offline passes differ by" in markdown) is (offline["spread"] > 0.1)
    assert (tmp_path / "work" / "request" / "locust_stats.csv").is_file()
