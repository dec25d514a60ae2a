"""A run of the benchmark: the model and its conversions (built once, cached), the engines' rounds
(``benchmarks.bench.rounds``), the reports.

The cache folder (``--cache-dir``) holds, per model, the mtgate package converted from it, the peers' artifacts, the
logs of the slow preparation steps and each run's worker configs and results (``runs/<name>/``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.bench.analysis import analyze, merge_rounds, summarize_case
from benchmarks.bench.engines import PEER_ENGINES, TEXT_PEER_ENGINES, EngineSpec, mtgate_engines
from benchmarks.bench.measure import Case, write_json
from benchmarks.bench.plan import NAME, Plan
from benchmarks.bench.report import publish, render_markdown
from benchmarks.bench.rounds import PEERS_SCRIPT, Unit, run_rounds, worker_env
from benchmarks.bench.rounds import run_command as _run
from benchmarks.bench.rounds import tail as _tail
from benchmarks.bench.workload import ROOT, WorkloadError, build_workload, workload_summary
from serving.commands.options import UsageError
from serving.package import Manifest, open_package
from serving.package.files import atomic_write_text

logger = logging.getLogger(__name__)

FORMAT = "mtgate-bench/1"
TARGETS = {"speedup": 1.25, "latency": 0.8, "fp32": 1.0}


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
    if plan.checkpoint is not None:
        model = plan.checkpoint.resolve()
        return model, plan.cache_dir / _model_key(model)
    folder = plan.cache_dir / f"random-{plan.preset}-seed{plan.seed}"
    model = folder / "hf"
    if not (model / "config.json").is_file():
        progress(f"building the random {plan.preset} model (seed {plan.seed}) in {model}")
        result = _run([str(python), str(PEERS_SCRIPT), "make-model", "--preset", plan.preset, "--seed",
                       str(plan.seed), "--out", str(model)], "make-model", 3600, worker_env(plan.threads),
                      folder / "logs" / "make-model.log")
        if result.returncode != 0:
            raise RuntimeError(f"building the random model failed ({folder / 'logs'}): {_tail(result.stderr)}")
    return model, folder


def converter_stamp() -> str:
    """A digest of the code that decides what a package holds (``converters/``, ``serving/package/``): the bench's
    cached package is converted again when it changes, even within one package format (a graph optimization does
    not bump the format, and a stale package would be measured in its place). The Makefile rebuilds the demo package
    on the same rule."""
    digest = hashlib.sha256()
    for folder in ("converters", "serving/package"):
        for path in sorted((ROOT / folder).glob("*.py")):
            digest.update(f"{folder}/{path.name}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _ensure_package(plan: Plan, model: Path, folder: Path, progress: Callable[[str], None]) -> Path:
    from serving.package import PackageError

    package = folder / f"mtgate-package-{'-'.join(plan.precisions)}"
    stamp_file = folder / f"{package.name}.converter"
    stamp = converter_stamp()
    try:
        open_package(package, verify=False)  # there, and in the package format this mtgate reads
        if stamp_file.is_file() and stamp_file.read_text(encoding="utf-8").strip() == stamp:
            return package
        progress(f"the converter changed since {package} was converted")
    except PackageError:
        pass  # not converted yet, or by an mtgate that wrote another format
    progress(f"converting {model} with mtgate convert into {package}")
    cmd = [sys.executable, "-m", "serving.commands.main", "convert", str(model), "-o", str(package), "--overwrite",
           "--runtimes", "onnxruntime,openvino", "--precision", ",".join(plan.precisions), "--name", "bench"]
    if not plan.verify:
        cmd.append("--no-verify")
    result = _run(cmd, "mtgate convert", 7200, worker_env(plan.threads), folder / "logs" / f"{package.name}.log")
    if result.returncode != 0:
        raise RuntimeError(f"mtgate convert failed ({folder / 'logs'}): {_tail(result.stderr or result.stdout)}")
    atomic_write_text(stamp_file, stamp + "\n")
    return package


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
    artifacts = {(a.runtime, a.precision) for a in open_package(package).manifest.artifacts}
    peers = TEXT_PEER_ENGINES if plan.text else PEER_ENGINES
    engines = [e for e in mtgate_engines() if (e.runtime, e.precision) in artifacts] + list(peers)
    if plan.engine_ids is not None:
        chosen = [e for e in engines if e.id in plan.engine_ids]
        missing = set(plan.engine_ids) - {e.id for e in chosen}
        if missing:
            raise UsageError(f"the package has no artifact for {', '.join(sorted(missing))}")
        return chosen
    return [e for e in engines if e.family in plan.families]


def _peer_libraries(plan: Plan) -> dict[str, Any]:
    result = _run([str(plan.peer_python), str(PEERS_SCRIPT), "versions"], "peer versions", 300,
                  worker_env(plan.threads))
    if result.returncode != 0:
        return {"error": _tail(result.stderr)}
    return dict(json.loads(result.stdout))


def run(plan: Plan, command: Sequence[str] = ("python", "-m", "benchmarks.bench")) -> int:
    """Run the comparison and write ``<output-dir>/<name>.json`` and ``.md``; returns the exit code.

    Arguments:
        plan: what to run.
        command: the command line, recorded in the reports.

    Raises:
        UsageError: the model cannot be built or converted, the sentences make no workload, or an engine asked for
            has no artifact in the package.
    """

    def progress(message: str) -> None:
        sys.stderr.write(f"{NAME}: {message}\n")
        sys.stderr.flush()

    machine = _machine()
    plan.cache_dir.mkdir(parents=True, exist_ok=True)
    # The random model needs torch + transformers: the peers' interpreter has them; this one may not.
    maker = Path(sys.executable) if _has_module("transformers") else plan.peer_python
    try:
        model, folder = _ensure_model(plan, maker, progress)
        package = plan.package or _ensure_package(plan, model, folder, progress)
    except RuntimeError as e:
        raise UsageError(str(e)) from e
    if plan.text:
        from benchmarks.bench.text import run_text

        engines = _selected_engines(plan, package)
        header = {"format": FORMAT, "created": datetime.now(UTC).isoformat(timespec="seconds"),
                  "command": " ".join(command), "git_commit": _git_commit(), "machine": machine}
        peer_libraries = _peer_libraries(plan) if any(e.family == "peer" for e in engines) else {}
        return run_text(plan, header, model, folder, package, engines, peer_libraries, progress)
    try:
        sentences, sentences_from = build_workload(plan.sentences_file, plan.num_sentences, package,
                                                   random=plan.checkpoint is None, seed=plan.seed)
    except WorkloadError as e:
        raise UsageError(str(e)) from e
    engines = _selected_engines(plan, package)
    peer_libraries = _peer_libraries(plan) if any(e.family == "peer" for e in engines) else {}

    run_dir = plan.cache_dir / "runs" / plan.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    workload_path = run_dir / "workload.json"
    write_json(workload_path, {"sentences": sentences})
    manifest = open_package(package, verify=False).manifest
    worker_config = {  # each process also gets its "cases" (below)
        "workload": str(workload_path),
        "repeats": plan.repeats, "warmup_sentences": plan.warmup_sentences, "threads": plan.threads,
        "new_tokens": plan.new_tokens, "package": str(package), "model": str(model),
        "special_ids": dataclasses.asdict(manifest.special_ids),
    }

    # With --interleave case a process per engine, case and round, else per engine and round.
    if plan.interleave == "case" and len(plan.cases) > 1:
        units = [Unit(plan.threads, [case], f"case{i + 1}") for i, case in enumerate(plan.cases)]
    else:
        units = [Unit(plan.threads, list(plan.cases), "")]
    runs, failures = run_rounds(plan, engines, units, worker_config, run_dir, model, folder, progress)
    results: dict[str, list[dict[str, Any]]] = {e.id: [r.result for r in runs if r.engine == e.id] for e in engines}

    entries: list[dict[str, Any]] = []
    outputs: dict[str, dict[str, list[list[int]]]] = {}
    for engine in engines:
        entry: dict[str, Any] = {"id": engine.id, "label": engine.label, "family": engine.family,
                                 "precision": engine.precision, "fp32": engine.fp32}
        if engine.id in failures:
            entry.update(status="failed", error=failures[engine.id].get("error", ""))
            entries.append(entry)
            continue
        rounds = results[engine.id]
        raw_cases = merge_rounds([r["cases"] for r in rounds], plan.cases)
        outputs[engine.id] = {Case(r["beam"], r["batch"]).name: r["outputs"] for r in raw_cases}
        entry["status"] = "ok"
        entry.update({k: rounds[0][k] for k in ("versions", "settings") if k in rounds[0]})
        entry["load_seconds"] = round(statistics.median(float(r["load_seconds"]) for r in rounds), 2)
        entry["rss_after_load_mib"] = rounds[-1].get("rss_after_load_mib")
        entry["peak_rss_mib"] = round(max(float(r["peak_rss_mib"]) for r in rounds), 1)
        entry["wall_seconds"] = round(sum(float(r["wall_seconds"]) for r in rounds), 1)
        entry["cases"] = [summarize_case(r, len(sentences), plan.new_tokens) for r in raw_cases]
        entries.append(entry)

    machine["load_end"] = [round(x, 2) for x in os.getloadavg()]
    analysis = analyze(entries, outputs, plan.cases, TARGETS)
    report = {
        "format": FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(command),
        "git_commit": _git_commit(),
        "machine": machine,
        "workload": {
            "model": _model_description(plan, model, manifest),
            **workload_summary(sentences),
            "sentences_from": sentences_from,
            "new_tokens": plan.new_tokens,
            "cases": [dataclasses.asdict(c) for c in plan.cases],
            "rounds": plan.rounds,
            "interleave": plan.interleave,
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
    return publish(plan, report, render_markdown)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _model_description(plan: Plan, model: Path, manifest: Manifest) -> dict[str, Any]:
    arch = dataclasses.asdict(manifest.architecture)
    shape = (f"vocab {arch['target_vocab_size']}, d_model {arch['d_model']}, {arch['encoder_layers']}+"
             f"{arch['decoder_layers']} layers, {arch['num_heads']} heads, ffn {arch['ffn_dim']}, {arch['activation']}")
    kind = f"random weights ({plan.preset} shape, seed {plan.seed})" if plan.checkpoint is None else str(plan.checkpoint)
    return {"path": str(model), "kind": "random" if plan.checkpoint is None else "directory",
            "description": f"Marian, {kind}: {shape}", "architecture": arch}
