"""The bench's real-text mode (``python -m benchmarks.bench --text``): a trained model (default the demo,
``models/demo-en-de-src``, with its built package ``models/demo-en-de``) translates held-out sentences text to text,
each engine with its own tokenizer and detokenizer, until EOS.

The engines run as in the random-model mode (``benchmarks.bench.rounds``: a process per engine, case and round,
the engines' order alternating); a case's speed is sentences/s (engines generate different tokens, so tokens/s is
shown but not compared), paired round by round. Every engine's translations are scored with BLEU against the
references and compared with transformers' ``generate`` (identical translations). The ratios that the issue's
targets ask for are mtgate's best over CTranslate2's best (``ct2-*``) and over the best peer.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.analysis import merge_rounds
from benchmarks.bench.engines import EngineSpec
from benchmarks.bench.measure import Case, write_json
from benchmarks.bench.plan import Plan
from benchmarks.bench.report import publish
from benchmarks.bench.rounds import Unit, run_rounds
from benchmarks.bench.text_report import render_text_markdown
from benchmarks.bench.workload import WorkloadError, read_sentences
from serving.commands.options import UsageError

TARGET_RATIO = 1.5  # issue 37: mtgate's best >= 1.5x CTranslate2's best, at batch 1 and 32
REFERENCE_ENGINE = "transformers-fp32"


def text_workload(plan: Plan) -> tuple[list[str], list[str] | None]:
    """The source sentences and, with ``--references``, their reference translations (line by line).

    Raises:
        UsageError: no sentences, or fewer references than sentences.
    """
    sentences = read_sentences(plan.sentences_file, plan.num_sentences)
    if not sentences:
        raise UsageError(str(WorkloadError(f"{plan.sentences_file}: no sentences")))
    if plan.references_file is None:
        return sentences, None
    references = read_sentences(plan.references_file, len(sentences))
    if len(references) != len(sentences):
        raise UsageError(f"--references {plan.references_file}: {len(references)} lines for {len(sentences)} "
                         f"sentences")
    return sentences, references


def summarize_text_case(raw: dict[str, Any], sentences: int) -> dict[str, Any]:
    """Median sentences/s and tokens/s over every pass, each round's median sentences/s, spread, ms/sentence and
    CPU use of one case."""
    seconds = [float(s) for s in raw["seconds"]]
    median = statistics.median(seconds)
    rounds = raw.get("round_seconds") or [seconds]
    return {
        "beam": raw["beam"],
        "batch": raw["batch"],
        "sentences": sentences,
        "tokens": int(raw["tokens"]),
        "seconds": [round(s, 4) for s in seconds],
        "sentences_per_s": round(sentences / median, 2),
        "sentences_per_s_rounds": [round(sentences / statistics.median(float(s) for s in r), 2) for r in rounds],
        "tokens_per_s": round(int(raw["tokens"]) / median, 1),
        "spread": round((max(seconds) - min(seconds)) / median, 4),
        "ms_per_sentence": round(1000.0 * median / max(1, sentences), 2),
        "cpu_per_wall": round(statistics.median(c / s for c, s in zip(raw["cpu_seconds"], seconds, strict=True)), 2),
    }


def paired_sentence_ratio(mine: dict[str, Any], peer: dict[str, Any]) -> tuple[float, list[float]]:
    """``mine`` / ``peer`` sentences/s of one case: the median of the rounds' ratios (the engines of a round ran close
    in time), and the ratios; the medians' ratio when the rounds do not pair."""
    a, b = mine["sentences_per_s_rounds"], peer["sentences_per_s_rounds"]
    if len(a) != len(b):
        return mine["sentences_per_s"] / peer["sentences_per_s"], []
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(ratios), ratios


def corpus_bleu(outputs: Sequence[str], references: Sequence[str]) -> float | None:
    """sacrebleu's corpus BLEU (default 13a tokenization), None without sacrebleu."""
    try:
        from sacrebleu.metrics.bleu import BLEU
    except ImportError:
        return None
    return round(float(BLEU().corpus_score(list(outputs), [list(references)]).score), 2)


def identical_share(outputs: Sequence[str], reference: Sequence[str]) -> float:
    """The share of sentences translated exactly as ``reference`` translated them."""
    if len(outputs) != len(reference) or not reference:
        return 0.0
    return round(sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference), 4)


def _fastest(pool: list[dict[str, Any]], index: int) -> dict[str, Any] | None:
    """The engine of ``pool`` with the most sentences/s in case ``index``."""
    return max(pool, key=lambda engine: engine["cases"][index]["sentences_per_s"]) if pool else None


def analyze_text(engines: list[dict[str, Any]], outputs: dict[str, dict[str, list[str]]], cases: Sequence[Case],
                 references: Sequence[str] | None) -> dict[str, Any]:
    """BLEU and agreement with transformers per engine and case; per case mtgate's best against CTranslate2's best
    and against the best peer (sentences/s, paired by round).

    Arguments:
        engines: engine entries (``id``, ``family``, ``status``, ``cases`` from :func:`summarize_text_case`); their
            cases gain ``bleu``, ``identical_to_transformers`` and ``vs_best_ct2``.
        outputs: engine id -> case name -> the translations of its last pass.
        cases: the measured cases.
        references: reference translations (None: no BLEU).
    """
    ok = [e for e in engines if e["status"] == "ok"]
    reference = next((e for e in ok if e["id"] == REFERENCE_ENGINE), None)
    comparison: list[dict[str, Any]] = []
    met = True
    for index, case in enumerate(cases):
        for engine in ok:
            row = engine["cases"][index]
            texts = outputs[engine["id"]][case.name]
            if references is not None:
                row["bleu"] = corpus_bleu(texts, references)
            if reference is not None:
                row["identical_to_transformers"] = identical_share(texts, outputs[reference["id"]][case.name])
        best_mtgate = _fastest([e for e in ok if e["family"] == "mtgate"], index)
        best_ct2 = _fastest([e for e in ok if e["id"].startswith("ct2-")], index)
        best_peer = _fastest([e for e in ok if e["family"] == "peer"], index)
        entry: dict[str, Any] = {"case": case.name, "beam": case.beam, "batch": case.batch,
                                 "best_mtgate": best_mtgate and best_mtgate["id"],
                                 "best_ct2": best_ct2 and best_ct2["id"], "best_peer": best_peer and best_peer["id"]}
        if best_ct2 is not None:
            for engine in ok:
                ratio, _ = paired_sentence_ratio(engine["cases"][index], best_ct2["cases"][index])
                engine["cases"][index]["vs_best_ct2"] = round(ratio, 3)
        if best_mtgate is not None:
            for key, peer in (("vs_ct2", best_ct2), ("vs_peer", best_peer)):
                if peer is not None:
                    ratio, rounds = paired_sentence_ratio(best_mtgate["cases"][index], peer["cases"][index])
                    entry[key] = round(ratio, 3)
                    entry[f"{key}_rounds"] = [round(r, 3) for r in rounds]
        entry["target_ok"] = entry.get("vs_ct2", 0.0) >= TARGET_RATIO
        met &= entry["target_ok"]
        comparison.append(entry)
    return {"reference": reference and reference["id"], "comparison": comparison, "target": TARGET_RATIO,
            "targets_met": met}


def run_text(plan: Plan, header: dict[str, Any], model: Path, folder: Path, package: Path,
             engines: Sequence[EngineSpec], peer_libraries: dict[str, Any],
             progress: Callable[[str], None]) -> int:
    """Run the real-text comparison and write ``<output-dir>/<name>.json`` and ``.md``; returns the exit code
    (1 when no engine ran or, with ``--check-targets``, a target was missed).

    Arguments:
        plan: what to run (``plan.text``).
        header: the report's opening fields (format, time, command, commit, machine).
        model: the Hugging Face checkpoint (the peers load it or its CTranslate2 conversion).
        folder: the model's cache folder (the peers' artifacts).
        package: the mtgate package converted from it.
        engines: the engines to run.
        peer_libraries: the peers' library versions.
        progress: where progress lines go.
    """
    sentences, references = text_workload(plan)
    run_dir = plan.cache_dir / "runs" / plan.name
    run_dir.mkdir(parents=True, exist_ok=True)
    workload_path = run_dir / "workload.json"
    write_json(workload_path, {"sentences": sentences})
    worker_config = {"mode": "text", "workload": str(workload_path), "repeats": plan.repeats,
                     "warmup_sentences": plan.warmup_sentences, "package": str(package), "model": str(model)}
    if plan.interleave == "case" and len(plan.cases) > 1:
        units = [Unit(plan.threads, [case], f"case{i + 1}") for i, case in enumerate(plan.cases)]
    else:
        units = [Unit(plan.threads, list(plan.cases), "")]
    runs, failures = run_rounds(plan, engines, units, worker_config, run_dir, model, folder, progress)

    entries: list[dict[str, Any]] = []
    outputs: dict[str, dict[str, list[str]]] = {}
    for engine in engines:
        entry: dict[str, Any] = {"id": engine.id, "label": engine.label, "family": engine.family,
                                 "precision": engine.precision}
        rounds = [r.result for r in runs if r.engine == engine.id]
        if engine.id in failures or not rounds:
            entry.update(status="failed", error=failures.get(engine.id, {}).get("error", "no run"))
            entries.append(entry)
            continue
        raw_cases = merge_rounds([r["cases"] for r in rounds], plan.cases)
        outputs[engine.id] = {Case(r["beam"], r["batch"]).name: r["outputs"] for r in raw_cases}
        entry.update(status="ok", **{k: rounds[0][k] for k in ("versions", "settings") if k in rounds[0]})
        entry["load_seconds"] = round(statistics.median(float(r["load_seconds"]) for r in rounds), 2)
        entry["peak_rss_mib"] = round(max(float(r["peak_rss_mib"]) for r in rounds), 1)
        entry["cases"] = [summarize_text_case(r, len(sentences)) for r in raw_cases]
        entries.append(entry)

    header["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    analysis = analyze_text(entries, outputs, plan.cases, references)
    report = {
        **header,
        "mode": "text",
        "workload": {
            "model": str(model), "package": str(package), "sentences_from": str(plan.sentences_file),
            "references_from": plan.references_file and str(plan.references_file), "sentences": len(sentences),
            "cases": [dataclasses.asdict(c) for c in plan.cases], "rounds": plan.rounds,
            "interleave": plan.interleave, "repeats": plan.repeats, "warmup_sentences": plan.warmup_sentences,
            "threads": plan.threads,
        },
        "peer_python": str(plan.peer_python) if peer_libraries else None,
        "peer_libraries": peer_libraries,
        "engines": entries,
        "analysis": analysis,
        "outputs": outputs,
    }
    return publish(plan, report, render_text_markdown)
