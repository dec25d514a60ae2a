"""Served latency at fixed arrival rates, per batching mode (``MTGATE_BATCHING``). A benchmark, not a test.

    .venv/bin/python -m benchmarks.served_batching
    .venv/bin/python benchmarks/served_batching.py --modes request,step --rates 2,4,8 --duration 30s

For each mode of ``--modes`` (``request``: a batch runs to completion before the next starts; ``step``: new
requests join the running decode batch at decoder-step boundaries), ``mtgate serve`` runs on a free loopback port
with ``MTGATE_BATCHING=<mode>``, ``MTGATE_THREADS``, ``MTGATE_PRECISION`` and ``MTGATE_RUNTIME`` in its environment
(plus any ``--server-env NAME=VALUE``); all of them start first and stay up (an idle server uses no CPU). For each
rate of ``--rates``, in order, the modes take turns (so that a change in the machine's speed over the run, which on a
shared VM can be tens of percent within minutes, hits every mode alike): headless Locust runs
``TranslateUser`` (one sentence per ``POST /v1/translate``, drawn from the bundled Multi30k test set) with
``--arrival-rate RATE``: every user sends one request every users / RATE seconds whatever the latency, so the
offered load is RATE requests/s. Before each rate the server must be idle (nothing in flight or queued on
``/metrics``), so that a rate does not inherit the backlog of the one before.

A rate holds when the ``Aggregated`` row of Locust's stats has p95 < ``--p95-ms``, no failed request and an achieved
rate of at least 90% of the offered one. A mode's ladder stops after two consecutive rates that do not hold; its
result is the highest rate that held. The servers are stopped (SIGTERM) at the end.

Writes ``<out-dir>/<name>.json`` and ``.md`` (after every rate, so an interrupted run keeps what it measured) and
prints the Markdown. Locust's CSVs and the server logs stay in ``--work-dir``. Exit code 0, or 2 on a usage error or
when a mode could not be measured (its server did not start, Locust failed).

That is ``--workload uniform`` (the default). ``--workload mixed`` hands the whole command line to
benchmarks/mixed_traffic.py: open-loop Poisson arrivals of single sentences and paragraphs over the stream, per-class
latency and time to first text (its own options: ``python -m benchmarks.mixed_traffic --help``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/served_batching.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    BenchmarkError,
    ReportFiles,
    UsageError,
    machine,
    read_package,
    run_header,
    run_name,
    say,
    seconds_option,
)
from loadtest.cli import LOCUSTFILE, STOP_TIMEOUT_S, LoadTestError, run_locust, start_server  # noqa: E402
from loadtest.corpus import default_corpus  # noqa: E402
from loadtest.metrics_text import MetricsUnavailable, read_metrics, summed  # noqa: E402
from loadtest.stats import Entry  # noqa: E402
from serving.commands.options import add_alias  # noqa: E402
from serving.package import DEFAULT_RUNTIME, RUNTIMES  # noqa: E402

MODES = ("request", "step")
WORKLOADS = ("uniform", "mixed")
DEFAULT_RATES = "2,4,6,8,10,12,14,16,20,24"
MIN_ACHIEVED = 0.9  # achieved / offered rate for a rate to hold
MISSES_TO_STOP = 2  # consecutive rates that do not hold end a mode's ladder
# Users per offered request/s: each user then has 4 s per request, far beyond any latency that can hold.
USERS_PER_RPS, MIN_USERS, MAX_USERS = 4, 16, 200
IDLE_TIMEOUT_S = 60.0  # the server's request timeout (30 s by default) ends any backlog well within it
# Set by this script for each server; --server-env may not set them.
_OWN_SETTINGS = ("MTGATE_BATCHING", "MTGATE_THREADS", "MTGATE_PRECISION", "MTGATE_RUNTIME", "MTGATE_BACKEND",
                 "MTGATE_HOST", "MTGATE_PORT", "MTGATE_MODEL_DIRS")


@dataclass(frozen=True)
class Config:
    """Everything a run needs, checked (``parse_args`` is the only place that builds it)."""

    package: Path
    model: dict[str, Any]
    modes: list[str]
    rates: list[float]
    duration_s: float
    p95_ms: float
    users: int | None  # None: users_for(rate)
    threads: int
    precision: str
    runtime: str
    beam_size: int | None
    server_env: dict[str, str]
    out_dir: Path
    work_dir: Path
    name: str
    server_timeout_s: float
    command: str


@dataclass
class RateResult:
    """One rate of a mode's ladder: what Locust measured and whether it held."""

    rate: float
    users: int
    requests: int
    failures: int
    achieved_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    holds: bool
    reasons: list[str]
    top_failures: list[str] = field(default_factory=list)


class RateOutcome(Protocol):
    """What the ladder reads of one rate's result (``RateResult``, and benchmarks/mixed_traffic.py's ``RateRun``)."""

    @property
    def rate(self) -> float: ...
    @property
    def holds(self) -> bool: ...
    @property
    def reasons(self) -> list[str]: ...


R = TypeVar("R", bound=RateOutcome)


@dataclass
class ModeResult(Generic[R]):
    """One batching mode: its ladder, its highest holding rate, and what its server said about its settings."""

    mode: str
    reported_batching: str | None = None
    rates: list[R] = field(default_factory=list)
    error: str | None = None

    @property
    def highest_rate_held(self) -> float | None:
        held = [r.rate for r in self.rates if r.holds]
        return max(held) if held else None


# ---------------------------------------------------------------- arguments


def served_parser(name: str, description: str | None) -> argparse.ArgumentParser:
    """The options every served benchmark (``benchmarks.<name>``) has: the model, the modes, the server's runtime
    settings, where results and work files go."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, help="model package (default: the bundled demo models/demo-en-de)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"batching modes, in order (default: {','.join(MODES)})")
    parser.add_argument("--threads", type=int, default=2, help="runtime threads, MTGATE_THREADS (default: 2)")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="int8",
                        help="artifact, MTGATE_PRECISION (default: int8)")
    parser.add_argument("--runtime", choices=RUNTIMES, default=DEFAULT_RUNTIME,
                        help=f"runtime, MTGATE_RUNTIME (default: {DEFAULT_RUNTIME})")
    add_alias(parser, "--backend", "runtime", new="--runtime", choices=RUNTIMES)
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="another server setting, e.g. MTGATE_MAX_BATCH_DELAY_MS=10 (repeatable)")
    file_name = name.replace("_", "-")
    parser.add_argument("--name", help=f"result file name (default: {file_name}-<UTC date>)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results",
                        help="where <name>.json and <name>.md go (default: benchmarks/results)")
    parser.add_argument("--work-dir", type=Path,
                        help=f"Locust CSVs and server logs (default: build/{file_name}/<name>)")
    parser.add_argument("--server-timeout", type=float, default=120.0,
                        help="seconds to wait for a server to become ready (default: 120)")
    return parser


def _build_parser() -> argparse.ArgumentParser:
    parser = served_parser("served_batching", __doc__)
    parser.add_argument("--rates", default=DEFAULT_RATES,
                        help=f"offered requests/s, increasing (default: {DEFAULT_RATES})")
    parser.add_argument("--duration", default="30s", help="Locust run time per rate: 30, '30s', '2m' (default: 30s)")
    parser.add_argument("--p95-ms", type=float, default=500.0, help="a rate holds while p95 < this (default: 500)")
    parser.add_argument("--users", type=int, default=0,
                        help=f"Locust users per rate (default: {USERS_PER_RPS} per request/s, at least {MIN_USERS}, "
                             f"at most {MAX_USERS})")
    parser.add_argument("--beam-size", type=int, help="beam_size sent with every request (default: the package's)")
    parser.add_argument("--workload", choices=WORKLOADS, default="uniform",
                        help="uniform: this script's Locust runs; mixed: short and long texts, Poisson arrivals, over "
                             "the stream (benchmarks/mixed_traffic.py and its options) (default: uniform)")
    return parser


def parse_rates(text: str) -> list[float]:
    """``--rates``: positive, increasing requests/s (UsageError otherwise)."""
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise UsageError(f"--rates {text!r}: not a comma-separated list of numbers") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise UsageError(f"--rates {text!r}: give one or more positive numbers, e.g. 2,4,8")
    if any(b <= a for a, b in zip(rates, rates[1:], strict=False)):
        raise UsageError(f"--rates {text!r}: the rates must increase (a ladder)")
    return rates


def parse_modes(text: str) -> list[str]:
    """``--modes``: batching modes of ``MODES``, in order, each once (UsageError otherwise)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise UsageError(f"--modes {text!r}: unknown mode {', '.join(unknown) or '(none given)'} "
                         f"(modes: {', '.join(MODES)})")
    if len(set(modes)) != len(modes):
        raise UsageError(f"--modes {text!r}: a mode is listed twice")
    return modes


def parse_server_env(pairs: list[str]) -> dict[str, str]:
    """``--server-env NAME=VALUE`` pairs: MTGATE_ settings other than the ones this script sets (UsageError)."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("MTGATE_"):
            raise UsageError(f"--server-env {pair!r}: expected MTGATE_<SETTING>=VALUE (see serving/server/settings.py)")
        if name in _OWN_SETTINGS:
            raise UsageError(f"--server-env {name}: set by this script (use --modes, --threads, --precision, "
                             "--runtime; host, port and model are chosen per server)")
        env[name] = value
    return env


def parse_args(argv: Sequence[str]) -> Config:
    """Check the command line and turn it into a Config.

    Raises:
        UsageError: any invalid argument or an unusable model package (one line that says which).
    """
    args = _build_parser().parse_args(argv)
    modes, rates, server_env = parse_modes(args.modes), parse_rates(args.rates), parse_server_env(args.server_env)
    duration_s = seconds_option("--duration", args.duration)
    for flag, value in (("--p95-ms", args.p95_ms), ("--server-timeout", args.server_timeout)):
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"{flag} must be a positive number (got {value:g})")
    if args.users < 0:
        raise UsageError(f"--users must be 0 (the default rule) or a number of users (got {args.users})")
    for flag, number in (("--threads", args.threads), ("--beam-size", args.beam_size)):
        if number is not None and number < 1:
            raise UsageError(f"{flag} must be at least 1 (got {number})")
    package, model = read_package(args.model)
    name = run_name(args.name, "served-batching", args.out_dir)
    return Config(
        package=package, model=model, modes=modes, rates=rates, duration_s=duration_s,
        p95_ms=args.p95_ms, users=args.users or None, threads=args.threads, precision=args.precision,
        runtime=args.runtime, beam_size=args.beam_size, server_env=server_env,
        out_dir=args.out_dir, work_dir=args.work_dir or ROOT / "build" / "served-batching" / name, name=name,
        server_timeout_s=args.server_timeout,
        command=shlex.join(["python", "-m", "benchmarks.served_batching", *argv]),
    )


def users_for(rate: float) -> int:
    """Locust users for an offered rate: enough that each has seconds per request, so latency cannot pace them."""
    return min(MAX_USERS, max(MIN_USERS, math.ceil(USERS_PER_RPS * rate)))


# ---------------------------------------------------------------- one rate


def locust_command(host: str, rate: float | None, users: int, duration_s: float, prefix: Path,
                   beam_size: int | None) -> list[str]:
    """Headless Locust, ``TranslateUser`` only, at a fixed arrival rate (``rate`` None: a closed loop, each user
    sends its next request as soon as the last one is answered)."""
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
        "--users", str(users), "--spawn-rate", str(users),
        "--run-time", f"{max(1, round(duration_s))}s", "--stop-timeout", str(STOP_TIMEOUT_S),
        "--csv", str(prefix), "--only-summary", "--exit-code-on-error", "0", "--loglevel", "WARNING",
    ]
    if rate is not None:
        command += ["--arrival-rate", f"{rate:g}"]
    if beam_size is not None:
        command += ["--beam-size", str(beam_size)]
    return [*command, "TranslateUser"]


def judge(rate: float, row: Entry, p95_limit_ms: float, top_failure: str | None = None) -> list[str]:
    """Why a rate does not hold (empty: it holds), from Locust's ``Aggregated`` row (and its most frequent failure)."""
    reasons = []
    p95 = row.percentile("95%")
    if row.requests == 0:
        reasons.append("no request completed")
    elif p95 is None or p95 >= p95_limit_ms:
        reasons.append(f"p95 {_ms(p95)} ms >= {p95_limit_ms:g} ms")
    if row.failures:
        reasons.append(f"{row.failures} of {row.requests} requests failed"
                       + (f" (most often: {top_failure[:120]})" if top_failure else ""))
    if row.rps < MIN_ACHIEVED * rate:
        reasons.append(f"achieved {row.rps:.2f} req/s < {MIN_ACHIEVED:.0%} of {rate:g}")
    return reasons


def run_rate(host: str, rate: float, config: Config, directory: Path) -> RateResult:
    """One Locust run at ``rate`` against ``host``, bounded in time.

    Raises:
        BenchmarkError: Locust failed or overran, or its stats are unreadable.
    """
    users = config.users or users_for(rate)
    directory.mkdir(parents=True, exist_ok=True)
    prefix = directory / "locust"
    command = locust_command(host, rate, users, config.duration_s, prefix, config.beam_size)
    try:
        run = run_locust(command, prefix, config.duration_s, f"rate {rate:g}")
    except LoadTestError as e:
        raise BenchmarkError(str(e)) from None
    row = run.aggregated
    failures = sorted(run.failures, key=lambda f: -f.occurrences)[:3]
    reasons = judge(rate, row, config.p95_ms, failures[0].error if failures else None)
    return RateResult(
        rate=rate, users=users, requests=row.requests, failures=row.failures, achieved_rps=row.rps,
        p50_ms=row.percentile("50%"), p95_ms=row.percentile("95%"), p99_ms=row.percentile("99%"),
        holds=not reasons, reasons=reasons, top_failures=[f"{f.occurrences} x {f.error}" for f in failures])


# ---------------------------------------------------------------- one mode


def server_load(host: str) -> float | None:
    """Requests in flight plus sentences queued, from the server's ``/metrics`` (None: it reports neither)."""
    try:
        values = summed(read_metrics(host, 5))
    except MetricsUnavailable:
        return None
    load = [values[name] for name in ("mtgate_inflight_requests", "mtgate_queue_depth") if name in values]
    return sum(load) if load else None


def wait_until_idle(host: str, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Return once the server has nothing in flight or queued.

    Raises:
        BenchmarkError: still busy after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while (load := server_load(host)) not in (None, 0.0):
        if time.monotonic() > deadline:
            raise BenchmarkError(f"the server is still busy ({load:g} requests and queued sentences) "
                                 f"{timeout_s:g} s after the last run")
        time.sleep(0.5)


def reported_batching(log_path: Path) -> str | None:
    """The batching mode in the server's ``settings:`` log line, or None when it logs none (a server without the
    setting ignores ``MTGATE_BATCHING``)."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"settings: .*?['\"]batching['\"]: ['\"]([A-Za-z_-]+)['\"]", text)  # the whole dict (older)
    if match:
        return match.group(1)
    line = re.search(r"settings: (.*)", text)  # only what differs from the defaults
    if line is None:
        return None
    changed = re.search(r"\bbatching=([A-Za-z_-]+)", line.group(1))
    from serving.server.settings import ServingSettings

    return changed.group(1) if changed else str(ServingSettings.model_fields["batching"].default)


class ServerOptions(Protocol):
    """What a server's environment is made of (this script's Config, and benchmarks/served_offline.py's)."""

    @property
    def server_env(self) -> dict[str, str]: ...
    @property
    def threads(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def runtime(self) -> str: ...


def server_environment(config: ServerOptions, mode: str) -> dict[str, str]:
    """The ``MTGATE_*`` settings of the server for ``mode``: ``--server-env``'s and this script's own."""
    return {**config.server_env, "MTGATE_BATCHING": mode, "MTGATE_THREADS": str(config.threads),
            "MTGATE_PRECISION": config.precision, "MTGATE_RUNTIME": config.runtime}


class LadderOptions(ServerOptions, Protocol):
    """What :func:`climb` reads of a run's configuration (this script's Config, and mixed_traffic's)."""

    @property
    def package(self) -> Path: ...
    @property
    def work_dir(self) -> Path: ...
    @property
    def server_timeout_s(self) -> float: ...
    @property
    def rates(self) -> list[float]: ...


def climb(results: list[ModeResult[R]], config: LadderOptions, measure: Callable[[str, str, float], R],
          summary: Callable[[R], str], on_rate: Callable[[], object]) -> None:
    """Start a server per mode of ``results``, then climb the rate ladder with the modes taking turns at each rate
    (so that a change in the machine's speed, which on a shared VM can be tens of percent within minutes, hits every
    mode alike), each server idle before its run: ``measure(mode, url, rate)`` runs one rate, ``summary(result)``
    says what it measured, ``on_rate`` is called after each run; stop the servers. A server or load failure ends that
    mode's ladder and goes into its ``error``; a mode's ladder also ends after MISSES_TO_STOP rates that do not hold."""
    with contextlib.ExitStack() as stack:
        servers: dict[str, Any] = {}
        for result in results:
            mode = result.mode
            try:
                server = stack.enter_context(start_server(config.package, config.work_dir / mode / "server.log",
                                                          config.server_timeout_s,
                                                          env=server_environment(config, mode)))
            except (LoadTestError, BenchmarkError) as e:
                result.error = str(e)
                say(f"{mode}: error: {e}")
                continue
            servers[mode] = server
            result.reported_batching = reported_batching(server.log)
            if result.reported_batching != mode:
                say(f"{mode}: warning: the server reports batching {result.reported_batching or '(nothing)'}, "
                     f"not {mode}")
        misses = dict.fromkeys(servers, 0)
        for rate in config.rates:
            for result in results:
                mode = result.mode
                if mode not in servers or misses[mode] >= MISSES_TO_STOP:
                    continue
                try:
                    wait_until_idle(servers[mode].url)
                    measured = measure(mode, servers[mode].url, rate)
                except (LoadTestError, BenchmarkError) as e:
                    result.error = str(e)
                    say(f"{mode}: error: {e}")
                    misses[mode] = MISSES_TO_STOP
                    continue
                result.rates.append(measured)
                say(f"{mode}: {rate:g} req/s: {summary(measured)}: "
                    + ("holds" if measured.holds else "; ".join(measured.reasons)))
                on_rate()
                misses[mode] = 0 if measured.holds else misses[mode] + 1


def run_modes(results: list[ModeResult[RateResult]], config: Config, on_rate: Callable[[], object]) -> None:
    """:func:`climb` with one Locust run of ``TranslateUser`` per rate (:func:`run_rate`)."""

    def measure(mode: str, url: str, rate: float) -> RateResult:
        users = config.users or users_for(rate)
        say(f"{mode}: {rate:g} req/s, {users} users, {config.duration_s:g} s")
        return run_rate(url, rate, config, config.work_dir / mode / f"rate-{rate:g}")

    def summary(measured: RateResult) -> str:
        return f"p95 {_ms(measured.p95_ms)} ms, {measured.achieved_rps:.2f} req/s, {measured.failures} failed"

    climb(results, config, measure, summary, on_rate)


# ---------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _users_text(config: Config) -> str:
    if config.users:
        return str(config.users)
    return f"{USERS_PER_RPS} per offered req/s, at least {MIN_USERS}, at most {MAX_USERS}"


def to_json(config: Config, host: dict[str, Any], modes: list[ModeResult[RateResult]], started: datetime,
            complete: bool) -> dict[str, Any]:
    return {
        "name": config.name,
        "command": config.command,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds") if complete else None,
        "complete": complete,
        "machine": host,
        "model": {"package": str(config.package), **config.model},
        "server": {"runtime": config.runtime, "precision": config.precision, "threads": config.threads,
                   "env": dict(config.server_env)},
        "load": {"user": "TranslateUser", "corpus": str(default_corpus()), "duration_s": config.duration_s,
                 "users": config.users or "auto", "users_rule": _users_text(config), "beam_size": config.beam_size,
                 "rates": config.rates},
        "rule": {"p95_below_ms": config.p95_ms, "max_failures": 0, "min_achieved_fraction": MIN_ACHIEVED,
                 "stop_after_misses": MISSES_TO_STOP},
        "modes": [{"mode": m.mode, "reported_batching": m.reported_batching, "highest_rate_held": m.highest_rate_held,
                   "error": m.error, "rates": [asdict(r) for r in m.rates]} for m in modes],
    }


def to_markdown(data: dict[str, Any]) -> str:
    """The report: how it was measured, the highest holding rate per mode, then each mode's table."""
    model, server, load, rule = data["model"], data["server"], data["load"], data["rule"]
    beam = load["beam_size"] if load["beam_size"] is not None else f"the package's ({model['package_beam_size']})"
    extra_env = ", ".join(f"`{k}={v}`" for k, v in server["env"].items())
    lines = [
        f"# Served batching at fixed arrival rates: {data['name']}",
        "",
        *run_header(data),
        f"- model: `{model['package']}` ({model['name']} {model['version']}); server: {server['runtime']}, "
        f"{server['precision']}, {server['threads']} threads" + (f", {extra_env}" if extra_env else ""),
        f"- load: Locust `{load['user']}` (one sentence per `POST /v1/translate`), sentences from "
        f"`{Path(load['corpus']).name}`, beam size {beam}, {load['duration_s']:g} s per rate, users: "
        f"{load['users_rule']}; Locust runs on the same machine",
        f"- a rate holds when p95 < {rule['p95_below_ms']:g} ms, no request failed and the achieved rate is at "
        f"least {rule['min_achieved_fraction']:.0%} of the offered one; a ladder stops after "
        f"{rule['stop_after_misses']} consecutive rates that do not hold",
        "",
        "| mode | highest rate held (req/s) | p95 there (ms) | server reports batching |",
        "|---|---|---|---|",
    ]
    for mode in data["modes"]:
        held = mode["highest_rate_held"]
        at = next((r for r in mode["rates"] if r["rate"] == held), None)
        best = "error" if mode["error"] and held is None else ("none" if held is None else f"{held:g}")
        lines.append(f"| {mode['mode']} | {best} | {_ms(at['p95_ms']) if at else '-'} | "
                     f"{mode['reported_batching'] or 'nothing (setting ignored?)'} |")
    for mode in data["modes"]:
        lines += ["", f"## {mode['mode']}", ""]
        if mode["error"]:
            lines += [f"Error: {mode['error']}", ""]
        lines += ["| offered req/s | users | requests | failed | achieved req/s | p50 ms | p95 ms | p99 ms | holds |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in mode["rates"]:
            verdict = "yes" if r["holds"] else "no: " + "; ".join(r["reasons"])
            lines.append(f"| {r['rate']:g} | {r['users']} | {r['requests']} | {r['failures']} | "
                         f"{r['achieved_rps']:.2f} | {_ms(r['p50_ms'])} | {_ms(r['p95_ms'])} | {_ms(r['p99_ms'])} | "
                         f"{verdict} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    workload = argparse.ArgumentParser(add_help=False)
    workload.add_argument("--workload", choices=WORKLOADS, default="uniform")
    try:
        if workload.parse_known_args(args)[0].workload == "mixed":
            from benchmarks import mixed_traffic

            return mixed_traffic.main(args, prog="served_batching")
        config = parse_args(args)
    except UsageError as e:
        say(f"served_batching: error: {e}")
        return 2
    except SystemExit as e:  # argparse: --help, or a malformed flag (its usage message is already on stderr)
        return int(e.code or 0)
    started = datetime.now(UTC)
    host = machine()
    modes: list[ModeResult[RateResult]] = []
    report = ReportFiles.of(config.out_dir, config.name)
    try:
        modes.extend(ModeResult[RateResult](mode) for mode in config.modes)
        run_modes(modes, config, on_rate=lambda: report.write(to_json(config, host, modes, started, False),
                                                               to_markdown))
    except KeyboardInterrupt:
        say(f"served_batching: interrupted; what was measured is in {report.json_path}")
        return 130
    report.finish(host, lambda: to_json(config, host, modes, started, True), to_markdown)
    return 2 if any(m.error for m in modes) else 0


if __name__ == "__main__":
    sys.exit(main())
