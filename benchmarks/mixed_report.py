"""The report of ``benchmarks.mixed_traffic``: issue 38's acceptance check over the modes' ladders, and the Markdown
(how it was measured, the highest rate each mode holds, the modes side by side per rate with step / request short
p95, each mode's per-class table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import run_header

LAG_WARNING_MS = 100.0  # the client's p99 send lag above which the report says the load generator fell behind


def ms(value: float | None) -> str:
    """Milliseconds as the tables show them ("-": none)."""
    return "-" if value is None else f"{value:.0f}"


def acceptance(modes: list[dict[str, Any]], short_limit_ms: float) -> dict[str, Any] | None:
    """Issue 38's check, when both modes ran: per rate where request's short p95 < ``short_limit_ms``, step's short
    p95 / request's (<= 0.5 passes); and whether step holds at least request's highest rate."""
    by_mode = {m["mode"]: m for m in modes}
    if not {"request", "step"} <= by_mode.keys():
        return None
    step_rates = {r["rate"]: r for r in by_mode["step"]["rates"]}
    ratios = {}
    for run in by_mode["request"]["rates"]:
        request_p95 = run["classes"]["short"]["latency_ms"]["p95"]
        if request_p95 is None or request_p95 >= short_limit_ms:
            continue
        step = step_rates.get(run["rate"])
        step_p95 = step["classes"]["short"]["latency_ms"]["p95"] if step else None
        ratios[f"{run['rate']:g}"] = None if step_p95 is None or not request_p95 else round(step_p95 / request_p95, 2)
    request_best, step_best = by_mode["request"]["highest_rate_held"], by_mode["step"]["highest_rate_held"]
    holds_rate = step_best is not None and (request_best is None or step_best >= request_best)
    ratios_pass = bool(ratios) and all(r is not None and r <= 0.5 for r in ratios.values())
    return {"short_p95_ratio_by_rate": ratios, "ratios_pass": ratios_pass, "step_holds_request_rate": holds_rate,
            "passes": ratios_pass and holds_rate}


def _side_by_side(data: dict[str, Any]) -> list[str]:
    modes = data["modes"]
    header = "| offered req/s | " + " | ".join(
        f"{m['mode']}: short p95 / long p95 ms | {m['mode']}: failed | {m['mode']}: holds" for m in modes)
    ratio = {"request", "step"} <= {m["mode"] for m in modes}
    lines = [header + (" | step / request short p95 |" if ratio else " |"),
             "|---|" + "---|---|---|" * len(modes) + ("---|" if ratio else "")]
    for rate in data["load"]["rates"]:
        runs = {m["mode"]: next((r for r in m["rates"] if r["rate"] == rate), None) for m in modes}
        if not any(runs.values()):
            continue
        cells = []
        for m in modes:
            run = runs[m["mode"]]
            if run is None:
                cells.append("- | - | -")
                continue
            short, long = run["classes"]["short"], run["classes"]["long"]
            failed = sum(n for c in run["classes"].values() for n in c["errors"].values())
            cells.append(f"{ms(short['latency_ms']['p95'])} / {ms(long['latency_ms']['p95'])} | {failed} | "
                         + ("yes" if run["holds"] else "no"))
        row = f"| {rate:g} | " + " | ".join(cells)
        if ratio:
            request, step = runs["request"], runs["step"]
            values = [r["classes"]["short"]["latency_ms"]["p95"] if r else None for r in (request, step)]
            row += " | " + (f"{values[1] / values[0]:.2f}" if None not in values and values[0] else "-")
        lines.append(row + " |")
    return lines


def _mode_table(mode: dict[str, Any]) -> list[str]:
    lines = ["| offered req/s | class | requests | answered | achieved req/s | latency p50 / p95 / p99 ms | "
             "first text p50 / p95 / p99 ms | mean tokens in / out | failed | send lag p99 ms | holds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in mode["rates"]:
        for kind, c in run["classes"].items():
            lat, first = c["latency_ms"], c["first_text_ms"]
            failed = ", ".join(f"{n} x {k}" for k, n in c["errors"].items()) or "0"
            verdict = ("yes" if run["holds"] else "no: " + "; ".join(run["reasons"])) if kind == "short" else ""
            lines.append(
                f"| {run['rate']:g} | {kind} | {c['requests']} | {c['ok']} | {c['achieved_rps']:.2f} | "
                f"{' / '.join(ms(lat[q]) for q in ('p50', 'p95', 'p99'))} | "
                f"{' / '.join(ms(first[q]) for q in ('p50', 'p95', 'p99'))} | "
                f"{c['input_tokens_mean'] or '-'} / {c['output_tokens_mean'] or '-'} | {failed} | "
                f"{ms(run['send_lag_ms']['p99'])} | {verdict} |")
    return lines


def to_markdown(data: dict[str, Any]) -> str:
    """The report: how it was measured, the highest holding rate per mode, the acceptance check, the modes side by
    side per rate, then each mode's per-class table."""
    model, server, load, rule = data["model"], data["server"], data["load"], data["rule"]
    beam = load["beam_size"] if load["beam_size"] is not None else f"the package's ({model['package_beam_size']})"
    mix = load["mix"]
    extra_env = ", ".join(f"`{k}={v}`" for k, v in server["env"].items())
    lines = [
        f"# Mixed traffic at fixed Poisson arrival rates: {data['name']}", "",
        *run_header(data),
        f"- model: `{model['package']}` ({model['name']} {model['version']}); server: {server['runtime']}, "
        f"{server['precision']}, {server['threads']} threads" + (f", {extra_env}" if extra_env else ""),
        f"- load: open loop, Poisson arrivals, {load['duration_s']:g} s per rate, seed {load['seed']}; "
        f"{1 - mix['long_fraction']:.0%} short (one sentence), {mix['long_fraction']:.0%} long (paragraphs of "
        f"{mix['min_sentences']}-{mix['max_sentences']} consecutive sentences as one text) from "
        f"`{Path(load['corpus']).name}`; each over `POST {load['route']}` (SSE), beam size {beam}, truncate on, "
        f"timeout {load['timeout_s']:g} s; the client runs on the same machine",
        f"- a rate holds when short p95 < {rule['short_p95_below_ms']:g} ms, long p95 < "
        f"{rule['long_p95_below_ms']:g} ms and no request failed; a ladder stops after {rule['stop_after_misses']} "
        "consecutive rates that do not hold. Latency is to the final event, first text to the first partial event "
        "with text, both from the request's scheduled time", "",
        "| mode | highest rate held (req/s) | short p95 there (ms) | long p95 there (ms) | server reports batching |",
        "|---|---|---|---|---|",
    ]
    for mode in data["modes"]:
        held = mode["highest_rate_held"]
        at = next((r for r in mode["rates"] if r["rate"] == held), None)
        best = "error" if mode["error"] and held is None else ("none" if held is None else f"{held:g}")
        p95 = [ms(at["classes"][k]["latency_ms"]["p95"]) if at else "-" for k in ("short", "long")]
        lines.append(f"| {mode['mode']} | {best} | {p95[0]} | {p95[1]} | "
                     f"{mode['reported_batching'] or 'nothing (setting ignored?)'} |")
    check = data.get("acceptance")
    if check is not None:
        ratios = ", ".join(f"{k} req/s: {'-' if v is None else f'{v:.2f}'}"
                           for k, v in check["short_p95_ratio_by_rate"].items()) or "no rate"
        lines += ["", f"Acceptance (issue 38): step / request short p95 where request's is under "
                      f"{rule['short_p95_below_ms']:g} ms ({ratios}): {'all' if check['ratios_pass'] else 'not all'} "
                      f"<= 0.5; step holds at least request's highest rate: "
                      f"{'yes' if check['step_holds_request_rate'] else 'no'}; "
                      f"**{'passes' if check['passes'] else 'does not pass'}**."]
    lines += ["", "## Per rate, modes side by side", "", *_side_by_side(data)]
    for mode in data["modes"]:
        lines += ["", f"## {mode['mode']}", ""]
        if mode["error"]:
            lines += [f"Error: {mode['error']}", ""]
        lines += _mode_table(mode)
        lagging = [r["rate"] for r in mode["rates"] if (r["send_lag_ms"]["p99"] or 0) > LAG_WARNING_MS]
        if lagging:
            lines += ["", f"The client sent late (p99 lag over {LAG_WARNING_MS:g} ms) at "
                          f"{', '.join(f'{r:g}' for r in lagging)} req/s: the load generator, not only the server, "
                          "fell behind there."]
    return "\n".join(lines) + "\n"
