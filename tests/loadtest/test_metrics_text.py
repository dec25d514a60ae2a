"""loadtest/metrics_text.py, the one reader of a server's /metrics: a server that does not answer, or answers with
something other than Prometheus' text format, is one ``MetricsUnavailable`` line; samples sum over label sets."""

from __future__ import annotations

import pytest

from loadtest.metrics_text import MetricsUnavailable, fetch_metrics, parse_families, read_metrics, summed
from loadtest.server import free_port

TEXT = "\n".join([
    "# TYPE mtgate_queue_depth gauge",
    'mtgate_queue_depth{model="a"} 3.0',
    'mtgate_queue_depth{model="b"} 4.0',
    "# TYPE mtgate_batch_size histogram",
    'mtgate_batch_size_bucket{model="a",le="+Inf"} 2.0',
    'mtgate_batch_size_count{model="a"} 2.0',
    'mtgate_batch_size_sum{model="a"} 7.0',
    "",
])


def test_samples_sum_over_label_sets() -> None:
    values = summed(parse_families(TEXT))
    assert values == {"mtgate_queue_depth": 7.0, "mtgate_batch_size_bucket": 2.0, "mtgate_batch_size_count": 2.0,
                      "mtgate_batch_size_sum": 7.0}


def test_not_the_text_format_is_one_line() -> None:
    with pytest.raises(MetricsUnavailable, match="^/metrics is not in Prometheus' text format") as info:
        parse_families("<html>not metrics</html>\n")
    assert "\n" not in str(info.value)


def test_no_answer_is_one_line() -> None:
    host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for read in (fetch_metrics, read_metrics):
        with pytest.raises(MetricsUnavailable, match=f"^{host}/metrics did not answer") as info:
            read(host, 2)
        assert "\n" not in str(info.value)
