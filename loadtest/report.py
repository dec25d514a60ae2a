"""Load-test reports: Markdown (with SVG files beside it) and self-contained HTML (SVG inline).

Plots are hand-written SVG: latency percentiles per entry, and throughput (requests/s, failures/s, translated
tokens/s) over time. ``mtgate validate`` reuses :func:`scenario_html` and :func:`html_page` for its own report.
"""

from __future__ import annotations

import html
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from loadtest.gate import Check
from loadtest.stats import AGGREGATED, PERCENTILES, TTFE, Entry, RunStats
from loadtest.targets import Scenario

_PLOT_PERCENTILES = PERCENTILES[:-2]  # 50% .. 99.9%; 99.99% and 100% are just the maximum in short runs
_NUMERIC = re.compile(r"^[-+]?[\d.,]+( ?(%|ms|req/s|tok/s|s))?$|^–$")
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:75em;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th,td.l{text-align:left}.pass{color:#11772d;font-weight:600}
.fail{color:#b00020;font-weight:600}.verdict{font-size:1.4em}svg{margin:.5em 1em .5em 0;vertical-align:top}
code{background:#f4f4f4;padding:0 .2em}
"""


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's run and its checks."""

    scenario: Scenario
    run: RunStats
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- plots


def line_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], x_label: str,
               y_label: str, x_ticks: Sequence[tuple[float, str]] | None = None, width: int = 520,
               height: int = 300) -> str:
    """An SVG line chart; y starts at 0. ``x_ticks`` replaces the numeric x axis with labelled positions."""
    left, right, top, bottom = 55, 180, 30, 45
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for _, pts in series for p in pts]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    if not points:
        out.append(f'<text x="{left + 10}" y="{top + plot_h / 2}">no data</text></svg>')
        return "\n".join(out)
    x_min = min(p[0] for p in points) if x_ticks is None else min(t[0] for t in x_ticks)
    x_max = max(p[0] for p in points) if x_ticks is None else max(t[0] for t in x_ticks)
    y_max = _nice_ceiling(max(p[1] for p in points))
    x_span = (x_max - x_min) or 1.0

    def sx(x: float) -> float:
        return left + (x - x_min) / x_span * plot_w

    def sy(y: float) -> float:
        return top + plot_h - y / y_max * plot_h

    for i in range(5):  # horizontal grid and y labels
        y = y_max * i / 4
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{_tick(y)}</text>')
    ticks = x_ticks if x_ticks is not None else [(x, _tick(x)) for x in (x_min + x_span * i / 5 for i in range(6))]
    for x, text in ticks:
        out.append(f'<text x="{sx(x):.1f}" y="{top + plot_h + 15}" text-anchor="middle">{html.escape(text)}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#444"/>')
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#444"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">{html.escape(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(y_label)}</text>')
    for i, (label, pts) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        if len(pts) > 1:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts)
        ly = top + 12 + i * 16
        out.append(f'<rect x="{left + plot_w + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{left + plot_w + 24}" y="{ly + 1}">{html.escape(_shorten(label, 28))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _tick(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.3g}"


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** (len(str(int(value))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return value


def _shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def latency_chart(run: RunStats) -> str:
    """Response-time percentiles (50% .. 99.9%) of every entry."""
    series = []
    for entry in run.entries:
        pts = [(float(i), v) for i, p in enumerate(_PLOT_PERCENTILES) if (v := entry.percentile(p)) is not None]
        if entry.requests and pts:
            series.append((entry.label, pts))
    ticks = [(float(i), p) for i, p in enumerate(_PLOT_PERCENTILES)]
    return line_chart("Latency percentiles", series, "percentile", "ms", x_ticks=ticks)


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
    origin = min([*totals, *(t for t, _ in token_history)], default=0.0)
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


def throughput_charts(run: RunStats) -> list[str]:
    series = throughput_series(run)
    charts = [line_chart("Requests over time", series[:2], "seconds", "per second")]
    if len(series) > 2:
        charts.append(line_chart("Translated tokens over time", series[2:], "seconds", "tokens per second"))
    return charts


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


def markdown_table(rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines) + "\n"


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


def _tokens_line(run: RunStats) -> str:
    t = run.tokens
    if t is None:
        return "Translated tokens: not recorded."
    return (f"Translated {t.translated} sentences, {t.input_tokens} source and {t.output_tokens} output tokens in "
            f"{t.seconds:.1f} s: {t.output_tokens_per_s:.1f} output tokens/s.")


# ---------------------------------------------------------------- documents


def scenario_html(result: ScenarioResult) -> str:
    """One scenario as an HTML fragment: checks, entries, failures, plots."""
    run = result.run
    status = "pass" if result.passed else "FAIL"
    parts = [f'<h2>Scenario {html.escape(result.scenario.name)}: <span class="{status.lower()}">{status}</span></h2>',
             f"<p>{html.escape(_describe(result.scenario))}. {html.escape(_tokens_line(run))}</p>",
             html_table(check_rows(result.checks)), html_table(entry_rows(run))]
    if run.failures:
        rows = [["entry", "error", "occurrences"]]
        rows += [[f"{f.method} {f.name}", f.error, str(f.occurrences)] for f in run.failures[:20]]
        parts += ["<h3>Failures</h3>", html_table(rows)]
    parts += ["<div>", latency_chart(run), *throughput_charts(run), "</div>"]
    return "\n".join(parts)


def html_page(title: str, body: str) -> str:
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _header(host: str, results: list[ScenarioResult]) -> tuple[str, str]:
    verdict = "PASS" if results and all(r.passed for r in results) else "FAIL"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return verdict, f"Target {host}, {when}."


def render_markdown(host: str, results: list[ScenarioResult], svg_names: dict[str, list[str]]) -> str:
    verdict, line = _header(host, results)
    out = [f"# Load test: {verdict}\n", f"{line}\n"]
    for r in results:
        out.append(f"## Scenario {r.scenario.name}: {'pass' if r.passed else 'FAIL'}\n")
        out.append(f"{_describe(r.scenario)}. {_tokens_line(r.run)}\n")
        out.append(markdown_table(check_rows(r.checks)))
        out.append(markdown_table(entry_rows(r.run)))
        if r.run.failures:
            rows = [["entry", "error", "occurrences"]]
            rows += [[f"{f.method} {f.name}", f.error, str(f.occurrences)] for f in r.run.failures[:20]]
            out.append("### Failures\n")
            out.append(markdown_table(rows))
        out.extend(f"![{name}]({name})\n" for name in svg_names.get(r.scenario.name, []))
    return "\n".join(out)


def render_html(host: str, results: list[ScenarioResult]) -> str:
    verdict, line = _header(host, results)
    body = [f'<h1>Load test: <span class="{verdict.lower()} verdict">{verdict}</span></h1>',
            f"<p>{html.escape(line)}</p>", *(scenario_html(r) for r in results)]
    return html_page(f"mtgate load test: {verdict}", "\n".join(body))


def write_report(directory: Path, host: str, results: list[ScenarioResult]) -> tuple[Path, Path]:
    """Write ``report.md`` (+ one SVG per plot) and ``report.html`` into ``directory``; return both paths."""
    svg_names: dict[str, list[str]] = {}
    for r in results:
        charts = [latency_chart(r.run), *throughput_charts(r.run)]
        names = [f"{r.scenario.name}-{kind}.svg" for kind in ("latency", "throughput", "tokens")[: len(charts)]]
        for name, svg in zip(names, charts, strict=True):
            write_text_atomically(directory / name, svg + "\n")
        svg_names[r.scenario.name] = names
    md, page = directory / "report.md", directory / "report.html"
    write_text_atomically(md, render_markdown(host, results, svg_names))
    write_text_atomically(page, render_html(host, results))
    return md, page
