"""A server's ``/metrics``, fetched and parsed (Prometheus' text exposition format): the one reader of it that the
load test's scraper (``loadtest.scrape``), the served benchmarks (``benchmarks.served_batching``,
``benchmarks.served_offline``) and the tests share. What the figures mean is each caller's.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class MetricsUnavailable(Exception):
    """``/metrics`` did not answer, or not in Prometheus' text format (the message says which)."""


def fetch_metrics(host: str, timeout_s: float) -> str:
    """The text of ``{host}/metrics``.

    Raises:
        MetricsUnavailable: no answer (connection refused, an HTTP error status, a timeout).
    """
    try:
        with urllib.request.urlopen(f"{host}/metrics", timeout=timeout_s) as resp:
            return str(resp.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise MetricsUnavailable(f"{host}/metrics did not answer ({e})") from None


def parse_families(text: str) -> list[Metric]:
    """The metric families of a ``/metrics`` text.

    Raises:
        MetricsUnavailable: not Prometheus' text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except ValueError as e:
        raise MetricsUnavailable(f"/metrics is not in Prometheus' text format ({e})") from None


def read_metrics(host: str, timeout_s: float) -> list[Metric]:
    """``{host}/metrics`` now, as metric families (raises :class:`MetricsUnavailable`)."""
    return parse_families(fetch_metrics(host, timeout_s))


def summed(families: Iterable[Metric]) -> dict[str, float]:
    """Each sample name's value summed over its label sets (``mtgate_queue_depth`` over the models, a histogram's
    ``_sum`` and ``_count``...)."""
    values: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
