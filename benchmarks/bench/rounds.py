"""The engine processes of a run: one per engine, unit (cases on a thread count) and round, the engines' order
alternating from one to the next (:func:`run_rounds`), and the commands they and the preparation steps run as."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.engines import EngineSpec
from benchmarks.bench.measure import Case, write_json
from benchmarks.bench.plan import Plan
from benchmarks.bench.workload import ROOT

logger = logging.getLogger(__name__)

PEERS_SCRIPT = ROOT / "benchmarks" / "peers.py"


def worker_env(threads: int) -> dict[str, str]:
    """The environment of an engine or preparation process: ``threads`` for every OpenMP/BLAS pool, no hub access."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[name] = str(threads)
    env.update({"TOKENIZERS_PARALLELISM": "false", "USE_TF": "0", "TF_CPP_MIN_LOG_LEVEL": "3",
                "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    return env


def run_command(cmd: list[str], what: str, timeout: float, env: dict[str, str] | None = None,
                log: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a step; with ``log``, its stdout and stderr also go to that file (kept for the slow preparation steps)."""
    logger.info("%s: %s", what, " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(cmd)}\n{result.stdout}\n{result.stderr}", encoding="utf-8")
    return result


def tail(text: str, lines: int = 6) -> str:
    """The last lines of a process's output, on one line (for an error message)."""
    return " | ".join(line for line in text.strip().splitlines()[-lines:])


def ensure_peer_artifact(plan: Plan, engine: EngineSpec, model: Path, folder: Path,
                         progress: Callable[[str], None]) -> Path | None:
    """The peer artifact ``engine`` loads, converted from ``model`` once (cached in ``folder/peers``)."""
    if engine.artifact is None:
        return None
    path = folder / "peers" / engine.artifact
    if not (path / ".complete").is_file():
        progress(f"preparing {engine.artifact} from {model}")
        result = run_command([str(plan.peer_python), str(PEERS_SCRIPT), "prepare", "--artifact", engine.artifact,
                              "--model", str(model), "--out", str(path)], f"prepare {engine.artifact}", 7200,
                             worker_env(plan.threads), folder / "logs" / f"prepare-{engine.artifact}.log")
        if result.returncode != 0:
            raise RuntimeError(f"preparing {engine.artifact} failed ({folder / 'logs'}): {tail(result.stderr)}")
    return path


def run_engine(plan: Plan, engine: EngineSpec, run_dir: Path, worker_config: dict[str, Any],
               progress: Callable[[str], None], turn: str, threads: int) -> dict[str, Any]:
    """One engine process (mtgate's worker, or the peers' script with the peers' interpreter): its result."""
    stem = f"{engine.id}.{turn}"
    config_path = run_dir / f"{stem}.config.json"
    result_path = run_dir / f"{stem}.result.json"
    config = {**worker_config, "engine": engine.id, "result": str(result_path)}
    write_json(config_path, config)
    if engine.family == "mtgate":
        cmd = [sys.executable, "-m", "benchmarks.bench.mtgate_worker", str(config_path)]
    else:
        cmd = [str(plan.peer_python), str(PEERS_SCRIPT), "run", str(config_path)]
    progress(f"running {engine.id} ({turn})")
    started = time.perf_counter()
    try:
        done = run_command(cmd, engine.id, plan.timeout, worker_env(threads), run_dir / f"{stem}.log")
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"no result within {plan.timeout:.0f}s"}
    if done.returncode != 0 or not result_path.is_file():
        return {"status": "failed", "error": f"exit {done.returncode}: {tail(done.stderr)}"}
    result = dict(json.loads(result_path.read_text(encoding="utf-8")))
    result["status"] = "ok"
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    return result


@dataclasses.dataclass(frozen=True)
class Unit:
    """What one engine process measures: ``cases`` on ``threads`` threads; ``label`` names its files (with the
    round: ``<engine>.round<r>[.<label>]``)."""

    threads: int
    cases: list[Case]
    label: str


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One engine process's result: which engine, round (from 1) and unit."""

    engine: str
    round: int
    unit: Unit
    result: dict[str, Any]


def run_rounds(plan: Plan, engines: Sequence[EngineSpec], units: Sequence[Unit], worker_config: dict[str, Any],
               run_dir: Path, model: Path, folder: Path,
               progress: Callable[[str], None]) -> tuple[list[EngineRun], dict[str, dict[str, Any]]]:
    """Every engine once per unit and round, each in a process of its own, the engines' order reversed from one
    unit to the next and, per unit, from one round to the next, so that a drift of the machine's speed over the run
    weighs on every engine alike (ratios are taken within a round: ``analysis.paired_ratio``). An engine that fails
    once is not run again.

    Returns:
        The runs in the order they ran, and the failed engines' errors.
    """
    runs: list[EngineRun] = []
    failures: dict[str, dict[str, Any]] = {}
    for round_index in range(plan.rounds):
        for unit_index, unit in enumerate(units):
            for engine in engines if (round_index + unit_index) % 2 == 0 else engines[::-1]:
                if engine.id in failures:
                    continue
                try:
                    artifact = (ensure_peer_artifact(plan, engine, model, folder, progress)
                                if engine.family == "peer" else None)
                    config = {**worker_config, "artifact": artifact and str(artifact), "threads": unit.threads,
                              "cases": [dataclasses.asdict(c) for c in unit.cases]}
                    if engine.runtime is not None:
                        config.update(runtime=engine.runtime, precision=engine.precision)
                    stem = f"round{round_index + 1}" + (f".{unit.label}" if unit.label else "")
                    result = run_engine(plan, engine, run_dir, config, progress, stem, unit.threads)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    result = {"status": "failed", "error": str(e)}
                if result.pop("status") != "ok":
                    failures[engine.id] = result
                    progress(f"{engine.id}: failed: {result.get('error', '')}")
                    continue
                runs.append(EngineRun(engine.id, round_index + 1, unit, result))
                progress(f"{engine.id}: " + ", ".join(_rate(r) for r in result["cases"]))
    return runs, failures


def _rate(case: dict[str, Any]) -> str:
    """A measured case in a progress line: tokens/s (and sentences/s in the real-text mode)."""
    seconds = statistics.median(case["seconds"])
    text = f"{Case(case['beam'], case['batch']).name} {case['tokens'] / seconds:.0f} tok/s"
    return text + (f" {case['sentences'] / seconds:.1f} sent/s" if "sentences" in case else "")
