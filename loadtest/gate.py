"""The gate: a run's stats against a scenario's targets -> one check per target (target, limit, measured, pass).

Rules, all computed exactly from Locust's per-entry stats:
- ``pNN_ms``: every request entry must meet it; the slowest entry is the measured value.
- ``ttfe_pNN_ms``: the same over the streaming time-to-first-event entries.
- ``max_error_rate``: failed / all requests, over every request entry.
- ``min_rps``: requests per second, summed over the request entries.
- ``min_tokens_per_s``: translated (output) tokens per second counted by the locustfile.
A run without a single successful request always fails, whatever the targets say.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from loadtest.stats import Entry, RunStats
from loadtest.targets import Targets

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    """One target evaluated: ``measured`` is None when the run has no data for it (which fails)."""

    scenario: str
    key: str
    label: str
    comparison: Literal["<=", ">="]
    limit: float
    measured: float | None
    unit: str
    passed: bool
    detail: str = ""

    @property
    def target(self) -> str:
        limit = f"{self.limit * 100:g} %" if self.unit == "%" else f"{self.limit:g} {self.unit}".rstrip()
        return f"{self.label} {self.comparison} {limit}"

    @property
    def measured_text(self) -> str:
        return "no data" if self.measured is None else _format(self.measured, self.unit)


def _format(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.2f} %"
    if unit == "":
        return f"{value:g}"
    if unit == "ms":  # whole milliseconds: Locust's percentiles are rounded (to 10 ms from 100 ms, 100 ms from 1 s)
        return f"{value:.0f} ms"
    return f"{value:.1f} {unit}" if value < 1000 else f"{value:.0f} {unit}"


def _check(scenario: str, key: str, label: str, comparison: Literal["<=", ">="], limit: float,
           measured: float | None, unit: str, detail: str = "") -> Check:
    if measured is None:
        passed = False
    elif comparison == "<=":
        passed = measured <= limit
    else:
        passed = measured >= limit
    check = Check(scenario, key, label, comparison, limit, measured, unit, passed, detail)
    if not passed:
        logger.warning("%s: %s missed: measured %s%s", scenario, check.target, check.measured_text,
                       f" ({detail})" if detail else "")
    return check


def _worst(entries: list[Entry], percentile: str) -> tuple[float | None, str]:
    """The highest value of this percentile over the entries, and which entry it is (when there are several)."""
    measured = [(v, e.label) for e in entries if e.requests and (v := e.percentile(percentile)) is not None]
    if not measured:
        return None, ""
    worst, label = max(measured)
    return worst, label if len(measured) > 1 else ""


def evaluate(scenario: str, targets: Targets, run: RunStats) -> list[Check]:
    """Evaluate every target that is set (and the implicit 'at least one successful request').

    Arguments:
        scenario: the scenario's name, carried into each check.
        targets: what to meet.
        run: the stats Locust wrote.

    Returns:
        One check per target, in a fixed order: successes, latency, time to first event, errors, throughput.
    """
    requests = run.request_entries
    total = sum(e.requests for e in requests)
    failed = sum(e.failures for e in requests)
    checks = [_check(scenario, "successful_requests", "successful requests", ">=", 1, float(total - failed), "")]
    for key, p in (("p50_ms", "50%"), ("p95_ms", "95%"), ("p99_ms", "99%")):
        limit = getattr(targets, key)
        if limit is not None:
            measured, where = _worst(requests, p)
            checks.append(_check(scenario, key, f"p{p[:-1]} latency", "<=", limit, measured, "ms", where))
    for key, p in (("ttfe_p50_ms", "50%"), ("ttfe_p95_ms", "95%"), ("ttfe_p99_ms", "99%")):
        limit = getattr(targets, key)
        if limit is not None:
            measured, where = _worst(run.first_event_entries, p)
            checks.append(_check(scenario, key, f"p{p[:-1]} time to first event", "<=", limit, measured, "ms", where))
    checks.append(_check(scenario, "max_error_rate", "error rate", "<=", targets.max_error_rate,
                         failed / total if total else None, "%", f"{failed} of {total} requests failed"))
    if targets.min_rps is not None:
        checks.append(_check(scenario, "min_rps", "requests/s", ">=", targets.min_rps,
                             sum(e.rps for e in requests) if total else None, "req/s"))
    if targets.min_tokens_per_s is not None:
        tokens = run.tokens
        checks.append(_check(scenario, "min_tokens_per_s", "translated tokens/s", ">=", targets.min_tokens_per_s,
                             tokens.output_tokens_per_s if tokens is not None and tokens.output_tokens else None,
                             "tok/s"))
    return checks


def passed(checks: list[Check]) -> bool:
    """True when every check passed (and there is at least one)."""
    return bool(checks) and all(c.passed for c in checks)


def format_table(checks: list[Check]) -> str:
    """A plain-text table: scenario, target, measured, result."""
    rows = [("scenario", "target", "measured", "result")]
    rows += [(c.scenario, c.target, c.measured_text, "pass" if c.passed else "FAIL") for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
