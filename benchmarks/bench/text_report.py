"""The Markdown report of a real-text run (``benchmarks.bench.text``; the JSON report is the run's dict itself)."""

from __future__ import annotations

from typing import Any

from benchmarks.bench.measure import Case


def _cell(row: dict[str, Any]) -> str:
    text = f"{row['sentences_per_s']:.1f} / {row['tokens_per_s']:.0f}"
    if row.get("bleu") is not None:
        text += f" / {row['bleu']:.1f}"
    if row.get("identical_to_transformers") is not None:
        text += f" / {100 * row['identical_to_transformers']:.0f}%"
    return text


def _ratio(value: float | None, rounds: list[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" ({', '.join(f'{r:.2f}' for r in rounds)})" if len(rounds) > 1 else "")


def render_text_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: per engine and case sentences/s, tokens/s, BLEU and agreement with transformers; the
    ratios of mtgate's best to CTranslate2's best and to the best peer; the workload and the command."""
    workload = report["workload"]
    cases = [Case(c["beam"], c["batch"]) for c in workload["cases"]]
    machine = report["machine"]
    lines = [f"# mtgate bench, real text, {report['created']}", "",
             f"{machine['cpu']}, {machine['cores']} cores, load average at the start "
             f"{', '.join(str(x) for x in machine['load_start'])}; {workload['threads']} thread(s) per engine. "
             f"{workload['sentences']} sentences of {workload['sentences_from']}, text in, text out, until EOS; "
             f"{workload['rounds']} round(s), a process per engine"
             + (", case and round" if workload["interleave"] == "case" else " and round")
             + ", the engines' order alternating.", "",
             "Each cell: sentences/s / tokens/s / BLEU / identical to transformers' generate.", "",
             "| engine | " + " | ".join(c.name for c in cases) + " | vs best CTranslate2 |",
             "|---|" + "---|" * len(cases) + "---|"]
    for engine in report["engines"]:
        if engine["status"] != "ok":
            lines.append(f"| {engine['label']} | failed: {engine.get('error', '')} |")
            continue
        ratios = ", ".join(f"{row['vs_best_ct2']:.2f}x" for row in engine["cases"] if "vs_best_ct2" in row)
        lines.append(f"| {engine['label']} | " + " | ".join(_cell(row) for row in engine["cases"])
                     + f" | {ratios or '-'} |")
    analysis = report["analysis"]
    lines += ["", f"mtgate's best against CTranslate2's best and the best peer (sentences/s, the median of the rounds' "
              f"ratios, each round's in brackets; target {analysis['target']}x CTranslate2):", "",
              "| case | best mtgate | best CTranslate2 | mtgate / CTranslate2 | best peer | mtgate / best peer |",
              "|---|---|---|---|---|---|"]
    for row in analysis["comparison"]:
        lines.append(f"| {row['case']} | {row['best_mtgate'] or '-'} | {row['best_ct2'] or '-'} | "
                     f"{_ratio(row.get('vs_ct2'), row.get('vs_ct2_rounds', []))} | {row['best_peer'] or '-'} | "
                     f"{_ratio(row.get('vs_peer'), row.get('vs_peer_rounds', []))} |")
    lines += ["", f"Model {workload['model']}, mtgate package {workload['package']}; references "
              f"{workload['references_from'] or '-'}.", "", f"Command: `{report['command']}` (commit "
              f"{report.get('git_commit') or '?'}).", ""]
    return "\n".join(lines)
