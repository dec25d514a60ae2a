"""Charts for the reports, drawn with matplotlib and returned as SVG text to inline in HTML (or save beside Markdown).

Why matplotlib: it is the long-maintained standard for static plots in Python, needs no browser, JavaScript or
network to draw or to view (the SVG is the picture), and its tick locators give round axis values. Vega-Lite via
altair would need a JavaScript runtime in the page (or a renderer binary) to show anything offline.

Only the object-oriented API is used (``Figure``, no ``pyplot``): no global state, safe to call from any thread.
matplotlib is imported when the first chart is drawn (or by :func:`preload`), not with this module: a command that
writes a report at its end does not pay for it at start-up.
Text stays text in the SVG (``svg.fonttype: none``), so the titles can be searched and read by a test; the
output is deterministic (fixed hash salt, no date).
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import matplotlib.axes
    from matplotlib.figure import Figure

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_STYLE: Any = {"svg.fonttype": "none", "svg.hashsalt": "mtgate", "font.family": "sans-serif", "font.size": 9,
          "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.color": "#e5e5e5"}
_XML_HEAD = re.compile(r"^.*?(?=<svg)", re.DOTALL)
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)  # RDF about the file: not part of the picture


@functools.cache
def _matplotlib() -> ModuleType:
    """matplotlib with its non-interactive backend (imported once, on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure
    import matplotlib.ticker

    return matplotlib


def preload() -> None:
    """Import matplotlib now (e.g. in a thread while a server starts), so that the first chart does not wait."""
    _matplotlib()


def _locator(**kwargs: Any) -> Any:
    return _matplotlib().ticker.MaxNLocator(**kwargs)


@dataclass(frozen=True)
class Series:
    """One line (or set of points): label, x values, y values, and how to draw it."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = "-"
    color: str | None = None
    marker: str | None = "o"


@dataclass(frozen=True)
class Line:
    """A horizontal reference line (a target), labelled in the legend."""

    label: str
    value: float
    color: str = "#b00020"


@dataclass
class Axes:
    """One panel: its series on the left axis, optional series on a right axis, reference lines."""

    title: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    right: list[Series] = field(default_factory=list)
    right_label: str = ""
    x_label: str = "seconds since start"
    integer_x: bool = True


def to_svg(figure: Figure) -> str:
    """The figure as an inline ``<svg>`` element (no XML declaration or DOCTYPE)."""
    buffer = io.StringIO()
    with _matplotlib().rc_context(_STYLE):
        figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    return _METADATA.sub("", _XML_HEAD.sub("", buffer.getvalue(), count=1), count=1).strip()


def _figure(width: float = 6.4, height: float = 3.2, rows: int = 1) -> Figure:
    with _matplotlib().rc_context(_STYLE):
        figure: Figure = _matplotlib().figure.Figure(figsize=(width, height * rows), layout="constrained")
    return figure


def _no_data(ax: matplotlib.axes.Axes, title: str) -> None:
    ax.set_title(title, loc="left", fontweight="bold")
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _draw(ax: matplotlib.axes.Axes, series: Sequence[Series], offset: int = 0) -> list[object]:
    handles: list[object] = []
    for i, s in enumerate(series):
        color = s.color or COLORS[(i + offset) % len(COLORS)]
        [handle] = ax.plot(list(s.x), list(s.y), s.style, color=color, marker=s.marker, markersize=3, linewidth=1.5,
                           label=s.label)
        handles.append(handle)
    return handles


def panels(axes: Sequence[Axes], width: float = 6.4, height: float = 3.0) -> str:
    """One chart of stacked panels sharing nothing but the figure; each panel with its legend outside on the right."""
    with _matplotlib().rc_context(_STYLE):
        figure = _figure(width, height, rows=len(axes))
        grid = figure.subplots(len(axes), 1, squeeze=False)
        for ax, spec in zip((row[0] for row in grid), axes, strict=True):
            points = [p for s in (*spec.series, *spec.right) for p in s.y if p is not None and math.isfinite(p)]
            if not points:
                _no_data(ax, spec.title)
                continue
            handles = _draw(ax, spec.series)
            for line in spec.lines:
                handles.append(ax.axhline(line.value, color=line.color, linestyle="--", linewidth=1,
                                          label=f"{line.label} {line.value:g}"))
            ax.set_title(spec.title, loc="left", fontweight="bold")
            ax.set_xlabel(spec.x_label)
            ax.set_ylabel(spec.y_label)
            ax.set_ylim(bottom=0)
            ax.xaxis.set_major_locator(_locator(nbins=8, integer=spec.integer_x))
            ax.yaxis.set_major_locator(_locator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
            if spec.right:
                twin = ax.twinx()
                handles += _draw(twin, spec.right, offset=len(spec.series))
                twin.set_ylabel(spec.right_label)
                twin.set_ylim(bottom=0)
                twin.yaxis.set_major_locator(_locator(nbins=6, integer=True))
                twin.grid(False)
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02 if not spec.right else 1.12, 1),
                      frameon=False, fontsize=8)
        return to_svg(figure)


def scatter(title: str, groups: Sequence[Series], x_label: str, y_label: str, lines: Sequence[Line] = (),
            vertical: Sequence[Line] = (), annotate: dict[str, tuple[float, float]] | None = None) -> str:
    """Points (each group one marker and colour), optional connecting style, target lines, text labels."""
    with _matplotlib().rc_context(_STYLE):
        figure = _figure(6.4, 3.8)
        ax = figure.subplots()
        if not any(len(g.x) for g in groups):
            _no_data(ax, title)
            return to_svg(figure)
        for i, g in enumerate(groups):
            ax.plot(list(g.x), list(g.y), linestyle=g.style or "none", color=g.color or COLORS[i % len(COLORS)],
                    marker=g.marker, markersize=14 if g.marker == "*" else 6, linewidth=1.2, label=g.label,
                    zorder=3 + i)
        for line in lines:
            ax.axhline(line.value, color=line.color, linestyle="--", linewidth=1, label=f"{line.label} {line.value:g}")
        for line in vertical:
            ax.axvline(line.value, color=line.color, linestyle=":", linewidth=1, label=f"{line.label} {line.value:g}")
        for text, (x, y) in (annotate or {}).items():
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=7)
        ax.set_title(title, loc="left", fontweight="bold")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
        return to_svg(figure)


def histogram(title: str, values: Mapping[str, Sequence[float]], x_label: str, bins: Sequence[float]) -> str:
    """Overlaid step histograms (one per label) over the same bins."""
    with _matplotlib().rc_context(_STYLE):
        figure = _figure(6.4, 3.2)
        ax = figure.subplots()
        if not any(values.values()):
            _no_data(ax, title)
            return to_svg(figure)
        for i, (label, data) in enumerate(values.items()):
            ax.hist(list(data), bins=list(bins), histtype="step", linewidth=1.8, color=COLORS[i % len(COLORS)],
                    label=f"{label} (n={len(data)})")
        ax.set_title(title, loc="left", fontweight="bold")
        ax.set_xlabel(x_label)
        ax.set_ylabel("sentences")
        ax.yaxis.set_major_locator(_locator(nbins=6, integer=True))
        ax.legend(loc="upper left", frameon=False, fontsize=8)
        return to_svg(figure)


def bars(title: str, categories: Sequence[str], values: Mapping[str, Sequence[float | None]], y_label: str,
         counts: Sequence[int] | None = None) -> str:
    """Grouped bars: one group per category, one bar per label; ``counts`` are written under the categories."""
    with _matplotlib().rc_context(_STYLE):
        figure = _figure(6.4, 3.2)
        ax = figure.subplots()
        if not categories:
            _no_data(ax, title)
            return to_svg(figure)
        width = 0.8 / max(1, len(values))
        for i, (label, data) in enumerate(values.items()):
            xs = [c + (i - (len(values) - 1) / 2) * width for c in range(len(categories))]
            ax.bar(xs, [v if v is not None else 0.0 for v in data], width=width, color=COLORS[i % len(COLORS)],
                   label=label)
        names = [f"{c}\n(n={n})" for c, n in zip(categories, counts, strict=True)] if counts else list(categories)
        ax.set_xticks(range(len(categories)), names)
        ax.grid(axis="x", visible=False)
        ax.set_title(title, loc="left", fontweight="bold")
        ax.set_ylabel(y_label)
        ax.yaxis.set_major_locator(_locator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
        return to_svg(figure)
