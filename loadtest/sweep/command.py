"""``mtgate sweep SWEEP.yaml``: measure serving configurations under the scenarios' load, and pick the cheapest one
that meets every target, with the replicas, cost and Kubernetes resources it implies.

Each point (``loadtest.sweep.config.Point``) starts its replicas of ``mtgate serve`` on loopback ports and runs
every scenario against them at once (the scenario's users split over the replicas; counts add up, percentiles are
the worst replica's). A finished point is saved in ``REPORT/points/<key>.json``: run the same command again and it
is not measured again (a changed package, scenario or setting is a new key). Bounded: every Locust run by its run
time, a run by ``budget`` (points and minutes), each server start by ``--server-timeout``.

Pruning, as Model Analyzer's quick search stops climbing where nothing can improve, within a group of points that
differ only in batch size and delay (tried in ascending order):
- a delay is not tried when a shorter one already missed a latency target at that batch size: under the same load,
  waiting longer for fuller batches does not make requests faster;
- a batch size is not tried when, at a smaller limit, none of the server's own batches (``/metrics``
  histogram) reached that limit: raising it changes nothing.
Exit 0 when a configuration meets every target, 1 when none does, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from loadtest.errors import LoadTestError
from loadtest.gate import Check, evaluate
from loadtest.locust_run import resolve_corpus, run_scenario
from loadtest.scrape import ServerMetrics
from loadtest.server import package_model_name, start_server
from loadtest.stats import RunStats, merge_runs
from loadtest.sweep.config import Point, Sweep, check_packages, load_sweep
from loadtest.sweep.results import PointResult, ScenarioSummary, cheapest
from loadtest.targets import Scenario, TargetsError

logger = logging.getLogger(__name__)

LATENCY_KEYS = frozenset({"p50_ms", "p95_ms", "p99_ms", "ttfe_p50_ms", "ttfe_p95_ms", "ttfe_p99_ms"})


def _usage_error(message: str) -> Exception:
    from serving.commands.options import UsageError

    return UsageError(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from serving.commands.options import positive_float, positive_int

    parser.add_argument("sweep", type=Path, metavar="SWEEP.yaml", help="sweep file: models, search space, targets, "
                                                                         "load and prices (see loadtest/sweeps/)")
    parser.add_argument("--report", type=Path, help="report directory, also where finished points are kept for a "
                                                    "rerun (default: reports/sweep-<name>)")
    parser.add_argument("--max-points", type=positive_int, metavar="N",
                        help="measure at most N points in this run (default: the file's budget)")
    parser.add_argument("--max-minutes", type=positive_float, metavar="M",
                        help="start no point after M minutes (default: the file's budget)")
    parser.add_argument("--dry-run", action="store_true", help="list the points and exit")
    parser.add_argument("--server-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                        help="seconds to wait for each replica to become ready (default: 120)")
    parser.add_argument("--tensorboard", type=Path, metavar="DIR",
                        help="also write every point's scalars and the result for TensorBoard into a new run "
                             "directory under DIR")


# ---------------------------------------------------------------- measuring


def point_key(point: Point, scenarios: list[Scenario]) -> str:
    """Identifies a measurement: the settings, the scenarios, and the package's manifest (a new build reruns)."""
    manifest = hashlib.sha256((point.model / "manifest.json").read_bytes()).hexdigest()
    text = json.dumps([point.to_json(), [s.model_dump(mode="json") for s in scenarios], manifest], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM, Linux), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def summarize(scenario: Scenario, run: RunStats, checks: list[Check], server: ServerMetrics | None) -> ScenarioSummary:
    requests = run.request_entries
    total = sum(e.requests for e in requests)
    p95 = [v for e in requests if e.requests and (v := e.percentile("95%")) is not None]
    tokens = run.tokens
    whole = server.whole_run() if server is not None else None
    batches = (server.samples[-1].batch_size.minus(server.samples[0].batch_size)
               if server is not None and len(server.samples) > 1 else None)
    return ScenarioSummary(
        name=scenario.name, passed=bool(checks) and all(c.passed for c in checks),
        missed=[f"{c.target} (measured {c.measured_text})" for c in checks if not c.passed],
        latency_missed=any(not c.passed and c.key in LATENCY_KEYS for c in checks),
        p95_ms=max(p95) if p95 else None, requests_per_s=sum(e.rps for e in requests),
        output_tokens_per_s=tokens.output_tokens_per_s if tokens is not None and tokens.output_tokens else None,
        tokens_per_request=tokens.output_tokens / total if tokens is not None and total else None,
        error_rate=sum(e.failures for e in requests) / total if total else None,
        batch_size_mean=whole.batch_size_mean if whole else None,
        batch_size_max=batches.upper_bound() if batches is not None else None,
        queue_wait_p95_ms=whole.queue_wait_p95_ms if whole else None)


def measure(sweep: Sweep, point: Point, key: str, directory: Path, server_timeout: float) -> PointResult:
    """Start the point's replicas, run every scenario against all of them at once, merge and gate."""
    started = time.monotonic()
    name = package_model_name(point.model)
    summaries = []
    try:
        with ExitStack() as stack:
            servers = [stack.enter_context(start_server(point.model, directory / f"server-{i}.log", server_timeout,
                                                        point.serve_args()))
                       for i in range(point.replicas)]
            for scenario in sweep.scenarios:
                corpus = resolve_corpus(None, scenario)
                users = max(1, math.ceil(scenario.concurrency / point.replicas))
                share = scenario.model_copy(update={"concurrency": users,
                                                    "spawn_rate": max(1.0, scenario.spawn_rate / point.replicas)})
                with ThreadPoolExecutor(point.replicas) as pool:
                    futures = [pool.submit(run_scenario, s.url, share, directory / scenario.name / f"replica-{i}",
                                           corpus, scenario.model or name) for i, s in enumerate(servers)]
                    results = [f.result() for f in futures]
                merged = merge_runs([r.run for r in results])
                checks = evaluate(scenario.name, scenario.targets, merged)
                summaries.append(summarize(scenario, merged, checks, results[0].server))
            rss = [v for s in servers if (v := _peak_rss_mb(s.process.pid)) is not None]
    except LoadTestError as e:
        return PointResult(point, key, "failed", str(e), seconds=time.monotonic() - started)
    return PointResult(point, key, "measured", scenarios=summaries, rss_mb=max(rss) if rss else None,
                       seconds=time.monotonic() - started)


def prune_reason(point: Point, earlier: list[PointResult]) -> str | None:
    """Why ``point`` cannot win given the measured points of its group (module docstring), or None."""
    for r in earlier:
        if r.status != "measured" or r.point.group != point.group:
            continue
        q = r.point
        if (q.max_batch_size == point.max_batch_size and q.max_queue_delay_us is not None
                and point.max_queue_delay_us is not None and q.max_queue_delay_us < point.max_queue_delay_us
                and any(s.latency_missed for s in r.scenarios)):
            return f"a shorter delay ({q.max_queue_delay_us} us) already missed a latency target"
        if q.max_queue_delay_us == point.max_queue_delay_us and q.max_batch_size < point.max_batch_size:
            largest = [s.batch_size_max for s in r.scenarios if s.batch_size_max is not None]
            if largest and max(largest) < q.max_batch_size:
                return (f"at limit {q.max_batch_size} no batch reached it (all at most {max(largest):g}); a larger "
                        "limit changes nothing")
    return None


def run_sweep(sweep: Sweep, report_dir: Path, max_points: int, max_minutes: float,
              server_timeout: float) -> list[PointResult]:
    """Every point in order: reused when already measured, else pruned, skipped, measured or left for the budget."""
    from serving.package.files import atomic_write_text

    points, skipped = sweep.points()
    keep = report_dir / "points"
    keep.mkdir(parents=True, exist_ok=True)
    results: list[PointResult] = []
    measured_now, started = 0, time.monotonic()
    for point in points:
        key = point_key(point, sweep.scenarios)
        saved = keep / f"{key}.json"
        if saved.exists():
            results.append(PointResult.from_json(json.loads(saved.read_text(encoding="utf-8"))))
            sys.stderr.write(f"point {point.label}: measured before, kept\n")
            continue
        if (reason := prune_reason(point, results)) is not None:
            results.append(PointResult(point, key, "pruned", reason))
            continue
        if measured_now >= max_points or time.monotonic() - started > max_minutes * 60:
            results.append(PointResult(point, key, "not run", "budget reached (run again to continue)"))
            continue
        sys.stderr.write(f"point {len(results) + 1}/{len(points)}: {point.label}\n")
        result = measure(sweep, point, key, keep / key, server_timeout)
        measured_now += 1
        atomic_write_text(saved, json.dumps(result.to_json(), indent=1) + "\n")
        results.append(result)
    results += [PointResult(p, "", "skipped", reason) for p, reason in skipped]
    return results


# ---------------------------------------------------------------- command


def run(args: argparse.Namespace) -> int:
    from loadtest.cli import check_tensorboard, check_writable
    from loadtest.sweep.report import write_sweep_report, write_sweep_tensorboard

    try:
        sweep = load_sweep(args.sweep)
        check_packages(sweep)
    except TargetsError as e:
        raise _usage_error(str(e)) from e
    points, skipped = sweep.points()
    if args.dry_run:
        for p in points:
            sys.stdout.write(f"{p.label}\n")
        for p, reason in skipped:
            sys.stdout.write(f"{p.label}  (skipped: {reason})\n")
        return 0
    report_dir: Path = args.report or Path("reports") / f"sweep-{sweep.file.name}"
    check_writable(report_dir, "--report", directory=True)
    if args.tensorboard is not None:
        check_tensorboard(args.tensorboard)
    budget = sweep.file.budget
    results = run_sweep(sweep, report_dir, args.max_points or budget.max_points,
                        args.max_minutes or budget.max_minutes, args.server_timeout)
    winner = cheapest(sweep, results)
    page, data = write_sweep_report(report_dir, sweep, results, winner)
    for r in results:
        sys.stdout.write(f"{r.status:8}  {'pass' if r.passed else '    '}  {r.point.label}"
                         f"{'  (' + r.reason + ')' if r.reason else ''}\n")
    if winner is None:
        sys.stdout.write(f"no configuration met every target: report {page} and {data}\n")
    else:
        sys.stdout.write(f"cheapest meeting every target: {winner[0].point.label}: report {page} and {data}\n")
    if args.tensorboard is not None:
        sys.stdout.write(f"tensorboard: {write_sweep_tensorboard(args.tensorboard, sweep, results, winner)}\n")
    return 0 if winner is not None else 1
