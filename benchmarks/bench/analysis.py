"""The analysis of a run: token-count checks, agreement with the fp32 reference, best peer per case, ratios (paired
round by round), targets."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.bench.measure import Case


def outputs_digest(outputs: Sequence[Sequence[int]]) -> str:
    """A short hash of an engine's outputs (equal outputs, equal digests)."""
    return hashlib.sha256(json.dumps([list(o) for o in outputs]).encode()).hexdigest()[:16]


def agreement(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How far ``outputs`` follow ``reference``: identical sentences, and the mean shared prefix.

    Decoding is autoregressive, so tokens after the first difference are not comparable; ``prefix`` is the mean
    fraction of each reference sentence reproduced before the first difference.
    """
    if len(outputs) != len(reference):
        return {"identical": 0.0, "prefix": 0.0, "first_mismatch": 0}
    identical = 0
    prefix: list[float] = []
    first: int | None = None
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        n = 0
        for a, b in zip(out, ref, strict=False):
            if a != b:
                break
            n += 1
        same = list(out) == list(ref)
        identical += same
        prefix.append(n / max(1, len(ref)))
        if not same and first is None:
            first = i
    return {"identical": identical / max(1, len(reference)), "prefix": float(np.mean(prefix)) if prefix else 1.0,
            "first_mismatch": first}


def merge_rounds(processes: Sequence[Sequence[dict[str, Any]]], cases: Sequence[Case]) -> list[dict[str, Any]]:
    """One engine's raw cases over the rounds of a run, in the order of ``cases``: ``processes`` are its engine
    processes in run order, each with the raw cases it measured (every case, or one with ``--interleave case``). A
    case gets the passes of every round, and ``round_seconds``, each round's passes apart (the harness pairs engines
    round by round). Token counts and outputs are the last round's."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for measured in processes:
        for raw in measured:
            by_case.setdefault(Case(raw["beam"], raw["batch"]).name, []).append(raw)
    merged: list[dict[str, Any]] = []
    for case in cases:
        rounds = by_case[case.name]
        merged.append({**rounds[-1],
                       "seconds": [s for r in rounds for s in r["seconds"]],
                       "cpu_seconds": [s for r in rounds for s in r["cpu_seconds"]],
                       "round_seconds": [list(r["seconds"]) for r in rounds]})
    return merged


def summarize_case(raw: dict[str, Any], sentences: int, new_tokens: int) -> dict[str, Any]:
    """Median tokens/s (over every pass), each round's median tokens/s, spread, ms/sentence, CPU use and the
    token-count check of one case."""
    seconds = [float(s) for s in raw["seconds"]]
    median = statistics.median(seconds)
    tokens = int(raw["tokens"])
    runs = [tokens / s for s in seconds]
    rounds = raw.get("round_seconds") or [seconds]
    expected = sentences * new_tokens
    return {
        "beam": raw["beam"],
        "batch": raw["batch"],
        "tokens": tokens,
        "expected_tokens": expected,
        "tokens_ok": tokens == expected and all(n == new_tokens for n in raw["lengths"]),
        "seconds": [round(s, 4) for s in seconds],
        "tokens_per_s": round(tokens / median, 2),
        "tokens_per_s_runs": [round(r, 2) for r in runs],
        "tokens_per_s_rounds": [round(tokens / statistics.median(float(s) for s in r), 2) for r in rounds],
        "spread": round((max(seconds) - min(seconds)) / median, 4),
        "ms_per_sentence": round(1000.0 * median / max(1, sentences), 2),
        "cpu_per_wall": round(statistics.median(c / s for c, s in zip(raw["cpu_seconds"], seconds, strict=True)), 2),
        "outputs_sha256": outputs_digest(raw["outputs"]),
    }


def paired_ratio(mine: dict[str, Any], peer: dict[str, Any]) -> tuple[float, list[float]]:
    """``mine`` / ``peer`` tokens/s of one case, paired round by round: the median of the rounds' ratios, and the
    ratios. Engines measured minutes apart on a machine whose speed drifts are compared within a round, where they
    ran close in time (the harness alternates the engines' order between rounds)."""
    a, b = mine["tokens_per_s_rounds"], peer["tokens_per_s_rounds"]
    if len(a) != len(b):  # not from the same rounds: the medians over every pass
        return mine["tokens_per_s"] / peer["tokens_per_s"], []
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(ratios), ratios


def analyze(engines: list[dict[str, Any]], outputs: dict[str, dict[str, list[list[int]]]], cases: Sequence[Case],
            targets: dict[str, float]) -> dict[str, Any]:
    """Token checks, agreement with the fp32 reference, best peer per case, ratios and targets.

    Arguments:
        engines: engine entries (``id``, ``family``, ``fp32``, ``status``, ``cases`` from :func:`summarize_case`).
        outputs: engine id -> case name -> the outputs of its last pass.
        cases: the measured cases.
        targets: ``speedup`` (best mtgate / best peer), ``latency`` (ms/sentence ratio at batch 1), ``fp32``
            (best mtgate fp32 / best fp32 peer).

    Returns:
        ``checks``, ``comparison`` (one row per case) and ``targets_met``; the engine entries gain ``agreement`` per
        case and ``vs_best_peer`` ratios.
    """
    ok = [e for e in engines if e["status"] == "ok"]
    fp32 = [e for e in ok if e["fp32"]]
    reference = next((e for e in fp32 if e["id"] == "transformers-fp32"), fp32[0] if fp32 else None)
    problems: list[str] = []
    mismatches: list[str] = []
    for engine in ok:
        for row in engine["cases"]:
            name = Case(row["beam"], row["batch"]).name
            if not row["tokens_ok"]:
                problems.append(f"{engine['id']} {name}: generated {row['tokens']} tokens, expected "
                                f"{row['expected_tokens']} ({row['expected_tokens'] // max(1, len(outputs[engine['id']][name]))} each)")
            if reference is not None and engine is not reference:
                row["agreement"] = agreement(outputs[engine["id"]][name], outputs[reference["id"]][name])
                row["agreement"]["reference"] = reference["id"]
                if engine["fp32"] and row["agreement"]["identical"] < 1.0:
                    mismatches.append(f"{engine['id']} {name}: {row['agreement']['identical']:.3f} of the sentences "
                                      f"identical to {reference['id']} (mean shared prefix "
                                      f"{row['agreement']['prefix']:.3f})")

    def valid(engine: dict[str, Any], index: int) -> bool:
        return bool(engine["cases"][index]["tokens_ok"])

    comparison: list[dict[str, Any]] = []
    met = True
    for index, case in enumerate(cases):
        def best(pool: list[dict[str, Any]], i: int = index) -> dict[str, Any] | None:
            pool = [e for e in pool if valid(e, i)]
            return max(pool, key=lambda e: e["cases"][i]["tokens_per_s"]) if pool else None

        peers = [e for e in ok if e["family"] == "peer"]
        mine = [e for e in ok if e["family"] == "mtgate"]
        best_peer, best_mtgate = best(peers), best(mine)
        best_fp32_peer = best([e for e in peers if e["fp32"]])
        best_fp32_mtgate = best([e for e in mine if e["fp32"]])
        entry: dict[str, Any] = {"case": case.name, "beam": case.beam, "batch": case.batch,
                               "best_peer": best_peer and best_peer["id"], "best_mtgate": best_mtgate and best_mtgate["id"],
                               "best_fp32_peer": best_fp32_peer and best_fp32_peer["id"],
                               "best_fp32_mtgate": best_fp32_mtgate and best_fp32_mtgate["id"]}
        if best_peer is not None:
            for engine in ok:
                if valid(engine, index):
                    ratio, _ = paired_ratio(engine["cases"][index], best_peer["cases"][index])
                    engine["cases"][index]["vs_best_peer"] = round(ratio, 3)
        if best_peer is not None and best_mtgate is not None:
            speedup, rounds = paired_ratio(best_mtgate["cases"][index], best_peer["cases"][index])
            entry["speedup"] = round(speedup, 3)
            entry["speedup_rounds"] = [round(r, 3) for r in rounds]
            entry["speedup_ok"] = speedup >= targets["speedup"]
            met &= entry["speedup_ok"]
            if case.batch == 1:  # same sentences and tokens: the ms ratio of a round is its tokens/s ratio inverted
                latency = statistics.median(1.0 / r for r in rounds) if rounds else 1.0 / speedup
                entry["latency_ratio"] = round(latency, 3)
                entry["latency_ok"] = latency <= targets["latency"]
                met &= entry["latency_ok"]
        if best_fp32_peer is not None and best_fp32_mtgate is not None:
            ratio, rounds = paired_ratio(best_fp32_mtgate["cases"][index], best_fp32_peer["cases"][index])
            entry["fp32_ratio"] = round(ratio, 3)
            entry["fp32_ratio_rounds"] = [round(r, 3) for r in rounds]
            entry["fp32_ok"] = ratio >= targets["fp32"]
            met &= entry["fp32_ok"]
        if best_peer is None or best_mtgate is None:
            met = False
        comparison.append(entry)
    return {
        "checks": {"reference": reference and reference["id"], "token_count_problems": problems,
                   "fp32_mismatches": mismatches},
        "comparison": comparison,
        "targets": targets,
        "targets_met": met and not problems,
    }
