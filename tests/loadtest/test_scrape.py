"""scrape.py: mtgate's /metrics text -> samples -> per-interval queue wait and batch size, against hand computation."""

from __future__ import annotations

import pytest

from loadtest.scrape import Histogram, ServerMetrics, parse

EXPOSITION = """\
# HELP mtgate_queue_wait_seconds time a sentence waits in the batch queue before its batch runs
# TYPE mtgate_queue_wait_seconds histogram
mtgate_queue_wait_seconds_bucket{{le="0.001",model="a"}} {q1}
mtgate_queue_wait_seconds_bucket{{le="0.01",model="a"}} {q2}
mtgate_queue_wait_seconds_bucket{{le="+Inf",model="a"}} {q3}
mtgate_queue_wait_seconds_sum{{model="a"}} {qsum}
mtgate_queue_wait_seconds_count{{model="a"}} {q3}
# HELP mtgate_batch_size sentences per engine batch
# TYPE mtgate_batch_size histogram
mtgate_batch_size_bucket{{le="4.0",model="a"}} {b1}
mtgate_batch_size_bucket{{le="+Inf",model="a"}} {b2}
mtgate_batch_size_sum{{model="a"}} {bsum}
mtgate_batch_size_count{{model="a"}} {b2}
# HELP mtgate_queue_depth sentences waiting in the batch queue
# TYPE mtgate_queue_depth gauge
mtgate_queue_depth{{model="a"}} {depth}
"""


def _sample(t: float, **values: float) -> str:
    return EXPOSITION.format(**values)


def test_intervals_are_differences_of_cumulative_values() -> None:
    first = parse(_sample(0, q1=0, q2=0, q3=0, qsum=0, b1=0, b2=0, bsum=0, depth=0), 100.0)
    # 10 sentences waited: 4 under 1 ms, 6 between 1 and 10 ms, 0.03 s in all; 3 batches of 2, 3 and 5 sentences
    second = parse(_sample(1, q1=4, q2=10, q3=10, qsum=0.03, b1=2, b2=3, bsum=10, depth=7), 101.0)
    assert first is not None and second is not None
    [interval] = ServerMetrics([first, second]).intervals()
    assert interval.time == 101.0 and interval.queue_depth == 7
    assert interval.queue_wait_mean_ms == pytest.approx(3.0)  # 0.03 s / 10
    # p95: rank 9.5 of 10 falls in (0.001, 0.01] holding observations 5..10: 0.001 + 0.009 * (9.5 - 4) / 6
    assert interval.queue_wait_p95_ms == pytest.approx((0.001 + 0.009 * 5.5 / 6) * 1000)
    assert interval.batch_size_mean == pytest.approx(10 / 3)
    assert interval.step_sentences_mean is None  # request-level batching: no step metric
    assert ServerMetrics([first, second]).whole_run() == interval
    restored = ServerMetrics.from_json(ServerMetrics([first, second]).to_json())
    assert restored.intervals() == [interval]


def test_quantile_edges_and_other_servers() -> None:
    assert Histogram({1.0: 0, float("inf"): 0}, 0, 0).quantile(0.5) is None
    assert Histogram({1.0: 2, float("inf"): 4}, 10, 4).quantile(0.95) == 1.0  # beyond the last finite bound
    assert parse("# TYPE nv_inference_count counter\nnv_inference_count 3\n", 0.0) is None  # not mtgate
