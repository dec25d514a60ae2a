"""Load-test reports: Markdown (with SVG files beside it) and self-contained HTML (SVG inline, no script, no network).

Charts (``loadtest.charts``, matplotlib) per scenario: latency percentiles over time with the targets drawn on
them (and the time to first event for streams), requests and failures per second with the users over time, output
tokens per second, and the server's queue wait and batch sizes from its ``/metrics`` (``loadtest.scrape``).
``mtgate validate`` and ``mtgate sweep`` reuse :func:`scenario_html` and :func:`html_page` for their own reports.
"""

from __future__ import annotations

import html
import multiprocessing
import os
import re
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from batch.tensorboard import markdown_table
from loadtest.charts import COLORS, Axes, Line, Series, panels
from loadtest.gate import Check
from loadtest.scrape import ServerMetrics
from loadtest.stats import AGGREGATED, TTFE, Entry, RunStats
from loadtest.targets import Scenario, Targets

if TYPE_CHECKING:
    from loadtest.server import ServedModel

_NUMERIC = re.compile(r"^[-+]?[\d.,]+( ?(%|ms|req/s|tok/s|s))?$|^–$")
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:75em;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th,td.l{text-align:left}.pass{color:#11772d;font-weight:600}
.fail{color:#b00020;font-weight:600}.verdict{font-size:1.4em}
figure.chart{display:inline-block;margin:.5em 1em .5em 0;vertical-align:top}figure.chart svg{max-width:100%;height:auto}
code{background:#f4f4f4;padding:0 .2em}td.text{text-align:left;max-width:28em;white-space:normal}
"""
# label, colour, line style, marker: Locust rounds response times (to 10 ms from 100 ms, to 100 ms from 1 s), so p95
# and p99 (or p50 and p95) are often the same number; each percentile has its own pattern so that none hides another.
_PERCENTILE_STYLE = {"50%": ("p50", "#1f77b4", "-", "o"), "95%": ("p95", "#ff7f0e", "-.", "s"),
                     "99%": ("p99", "#d62728", ":", "x")}
LOCUST_WINDOW_S = 10  # Locust's history rows give the percentiles of the last 10 s (its "current" response times)


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's run, its checks, what the server's /metrics said during it (None: not scraped), and the model
    its requests went to (None: not looked up)."""

    scenario: Scenario
    run: RunStats
    checks: list[Check]
    server: ServerMetrics | None = None
    model: ServedModel | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, creating its directory (``serving.package.files.atomic_write_text``)."""
    from serving.package.files import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


# ---------------------------------------------------------------- charts


def _origin(run: RunStats) -> float:
    """Time zero of a run's charts: its first history row (whole seconds, so the x ticks are whole seconds too)."""
    if run.history:
        return min(h.timestamp for h in run.history)
    return run.tokens.started if run.tokens is not None else 0.0


def _latency_series(run: RunStats, first_event: bool) -> list[Series]:
    """p50/p95/p99 over time for a single entry; with several entries, each one's p95 (one colour each)."""
    rows = [h for h in run.history if h.name != AGGREGATED and (h.type == TTFE) == first_event]
    names = sorted({(h.type, h.name) for h in rows})
    origin = _origin(run)
    shown = _PERCENTILE_STYLE if len(names) == 1 else {"95%": ("p95", "", "-", "o")}
    series = []
    for i, (kind, name) in enumerate(names):
        points = [h for h in rows if (h.type, h.name) == (kind, name) and h.total_requests > 0]
        for p, (short, color, style, marker) in shown.items():
            xy = [(h.timestamp - origin, v) for h in points if (v := h.percentiles.get(p)) is not None and v > 0]
            if xy:
                label = short if len(names) == 1 else f"{short} {kind} {name}"
                series.append(Series(label, [x for x, _ in xy], [y for _, y in xy], style,
                                     color or COLORS[i % len(COLORS)], marker))
    return series


def window_text(duration_s: float) -> str:
    """What each point of a latency-over-time chart covers: Locust's last 10 s, or the run so far when shorter."""
    return (f"each point: the last {LOCUST_WINDOW_S} s" if duration_s > LOCUST_WINDOW_S
            else "each point: the run so far")


def _target_lines(targets: Targets, prefix: str) -> list[Line]:
    colors = {"p50": "#1f77b4", "p95": "#ff7f0e", "p99": "#d62728"}
    return [Line(f"target {short}", value, colors[short]) for short in ("p50", "p95", "p99")
            if (value := getattr(targets, f"{prefix}{short}_ms")) is not None]


def latency_chart(result: ScenarioResult) -> str:
    """Latency percentiles over time (Locust's last 10 s at each point) per request entry, with the targets."""
    run, targets = result.run, result.scenario.targets
    several = len({e.label for e in run.request_entries}) > 1
    title = "p95 latency per entry over time" if several else "Latency over time"
    window = window_text(result.scenario.duration)
    axes = [Axes(f"{title} ({window})", "ms", _latency_series(run, False), _target_lines(targets, ""))]
    if run.first_event_entries:
        axes.append(Axes(f"Time to first event over time ({window})", "ms", _latency_series(run, True),
                         _target_lines(targets, "ttfe_")))
    return panels(axes)


def throughput_series(run: RunStats) -> list[tuple[str, list[tuple[float, float]]]]:
    """requests/s and failures/s (request entries, not TTFE rows) and output tokens/s over the run.

    Rates come from the cumulative counts between consecutive history rows, which are exact, rather than from
    Locust's "current" rate column, which lags by a few seconds and reads 0 at the start of a short run.
    """
    totals: dict[float, list[int]] = defaultdict(lambda: [0, 0])
    rows = [h for h in run.history if h.type != TTFE and h.name != AGGREGATED]
    if not rows:  # history written without --csv-full-history: only Aggregated rows
        rows = [h for h in run.history if h.name == AGGREGATED]
    for h in rows:
        totals[h.timestamp][0] += h.total_requests
        totals[h.timestamp][1] += h.total_failures
    token_history = run.tokens.history if run.tokens is not None else []
    origin = _origin(run)
    counts = sorted(totals.items())
    requests, failures = [], []
    for (t0, (r0, f0)), (t1, (r1, f1)) in zip(counts, counts[1:], strict=False):
        requests.append((t1 - origin, (r1 - r0) / (t1 - t0)))
        failures.append((t1 - origin, (f1 - f0) / (t1 - t0)))
    series: list[tuple[str, list[tuple[float, float]]]] = [("requests/s", requests), ("failures/s", failures)]
    if len(token_history) > 1:
        rates = [(t1 - origin, (n1 - n0) / (t1 - t0))
                 for (t0, n0), (t1, n1) in zip(token_history, token_history[1:], strict=False)
                 if t1 - t0 > 0.2]  # skip a very short last interval, whose rate is noise
        series.append(("output tokens/s", rates))
    return series


def _series(label: str, points: list[tuple[float, float]], color: str | None = None, style: str = "-") -> Series:
    return Series(label, [x for x, _ in points], [y for _, y in points], style, color)


def users_series(run: RunStats) -> list[tuple[float, float]]:
    """Simulated users over time (one value per history timestamp)."""
    origin = _origin(run)
    users = {h.timestamp: h.users for h in run.history}
    return [(t - origin, float(u)) for t, u in sorted(users.items())]


def throughput_chart(result: ScenarioResult) -> str:
    """Requests and failures per second, users on the right axis; output tokens per second below."""
    run = result.run
    series = throughput_series(run)
    targets = result.scenario.targets
    lines = [Line("target requests/s", targets.min_rps, "#2ca02c")] if targets.min_rps is not None else []
    axes = [Axes("Throughput and users over time", "per second",
                 [_series("requests/s", series[0][1], "#1f77b4"), _series("failures/s", series[1][1], "#d62728")],
                 lines, right=[_series("users", users_series(run), "#7f7f7f", ":")], right_label="users")]
    tokens = series[2][1] if len(series) > 2 else []
    token_lines = ([Line("target tokens/s", targets.min_tokens_per_s, "#2ca02c")]
                   if targets.min_tokens_per_s is not None else [])
    axes.append(Axes("Translated tokens over time", "output tokens per second",
                     [_series("output tokens/s", tokens, "#9467bd")], token_lines))
    return panels(axes)


def server_chart(server: ServerMetrics, origin: float) -> str:
    """The server's queue wait (mean and p95 per interval) and batch sizes, from /metrics."""
    intervals = server.intervals()

    def points(attr: str) -> list[tuple[float, float]]:
        return [(i.time - origin, v) for i in intervals if (v := getattr(i, attr)) is not None]

    batch = [_series("mean batch size", points("batch_size_mean"), "#2ca02c")]
    if any(i.step_sentences_mean for i in intervals):
        batch.append(_series("mean sentences per decoder step", points("step_sentences_mean"), "#8c564b"))
    return panels([
        Axes("Server queue wait (/metrics)", "ms", [_series("mean", points("queue_wait_mean_ms"), "#1f77b4"),
                                                   _series("p95", points("queue_wait_p95_ms"), "#ff7f0e")]),
        Axes("Server batch size (/metrics)", "sentences per engine batch", batch,
             right=[_series("queue depth", [(i.time - origin, i.queue_depth) for i in intervals], "#7f7f7f", ":")],
             right_label="sentences queued"),
    ])


def scenario_charts(result: ScenarioResult) -> list[tuple[str, str, str]]:
    """(slug, caption, SVG) of every chart of one scenario."""
    charts = [("latency", "latency percentiles over time with the targets", latency_chart(result)),
              ("throughput", "throughput, users and translated tokens over time", throughput_chart(result))]
    if result.server is not None and len(result.server.samples) > 1:
        charts.append(("server", "the server's queue wait and batch sizes (/metrics, every second)",
                       server_chart(result.server, _origin(result.run))))
    return charts


def draw_all(results: list[ScenarioResult]) -> list[list[tuple[str, str, str]]]:
    """Every scenario's charts, drawn side by side on the cores this process may use.

    Drawing is CPU-bound and most of a report's time (about 0.7 s of CPU per scenario). On Linux the workers are
    forked from this process, so they start with matplotlib already imported (``loadtest.charts.preload``);
    elsewhere, or with one core, the charts are drawn here one after another.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(len(results), cores)
    if workers < 2 or sys.platform != "linux":
        return [scenario_charts(r) for r in results]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(scenario_charts, results))


def figure_html(slug: str, caption: str, svg: str) -> str:
    """A chart as an HTML figure (``data-chart`` names it for tests and readers)."""
    return f'<figure class="chart" data-chart="{html.escape(slug)}">{svg}<figcaption>{html.escape(caption)}' \
           "</figcaption></figure>"


# ---------------------------------------------------------------- tables


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def entry_rows(run: RunStats) -> list[list[str]]:
    header = ["entry", "requests", "failures", "p50 ms", "p95 ms", "p99 ms", "max ms", "req/s"]
    rows = [header]
    entries: list[Entry] = [*run.entries, run.aggregated]
    for e in entries:
        rows.append([e.label, str(e.requests), str(e.failures), _ms(e.percentile("50%")), _ms(e.percentile("95%")),
                     _ms(e.percentile("99%")), _ms(e.max_ms), f"{e.rps:.1f}"])
    return rows


def check_rows(checks: list[Check]) -> list[list[str]]:
    rows = [["target", "measured", "result", "note"]]
    rows += [[c.target, c.measured_text, "pass" if c.passed else "FAIL", c.detail] for c in checks]
    return rows


def html_table(rows: list[list[str]]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0]) + "</tr>"]
    for row in rows[1:]:
        cells = []
        for c in row:
            cls = ' class="pass"' if c == "pass" else ' class="fail"' if c in ("FAIL", "fail") else (
                "" if _NUMERIC.match(c) else ' class="l"')
            cells.append(f"<td{cls}>{html.escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _describe(scenario: Scenario) -> str:
    users = ", ".join(f"{name} ×{weight}" if weight > 1 else name for name, weight in scenario.users.items())
    return (f"{scenario.concurrency} concurrent users ({users}), spawn rate {scenario.spawn_rate:g}/s, "
            f"{scenario.duration:g} s")


def model_line(result: ScenarioResult) -> str:
    """Which model the scenario's requests went to, as the server reported it."""
    if result.model is None:
        return "Model: not looked up (the server's default)."
    return f"Model: {result.model.describe()}."


def _tokens_line(run: RunStats) -> str:
    t = run.tokens
    if t is None:
        return "Translated tokens: not recorded."
    return (f"Translated {t.translated} sentences, {t.input_tokens} source and {t.output_tokens} output tokens in "
            f"{t.seconds:.1f} s: {t.output_tokens_per_s:.1f} output tokens/s.")


# ---------------------------------------------------------------- documents


def scenario_html(result: ScenarioResult, charts: list[tuple[str, str, str]] | None = None) -> str:
    """One scenario as an HTML fragment: checks, entries, failures, plots (``charts``: already drawn, else drawn)."""
    run = result.run
    status = "pass" if result.passed else "FAIL"
    parts = [f'<h2>Scenario {html.escape(result.scenario.name)}: <span class="{status.lower()}">{status}</span></h2>',
             f"<p>{html.escape(_describe(result.scenario))}. {html.escape(model_line(result))} "
             f"{html.escape(_tokens_line(run))}</p>",
             html_table(check_rows(result.checks)), html_table(entry_rows(run))]
    if run.failures:
        rows = [["entry", "error", "occurrences"]]
        rows += [[f"{f.method} {f.name}", f.error, str(f.occurrences)] for f in run.failures[:20]]
        parts += ["<h3>Failures</h3>", html_table(rows)]
    if result.server is not None and (whole := result.server.whole_run()) is not None:
        parts.append(f"<p>{html.escape(_server_line(whole))}</p>")
    elif result.server is not None:
        parts.append("<p>The server's /metrics had no batching metrics (not an mtgate server?).</p>")
    parts += ["<div>", *(figure_html(slug, f"{result.scenario.name}: {caption}", svg)
                         for slug, caption, svg in (scenario_charts(result) if charts is None else charts)), "</div>"]
    return "\n".join(parts)


def _server_line(whole: object) -> str:
    from loadtest.scrape import Interval

    assert isinstance(whole, Interval)

    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f} ms"

    batch = "–" if whole.batch_size_mean is None else f"{whole.batch_size_mean:.1f}"
    return (f"Server (/metrics over the run): queue wait mean {ms(whole.queue_wait_mean_ms)}, p95 "
            f"{ms(whole.queue_wait_p95_ms)}; mean batch size {batch} sentences.")


def html_page(title: str, body: str) -> str:
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _header(host: str, results: list[ScenarioResult]) -> tuple[str, str]:
    verdict = "PASS" if results and all(r.passed for r in results) else "FAIL"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    models = list(dict.fromkeys(r.model.describe() for r in results if r.model is not None))
    tested = f", model{'s' if len(models) > 1 else ''} {'; '.join(models)}" if models else ""
    return verdict, f"Target {host}{tested}, {when}."


def render_markdown(host: str, results: list[ScenarioResult], svg_names: dict[str, list[str]]) -> str:
    verdict, line = _header(host, results)
    out = [f"# Load test: {verdict}\n", f"{line}\n"]
    for r in results:
        out.append(f"## Scenario {r.scenario.name}: {'pass' if r.passed else 'FAIL'}\n")
        out.append(f"{_describe(r.scenario)}. {model_line(r)} {_tokens_line(r.run)}\n")
        out.append(markdown_table(check_rows(r.checks)))
        out.append(markdown_table(entry_rows(r.run)))
        if r.run.failures:
            rows = [["entry", "error", "occurrences"]]
            rows += [[f"{f.method} {f.name}", f.error, str(f.occurrences)] for f in r.run.failures[:20]]
            out.append("### Failures\n")
            out.append(markdown_table(rows))
        out.extend(f"![{name}]({name})\n" for name in svg_names.get(r.scenario.name, []))
    return "\n".join(out)


def render_html(host: str, results: list[ScenarioResult], charts: list[list[tuple[str, str, str]]] | None = None) -> str:
    verdict, line = _header(host, results)
    drawn = charts if charts is not None else [scenario_charts(r) for r in results]
    body = [f'<h1>Load test: <span class="{verdict.lower()} verdict">{verdict}</span></h1>',
            f"<p>{html.escape(line)}</p>", *(scenario_html(r, c) for r, c in zip(results, drawn, strict=True))]
    return html_page(f"mtgate load test: {verdict}", "\n".join(body))


def write_report(directory: Path, host: str, results: list[ScenarioResult]) -> tuple[Path, Path]:
    """Write ``report.md`` (+ one SVG per chart) and ``report.html`` into ``directory``; return both paths.

    Each chart is drawn once, for both documents, the scenarios' side by side (:func:`draw_all`).
    """
    svg_names: dict[str, list[str]] = {}
    charts = draw_all(results)
    for r, drawn in zip(results, charts, strict=True):
        names = []
        for slug, _, svg in drawn:
            name = f"{r.scenario.name}-{slug}.svg"
            write_text_atomically(directory / name, svg + "\n")
            names.append(name)
        svg_names[r.scenario.name] = names
    md, page = directory / "report.md", directory / "report.html"
    write_text_atomically(md, render_markdown(host, results, svg_names))
    write_text_atomically(page, render_html(host, results, charts))
    return md, page
