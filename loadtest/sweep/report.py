"""The sweep's report (``sweep.html``, ``sweep.json``, ``k8s-patch.yaml``) and its TensorBoard run."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from loadtest.capacity import Plan, describe, plan_rows
from loadtest.charts import Line, Series, scatter
from loadtest.report import figure_html, html_page, html_table, write_text_atomically
from loadtest.sweep.config import Sweep
from loadtest.sweep.results import PointResult, capacity_plan, kubernetes_patch, pareto_front, tokens_per_core

Winner = tuple[PointResult, Plan | None] | None


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def pareto_chart(sweep: Sweep, results: list[PointResult], winner: Winner) -> str:
    name = sweep.pareto_scenario.name
    xy = {id(r): (t, s.p95_ms) for r in results if r.status == "measured" and (s := r.scenario(name))
          and s.p95_ms is not None and (t := tokens_per_core(r, name)) is not None}

    def group(label: str, members: list[PointResult], style: str, color: str, marker: str) -> Series:
        points = [xy[id(r)] for r in members if id(r) in xy]
        return Series(label, [x for x, _ in points], [y for _, y in points], style, color, marker)

    front = pareto_front(results, name)
    groups = [group("missed a target", [r for r in results if not r.passed], "", "#b0b0b0", "o"),
              group("met every target", [r for r in results if r.passed], "", "#2ca02c", "o"),
              group("Pareto front", front, "-", "#1f77b4", "D")]
    if winner is not None:
        groups.append(group("cheapest meeting every target", [winner[0]], "", "#d62728", "*"))
    target = sweep.pareto_scenario.targets.p95_ms
    labels = {f"{i + 1}": xy[id(r)] for i, r in enumerate(results) if id(r) in xy}
    return scatter(f"Pareto front: p95 latency vs throughput per core ({name})", groups,
                   "output tokens/s per core", "p95 latency (ms)",
                   [Line("target p95", target)] if target is not None else [], annotate=labels)


def _rows(sweep: Sweep, results: list[PointResult]) -> list[list[str]]:
    name = sweep.pareto_scenario.name
    capacity = sweep.file.capacity
    cost = f"cost/month ({capacity.prices.currency})" if capacity is not None else "cost/month"
    rows = [["#", "configuration", "status", "targets", f"p95 ms ({name})", "tok/s per core", "req/s",
             "mean batch", cost, "note"]]
    for i, r in enumerate(results):
        s = r.scenario(name)
        p = capacity_plan(sweep, r) if r.status == "measured" else None
        note = r.reason or "; ".join(m for sc in r.scenarios for m in sc.missed)
        rows.append([str(i + 1), r.point.label, r.status + (" (kept)" if r.reused else ""),
                     "pass" if r.passed else ("FAIL" if r.status == "measured" else "–"),
                     _num(s.p95_ms if s else None, 0), _num(tokens_per_core(r, name)),
                     _num(s.requests_per_s if s else None), _num(s.batch_size_mean if s else None),
                     _num(p.cost_per_month, 2) if p else "–", note])
    return rows


def to_json(sweep: Sweep, results: list[PointResult], winner: Winner) -> dict[str, Any]:
    name = sweep.pareto_scenario.name
    return {
        "sweep": str(sweep.path), "name": sweep.file.name, "node_cores": sweep.node_cores,
        "scenarios": [s.name for s in sweep.scenarios], "pareto_scenario": name,
        "points": [{**r.to_json(), "tokens_per_s_per_core": tokens_per_core(r, name),
                    "capacity": (p.to_json() if (p := capacity_plan(sweep, r)) is not None else None)
                    if r.status == "measured" else None} for r in results],
        "pareto_front": [r.key for r in pareto_front(results, name)],
        "winner": None if winner is None else {"key": winner[0].key, "label": winner[0].point.label,
                                               "point": winner[0].point.to_json(),
                                               "capacity": winner[1].to_json() if winner[1] else None},
    }


def write_sweep_report(directory: Path, sweep: Sweep, results: list[PointResult], winner: Winner) -> tuple[Path, Path]:
    """``sweep.html`` and ``sweep.json`` (and ``k8s-patch.yaml`` for the winner); returns the first two."""
    name = sweep.pareto_scenario.name
    verdict = ("no configuration met every target" if winner is None else
               f"#{results.index(winner[0]) + 1} is the cheapest that meets every target")
    parts = [f"<h1>Sweep {html.escape(sweep.file.name)}: <span class=\"{'pass' if winner else 'fail'} verdict\">"
             f"{html.escape(verdict)}</span></h1>",
             f"<p>{len(results)} points from <code>{html.escape(str(sweep.path))}</code> on a node of "
             f"{sweep.node_cores} cores; scenarios {', '.join(s.name for s in sweep.scenarios)}; throughput and "
             f"latency below are from {html.escape(name)}.</p>",
             figure_html("pareto", "each measured point (numbered as in the table); the front and the winner",
                         pareto_chart(sweep, results, winner)),
             html_table(_rows(sweep, results))]
    if winner is not None:
        point, plan = winner
        patch = kubernetes_patch(point, plan)
        write_text_atomically(directory / "k8s-patch.yaml", patch)
        parts.append(f"<h2>Cheapest configuration meeting every target</h2><p>{html.escape(point.point.label)}: "
                     f"<code>mtgate serve {html.escape(' '.join(point.point.serve_args()))}</code></p>")
        if plan is not None:
            parts += [f"<p>{html.escape(describe(plan))}.</p>", html_table(plan_rows(plan))]
        parts.append("<h3>Kubernetes (patch for deploy/k8s/deployment.yaml, <code>k8s-patch.yaml</code>)</h3>"
                     f"<pre>{html.escape(patch)}</pre>")
    page, data = directory / "sweep.html", directory / "sweep.json"
    write_text_atomically(page, html_page(f"mtgate sweep {sweep.file.name}", "\n".join(parts)))
    write_text_atomically(data, json.dumps(to_json(sweep, results, winner), indent=2) + "\n")
    return page, data


def write_sweep_tensorboard(root: Path, sweep: Sweep, results: list[PointResult], winner: Winner) -> Path:
    """One TensorBoard run: each point's numbers at its index (step), the table and the winner as text."""
    from batch.tensorboard import markdown_table, open_run

    name = sweep.pareto_scenario.name
    with open_run(root, "sweep") as writer:
        for step, r in enumerate(results):
            if r.status != "measured":
                continue
            s = r.scenario(name)
            p = capacity_plan(sweep, r)
            writer.scalars({"p95_ms": s.p95_ms if s else None, "tokens_per_s_per_core": tokens_per_core(r, name),
                            "requests_per_s": s.requests_per_s if s else None, "passed": float(r.passed),
                            "cost_per_month": p.cost_per_month if p else None}, step=step, prefix="sweep/")
        writer.text("points", markdown_table(_rows(sweep, results)))
        if winner is not None:
            text = f"**{winner[0].point.label}**"
            if winner[1] is not None:
                text += f"\n\n{describe(winner[1])}"
                writer.scalar("sweep/winner_cost_per_month", winner[1].cost_per_month)
            writer.text("winner", text)
        return writer.directory
