"""Mixed-length traffic at fixed Poisson arrival rates, per batching mode: the ``--workload mixed`` of
``benchmarks.served_batching``. A benchmark, not a test.

    .venv/bin/python -m benchmarks.served_batching --workload mixed --rates 1,2,4,8 --duration 20s --beam-size 4
    .venv/bin/python -m benchmarks.mixed_traffic --modes request,step --rates 2,4,8 --long-fraction 0.25

The servers start as ``served_batching`` starts them (one ``mtgate serve`` per mode of ``--modes`` with
``MTGATE_BATCHING=<mode>``, ``MTGATE_THREADS``, ``MTGATE_PRECISION``, ``MTGATE_RUNTIME``, ``--server-env``), and for
each rate of ``--rates`` the modes take turns, each server idle before its run (the report:
benchmarks/mixed_report.py). The load (benchmarks/mixed_load.py) is open loop: Poisson arrivals at the rate
(exponential gaps, seeded by ``--seed`` and the rate, so both modes get the same requests), each request sent at its
time whatever the others' latency, over ``POST /v1/translate/stream`` (SSE; ``beam_size`` ``--beam-size``,
``truncate`` on). A request is a paragraph with probability
``--long-fraction`` (default 0.25: ``--paragraph`` consecutive sentences, default 4-8, of the bundled Multi30k test
set joined with spaces and sent as one text, which the model translates whole), else one sentence of that set.

Per class (short / long): requests, answered, latency (to the final event) and time to the first streamed text (to
the first ``partial`` event with text) at p50 / p95 / p99, errors by HTTP status or ``timeout`` (``--timeout`` per
request), ``connection``, ``stream`` (no final event), and the achieved rate. A rate holds for a mode when short p95
< ``--short-p95-ms``, long p95 < ``--long-p95-ms`` and no request failed (in an open loop every planned request is
sent, so failures and the timeout bound what a backlog can hide). A mode's ladder stops after two consecutive rates
that do not hold. The report puts the modes side by side per rate with the ratio step / request of short p95, and
checks issue 38's acceptance: step's short p95 <= 0.5x request's at every rate where request's short p95 is under
the short target, and step holds at least request's highest rate.

Writes ``<out-dir>/<name>.json`` and ``.md`` after every rate and prints the Markdown; server logs go to
``--work-dir``. Exit code 0, or 2 on a usage error or when a mode could not be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/mixed_traffic.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    ReportFiles,
    UsageError,
    machine,
    read_package,
    run_name,
    say,
    seconds_option,
)
from benchmarks.mixed_load import Mix, run_open_loop, schedule, send_lag_ms, summarize  # noqa: E402
from benchmarks.mixed_report import acceptance, ms, to_markdown  # noqa: E402
from benchmarks.served_batching import (  # noqa: E402
    MISSES_TO_STOP,
    ModeResult,
    climb,
    parse_modes,
    parse_rates,
    parse_server_env,
    served_parser,
)
from loadtest.corpus import CorpusError, default_corpus, paragraph_range, read_lines  # noqa: E402

DEFAULT_RATES = "1,2,4,6,8,12,16"


@dataclass(frozen=True)
class Config:
    """Everything a run needs, checked (``parse_args`` is the only place that builds it)."""

    package: Path
    model: dict[str, Any]
    modes: list[str]
    rates: list[float]
    duration_s: float
    mix: Mix
    seed: int
    short_p95_ms: float
    long_p95_ms: float
    timeout_s: float
    beam_size: int | None
    threads: int
    precision: str
    runtime: str
    server_env: dict[str, str]
    corpus: Path
    out_dir: Path
    work_dir: Path
    name: str
    server_timeout_s: float
    command: str


@dataclass
class RateRun:
    """One rate of a mode's ladder: the per-class summaries and whether it held."""

    rate: float
    planned: int
    elapsed_s: float
    classes: dict[str, Any]  # kind -> ClassSummary as a dict
    send_lag_ms: dict[str, float | None]
    holds: bool
    reasons: list[str]


# ---------------------------------------------------------------- arguments


def _build_parser(prog: str) -> argparse.ArgumentParser:
    parser = served_parser(prog, __doc__)
    parser.add_argument("--workload", choices=["mixed"], default="mixed", help=argparse.SUPPRESS)
    parser.add_argument("--rates", default=DEFAULT_RATES, help=f"offered requests/s, increasing (default: {DEFAULT_RATES})")
    parser.add_argument("--duration", default="20s", help="arrivals per rate: 20, '20s', '1m' (default: 20s)")
    parser.add_argument("--long-fraction", type=float, default=0.25,
                        help="fraction of requests that are paragraphs (default: 0.25)")
    parser.add_argument("--paragraph", default="4-8", metavar="MIN-MAX",
                        help="sentences per paragraph, a range (default: 4-8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the arrivals and texts (default: 0)")
    parser.add_argument("--short-p95-ms", type=float, default=1000.0,
                        help="a rate holds while short requests' p95 < this (default: 1000)")
    parser.add_argument("--long-p95-ms", type=float, default=5000.0,
                        help="... and long requests' p95 < this (default: 5000)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a request may take before it counts as an error (default: 60)")
    parser.add_argument("--beam-size", type=int, help="beam_size of every request, 1: greedy (default: the package's)")
    parser.add_argument("--corpus", type=Path, help="sentence file (default: the bundled Multi30k test set)")
    return parser


def parse_args(argv: Sequence[str], prog: str = "mixed_traffic") -> Config:
    """Check the command line and turn it into a Config (UsageError: one line that says what is wrong)."""
    args = _build_parser(prog).parse_args(argv)
    modes, rates, server_env = parse_modes(args.modes), parse_rates(args.rates), parse_server_env(args.server_env)
    duration_s = seconds_option("--duration", args.duration)
    for flag, value in (("--short-p95-ms", args.short_p95_ms), ("--long-p95-ms", args.long_p95_ms),
                        ("--timeout", args.timeout), ("--server-timeout", args.server_timeout)):
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"{flag} must be a positive number (got {value:g})")
    if not 0 <= args.long_fraction <= 1:
        raise UsageError(f"--long-fraction must be between 0 and 1 (got {args.long_fraction:g})")
    for flag, number in (("--threads", args.threads), ("--beam-size", args.beam_size)):
        if number is not None and number < 1:
            raise UsageError(f"{flag} must be at least 1 (got {number})")
    try:
        low, high = paragraph_range(args.paragraph)
    except ValueError as e:
        raise UsageError(f"--paragraph {e}") from None
    try:
        corpus = args.corpus or default_corpus()
        sentences = len(read_lines(corpus))
    except CorpusError as e:
        raise UsageError(str(e)) from None
    if sentences < high:
        raise UsageError(f"--corpus {corpus}: {sentences} sentences, fewer than a paragraph's {high}")
    package, model = read_package(args.model)
    name = run_name(args.name, "mixed-traffic", args.out_dir)
    return Config(
        package=package, model=model, modes=modes, rates=rates, duration_s=duration_s,
        mix=Mix(args.long_fraction, low, high), seed=args.seed, short_p95_ms=args.short_p95_ms,
        long_p95_ms=args.long_p95_ms, timeout_s=args.timeout, beam_size=args.beam_size, threads=args.threads,
        precision=args.precision, runtime=args.runtime, server_env=server_env, corpus=corpus,
        out_dir=args.out_dir, work_dir=args.work_dir or ROOT / "build" / "mixed-traffic" / name, name=name,
        server_timeout_s=args.server_timeout, command=shlex.join(["python", "-m", f"benchmarks.{prog}", *argv]),
    )


# ---------------------------------------------------------------- one rate, the ladder


def judge(classes: dict[str, Any], limits: dict[str, float]) -> list[str]:
    """Why a rate does not hold (empty: it holds): a class's p95 at or over its limit, or any failed request."""
    reasons = []
    for kind, limit in limits.items():
        summary = classes[kind]
        p95 = summary["latency_ms"].get("p95")
        if summary["requests"] and (p95 is None or p95 >= limit):
            reasons.append(f"{kind} p95 {ms(p95)} ms >= {limit:g} ms")
    failed = {k: n for c in classes.values() for k, n in c["errors"].items()}
    if failed:
        reasons.append("failed: " + ", ".join(f"{n} x {k}" for k, n in sorted(failed.items())))
    return reasons


def run_rate(url: str, rate: float, corpus: list[str], config: Config) -> RateRun:
    planned = schedule(corpus, rate, config.duration_s, config.mix, config.seed)
    body: dict[str, Any] = {"truncate": True}
    if config.beam_size is not None:
        body["beam_size"] = config.beam_size
    outcomes, elapsed = asyncio.run(run_open_loop(url, planned, body, config.timeout_s))
    classes = {kind: asdict(s) for kind, s in summarize(outcomes, elapsed).items()}
    reasons = judge(classes, {"short": config.short_p95_ms, "long": config.long_p95_ms})
    return RateRun(rate=rate, planned=len(planned), elapsed_s=round(elapsed, 2), classes=classes,
                   send_lag_ms=send_lag_ms(outcomes), holds=not reasons, reasons=reasons)


def run_modes(results: list[ModeResult[RateRun]], config: Config, on_rate: Callable[[], object]) -> None:
    """``served_batching.climb`` with one open-loop run of the mix per rate (:func:`run_rate`)."""
    corpus = read_lines(config.corpus)

    def measure(mode: str, url: str, rate: float) -> RateRun:
        say(f"{mode}: {rate:g} req/s, {config.duration_s:g} s")
        return run_rate(url, rate, corpus, config)

    def summary(measured: RateRun) -> str:
        short, long = measured.classes["short"], measured.classes["long"]
        return f"short p95 {ms(short['latency_ms']['p95'])} ms, long p95 {ms(long['latency_ms']['p95'])} ms"

    climb(results, config, measure, summary, on_rate)


# ---------------------------------------------------------------- report


def to_json(config: Config, host: dict[str, Any], modes: list[ModeResult[RateRun]], started: datetime,
            complete: bool) -> dict[str, Any]:
    mode_data = [{"mode": m.mode, "reported_batching": m.reported_batching, "highest_rate_held": m.highest_rate_held,
                  "error": m.error, "rates": [asdict(r) for r in m.rates]} for m in modes]
    return {
        "name": config.name, "command": config.command, "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds") if complete else None, "complete": complete,
        "machine": host, "model": {"package": str(config.package), **config.model},
        "server": {"runtime": config.runtime, "precision": config.precision, "threads": config.threads,
                   "env": dict(config.server_env)},
        "load": {"workload": "mixed", "route": "/v1/translate/stream", "corpus": str(config.corpus),
                 "mix": asdict(config.mix), "seed": config.seed, "duration_s": config.duration_s,
                 "beam_size": config.beam_size, "timeout_s": config.timeout_s, "rates": config.rates},
        "rule": {"short_p95_below_ms": config.short_p95_ms, "long_p95_below_ms": config.long_p95_ms,
                 "max_failures": 0, "stop_after_misses": MISSES_TO_STOP},
        "modes": mode_data,
        "acceptance": acceptance(mode_data, config.short_p95_ms),
    }


# ---------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None, prog: str = "mixed_traffic") -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = parse_args(args, prog)
    except UsageError as e:
        say(f"{prog}: error: {e}")
        return 2
    except SystemExit as e:  # argparse: --help, or a malformed flag (its usage message is already on stderr)
        return int(e.code or 0)
    started, host = datetime.now(UTC), machine()
    modes = [ModeResult[RateRun](mode) for mode in config.modes]
    report = ReportFiles.of(config.out_dir, config.name)
    try:
        run_modes(modes, config, on_rate=lambda: report.write(to_json(config, host, modes, started, False),
                                                               to_markdown))
    except KeyboardInterrupt:
        say(f"{prog}: interrupted; what was measured is in {report.json_path}")
        return 130
    report.finish(host, lambda: to_json(config, host, modes, started, True), to_markdown)
    return 2 if any(m.error for m in modes) else 0


if __name__ == "__main__":
    sys.exit(main())
