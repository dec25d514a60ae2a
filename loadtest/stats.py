"""Read what one headless Locust run wrote: ``PREFIX_stats.csv``, ``PREFIX_stats_history.csv``,
``PREFIX_failures.csv`` (Locust's ``--csv PREFIX --csv-full-history``), ``PREFIX_tokens.json`` (our locustfile's
``--tokens-file``) and ``PREFIX_response_times.json`` (our locustfile: each entry's response-time histogram, as
Locust keeps it). Times are milliseconds, as Locust writes them.

Runs made side by side against replicas of one service merge into one (:func:`merge_runs`): their histograms add
up, so the merged percentiles are those of all the requests together, computed as Locust computes its own.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

PERCENTILES: tuple[str, ...] = ("50%", "66%", "75%", "80%", "90%", "95%", "98%", "99%", "99.9%", "99.99%", "100%")
PERCENTILE_FRACTIONS = dict(zip(PERCENTILES, (0.50, 0.66, 0.75, 0.80, 0.90, 0.95, 0.98, 0.99, 0.999, 0.9999, 1.0), strict=True))
"""Each column's fraction, as Locust's ``PERCENTILES_TO_REPORT`` spells it (the same float, the same rounding)."""
HISTOGRAMS = "_response_times.json"
"""The suffix of the histograms file (beside ``--csv PREFIX``'s)."""
HISTOGRAM_FIELDS = ("method", "name", "num_requests", "num_none_requests", "min_response_time", "max_response_time",
                    "response_times")
"""What the locustfile keeps of each Locust ``StatsEntry`` (the fields of its ``serialize()`` percentiles need)."""
TTFE = "TTFE"  # request type the locustfile gives time-to-first-event entries
AGGREGATED = "Aggregated"


class StatsError(Exception):
    """Locust's output is missing or not in the expected format (the message names the file)."""


@dataclass(frozen=True)
class Histogram:
    """An entry's response times as Locust keeps them (``StatsEntry.response_times``: each time rounded to two
    significant digits -> how many requests took it); histograms of runs side by side add up exactly.

    Attributes:
        counts: rounded milliseconds -> requests.
        requests: the requests with a response time (Locust's ``num_requests - num_none_requests``).
        min_ms, max_ms: the exact extremes (None: no request).
    """

    counts: dict[int, int]
    requests: int
    min_ms: float | None
    max_ms: float | None

    def percentile(self, fraction: float) -> int:
        """The time ``fraction`` of the requests took at most: Locust's ``calculate_response_time_percentile``."""
        within = int(self.requests * fraction)
        done = 0
        for ms in sorted(self.counts, reverse=True):
            done += self.counts[ms]
            if self.requests - done <= within:
                return ms
        return 0

    def median(self) -> float:
        """Locust's ``median_response_time``: the 50th percentile within the exact extremes (0 without requests)."""
        if not self.counts:
            return 0
        median: float = self.percentile(0.5)
        if self.max_ms is not None and median > self.max_ms:
            return self.max_ms
        return self.min_ms if self.min_ms is not None and median < self.min_ms else median

    @staticmethod
    def merge(histograms: list[Histogram]) -> Histogram:
        counts: dict[int, int] = {}
        for histogram in histograms:
            for ms, n in histogram.counts.items():
                counts[ms] = counts.get(ms, 0) + n
        minimum = [h.min_ms for h in histograms if h.min_ms is not None]
        maximum = [h.max_ms for h in histograms if h.max_ms is not None]
        return Histogram(counts, sum(h.requests for h in histograms), min(minimum) if minimum else None,
                         max(maximum) if maximum else None)


@dataclass(frozen=True)
class Entry:
    """One row of ``_stats.csv``: a request type and name (or the ``Aggregated`` row), with its histogram when the
    run wrote one."""

    type: str
    name: str
    requests: int
    failures: int
    median_ms: float | None
    average_ms: float | None
    min_ms: float | None
    max_ms: float | None
    average_size: float
    rps: float
    failures_per_s: float
    percentiles: dict[str, float | None]
    histogram: Histogram | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        return f"{self.type} {self.name}".strip()

    @property
    def is_first_event(self) -> bool:
        return self.type == TTFE

    def percentile(self, p: str) -> float | None:
        return self.percentiles.get(p)


@dataclass(frozen=True)
class HistoryPoint:
    """One row of ``_stats_history.csv`` (written every second; percentiles over Locust's 10 s window)."""

    timestamp: float
    users: int
    type: str
    name: str
    rps: float
    failures_per_s: float
    percentiles: dict[str, float | None]
    total_requests: int
    total_failures: int


@dataclass(frozen=True)
class Failure:
    """One row of ``_failures.csv``."""

    method: str
    name: str
    error: str
    occurrences: int


@dataclass(frozen=True)
class Tokens:
    """Translated-token counts from the locustfile (``--tokens-file``)."""

    started: float
    stopped: float
    translated: int
    input_tokens: int
    output_tokens: int
    history: list[tuple[float, int]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(self.stopped - self.started, 1e-9)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


@dataclass(frozen=True)
class RunStats:
    """Everything one run measured."""

    entries: list[Entry]
    aggregated: Entry
    history: list[HistoryPoint]
    failures: list[Failure]
    tokens: Tokens | None

    @property
    def request_entries(self) -> list[Entry]:
        """Whole requests (what latency, error-rate and throughput targets are about)."""
        return [e for e in self.entries if not e.is_first_event]

    @property
    def first_event_entries(self) -> list[Entry]:
        """Streaming time-to-first-event entries."""
        return [e for e in self.entries if e.is_first_event]


def _number(value: str, path: Path, column: str) -> float | None:
    if value in ("N/A", ""):
        return None
    try:
        number = float(value)
    except ValueError as e:
        raise StatsError(f"{path}: column {column!r} has {value!r}, not a number") from e
    return number if math.isfinite(number) else None


def _required(value: str, path: Path, column: str) -> float:
    number = _number(value, path, column)
    return 0.0 if number is None else number


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise StatsError(f"{path}: not a Locust stats file (missing columns: {', '.join(missing)})")
            return list(reader)
    except FileNotFoundError as e:
        raise StatsError(f"{path}: no such file (did Locust run?)") from e
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise StatsError(f"{path}: unreadable ({e})") from e


_STATS_COLUMNS = ("Type", "Name", "Request Count", "Failure Count", "Median Response Time", "Average Response Time",
                  "Min Response Time", "Max Response Time", "Average Content Size", "Requests/s", "Failures/s",
                  *PERCENTILES)
_HISTORY_COLUMNS = ("Timestamp", "User Count", "Type", "Name", "Requests/s", "Failures/s", *PERCENTILES,
                    "Total Request Count", "Total Failure Count")


def read_entries(path: Path) -> list[Entry]:
    """All rows of a ``_stats.csv``, the ``Aggregated`` row last."""
    entries = []
    for row in _rows(path, _STATS_COLUMNS):
        lowest = _number(row["Min Response Time"], path, "Min Response Time")
        highest = _number(row["Max Response Time"], path, "Max Response Time")
        entries.append(Entry(
            type=row["Type"],
            name=row["Name"],
            requests=int(_required(row["Request Count"], path, "Request Count")),
            failures=int(_required(row["Failure Count"], path, "Failure Count")),
            median_ms=_number(row["Median Response Time"], path, "Median Response Time"),
            average_ms=_number(row["Average Response Time"], path, "Average Response Time"),
            min_ms=lowest,
            max_ms=highest,
            average_size=_required(row["Average Content Size"], path, "Average Content Size"),
            rps=_required(row["Requests/s"], path, "Requests/s"),
            failures_per_s=_required(row["Failures/s"], path, "Failures/s"),
            percentiles={p: _within(_number(row[p], path, p), lowest, highest) for p in PERCENTILES},
        ))
    return entries


def _within(value: float | None, lowest: float | None, highest: float | None) -> float | None:
    """A percentile within the entry's exact min and max: Locust computes percentiles from rounded response times
    (to 10 ms from 100 ms, to 100 ms from 1 s), so a p99 of 2100 ms could stand beside a max of 2070 ms."""
    if value is None:
        return None
    if highest is not None:
        value = min(value, highest)
    return value if lowest is None else max(value, lowest)


def read_history(path: Path) -> list[HistoryPoint]:
    return [
        HistoryPoint(
            timestamp=_required(row["Timestamp"], path, "Timestamp"),
            users=int(_required(row["User Count"], path, "User Count")),
            type=row["Type"],
            name=row["Name"],
            rps=_required(row["Requests/s"], path, "Requests/s"),
            failures_per_s=_required(row["Failures/s"], path, "Failures/s"),
            percentiles={p: _number(row[p], path, p) for p in PERCENTILES},
            total_requests=int(_required(row["Total Request Count"], path, "Total Request Count")),
            total_failures=int(_required(row["Total Failure Count"], path, "Total Failure Count")),
        )
        for row in _rows(path, _HISTORY_COLUMNS)
    ]


def read_failures(path: Path) -> list[Failure]:
    if not path.exists():
        return []
    return [
        Failure(row["Method"], row["Name"], row["Error"], int(_required(row["Occurrences"], path, "Occurrences")))
        for row in _rows(path, ("Method", "Name", "Error", "Occurrences"))
    ]


def read_tokens(path: Path) -> Tokens | None:
    """The locustfile's token counts, or None when the file is absent (for example, an older run)."""
    if not path.exists():
        return None
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        return Tokens(
            started=float(data["started"]),
            stopped=float(data["stopped"]),
            translated=int(data["translated"]),
            input_tokens=int(data["input_tokens"]),
            output_tokens=int(data["output_tokens"]),
            history=[(float(t), int(n)) for t, n in data.get("history", [])],
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise StatsError(f"{path}: not a token-count file ({e})") from e


def read_histograms(path: Path) -> dict[tuple[str, str], Histogram]:
    """(type, name) -> histogram of each entry in a ``PREFIX_response_times.json`` ({} when the file is absent)."""
    if not path.exists():
        return {}

    def histogram(entry: dict[str, Any]) -> Histogram:
        timed = entry["min_response_time"] is not None  # Locust's minimum is None until a request is timed
        return Histogram(counts={int(ms): int(n) for ms, n in entry["response_times"].items()},
                         requests=int(entry["num_requests"]) - int(entry["num_none_requests"]),
                         min_ms=float(entry["min_response_time"]) if timed else None,
                         max_ms=float(entry["max_response_time"]) if timed else None)

    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        return {(str(entry["method"]), str(entry["name"])): histogram(entry) for entry in data}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise StatsError(f"{path}: not a response-time histogram file ({e})") from e


def read_run(prefix: Path) -> RunStats:
    """Read every file of the run written with ``--csv PREFIX``.

    Raises:
        StatsError: a required file is missing or malformed, or it has no ``Aggregated`` row.
    """
    base = str(prefix)
    histograms = read_histograms(Path(base + HISTOGRAMS))
    entries = [replace(e, histogram=histograms.get((e.type, e.name)))
               for e in read_entries(Path(base + "_stats.csv"))]
    aggregated = [e for e in entries if e.name == AGGREGATED and not e.type]
    if not aggregated:
        raise StatsError(f"{base}_stats.csv: no Aggregated row")
    history_path = Path(base + "_stats_history.csv")
    return RunStats(
        entries=[e for e in entries if e is not aggregated[-1]],
        aggregated=aggregated[-1],
        history=read_history(history_path) if history_path.exists() else [],
        failures=read_failures(Path(base + "_failures.csv")),
        tokens=read_tokens(Path(base + "_tokens.json")),
    )


def _merge_entries(entries: list[Entry]) -> Entry:
    """Entries of the same label from replicas served side by side: counts and rates add up; the median and the
    percentiles are those of the merged histograms, as Locust computes them for one run (without histograms, from
    runs that did not write them: the worst replica's)."""
    first = entries[0]
    requests = sum(e.requests for e in entries)

    def worst(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    def weighted(values: list[tuple[float | None, int]]) -> float | None:
        present = [(v, n) for v, n in values if v is not None and n]
        return sum(v * n for v, n in present) / sum(n for _, n in present) if present else None

    histograms = [e.histogram for e in entries if e.histogram is not None]
    merged = Histogram.merge(histograms) if len(histograms) == len(entries) else None
    if merged is not None:
        median: float | None = merged.median()
        percentiles = {p: float(merged.percentile(f)) if requests else None for p, f in PERCENTILE_FRACTIONS.items()}
    else:
        median = worst([e.median_ms for e in entries])
        percentiles = {p: worst([e.percentile(p) for e in entries]) for p in PERCENTILES}
    minimum = [e.min_ms for e in entries if e.min_ms is not None]
    return Entry(
        type=first.type, name=first.name, requests=requests, failures=sum(e.failures for e in entries),
        median_ms=median, average_ms=weighted([(e.average_ms, e.requests) for e in entries]),
        min_ms=min(minimum) if minimum else None, max_ms=worst([e.max_ms for e in entries]),
        average_size=weighted([(e.average_size, e.requests) for e in entries]) or 0.0,
        rps=sum(e.rps for e in entries), failures_per_s=sum(e.failures_per_s for e in entries),
        percentiles=percentiles, histogram=merged)


def merge_runs(runs: list[RunStats]) -> RunStats:
    """One run from runs made at the same time against replicas of one service (see :func:`_merge_entries`)."""
    if len(runs) == 1:
        return runs[0]
    labels = list(dict.fromkeys(e.label for r in runs for e in r.entries))
    entries = [_merge_entries([e for r in runs for e in r.entries if e.label == label]) for label in labels]
    tokens = [r.tokens for r in runs if r.tokens is not None]
    merged_tokens = Tokens(
        started=min(t.started for t in tokens), stopped=max(t.stopped for t in tokens),
        translated=sum(t.translated for t in tokens), input_tokens=sum(t.input_tokens for t in tokens),
        output_tokens=sum(t.output_tokens for t in tokens)) if tokens else None
    return RunStats(entries=entries, aggregated=_merge_entries([r.aggregated for r in runs]),
                    history=[h for r in runs for h in r.history], failures=[f for r in runs for f in r.failures],
                    tokens=merged_tokens)
