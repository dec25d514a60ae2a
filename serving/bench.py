"""``mtgate bench``: generated tokens per second of mtgate's engines side by side with peer engines.

The workload (issue 4): a Marian model (a random-weight model of the opus-mt-en-de shape built from a config with a
fixed seed, or any Hugging Face Marian directory), N source sentences (Multi30k test_2016 lengths, or a file),
exactly ``--new-tokens`` generated tokens per sentence, greedy and beam search, batch 1 and 16, on a fixed number of
threads. Every engine runs in its own process, one after another, over the same token ids and the same batches:

- mtgate: every runtime x precision of a package converted once from the model (``mtgate convert``, cached), run
  through ``Translator.translate`` with this interpreter;
- peers (``benchmarks/peers.py``, run with ``--peer-python``, a venv with the ``bench`` extra): transformers fp32,
  CTranslate2 float32 and int8, optimum ONNX Runtime fp32 and int8 (dynamic), optimum-intel OpenVINO fp32, default
  and int8 weights. Peer artifacts are converted once from the same directory and cached.

Each engine process warms up, then times ``--repeats`` passes over all sentences; it reports median tokens/s, the
spread of the passes ((max - min) / median), ms per sentence, CPU seconds per pass and its peak RSS. The harness
checks that every engine generated exactly ``sentences x new tokens`` tokens and that the fp32 engines generated the
same tokens as the reference (transformers fp32, else the first fp32 engine), computes ratios against the best peer,
and writes JSON and Markdown.

Forcing the output length: peers use ``min_new_tokens = max_new_tokens = N`` (transformers/optimum) or
``min_decoding_length = max_decoding_length = N`` (CTranslate2): EOS is masked for N steps and decoding stops at N.
mtgate's ``DecodeOptions`` has no minimum length, so the bench loads the package as usual and overrides the
package's decoding defaults for the run: EOS joins ``bad_word_ids``, ``max_length = N``, no forced EOS. That is the
same N decoder steps, through the same ``Translator.translate`` path a server request takes.

Token ids in, token ids out: sentences are tokenized once (random ids with the same lengths for a random-weight
model, the package tokenizer otherwise) and every engine gets the same ids, so no engine's time includes
tokenization. This module's top level imports only the standard library and numpy: ``benchmarks/peers.py`` imports
its measuring loop from the peers' interpreter.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

FORMAT = "mtgate-bench/1"
ROOT = Path(__file__).resolve().parents[1]
PEERS_SCRIPT = ROOT / "benchmarks" / "peers.py"
DEFAULT_SENTENCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
DEFAULT_PEER_PYTHON = ROOT / "build" / "bench-venv" / "bin" / "python"
DEFAULT_OUTPUT_DIR = ROOT / "benchmarks" / "results"
TOKENS_PER_WORD = 1.4
PRESETS = ("opus-mt-en-de", "tiny")

GenerateFn = Callable[[list[list[int]], int], list[list[int]]]
"""``generate(batch, beam_size)``: source ids of each sentence (EOS not included; the engine appends it as its
tokenizer would) -> the generated ids of each sentence (no start token, no EOS)."""


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the comparison.

    Attributes:
        id: stable identifier (``mtgate-onnxruntime-fp32``, ``ct2-int8``...).
        label: what the tables show.
        family: ``mtgate`` or ``peer``.
        precision: weights/compute precision as the engine's users name it.
        fp32: float32 weights and compute: must generate the reference's tokens.
        runtime: the mtgate runtime (mtgate engines only).
        artifact: the peer artifact it loads (``benchmarks/peers.py prepare``), None for the HF directory itself.
    """

    id: str
    label: str
    family: str
    precision: str
    fp32: bool
    runtime: str | None = None
    artifact: str | None = None


PEER_ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("transformers-fp32", "transformers fp32", "peer", "fp32", True),
    EngineSpec("ct2-float32", "CTranslate2 float32", "peer", "float32", True, artifact="ct2-float32"),
    EngineSpec("ct2-int8", "CTranslate2 int8", "peer", "int8", False, artifact="ct2-int8"),
    EngineSpec("ort-fp32", "optimum ONNX Runtime fp32", "peer", "fp32", True, artifact="ort-fp32"),
    EngineSpec("ort-int8", "optimum ONNX Runtime int8 (dynamic)", "peer", "int8", False, artifact="ort-int8"),
    EngineSpec("ov-fp32", "optimum-intel OpenVINO fp32", "peer", "fp32", True, artifact="ov-fp32"),
    EngineSpec("ov-default", "optimum-intel OpenVINO default", "peer", "default", False, artifact="ov-fp32"),
    EngineSpec("ov-int8", "optimum-intel OpenVINO int8 weights", "peer", "int8-weights", False, artifact="ov-int8"),
)


def mtgate_engines(runtimes: Sequence[str] = ("onnxruntime", "openvino"),
                   precisions: Sequence[str] = ("fp32", "int8")) -> list[EngineSpec]:
    """The mtgate engines for the given runtimes x precisions."""
    names = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}
    return [
        EngineSpec(f"mtgate-{runtime}-{precision}", f"mtgate {names.get(runtime, runtime)} {precision}", "mtgate",
                   precision, precision == "fp32", runtime=runtime)
        for runtime in runtimes
        for precision in precisions
    ]


@dataclass(frozen=True)
class Case:
    """One measured configuration: beam size and sentences per batch."""

    beam: int
    batch: int

    @property
    def name(self) -> str:
        return f"{'greedy' if self.beam == 1 else f'beam{self.beam}'} b{self.batch}"


# ---------------------------------------------------------------------------------------------------------------
# The measuring loop: shared by the mtgate worker (below) and the peer worker (benchmarks/peers.py).


def measure(
    generate: GenerateFn,
    sentences: list[list[int]],
    cases: Sequence[Case],
    repeats: int,
    warmup_sentences: int | None = None,
) -> list[dict[str, Any]]:
    """Time ``generate`` on every case: a warm-up, then ``repeats`` passes over all sentences.

    Sentences are cut into batches of ``case.batch`` in their given order (the same batches for every engine).

    Arguments:
        generate: the engine (:data:`GenerateFn`).
        sentences: source ids, EOS not included.
        cases: beam size x batch size combinations.
        repeats: timed passes per case (>= 1).
        warmup_sentences: sentences decoded before timing (None: ``max(4, 2 x batch)``, at most all).

    Returns:
        One dict per case: ``beam``, ``batch``, ``seconds`` and ``cpu_seconds`` of each pass, ``tokens`` generated
        per pass, ``lengths`` of each output and the ``outputs`` of the last pass.
    """
    results: list[dict[str, Any]] = []
    for case in cases:
        batches = [sentences[i : i + case.batch] for i in range(0, len(sentences), case.batch)]
        warm = warmup_sentences if warmup_sentences is not None else max(4, 2 * case.batch)
        warm = min(len(sentences), warm)
        for i in range(0, warm, case.batch):
            generate(sentences[i : min(warm, i + case.batch)], case.beam)
        seconds: list[float] = []
        cpu_seconds: list[float] = []
        outputs: list[list[int]] = []
        for _ in range(repeats):
            gc.collect()
            outputs = []
            cpu_start = time.process_time()
            start = time.perf_counter()
            for batch in batches:
                outputs.extend(generate(batch, case.beam))
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
        results.append({
            "beam": case.beam,
            "batch": case.batch,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "tokens": sum(len(o) for o in outputs),
            "lengths": [len(o) for o in outputs],
            "outputs": outputs,
        })
        logger.info("%s: %d tokens, median %.3fs", case.name, results[-1]["tokens"], statistics.median(seconds))
    return results


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (``getrusage``)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float | None:
    """This process's current resident set size, MiB (Linux ``/proc``; None elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def package_versions(names: Sequence[str]) -> dict[str, str]:
    """Installed distribution versions (absent ones omitted)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def run_worker(config: dict[str, Any], load: Callable[[dict[str, Any]], tuple[GenerateFn, dict[str, Any]]]) -> None:
    """Load one engine, measure it and write its result JSON (``config["result"]``).

    Arguments:
        config: the worker config the harness wrote (engine, workload, threads...).
        load: builds the engine: ``config -> (generate, {"versions": ..., "settings": ...})``.
    """
    workload = json.loads(Path(config["workload"]).read_text(encoding="utf-8"))
    cases = [Case(**c) for c in config["cases"]]
    started = time.perf_counter()
    generate, about = load(config)
    load_seconds = time.perf_counter() - started
    load_rss = current_rss_mib()
    results = measure(generate, workload["sentences"], cases, int(config["repeats"]), config.get("warmup_sentences"))
    result = {
        "engine": config["engine"],
        "load_seconds": load_seconds,
        "rss_after_load_mib": load_rss,
        "peak_rss_mib": peak_rss_mib(),
        "python": sys.executable,
        **about,
        "cases": results,
    }
    _write_json_atomic(Path(config["result"]), result)


# ---------------------------------------------------------------------------------------------------------------
# The mtgate worker (``python -m serving.bench WORKER_CONFIG``).


class _IdsTokenizer:
    """Texts that are space-separated token ids: the bench feeds every engine the same ids."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


def _load_mtgate(config: dict[str, Any]) -> tuple[GenerateFn, dict[str, Any]]:
    from serving.engine import DecodeOptions, Translator

    translator = Translator.load(config["package"], runtime=config["runtime"], precision=config["precision"],
                                 threads=int(config["threads"]))
    decoding = translator.info.decoding
    eos = translator.ids.eos
    # Exactly new_tokens tokens: EOS can never be chosen and the cap (EOS included) is new_tokens; no forced EOS.
    forced = dataclasses.replace(
        decoding,
        max_length=int(config["new_tokens"]),
        extra_length=None,
        forced_eos=False,
        bad_word_ids=tuple(sorted({*decoding.bad_word_ids, eos})),
    )
    translator.info = dataclasses.replace(translator.info, decoding=forced)
    translator.tokenizer = _IdsTokenizer()

    def generate(batch: list[list[int]], beam: int) -> list[list[int]]:
        texts = [" ".join(map(str, ids)) for ids in batch]
        return [t.token_ids for t in translator.translate(texts, DecodeOptions(beam_size=beam))]

    about = {
        "versions": package_versions(["mtgate", "onnxruntime", "openvino", "numpy"]),
        "settings": {"runtime": config["runtime"], "precision": config["precision"], "threads": config["threads"],
                     "decoding": dataclasses.asdict(forced)},
    }
    return generate, about


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of an mtgate engine process: ``python -m serving.bench WORKER_CONFIG.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m serving.bench WORKER_CONFIG.json\n")
        return 2
    logging.basicConfig(level=os.environ.get("MTGATE_BENCH_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    run_worker(config, _load_mtgate)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Workload


def read_sentences(path: Path, count: int) -> list[str]:
    """The first ``count`` non-empty lines of a text file (``.gz`` read as gzip)."""
    opener = gzip.open if path.suffix == ".gz" else open
    lines: list[str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                lines.append(line)
                if len(lines) == count:
                    break
    return lines


def random_ids_like(texts: Sequence[str], vocab_size: int, special: Sequence[int], seed: int,
                    tokens_per_word: float = TOKENS_PER_WORD) -> list[list[int]]:
    """Random source ids: ``round(words x tokens_per_word)`` (>= 1) ids per text, none of them special."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(list(special), dtype=np.int64))
    sentences: list[list[int]] = []
    for text in texts:
        n = max(1, round(len(text.split()) * tokens_per_word))
        sentences.append(rng.choice(allowed, size=n).astype(int).tolist())
    return sentences


def workload_summary(sentences: Sequence[Sequence[int]]) -> dict[str, Any]:
    lengths = np.array([len(s) + 1 for s in sentences])  # + EOS
    return {
        "sentences": len(sentences),
        "source_tokens_incl_eos": {"total": int(lengths.sum()), "mean": round(float(lengths.mean()), 2),
                                   "min": int(lengths.min()), "max": int(lengths.max())},
    }


def outputs_digest(outputs: Sequence[Sequence[int]]) -> str:
    return hashlib.sha256(json.dumps([list(o) for o in outputs]).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# Analysis


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


def summarize_case(raw: dict[str, Any], sentences: int, new_tokens: int) -> dict[str, Any]:
    """Median tokens/s, spread, ms/sentence, CPU use and the token-count check of one case."""
    seconds = [float(s) for s in raw["seconds"]]
    median = statistics.median(seconds)
    tokens = int(raw["tokens"])
    runs = [tokens / s for s in seconds]
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
        "spread": round((max(seconds) - min(seconds)) / median, 4),
        "ms_per_sentence": round(1000.0 * median / max(1, sentences), 2),
        "cpu_per_wall": round(statistics.median(c / s for c, s in zip(raw["cpu_seconds"], seconds, strict=True)), 2),
        "outputs_sha256": outputs_digest(raw["outputs"]),
    }


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
            peer_tps = best_peer["cases"][index]["tokens_per_s"]
            for engine in ok:
                if valid(engine, index):
                    engine["cases"][index]["vs_best_peer"] = round(engine["cases"][index]["tokens_per_s"] / peer_tps, 3)
        if best_peer is not None and best_mtgate is not None:
            speedup = best_mtgate["cases"][index]["tokens_per_s"] / best_peer["cases"][index]["tokens_per_s"]
            entry["speedup"] = round(speedup, 3)
            entry["speedup_ok"] = speedup >= targets["speedup"]
            met &= entry["speedup_ok"]
            if case.batch == 1:
                latency = best_mtgate["cases"][index]["ms_per_sentence"] / best_peer["cases"][index]["ms_per_sentence"]
                entry["latency_ratio"] = round(latency, 3)
                entry["latency_ok"] = latency <= targets["latency"]
                met &= entry["latency_ok"]
        if best_fp32_peer is not None and best_fp32_mtgate is not None:
            ratio = best_fp32_mtgate["cases"][index]["tokens_per_s"] / best_fp32_peer["cases"][index]["tokens_per_s"]
            entry["fp32_ratio"] = round(ratio, 3)
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


# ---------------------------------------------------------------------------------------------------------------
# Reports


def _fmt_tps(row: dict[str, Any] | None, with_ms: bool) -> str:
    if row is None:
        return "-"
    text = f"{row['tokens_per_s']:.0f}"
    if with_ms:
        text += f" ({row['ms_per_sentence']:.0f})"
    if not row["tokens_ok"]:
        text += " (!)"
    return text


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: results table, ratios, checks, workload, versions and the command."""
    cases = [Case(c["beam"], c["batch"]) for c in report["workload"]["cases"]]
    header = ["engine"] + [f"{c.name}" + (" (ms/sentence)" if c.batch == 1 else "") for c in cases]
    header += ["spread max", "peak RSS MiB"]
    lines = [f"# mtgate bench {report['created']}", ""]
    machine = report["machine"]
    busiest = max([*machine["load_start"][:1], *machine["load_end"][:1]])
    if machine["cores"] and busiest > 0.5 * machine["cores"]:
        lines += [f"**Warning:** load average {busiest} on {machine['cores']} cores during the run: other processes "
                  "competed for the CPU, so these numbers are not comparable with an idle machine's.", ""]
    lines += ["Generated target tokens per second (median of the timed passes); at batch 1 also ms per sentence.", "",
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
        lines += ["", f"Ratios (targets: best mtgate >= {t['speedup']}x best peer; ms/sentence at batch 1 <= "
                      f"{t['latency']}x; best mtgate fp32 >= {t['fp32']}x best fp32 peer):", "",
                  "| case | best peer | best mtgate | speedup | ms ratio b1 | best fp32 peer | best mtgate fp32 | fp32 ratio |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in comparison:
            def mark(key: str, ok_key: str, r: dict[str, Any] = row) -> str:
                if key not in r:
                    return "-"
                return f"{r[key]:.2f}x {'ok' if r[ok_key] else 'MISSED'}"
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
              f"{sorted({c.batch for c in cases})}; warm-up, then {w['repeats']} timed passes; {w['threads']} threads",
              f"- machine: {report['machine']['cpu']}, {report['machine']['cores']} cores; load average at start "
              f"{report['machine']['load_start']}, at end {report['machine']['load_end']}",
              "", "## Engines", "", "| engine | versions | settings |", "|---|---|---|"]
    for engine in report["engines"]:
        versions = ", ".join(f"{k} {v}" for k, v in engine.get("versions", {}).items())
        settings = ", ".join(f"{k}={v}" for k, v in engine.get("settings", {}).items() if k != "decoding")
        lines.append(f"| {engine['id']} | {versions} | {settings} |")
    lines += ["", "Command:", "", "```", report["command"], "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The harness


def _write_json_atomic(path: Path, data: Any) -> None:
    _write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def _write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _csv_ints(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from e
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {value!r}")
    return numbers


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mtgate" / "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, metavar="DIR",
                        help="Hugging Face Marian directory (default: a random-weight model of --preset's shape)")
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help="shape of the random-weight model (default: opus-mt-en-de; tiny with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model and ids (default 0)")
    parser.add_argument("--sentences", type=Path, default=None, metavar="FILE",
                        help="source sentences, one per line (default: Multi30k test_2016 EN)")
    parser.add_argument("-n", "--num-sentences", type=int, default=None, help="sentences to use (default 64)")
    parser.add_argument("--new-tokens", type=int, default=None, help="generated tokens per sentence (default 32)")
    parser.add_argument("--beams", type=_csv_ints, default=None, help="beam sizes (default 1,4)")
    parser.add_argument("--batch-sizes", type=_csv_ints, default=None, help="sentences per batch (default 1,16)")
    parser.add_argument("--engines", default=None,
                        help="comma-separated engine ids, or 'all', 'mtgate', 'peers' (default all; mtgate with "
                             "--quick); ids: mtgate-{onnxruntime,openvino}-{fp32,int8}, "
                             + ", ".join(e.id for e in PEER_ENGINES))
    parser.add_argument("--repeats", type=int, default=None, help="timed passes per case (default 3)")
    parser.add_argument("--warmup-sentences", type=int, default=None,
                        help="sentences decoded before timing each case (default max(4, 2 x batch size))")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--peer-python", type=Path, default=None,
                        help=f"interpreter with the bench extra for the peers (default {DEFAULT_PEER_PYTHON} if it "
                             "exists, else this one)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where models and converted artifacts are kept (default ~/.cache/mtgate/bench)")
    parser.add_argument("-o", "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help=f"where the JSON and Markdown reports go (default {DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--name", default=None, help="report file stem (default bench-<UTC time>)")
    parser.add_argument("--no-verify", action="store_true", help="skip the parity check of mtgate convert")
    parser.add_argument("--engine-timeout", type=float, default=7200.0, help="seconds per engine process")
    parser.add_argument("--check-targets", action="store_true",
                        help="exit 1 when a target is missed or an engine generated the wrong number of tokens")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: tiny model, 4 sentences, 8 tokens, 1 pass, mtgate engines only")


@dataclass
class Plan:
    """Resolved arguments."""

    model: Path | None
    preset: str
    seed: int
    sentences_file: Path
    num_sentences: int
    new_tokens: int
    cases: list[Case]
    engine_ids: list[str] | None  # None: every available engine of the selected families
    families: set[str]
    repeats: int
    warmup_sentences: int | None
    threads: int
    peer_python: Path
    cache_dir: Path
    output_dir: Path
    name: str
    verify: bool
    timeout: float
    precisions: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


def _plan(args: argparse.Namespace) -> Plan:
    from serving.cli import UsageError

    quick = bool(args.quick)
    if args.model is not None and not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
    sentences_file = args.sentences or DEFAULT_SENTENCES
    if not sentences_file.is_file():
        raise UsageError(f"--sentences {sentences_file}: no such file")
    for flag, value in (("--num-sentences", args.num_sentences), ("--new-tokens", args.new_tokens),
                        ("--repeats", args.repeats), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    engines = (args.engines or ("mtgate" if quick else "all")).strip()
    families: set[str] = set()
    engine_ids: list[str] | None = None
    if engines in ("all", "mtgate", "peers"):
        families = {"mtgate", "peer"} if engines == "all" else {"mtgate" if engines == "mtgate" else "peer"}
    else:
        engine_ids = [e.strip() for e in engines.split(",") if e.strip()]
        known = {e.id for e in PEER_ENGINES} | {e.id for e in mtgate_engines()}
        unknown = [e for e in engine_ids if e not in known]
        if unknown:
            raise UsageError(f"unknown engine(s) {', '.join(unknown)} (known: all, mtgate, peers, "
                             f"{', '.join(sorted(known))})")
        families = {"mtgate" if e.startswith("mtgate-") else "peer" for e in engine_ids}
    beams = args.beams or [1, 4]
    batch_sizes = args.batch_sizes or ([1, 4] if quick else [1, 16])
    peer_python = args.peer_python or (DEFAULT_PEER_PYTHON if DEFAULT_PEER_PYTHON.exists() else Path(sys.executable))
    if "peer" in families and not peer_python.exists():
        raise UsageError(f"--peer-python {peer_python}: no such interpreter")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Plan(
        model=args.model,
        preset=args.preset or ("tiny" if quick else "opus-mt-en-de"),
        seed=args.seed,
        sentences_file=sentences_file,
        num_sentences=args.num_sentences or (4 if quick else 64),
        new_tokens=args.new_tokens or (8 if quick else 32),
        cases=[Case(beam, batch) for beam in beams for batch in batch_sizes],
        engine_ids=engine_ids,
        families=families,
        repeats=args.repeats or (1 if quick else 3),
        warmup_sentences=args.warmup_sentences if args.warmup_sentences is not None else (1 if quick else None),
        threads=args.threads,
        peer_python=peer_python,
        cache_dir=args.cache_dir or _default_cache(),
        output_dir=args.output_dir,
        name=args.name or f"{'quick' if quick else 'bench'}-{stamp}",
        verify=not (args.no_verify or quick),
        timeout=args.engine_timeout,
        precisions=["fp32"] if quick else ["fp32", "int8"],
    )


def _worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[name] = str(threads)
    env.update({"TOKENIZERS_PARALLELISM": "false", "USE_TF": "0", "TF_CPP_MIN_LOG_LEVEL": "3",
                "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    return env


def _run(cmd: list[str], what: str, timeout: float, env: dict[str, str] | None = None,
         log: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a step; with ``log``, its stdout and stderr also go to that file (kept for the slow preparation steps)."""
    logger.info("%s: %s", what, " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(cmd)}\n{result.stdout}\n{result.stderr}", encoding="utf-8")
    return result


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:])


def _model_key(model: Path) -> str:
    """A cache key for a model directory: its config and the size and mtime of its files."""
    digest = hashlib.sha256()
    for path in sorted(model.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    digest.update((model / "config.json").read_bytes())
    return f"{model.name}-{digest.hexdigest()[:12]}"


def _ensure_model(plan: Plan, python: Path, progress: Callable[[str], None]) -> tuple[Path, Path]:
    """The HF model directory and its cache folder (a random model is built once per preset and seed)."""
    if plan.model is not None:
        model = plan.model.resolve()
        return model, plan.cache_dir / _model_key(model)
    folder = plan.cache_dir / f"random-{plan.preset}-seed{plan.seed}"
    model = folder / "hf"
    if not (model / "config.json").is_file():
        progress(f"building the random {plan.preset} model (seed {plan.seed}) in {model}")
        result = _run([str(python), str(PEERS_SCRIPT), "make-model", "--preset", plan.preset, "--seed",
                       str(plan.seed), "--out", str(model)], "make-model", 3600, _worker_env(plan.threads),
                      folder / "logs" / "make-model.log")
        if result.returncode != 0:
            raise RuntimeError(f"building the random model failed ({folder / 'logs'}): {_tail(result.stderr)}")
    return model, folder


def _ensure_package(plan: Plan, model: Path, folder: Path, progress: Callable[[str], None]) -> Path:
    from serving.package import PackageError, read_manifest

    package = folder / f"mtgate-package-{'-'.join(plan.precisions)}"
    try:
        read_manifest(package)  # there, and in the package format this mtgate reads
        return package
    except PackageError:
        pass  # not converted yet, or by an mtgate that wrote another format
    progress(f"converting {model} with mtgate convert into {package}")
    cmd = [sys.executable, "-m", "serving.cli", "convert", str(model), "-o", str(package), "--overwrite",
           "--runtimes", "onnxruntime,openvino", "--precision", ",".join(plan.precisions), "--name", "bench"]
    if not plan.verify:
        cmd.append("--no-verify")
    result = _run(cmd, "mtgate convert", 7200, _worker_env(plan.threads), folder / "logs" / f"{package.name}.log")
    if result.returncode != 0:
        raise RuntimeError(f"mtgate convert failed ({folder / 'logs'}): {_tail(result.stderr or result.stdout)}")
    return package


def _build_workload(plan: Plan, model: Path, package: Path) -> tuple[list[list[int]], str]:
    from serving.package import load_manifest
    from serving.tokenizers import load_tokenizer

    texts = read_sentences(plan.sentences_file, plan.num_sentences)
    if not texts:
        from serving.cli import UsageError

        raise UsageError(f"{plan.sentences_file}: no sentences")
    manifest = load_manifest(package)
    special = manifest["special_ids"]
    if plan.model is None:
        vocab = int(manifest["architecture"]["source_vocab_size"])
        ids = [int(special[k]) for k in ("pad", "eos", "unk", "decoder_start") if special.get(k) is not None]
        return (random_ids_like(texts, vocab, ids, plan.seed),
                f"random ids, {TOKENS_PER_WORD} per word of {plan.sentences_file.name}")
    tokenizer = load_tokenizer(package, manifest["tokenizer"])
    return [tokenizer.encode(t) for t in texts], f"{plan.sentences_file.name} tokenized by the package tokenizer"


def _machine() -> dict[str, Any]:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in ("", platform.machine(), platform.processor()):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    interesting = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni"]
    return {"cpu": cpu, "cores": os.cpu_count(), "flags": [f for f in interesting if f in flags],
            "load_start": [round(x, 2) for x in os.getloadavg()], "platform": platform.platform(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None


def _selected_engines(plan: Plan, package: Path) -> list[EngineSpec]:
    from serving.package import load_manifest

    artifacts = {(a["runtime"], a["precision"]) for a in load_manifest(package)["artifacts"]}
    engines = [e for e in mtgate_engines() if (e.runtime, e.precision) in artifacts] + list(PEER_ENGINES)
    if plan.engine_ids is not None:
        chosen = [e for e in engines if e.id in plan.engine_ids]
        missing = set(plan.engine_ids) - {e.id for e in chosen}
        if missing:
            from serving.cli import UsageError

            raise UsageError(f"the package has no artifact for {', '.join(sorted(missing))}")
        return chosen
    return [e for e in engines if e.family in plan.families]


def _peer_libraries(plan: Plan) -> dict[str, Any]:
    result = _run([str(plan.peer_python), str(PEERS_SCRIPT), "versions"], "peer versions", 300,
                  _worker_env(plan.threads))
    if result.returncode != 0:
        return {"error": _tail(result.stderr)}
    return dict(json.loads(result.stdout))


def _ensure_peer_artifact(plan: Plan, engine: EngineSpec, model: Path, folder: Path,
                          progress: Callable[[str], None]) -> Path | None:
    if engine.artifact is None:
        return None
    path = folder / "peers" / engine.artifact
    if not (path / ".complete").is_file():
        progress(f"preparing {engine.artifact} from {model}")
        result = _run([str(plan.peer_python), str(PEERS_SCRIPT), "prepare", "--artifact", engine.artifact,
                       "--model", str(model), "--out", str(path)], f"prepare {engine.artifact}", 7200,
                      _worker_env(plan.threads), folder / "logs" / f"prepare-{engine.artifact}.log")
        if result.returncode != 0:
            raise RuntimeError(f"preparing {engine.artifact} failed ({folder / 'logs'}): {_tail(result.stderr)}")
    return path


def _run_engine(plan: Plan, engine: EngineSpec, run_dir: Path, worker_config: dict[str, Any],
                progress: Callable[[str], None]) -> dict[str, Any]:
    config_path = run_dir / f"{engine.id}.config.json"
    result_path = run_dir / f"{engine.id}.result.json"
    config = {**worker_config, "engine": engine.id, "result": str(result_path)}
    _write_json_atomic(config_path, config)
    if engine.family == "mtgate":
        cmd = [sys.executable, "-m", "serving.bench", str(config_path)]
    else:
        cmd = [str(plan.peer_python), str(PEERS_SCRIPT), "run", str(config_path)]
    progress(f"running {engine.id}")
    started = time.perf_counter()
    try:
        done = _run(cmd, engine.id, plan.timeout, _worker_env(plan.threads), run_dir / f"{engine.id}.log")
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"no result within {plan.timeout:.0f}s"}
    if done.returncode != 0 or not result_path.is_file():
        return {"status": "failed", "error": f"exit {done.returncode}: {_tail(done.stderr)}"}
    result = dict(json.loads(result_path.read_text(encoding="utf-8")))
    result["status"] = "ok"
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    return result


def run(args: argparse.Namespace) -> int:
    """``mtgate bench``: run the comparison and write ``<output-dir>/<name>.json`` and ``.md``."""
    from serving.cli import UsageError

    plan = _plan(args)

    def progress(message: str) -> None:
        sys.stderr.write(f"mtgate bench: {message}\n")
        sys.stderr.flush()

    machine = _machine()
    plan.cache_dir.mkdir(parents=True, exist_ok=True)
    # The random model needs torch + transformers: the peers' interpreter has them; this one may not.
    maker = Path(sys.executable) if _has_module("transformers") else plan.peer_python
    try:
        model, folder = _ensure_model(plan, maker, progress)
        package = _ensure_package(plan, model, folder, progress)
    except RuntimeError as e:
        raise UsageError(str(e)) from e
    sentences, sentences_from = _build_workload(plan, model, package)
    engines = _selected_engines(plan, package)
    peer_libraries = _peer_libraries(plan) if any(e.family == "peer" for e in engines) else {}

    run_dir = plan.cache_dir / "runs" / plan.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    workload_path = run_dir / "workload.json"
    _write_json_atomic(workload_path, {"sentences": sentences})
    manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    worker_config = {
        "workload": str(workload_path), "cases": [dataclasses.asdict(c) for c in plan.cases],
        "repeats": plan.repeats, "warmup_sentences": plan.warmup_sentences, "threads": plan.threads,
        "new_tokens": plan.new_tokens, "package": str(package), "model": str(model),
        "special_ids": manifest["special_ids"],
    }

    entries: list[dict[str, Any]] = []
    outputs: dict[str, dict[str, list[list[int]]]] = {}
    for engine in engines:
        entry: dict[str, Any] = {"id": engine.id, "label": engine.label, "family": engine.family,
                                 "precision": engine.precision, "fp32": engine.fp32}
        try:
            artifact = _ensure_peer_artifact(plan, engine, model, folder, progress) if engine.family == "peer" else None
            config = {**worker_config, "artifact": artifact and str(artifact)}
            if engine.runtime is not None:
                config.update(runtime=engine.runtime, precision=engine.precision)
            result = _run_engine(plan, engine, run_dir, config, progress)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            result = {"status": "failed", "error": str(e)}
        entry["status"] = result.pop("status")
        if entry["status"] != "ok":
            entry["error"] = result.get("error", "")
            progress(f"{engine.id}: {entry['status']}: {entry['error']}")
            entries.append(entry)
            continue
        raw_cases = result.pop("cases")
        outputs[engine.id] = {Case(r["beam"], r["batch"]).name: r["outputs"] for r in raw_cases}
        entry.update({k: result[k] for k in ("versions", "settings", "load_seconds", "rss_after_load_mib",
                                             "peak_rss_mib", "wall_seconds") if k in result})
        entry["peak_rss_mib"] = round(float(entry["peak_rss_mib"]), 1)
        entry["cases"] = [summarize_case(r, len(sentences), plan.new_tokens) for r in raw_cases]
        progress(f"{engine.id}: " + ", ".join(f"{Case(r['beam'], r['batch']).name} {r['tokens_per_s']:.0f} tok/s"
                                             for r in entry["cases"]))
        entries.append(entry)

    machine["load_end"] = [round(x, 2) for x in os.getloadavg()]
    targets = {"speedup": 1.25, "latency": 0.8, "fp32": 1.0}
    analysis = analyze(entries, outputs, plan.cases, targets)
    report = {
        "format": FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "mtgate " + " ".join(sys.argv[1:]) if sys.argv and "bench" in sys.argv else "mtgate bench",
        "git_commit": _git_commit(),
        "machine": machine,
        "workload": {
            "model": _model_description(plan, model, manifest),
            **workload_summary(sentences),
            "sentences_from": sentences_from,
            "new_tokens": plan.new_tokens,
            "cases": [dataclasses.asdict(c) for c in plan.cases],
            "repeats": plan.repeats,
            "warmup_sentences": plan.warmup_sentences,
            "threads": plan.threads,
            "seed": plan.seed,
        },
        "peer_python": str(plan.peer_python) if peer_libraries else None,
        "peer_libraries": peer_libraries,
        "engines": entries,
        "analysis": analysis,
    }
    json_path = plan.output_dir / f"{plan.name}.json"
    md_path = plan.output_dir / f"{plan.name}.md"
    markdown = render_markdown(report)
    _write_json_atomic(json_path, report)
    _write_text_atomic(md_path, markdown)
    sys.stdout.write(markdown)
    sys.stdout.write(f"\nwrote {json_path} and {md_path}\n")
    if args.check_targets and not analysis["targets_met"]:
        return 1
    return 0 if any(e["status"] == "ok" for e in entries) else 1


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _model_description(plan: Plan, model: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    arch = manifest["architecture"]
    shape = (f"vocab {arch['target_vocab_size']}, d_model {arch['d_model']}, {arch['encoder_layers']}+"
             f"{arch['decoder_layers']} layers, {arch['num_heads']} heads, ffn {arch['ffn_dim']}, {arch['activation']}")
    kind = f"random weights ({plan.preset} shape, seed {plan.seed})" if plan.model is None else str(plan.model)
    return {"path": str(model), "kind": "random" if plan.model is None else "directory",
            "description": f"Marian, {kind}: {shape}", "architecture": arch}


if __name__ == "__main__":
    sys.exit(worker_main())
