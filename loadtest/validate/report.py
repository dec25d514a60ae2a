"""``mtgate validate``'s report: ``validate.json`` and a self-contained ``validate.html`` (charts inline), and its
TensorBoard run."""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.capacity import plan_rows
from loadtest.quality import BOOTSTRAP_SAMPLES, quality_html
from loadtest.report import html_page, html_table, scenario_html, write_text_atomically

if TYPE_CHECKING:
    from loadtest.quality import SystemScore
    from loadtest.validate.command import Outcome


def describe_package(summary: dict[str, Any]) -> str:
    """``models/en-de (opus-mt-en-de 1, onnxruntime/int8: why)``: how the report names a package and the artifact it
    was measured at (with the reason ``--precision auto`` chose that precision)."""
    name = " ".join(str(summary[k]) for k in ("name", "version") if summary.get(k))
    artifact = "/".join(str(summary[k]) for k in ("runtime", "precision") if summary.get(k))
    if artifact and summary.get("precision_reason"):
        artifact += f": {summary['precision_reason']}"
    inside = ", ".join(filter(None, [name, artifact]))
    return f"{summary.get('path')}" + (f" ({inside})" if inside else "")


def to_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "verdict": outcome.verdict,
        # REJECT: what failed; PROMOTE: what was checked.
        "reasons": [f"{c.name}: {c.detail}" for c in outcome.checks if not c.passed]
        or [f"{c.name}: {c.detail}" for c in outcome.checks],
        "checks": [asdict(c) for c in outcome.checks],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "candidate": outcome.candidate,
        "baseline": outcome.baseline,
        "testset": outcome.testset,
        "parity": outcome.parity,
        # tokens_per_s: the median of the timed passes; null when the speed was left to a load scenario
        "quality": {role: {**asdict(s), "tokens_per_s": _speed_value(outcome, s),
                           "speed": s.speed.to_json() if s.speed is not None else None}
                    for role, s in outcome.quality.items()},
        "speed_left_to": outcome.speed_left_to,
        "comparison": [asdict(c) for c in outcome.comparisons],
        "load": None if outcome.host is None else {
            "host": outcome.host,
            "scenarios": [{"name": r.scenario.name, "passed": r.passed,
                           "model": r.model.describe() if r.model is not None else None,
                           "output_tokens_per_s": r.run.tokens.output_tokens_per_s if r.run.tokens else None,
                           "checks": [{"target": c.target, "key": c.key, "limit": c.limit, "measured": c.measured,
                                       "passed": c.passed, "detail": c.detail} for c in r.checks]}
                          for r in outcome.load]},
        "cost": outcome.cost,
        "analysis": outcome.analysis.to_json() if outcome.analysis is not None else None,
        "shadow": None if outcome.shadow is None else {k: v for k, v in outcome.shadow.items() if k != "chrf_values"},
    }


def to_html(outcome: Outcome) -> str:
    verdict = outcome.verdict
    cls = "pass" if verdict == "PROMOTE" else "fail"
    parts = [f'<h1>Validation: <span class="{cls} verdict">{verdict}</span></h1>',
             f"<p>Candidate <code>{html.escape(describe_package(outcome.candidate))}</code>"
             + (f", baseline <code>{html.escape(describe_package(outcome.baseline))}</code>" if outcome.baseline
                else "")
             + f"; test set {html.escape(str(outcome.testset.get('source')))} "
               f"({outcome.testset.get('sentences')} sentences).</p>",
             "<h2>Checks</h2>",
             html_table([["check", "result", "detail"],
                         *([c.name, "pass" if c.passed else "FAIL", c.detail] for c in outcome.checks)])]
    if outcome.parity:
        rows = [["artifact", "reference", "result", "details"]]
        rows += [[str(r.get("artifact")), str(r.get("reference")), "pass" if r.get("passed") else "FAIL",
                  ", ".join(f"{k} {_short(v)}" for k, v in r.items() if k not in ("artifact", "reference", "passed"))]
                 for r in outcome.parity]
        parts += ["<h2>Parity</h2>", html_table(rows)]
    if outcome.quality:
        rows = [["system", "BLEU", "chrF", "sentences", "output tokens/s (in process)"]]
        rows += [[role, f"{s.bleu:.2f}", f"{s.chrf:.2f}", str(s.sentences), _speed_text(outcome, s)]
                 for role, s in outcome.quality.items()]
        parts += ["<h2>Quality</h2>", html_table(rows), f"<p>{html.escape(_speed_note(outcome))}</p>"]
        if outcome.comparisons:
            rows = [["metric", "candidate", "baseline", "delta", "p-value", "candidate mean ± 95% CI",
                     "baseline mean ± 95% CI"]]
            rows += [[c.metric, f"{c.candidate:.2f}", f"{c.baseline:.2f}", f"{c.delta:+.2f}", f"{c.p_value:.4f}",
                      f"{c.candidate_mean:.2f} ± {c.candidate_ci:.2f}", f"{c.baseline_mean:.2f} ± {c.baseline_ci:.2f}"]
                     for c in outcome.comparisons]
            parts += [f"<p>Paired bootstrap resampling, {BOOTSTRAP_SAMPLES} samples (sacrebleu).</p>",
                      html_table(rows)]
            parts += [f"<p>{html.escape(c.metric)}: {html.escape(c.significance(outcome.alpha))}.</p>"
                      for c in outcome.comparisons]
        sigs = {s.bleu_signature for s in outcome.quality.values()} | {s.chrf_signature for s in outcome.quality.values()}
        parts.append("<p>" + "<br>".join(f"<code>{html.escape(sig)}</code>" for sig in sorted(sigs)) + "</p>")
        if outcome.analysis is not None:
            parts.append(quality_html(outcome.analysis))
    if outcome.cost is not None:
        c = outcome.cost
        per_million = c["per_million_tokens"]
        parts += ["<h2>Cost</h2>", f"<p>{html.escape(str(c.get('throughput_note', '')))}</p>", html_table([
            ["price per core-hour", "cores", "output tokens/s", "measured by", "per million output tokens"],
            [f"{c['price_per_core_hour']:g}", str(c["cores"]), f"{c['tokens_per_s']:.1f}", c["throughput_source"],
             "–" if per_million is None else f"{per_million:.4f}"]])]
        if outcome.plan is not None:
            from loadtest.capacity import describe

            parts += [f"<p>Capacity for the expected load: {html.escape(describe(outcome.plan))}.</p>",
                      html_table(plan_rows(outcome.plan))]
    if outcome.shadow is not None:
        from loadtest.validate.shadow import shadow_html

        parts.append(shadow_html(outcome.shadow))
    if outcome.load:
        parts += [f"<h2>Load (server at {html.escape(outcome.host or '')})</h2>", *(scenario_html(r) for r in outcome.load)]
    return html_page(f"mtgate validate: {verdict}", "\n".join(parts))


def _speed_value(outcome: Outcome, s: SystemScore) -> float | None:
    return None if s.speed is None and outcome.speed_left_to is not None else s.tokens_per_s


def _speed_text(outcome: Outcome, s: SystemScore) -> str:
    if s.speed is not None:
        return s.speed.text()
    if outcome.speed_left_to is not None:
        return f"– (load scenario {outcome.speed_left_to})"
    return f"{s.tokens_per_s:.1f} (1 pass)"


def _speed_note(outcome: Outcome) -> str:
    """How the in-process speed was measured, or why it was not."""
    if outcome.speed_left_to is not None:
        return (f"Speed: not timed in process; the cost uses the throughput of load scenario {outcome.speed_left_to}, "
                "which decodes as the quality run did.")
    speeds = [s.speed for s in outcome.quality.values() if s.speed is not None]
    if not speeds:
        return "Speed: the one pass that translated the test set (not repeated)."
    return (f"Speed: median and range of {len(speeds[0].samples)} timed passes of the test set per system (systems "
            "alternating), after the pass that translated it for quality; on a shared machine the range shows how "
            "much the load moved it.")


def _plain(value: Any) -> Any:
    """numpy scalars (in parity rows) as Python numbers; anything else unknown as text."""
    return value.item() if hasattr(value, "item") else str(value)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_outcome(directory: Path, outcome: Outcome) -> tuple[Path, Path]:
    data, page = directory / "validate.json", directory / "validate.html"
    write_text_atomically(data, json.dumps(to_json(outcome), indent=2, default=_plain) + "\n")
    write_text_atomically(page, to_html(outcome))
    return data, page




def write_validate_tensorboard(root: Path, outcome: Outcome) -> Path:
    """One TensorBoard run: quality, comparison, cost and load scalars; the verdict and examples as text."""
    from batch.tensorboard import markdown_table, open_run
    from loadtest.cli import write_scenarios
    from loadtest.quality import examples_markdown

    with open_run(root, "validate") as writer:
        for role, s in outcome.quality.items():
            speed = _speed_value(outcome, s)
            writer.scalars({"bleu": s.bleu, "chrf": s.chrf, **({"tokens_per_s": speed} if speed is not None else {})},
                           prefix=f"quality/{role}_")
        for c in outcome.comparisons:
            writer.scalars({"delta": c.delta, "p_value": c.p_value}, prefix=f"comparison/{c.metric.lower()}_")
        if outcome.cost is not None:
            writer.scalar("cost/per_million_tokens", outcome.cost["per_million_tokens"])
            writer.scalar("cost/tokens_per_s", outcome.cost["tokens_per_s"])
        if outcome.plan is not None:
            writer.scalars({"replicas": float(outcome.plan.replicas), "cores": float(outcome.plan.cores),
                            "per_month": outcome.plan.cost_per_month}, prefix="capacity/")
        write_scenarios(writer, outcome.load)
        writer.scalar("verdict/promote", float(outcome.verdict == "PROMOTE"))
        rows = [["check", "result", "detail"]] + [[c.name, "pass" if c.passed else "FAIL", c.detail]
                                                  for c in outcome.checks]
        systems = "".join(f"\n\n{role}: `{describe_package(summary)}`"
                          for role, summary in (("candidate", outcome.candidate), ("baseline", outcome.baseline))
                          if summary)
        writer.text("verdict", f"**{outcome.verdict}**{systems}\n\n{markdown_table(rows)}")
        if outcome.analysis is not None and outcome.analysis.losses + outcome.analysis.gains:
            writer.text("examples", examples_markdown(outcome.analysis))
        return writer.directory
