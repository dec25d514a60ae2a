"""The Markdown report of a run (the JSON report is the run's dict itself), and its publishing: both written, printed, the
run's exit status."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from benchmarks.bench.measure import Case
from benchmarks.bench.plan import Plan
from benchmarks.common import ReportFiles


def _fmt_tps(row: dict[str, Any] | None, with_ms: bool) -> str:
    if row is None:
        return "-"
    text = f"{row['tokens_per_s']:.0f}"
    if with_ms:
        text += f" ({row['ms_per_sentence']:.0f})"
    if not row["tokens_ok"]:
        text += " (!)"
    return text


def _rounds_text(workload: dict[str, Any]) -> str:
    passes = f"a warm-up, then {workload['repeats']} timed pass{'es' if workload['repeats'] > 1 else ''}"
    rounds = int(workload.get("rounds", 1))
    by_case = workload.get("interleave") == "case"
    if rounds == 1 and not by_case:
        return f"one process per engine: {passes}"
    per, turns = (("engine, case and round", "from one case to the next and, per case, from one round to the next")
                  if by_case else ("engine and round", "every round"))
    return (f"{rounds} round{'s' if rounds > 1 else ''}; a process per {per}, the engines' order reversed {turns}; "
            f"in each, per case {passes}")


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: results table, ratios, checks, workload, versions and the command."""
    cases = [Case(c["beam"], c["batch"]) for c in report["workload"]["cases"]]
    header = ["engine"] + [f"{c.name}" + (" (ms/sentence)" if c.batch == 1 else "") for c in cases]
    header += ["spread max", "peak RSS MiB"]
    lines = [f"# mtgate bench {report['created']}", ""]
    machine = report["machine"]
    # At the end the load average counts the bench's own engines (``--threads`` each): only the start tells of others.
    before = machine["load_start"][0]
    if machine["cores"] and before > 0.5 * machine["cores"]:
        lines += [f"**Warning:** load average {before} on {machine['cores']} cores when the run started: other "
                  "processes were competing for the CPU, so these numbers are not comparable with an idle machine's.", ""]
    lines += ["Generated target tokens per second (median of the timed passes of every round); at batch 1 also ms per "
              "sentence.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for engine in report["engines"]:
        if engine["status"] != "ok":
            continue
        rows = {Case(r["beam"], r["batch"]).name: r for r in engine["cases"]}
        cells = [engine["label"]] + [_fmt_tps(rows.get(c.name), c.batch == 1) for c in cases]
        cells.append(f"{max(r['spread'] for r in engine['cases']):.0%}")
        cells.append(f"{engine['peak_rss_mib']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    skipped = [e for e in report["engines"] if e["status"] != "ok"]
    if skipped:
        lines += ["", "Not measured:", ""]
        lines += [f"- {e['label']}: {e['status']}: {e.get('error', '')}" for e in skipped]
    comparison = report["analysis"]["comparison"]
    if any("speedup" in row or "fp32_ratio" in row for row in comparison):
        t = report["analysis"]["targets"]
        rounds = report["workload"].get("rounds", 1)
        paired = (f"the median over the {rounds} rounds of the ratio within a round (each round's ratios in brackets)"
                  if rounds > 1 else "the ratio of the medians")
        lines += ["", f"Ratios, {paired} (targets: best mtgate >= {t['speedup']}x best peer; ms/sentence at batch 1 "
                      f"<= {t['latency']}x; best mtgate fp32 >= {t['fp32']}x best fp32 peer):", "",
                  "| case | best peer | best mtgate | speedup | ms ratio b1 | best fp32 peer | best mtgate fp32 | fp32 ratio |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in comparison:
            def mark(key: str, ok_key: str, r: dict[str, Any] = row) -> str:
                if key not in r:
                    return "-"
                per_round = r.get(f"{key}_rounds", [])
                detail = f" ({', '.join(f'{x:.2f}' for x in per_round)})" if len(per_round) > 1 else ""
                return f"{r[key]:.2f}x {'ok' if r[ok_key] else 'MISSED'}{detail}"
            lines.append(f"| {row['case']} | {row['best_peer'] or '-'} | {row['best_mtgate'] or '-'} | "
                         f"{mark('speedup', 'speedup_ok')} | {mark('latency_ratio', 'latency_ok')} | "
                         f"{row['best_fp32_peer'] or '-'} | {row['best_fp32_mtgate'] or '-'} | "
                         f"{mark('fp32_ratio', 'fp32_ok')} |")
        lines += ["", f"Targets met: {'yes' if report['analysis']['targets_met'] else 'no'}"]
    checks = report["analysis"]["checks"]
    lines += ["", "## Checks", "",
              f"- every engine generated {report['workload']['new_tokens']} tokens per sentence: "
              + ("yes" if not checks["token_count_problems"] else "NO")]
    lines += [f"  - {p}" for p in checks["token_count_problems"]]
    lines.append(f"- fp32 engines identical to {checks['reference']}: "
                 + ("yes" if not checks["fp32_mismatches"] else "NO"))
    lines += [f"  - {m}" for m in checks["fp32_mismatches"]]
    agree = []
    for engine in report["engines"]:
        if engine["status"] == "ok" and not engine["fp32"]:
            parts = [f"{Case(r['beam'], r['batch']).name} {r['agreement']['identical']:.2f}/{r['agreement']['prefix']:.2f}"
                     for r in engine["cases"] if "agreement" in r]
            if parts:
                agree.append(f"  - {engine['id']}: " + ", ".join(parts))
    if agree:
        lines += ["- non-fp32 engines vs the reference (identical sentences / mean shared prefix):"] + agree
    w = report["workload"]
    src = w["source_tokens_incl_eos"]
    lines += ["", "## Workload", "",
              f"- model: {w['model']['description']}",
              f"- sentences: {w['sentences']} ({w['sentences_from']}), source tokens incl. EOS: mean {src['mean']}, "
              f"min {src['min']}, max {src['max']}",
              f"- {w['new_tokens']} generated tokens per sentence; beams {sorted({c.beam for c in cases})}, batch sizes "
              f"{sorted({c.batch for c in cases})}; {_rounds_text(w)}; {w['threads']} threads",
              f"- machine: {report['machine']['cpu']}, {report['machine']['cores']} cores; load average at start "
              f"{report['machine']['load_start']}, at end {report['machine']['load_end']}",
              "", "## Engines", "", "| engine | versions | settings |", "|---|---|---|"]
    for engine in report["engines"]:
        versions = ", ".join(f"{k} {v}" for k, v in engine.get("versions", {}).items())
        settings = ", ".join(f"{k}={v}" for k, v in engine.get("settings", {}).items() if k != "decoding")
        lines.append(f"| {engine['id']} | {versions} | {settings} |")
    lines += ["", "Command:", "", "```", report["command"], "```", ""]
    return "\n".join(lines)


def publish(plan: Plan, report: dict[str, Any], render: Callable[[dict[str, Any]], str]) -> int:
    """Write a run's report (``plan.output_dir``/``plan.name`` ``.json`` and ``.md``), print it, and return the
    run's exit status: 1 when ``--check-targets`` found a target missed or no engine measured anything, else 0."""
    files = ReportFiles.of(plan.output_dir, plan.name)
    sys.stdout.write(files.write(report, render))
    sys.stdout.write(f"\nwrote {files.json_path} and {files.md_path}\n")
    if plan.check_targets and not report["analysis"]["targets_met"]:
        return 1
    return 0 if any(e["status"] == "ok" for e in report["engines"]) else 1

