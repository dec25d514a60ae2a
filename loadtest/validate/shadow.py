"""``mtgate validate --shadow-log LOG``: the live-traffic section of the verdict, from the pair log of
``mtgate serve --shadow`` (``serving.server.shadow``): agreement, the distribution of the candidate's sentence chrF
against production, the worst disagreements, the latencies on real traffic, and the targets file's ``shadow:``
rules (``min_pairs``, ``min_agreement``, ``min_chrf_mean``, ``min_chrf_p10``) as checks.

The log is read with its rotated files (``LOG.N`` ... ``LOG.1``, then ``LOG``: oldest first). A line that is not a
JSON object of a pair is counted and skipped (the server writes whole lines; a copy may have been cut).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.charts import histogram
from loadtest.report import html_table
from loadtest.targets import ShadowTargets

WORST = 10


class ShadowLogError(Exception):
    """The log cannot be read or holds no pair (a usage error)."""


def log_files(path: Path) -> list[Path]:
    """``path`` and its rotated files, oldest first."""
    rotated = sorted((p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
                     key=lambda p: -int(p.suffix[1:]))
    return [*rotated, path] if path.is_file() else rotated


def read_pairs(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Every pair of the log (and its rotated files), and how many lines were skipped.

    Raises:
        ShadowLogError: no such log, or no pair in it.
    """
    files = log_files(path)
    if not files:
        raise ShadowLogError(f"--shadow-log {path}: no such file")
    pairs, skipped = [], 0
    for file in files:
        try:
            lines = file.read_bytes().splitlines()
        except OSError as e:
            raise ShadowLogError(f"--shadow-log {file}: {e.strerror or e}") from None
        for line in lines:
            try:
                record = json.loads(line)
                if isinstance(record, dict) and isinstance(record.get("identical"), bool):
                    pairs.append(record)
                    continue
            except ValueError:
                pass
            skipped += 1
    if not pairs:
        raise ShadowLogError(f"--shadow-log {path}: no compared pair in {len(files)} file(s)")
    return pairs, skipped


def _stats(values: list[float], quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)) -> dict[str, float | None]:
    if not values:
        return {"mean": None, **{f"p{round(q * 100)}": None for q in quantiles}}
    array = np.asarray(values, dtype=np.float64)
    return {"mean": round(float(array.mean()), 4),
            **{f"p{round(q * 100)}": round(float(np.quantile(array, q)), 4) for q in quantiles}}


def summarize(path: Path) -> dict[str, Any]:
    """The section's numbers (``validate.json``'s ``shadow``).

    Raises:
        ShadowLogError: as :func:`read_pairs`.
    """
    pairs, skipped = read_pairs(path)
    requests: dict[tuple[str, str], dict[str, Any]] = {}
    for r in pairs:  # latencies are per request: one of its pairs stands for it
        requests.setdefault((str(r.get("time")), str(r.get("request_id"))), r)
    production = [float(r["production_seconds"]) for r in requests.values() if r.get("production_seconds") is not None]
    candidate = [float(r["candidate_seconds"]) for r in requests.values() if r.get("candidate_seconds") is not None]
    chrf = [float(r["chrf"]) for r in pairs if r.get("chrf") is not None]
    scored = [r for r in pairs if not r["identical"]]
    worst = sorted(scored, key=lambda r: float(r["chrf"]) if r.get("chrf") is not None else 0.0)[:WORST]
    return {
        "log": str(path),
        "files": len(log_files(path)),
        "skipped_lines": skipped,
        "models": sorted({str(r.get("model")) for r in pairs}),
        "candidates": sorted({str(r.get("candidate")) for r in pairs}),
        "pairs": len(pairs),
        "requests": len(requests),
        "agreement": round(sum(r["identical"] for r in pairs) / len(pairs), 4),
        "chrf": _stats(chrf),
        "chrf_values": chrf,
        "bleu": _stats([float(r["bleu"]) for r in pairs if r.get("bleu") is not None]),
        "length_ratio": _stats([float(r["length_ratio"]) for r in pairs if r.get("length_ratio") is not None]),
        "latency_seconds": {"production": _stats(production, (0.5, 0.95)),
                            "candidate": _stats(candidate, (0.5, 0.95))},
        "worst": [{k: r.get(k) for k in ("request_id", "source", "production_text", "candidate_text", "chrf", "bleu")}
                  for r in worst],
    }


def shadow_checks(summary: dict[str, Any], rules: ShadowTargets) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) of each rule the targets file sets; a rule on a score the log lacks fails."""
    checks = []
    if rules.min_pairs is not None:
        checks.append((f"shadow pairs >= {rules.min_pairs}", summary["pairs"] >= rules.min_pairs,
                       f"{summary['pairs']} pairs from {summary['requests']} requests"))
    if rules.min_agreement is not None:
        checks.append((f"shadow agreement >= {rules.min_agreement:g}", summary["agreement"] >= rules.min_agreement,
                       f"{summary['agreement']:.4f} of {summary['pairs']} sentences identical"))
    for name, key, floor in (("mean", "mean", rules.min_chrf_mean), ("p10", "p10", rules.min_chrf_p10)):
        if floor is None:
            continue
        value = summary["chrf"][key]
        checks.append((f"shadow chrF {name} >= {floor:g}", value is not None and value >= floor,
                       "no chrF in the log (the server had no sacrebleu)" if value is None else f"{value:.2f}"))
    return checks


def shadow_html(summary: dict[str, Any]) -> str:
    """The report's section."""
    def cell(value: Any, scale: float = 1.0, unit: str = "") -> str:
        return "–" if value is None else f"{value * scale:.2f}{unit}"

    latency = summary["latency_seconds"]
    parts = [
        "<h2>Live traffic (shadow)</h2>",
        f"<p>{summary['pairs']} sentences of {summary['requests']} requests translated by production "
        f"({html.escape(', '.join(summary['models']))}) and the candidate "
        f"({html.escape(', '.join(summary['candidates']))}), from <code>{html.escape(summary['log'])}</code> "
        f"({summary['files']} file(s), {summary['skipped_lines']} line(s) skipped). Agreement (identical "
        f"translations): {summary['agreement']:.2%}.</p>",
        html_table([["score (candidate vs production)", "mean", "p10", "p50", "p90"],
                    *([name, *(cell(summary[key][q]) for q in ("mean", "p10", "p50", "p90"))]
                      for name, key in (("chrF", "chrf"), ("BLEU", "bleu"), ("length ratio", "length_ratio")))]),
        histogram("Candidate's sentence chrF against production", {"chrF": summary["chrf_values"]}, "chrF",
                  list(range(0, 101, 5))),
        html_table([["latency per request", "mean", "p50", "p95"],
                    *([side, *(cell(latency[side][q], 1000, " ms") for q in ("mean", "p50", "p95"))]
                      for side in ("production", "candidate"))]),
        "<p>Production's latency is admission to answer on the server; the candidate's is its translation in the "
        "shadow's process (no queueing): compare their trends, not their values.</p>",
    ]
    if summary["worst"]:
        parts += ["<h3>Worst disagreements</h3>", html_table(
            [["request", "source", "production", "candidate", "chrF"],
             *([str(w.get("request_id") or ""), str(w.get("source")), str(w.get("production_text")),
                str(w.get("candidate_text")), cell(w.get("chrf"))] for w in summary["worst"])])]
    return "\n".join(parts)
