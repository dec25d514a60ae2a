"""Served vs offline throughput: the engine's tokens/s in-process and ``mtgate serve``'s at saturation under Locust,
on the same sentences and options, in one run. A benchmark, not a test.

    .venv/bin/python -m benchmarks.served_offline -m models/demo-en-de --duration 45s

Offline: the package is loaded in this process (``Translator.load`` with ``--runtime``, ``--precision``,
``--threads``: what the server loads), and the sentences the Locust users draw from (the bundled Multi30k test set,
``loadtest.corpus.default_corpus``; ``--sentences N``: its first N) are translated in file order, ``--batch-size``
sentences per ``Translator.translate`` call (a saturated request-level server runs batches of its
``MTGATE_MAX_BATCH_SIZE``, which is set to the same number), with the options every request carries
(``--beam-size``, else the package's). The offline passes run before each mode's server and after the last one
(``--passes`` each time; the engine is loaded, warmed up on its first two batches, and released every time), so
that a change in the machine's load between the parts shows and hits both; the median pass counts. Tokens are
counted as the server counts ``output_tokens`` (generated tokens before EOS, per translation).

Served: for each mode of ``--modes``, ``mtgate serve`` starts as benchmarks/served_batching.py starts it
(``MTGATE_BATCHING``, ``MTGATE_THREADS``, ``MTGATE_PRECISION``, ``MTGATE_RUNTIME``, plus ``MTGATE_MAX_BATCH_SIZE``
and any ``--server-env``), and headless Locust runs ``--users`` ``TranslateUser``s in a closed loop (one sentence
per ``POST /v1/translate``, the next request as soon as the last one is answered, no think time), all started at
once. Once the first request is in flight, ``--warmup`` seconds pass; then the server's ``/metrics`` are scraped at
the start and end of a ``--duration`` window (and once a second between): served tokens/s is the window's increase
of ``mtgate_output_tokens_total`` over its length, requests/s the increase of ``/v1/translate`` 200s. The server was
saturated when its engine ran full batches (mean sentences per engine batch, or in flight per decoder step with
step batching, at least 95% of the batch size) and its batch queue (``mtgate_queue_depth``) held sentences at 90% of
the scrapes or more: work was waiting whenever the engine could take it. Latency percentiles are Locust's over its
whole run (warm-up included). On Linux the report also gives each server thread's share of a core in the window and
its context switches (``ServerThread``): the event loop is the main thread, the busiest others are the decoding
thread and the runtime's own threads.

Writes ``<out-dir>/<name>.json`` and ``.md`` (after the offline part and after every mode) and prints the Markdown;
Locust's CSVs and the server logs stay in ``--work-dir``. Exit code 0, or 2 on a usage error or when a part could
not be measured (the package did not load, a server did not start, Locust failed).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/served_offline.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    BenchmarkError,
    ReportFiles,
    machine,
    read_package,
    run_header,
    run_name,
    say,
    seconds_option,
)
from benchmarks.served_batching import (  # noqa: E402
    locust_command,
    parse_modes,
    parse_server_env,
    reported_batching,
    served_parser,
    server_environment,
    wait_until_idle,
)
from loadtest.cli import LoadTestError, run_locust, start_server  # noqa: E402
from loadtest.corpus import CorpusError, default_corpus, read_lines  # noqa: E402
from loadtest.metrics_text import MetricsUnavailable, fetch_metrics, parse_families, summed  # noqa: E402
from loadtest.stats import RunStats  # noqa: E402
from serving.commands.options import UsageError  # noqa: E402

TARGET_RATIO = 0.85  # issue 15: at saturation the server delivers >= 85% of the engine's offline tokens/s
WARMUP_BATCHES = 2  # offline: batches translated once after each load, before the timed passes
SATURATED_FILL = 0.95  # mean sentences per engine batch (or decoder step) / batch size
SATURATED_QUEUED = 0.9  # share of the window's scrapes that found sentences queued
SPREAD_WARNING = 0.1  # offline passes whose tokens/s differ more ((max - min) / median): flagged in the report
TAIL_S = 3.0  # Locust runs this long past the window, so that the load is still on at its last scrape
LOAD_START_TIMEOUT_S = 60.0  # from starting Locust to its first request in flight on the server
ROUTE = "/v1/translate"
# Set by this script for each server (--batch-size), besides served_batching's own settings.
_BATCH_SIZE_SETTINGS = ("MTGATE_MAX_BATCH_SIZE", "MTGATE_MAX_BATCH_SENTENCES")


@dataclass(frozen=True)
class Config:
    """Everything a run needs, checked (``parse_args`` is the only place that builds it)."""

    package: Path
    model: dict[str, Any]
    modes: list[str]
    duration_s: float
    warmup_s: float
    users: int
    threads: int
    precision: str
    runtime: str
    beam_size: int | None
    batch_size: int
    passes: int
    sentences: int | None  # None: the whole corpus
    server_env: dict[str, str]  # --server-env and MTGATE_MAX_BATCH_SIZE
    out_dir: Path
    work_dir: Path
    name: str
    server_timeout_s: float
    command: str


@dataclass(frozen=True)
class OfflinePass:
    """One timed pass over every batch."""

    slot: str  # when it ran: "before <mode>" or "after <mode>"
    seconds: float
    cpu_seconds: float  # this process, every thread
    sentences: int
    output_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds


@dataclass
class OfflineResult:
    """The engine in this process: its passes over the sentences."""

    sentences: int = 0
    batches: int = 0
    beam_size: int | None = None  # as resolved by the engine
    load_s: float | None = None
    passes: list[OfflinePass] = field(default_factory=list)
    error: str | None = None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the passes' tokens/s (None: fewer than two passes)."""
        rates = [p.tokens_per_s for p in self.passes]
        return (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 else None

    def median(self, value: Callable[[OfflinePass], float]) -> float | None:
        return statistics.median(value(p) for p in self.passes) if self.passes else None

    def to_json(self) -> dict[str, Any]:
        return {
            "sentences": self.sentences, "batches": self.batches, "beam_size": self.beam_size, "load_s": self.load_s,
            "passes": [{**asdict(p), "tokens_per_s": p.tokens_per_s, "sentences_per_s": p.sentences_per_s}
                       for p in self.passes],
            "tokens_per_s": self.median(lambda p: p.tokens_per_s),
            "sentences_per_s": self.median(lambda p: p.sentences_per_s),
            "seconds": self.median(lambda p: p.seconds),
            "output_tokens_per_sentence": (self.passes[0].output_tokens / self.passes[0].sentences
                                           if self.passes and self.passes[0].sentences else None),
            "cpu_per_wall": self.median(lambda p: p.cpu_seconds / p.seconds),
            "spread": self.spread,
            "error": self.error,
        }


@dataclass(frozen=True)
class Scrape:
    """What one ``/metrics`` scrape says (every label set summed), at ``time`` (``time.monotonic()``, the midpoint
    of the request)."""

    time: float
    output_tokens: float
    sentences: float
    requests_ok: float  # /v1/translate answered 200
    requests_failed: float  # /v1/translate answered otherwise
    queue_depth: float
    inflight: float
    batch_sum: float
    batch_count: float
    step_sum: float
    step_count: float


@dataclass(frozen=True)
class ServerThread:
    """One thread of the server process over the window: how much of a core it used and how often the kernel took
    its core away while it could still run (involuntary context switches). On a machine whose cores all run the
    runtime's threads, every wake-up of the event loop pre-empts one of them: the decoding thread's involuntary
    switches show what the HTTP side costs the engine."""

    tid: int
    role: str  # "event loop" (the main thread), else "thread"
    cores: float  # CPU seconds / window seconds
    involuntary_per_s: float
    voluntary_per_s: float


@dataclass
class ModeResult:
    """One batching mode at saturation: the server's window, Locust's whole run, and what each cost in CPU."""

    mode: str
    batch_size: int  # the server's MTGATE_MAX_BATCH_SIZE
    reported_batching: str | None = None
    window_s: float | None = None
    output_tokens: int | None = None
    sentences: int | None = None
    requests: int | None = None
    failed_responses: int | None = None  # non-200 answers to /v1/translate in the window (server's count)
    queue_depths: list[float] = field(default_factory=list)  # at every scrape of the window
    inflight: list[float] = field(default_factory=list)
    mean_batch_size: float | None = None  # request batching: sentences per engine batch in the window
    mean_step_sentences: float | None = None  # step batching: sentences in flight per decoder step in the window
    server_cpu_s: float | None = None  # the server process in the window
    # The server's threads in the window (Linux /proc; empty elsewhere), busiest first: see ServerThread.
    server_threads: list[ServerThread] = field(default_factory=list)
    locust_requests: int | None = None
    locust_failures: int | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    locust_rps: float | None = None
    locust_wall_s: float | None = None  # the Locust process, from start to exit
    locust_cpu_s: float | None = None
    top_failures: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.output_tokens is None or not self.window_s else self.output_tokens / self.window_s

    @property
    def fill(self) -> float | None:
        """Mean sentences per decoder step (step batching) or per engine batch (request batching) / batch size."""
        mean = self.mean_step_sentences if self.mean_step_sentences is not None else self.mean_batch_size
        return None if mean is None else mean / self.batch_size

    @property
    def queued_share(self) -> float | None:
        """The share of the window's scrapes that found sentences in the batch queue."""
        return sum(q > 0 for q in self.queue_depths) / len(self.queue_depths) if self.queue_depths else None

    @property
    def saturated(self) -> bool | None:
        """Full batches and work waiting (None: not measured)."""
        if self.fill is None or self.queued_share is None:
            return None
        return self.fill >= SATURATED_FILL and self.queued_share >= SATURATED_QUEUED

    def to_json(self) -> dict[str, Any]:
        window = self.window_s or 0.0

        def per_s(count: int | None) -> float | None:
            return None if count is None or not window else count / window

        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "sentences_per_s": per_s(self.sentences),
                "requests_per_s": per_s(self.requests), "fill": self.fill, "queued_share": self.queued_share,
                "saturated": self.saturated,
                "output_tokens_per_sentence": (self.output_tokens / self.sentences
                                               if self.output_tokens is not None and self.sentences else None),
                "server_cpu_per_wall": None if self.server_cpu_s is None or not window else self.server_cpu_s / window,
                "locust_cpu_per_wall": (self.locust_cpu_s / self.locust_wall_s
                                        if self.locust_cpu_s is not None and self.locust_wall_s else None)}


# ---------------------------------------------------------------- arguments


def _build_parser() -> argparse.ArgumentParser:
    parser = served_parser("served_offline", __doc__)
    parser.add_argument("--duration", default="45s",
                        help="served: the measurement window per mode: 45, '45s', '2m' (default: 45s)")
    parser.add_argument("--warmup", default="10s",
                        help="served: load before the window starts, from the first request (default: 10s)")
    parser.add_argument("--users", type=int, default=64,
                        help="served: Locust users, a closed loop without think time (default: 64, two full batches)")
    parser.add_argument("--beam-size", type=int,
                        help="beam_size of every request and of the offline calls (default: the package's)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentences per offline call and the server's MTGATE_MAX_BATCH_SIZE (default: 32)")
    parser.add_argument("--passes", type=int, default=1,
                        help="offline: timed passes before each mode and after the last; the median of all counts "
                             "(default: 1)")
    parser.add_argument("--sentences", type=int, default=0,
                        help="offline: the corpus's first N sentences (default: all; the users draw from all)")
    return parser


def parse_args(argv: Sequence[str]) -> Config:
    """Check the command line and turn it into a Config.

    Raises:
        UsageError: any invalid argument or an unusable model package (one line that says which).
    """
    args = _build_parser().parse_args(argv)
    modes, server_env = parse_modes(args.modes), parse_server_env(args.server_env)
    taken = [name for name in _BATCH_SIZE_SETTINGS if name in server_env]
    if taken:
        raise UsageError(f"--server-env {taken[0]}: set by this script (use --batch-size: the offline part uses it too)")
    duration_s, warmup_s = seconds_option("--duration", args.duration), seconds_option("--warmup", args.warmup)
    if not math.isfinite(args.server_timeout) or args.server_timeout <= 0:
        raise UsageError(f"--server-timeout must be a positive number (got {args.server_timeout:g})")
    for flag, number in (("--users", args.users), ("--threads", args.threads), ("--beam-size", args.beam_size),
                         ("--batch-size", args.batch_size), ("--passes", args.passes)):
        if number is not None and number < 1:
            raise UsageError(f"{flag} must be at least 1 (got {number})")
    if args.sentences < 0:
        raise UsageError(f"--sentences must be 0 (all) or a number of sentences (got {args.sentences})")
    package, model = read_package(args.model)
    name = run_name(args.name, "served-offline", args.out_dir)
    return Config(
        package=package, model=model, modes=modes, duration_s=duration_s, warmup_s=warmup_s, users=args.users,
        threads=args.threads, precision=args.precision, runtime=args.runtime, beam_size=args.beam_size,
        batch_size=args.batch_size, passes=args.passes, sentences=args.sentences or None,
        server_env={**server_env, "MTGATE_MAX_BATCH_SIZE": str(args.batch_size)},
        out_dir=args.out_dir, work_dir=args.work_dir or ROOT / "build" / "served-offline" / name, name=name,
        server_timeout_s=args.server_timeout,
        command=shlex.join(["python", "-m", "benchmarks.served_offline", *argv]),
    )


# ---------------------------------------------------------------- offline


def run_offline(result: OfflineResult, config: Config, texts: list[str], slot: str) -> None:
    """Load the package here, warm up, and time ``config.passes`` passes over ``texts`` in batches of
    ``config.batch_size`` into ``result``; an engine error goes into ``result.error``. The engine is released at
    the end, so that its threads take nothing from the server that runs next."""
    from serving.engine.errors import ServingError
    from serving.engine.translator import DecodeOptions, Translator
    from serving.package import PackageError

    batches = [texts[i:i + config.batch_size] for i in range(0, len(texts), config.batch_size)]
    result.sentences, result.batches = len(texts), len(batches)
    options = DecodeOptions(beam_size=config.beam_size)
    try:
        started = time.perf_counter()
        translator = Translator.load(config.package, runtime=config.runtime, precision=config.precision,
                                     threads=config.threads)
        result.load_s = max(result.load_s or 0.0, time.perf_counter() - started)
        result.beam_size = translator.search_options(options).beam_size
        for batch in batches[:WARMUP_BATCHES]:
            translator.translate(batch, options)
        for number in range(1, config.passes + 1):
            wall, cpu, tokens = time.perf_counter(), time.process_time(), 0
            for batch in batches:
                tokens += sum(t.output_tokens for t in translator.translate(batch, options))
            done = OfflinePass(slot=slot, seconds=time.perf_counter() - wall,
                               cpu_seconds=time.process_time() - cpu, sentences=len(texts), output_tokens=tokens)
            result.passes.append(done)
            say(f"offline {slot}: pass {number} of {config.passes}: {done.seconds:.2f} s, "
                 f"{done.tokens_per_s:.0f} tokens/s")
    except (PackageError, ServingError) as e:
        result.error = str(e)
        say(f"offline: error: {e}")


# ---------------------------------------------------------------- served


def parse_metrics(text: str, when: float) -> Scrape:
    """The figures of one ``/metrics`` text (Prometheus' exposition format), each summed over its label sets.

    Raises:
        BenchmarkError: not the exposition format, or no ``mtgate_output_tokens_total`` (not an mtgate server).
    """
    try:
        families = parse_families(text)
    except MetricsUnavailable as e:
        raise BenchmarkError(str(e)) from None
    values = summed(families)
    ok = failed = 0.0
    for sample in (s for family in families for s in family.samples):
        if sample.name == "mtgate_requests_total" and sample.labels.get("route") == ROUTE:
            if sample.labels.get("status") == "200":
                ok += sample.value
            else:
                failed += sample.value
    if "mtgate_output_tokens" not in {family.name for family in families}:  # a counter with labels has no sample until its first increment
        raise BenchmarkError("/metrics has no mtgate_output_tokens_total: not an mtgate server?")
    return Scrape(
        time=when, output_tokens=values.get("mtgate_output_tokens_total", 0.0),
        sentences=values.get("mtgate_sentences_total", 0.0), requests_ok=ok, requests_failed=failed,
        queue_depth=values.get("mtgate_queue_depth", 0.0), inflight=values.get("mtgate_inflight_requests", 0.0),
        batch_sum=values.get("mtgate_batch_size_sum", 0.0), batch_count=values.get("mtgate_batch_size_count", 0.0),
        step_sum=values.get("mtgate_step_sentences_sum", 0.0),
        step_count=values.get("mtgate_step_sentences_count", 0.0))


def scrape(host: str) -> Scrape:
    """The server's ``/metrics`` now.

    Raises:
        BenchmarkError: no answer, or not mtgate's metrics.
    """
    sent = time.monotonic()
    try:
        text = fetch_metrics(host, 10)
    except MetricsUnavailable as e:
        raise BenchmarkError(str(e)) from None
    return parse_metrics(text, (sent + time.monotonic()) / 2)


def _process_cpu_s(pid: int) -> float | None:
    import psutil  # Locust's dependency

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


_ThreadTimes = dict[int, tuple[float, int, int]]  # tid -> (CPU seconds, voluntary, involuntary context switches)


def _thread_times(pid: int) -> _ThreadTimes:
    """Every thread's CPU seconds and context switches, from Linux's /proc (empty where there is none)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    times: _ThreadTimes = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        switches = dict(line.split(":\t") for line in status.splitlines() if "ctxt_switches" in line)
        times[int(task.name)] = ((int(fields[11]) + int(fields[12])) / ticks,
                                 int(switches.get("voluntary_ctxt_switches", 0)),
                                 int(switches.get("nonvoluntary_ctxt_switches", 0)))
    return times


def server_threads(pid: int, before: _ThreadTimes, after: _ThreadTimes, window_s: float) -> list[ServerThread]:
    """The threads alive at both readings that used at least 1% of a core, busiest first."""
    threads = [ServerThread(tid, "event loop" if tid == pid else "thread", (cpu - before[tid][0]) / window_s,
                            (involuntary - before[tid][2]) / window_s, (voluntary - before[tid][1]) / window_s)
               for tid, (cpu, voluntary, involuntary) in after.items() if tid in before and window_s > 0]
    return sorted((t for t in threads if t.cores >= 0.01), key=lambda t: -t.cores)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _mean_of(total: float, count: float) -> float | None:
    return total / count if count > 0 else None


def watch_window(host: str, server_pid: int, locust: Future[Any], config: Config, result: ModeResult) -> None:
    """Wait for the load to start and for ``config.warmup_s``, then measure the ``config.duration_s`` window from
    the server's ``/metrics`` into ``result``.

    Raises:
        BenchmarkError: no request arrived, Locust stopped before the window ended, or ``/metrics`` failed.
    """
    deadline = time.monotonic() + LOAD_START_TIMEOUT_S
    while scrape(host).inflight == 0:
        if locust.done():
            raise BenchmarkError("Locust ended before any request reached the server")
        if time.monotonic() > deadline:
            raise BenchmarkError(f"no request reached the server within {LOAD_START_TIMEOUT_S:g} s of starting Locust")
        time.sleep(0.1)
    _sleep_until(time.monotonic() + config.warmup_s)
    start, cpu_start, threads_start = scrape(host), _process_cpu_s(server_pid), _thread_times(server_pid)
    samples = [start]
    for second in range(1, math.ceil(config.duration_s)):
        _sleep_until(start.time + second)
        samples.append(scrape(host))
    _sleep_until(start.time + config.duration_s)
    end, cpu_end, threads_end = scrape(host), _process_cpu_s(server_pid), _thread_times(server_pid)
    samples.append(end)
    if locust.done():
        raise BenchmarkError("Locust stopped before the measurement window ended")
    result.window_s = end.time - start.time
    result.output_tokens = round(end.output_tokens - start.output_tokens)
    result.sentences = round(end.sentences - start.sentences)
    result.requests = round(end.requests_ok - start.requests_ok)
    result.failed_responses = round(end.requests_failed - start.requests_failed)
    result.queue_depths = [s.queue_depth for s in samples]
    result.inflight = [s.inflight for s in samples]
    result.mean_batch_size = _mean_of(end.batch_sum - start.batch_sum, end.batch_count - start.batch_count)
    result.mean_step_sentences = _mean_of(end.step_sum - start.step_sum, end.step_count - start.step_count)
    result.server_cpu_s = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    result.server_threads = server_threads(server_pid, threads_start, threads_end, result.window_s)


def _locust_with_cpu(command: list[str], prefix: Path, run_s: float) -> tuple[RunStats, float, float]:
    """``run_locust``, and the Locust process's wall and CPU seconds (its rusage: this process's children reaped
    meanwhile; the server, the only other child, is reaped only after it is stopped)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    run = run_locust(command, prefix, run_s, "locust")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return run, time.monotonic() - started, cpu


def run_mode(result: ModeResult, config: Config) -> None:
    """Start the server for ``result.mode``, load it to saturation with Locust, measure the window into ``result``,
    stop the server. A server, Locust or metrics failure goes into ``result.error``."""
    mode = result.mode
    directory = config.work_dir / mode
    run_s = config.warmup_s + config.duration_s + TAIL_S
    try:
        with start_server(config.package, directory / "server.log", config.server_timeout_s,
                          env=server_environment(config, mode)) as server:
            result.reported_batching = reported_batching(server.log)
            if result.reported_batching != mode:
                say(f"{mode}: warning: the server reports batching {result.reported_batching or '(nothing)'}, "
                     f"not {mode}")
            wait_until_idle(server.url)
            directory.mkdir(parents=True, exist_ok=True)
            prefix = directory / "locust"
            command = locust_command(server.url, None, config.users, run_s, prefix, config.beam_size)
            say(f"{mode}: {config.users} users, {config.warmup_s:g} s warm-up, {config.duration_s:g} s window")
            with ThreadPoolExecutor(max_workers=1) as pool:  # on an error, leaving the block waits for Locust's end
                locust = pool.submit(_locust_with_cpu, command, prefix, run_s)
                watch_window(server.url, server.process.pid, locust, config, result)
                run, result.locust_wall_s, result.locust_cpu_s = locust.result()
    except (LoadTestError, BenchmarkError) as e:
        result.error = str(e)
        say(f"{mode}: error: {e}")
        return
    row = run.aggregated
    result.locust_requests, result.locust_failures, result.locust_rps = row.requests, row.failures, row.rps
    result.p50_ms, result.p95_ms, result.p99_ms = row.percentile("50%"), row.percentile("95%"), row.percentile("99%")
    result.top_failures = [f"{f.occurrences} x {f.error}" for f in sorted(run.failures, key=lambda f: -f.occurrences)[:3]]
    say(f"{mode}: {_num(result.tokens_per_s)} tokens/s, batches {_num(None if result.fill is None else 100 * result.fill)}% full, "
         f"queue held sentences at {sum(q > 0 for q in result.queue_depths)} of {len(result.queue_depths)} scrapes, "
         f"{result.locust_failures} failed")


# ---------------------------------------------------------------- report


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(served: float | None, offline: float | None) -> float | None:
    return None if served is None or not offline else served / offline


def to_json(config: Config, host: dict[str, Any], offline: OfflineResult, modes: list[ModeResult],
            started: datetime, complete: bool) -> dict[str, Any]:
    off = offline.to_json()
    return {
        "name": config.name,
        "command": config.command,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds") if complete else None,
        "complete": complete,
        "machine": host,
        "model": {"package": str(config.package), **config.model},
        "engine": {"runtime": config.runtime, "precision": config.precision, "threads": config.threads,
                   "beam_size": config.beam_size, "batch_size": config.batch_size},
        "corpus": str(default_corpus()),
        "target_ratio": TARGET_RATIO,
        "offline": {"sentences_rule": "all" if config.sentences is None else f"first {config.sentences}",
                    "passes_per_slot": config.passes, "warmup_batches": WARMUP_BATCHES, **off},
        "served": {"user": "TranslateUser", "users": config.users, "loop": "closed, no think time",
                   "warmup_s": config.warmup_s, "duration_s": config.duration_s, "server_env": dict(config.server_env),
                   "modes": [m.to_json() for m in modes]},
        "summary": [{"mode": m.mode, "served_tokens_per_s": m.tokens_per_s, "offline_tokens_per_s": off["tokens_per_s"],
                     "ratio": _ratio(m.tokens_per_s, off["tokens_per_s"]), "saturated": m.saturated}
                    for m in modes],
    }


def to_markdown(data: dict[str, Any]) -> str:
    """The report: how it was measured, the summary per mode, then the offline passes and each mode's figures."""
    model, engine, off, served = data["model"], data["engine"], data["offline"], data["served"]
    beam = engine["beam_size"] if engine["beam_size"] is not None else f"the package's ({off['beam_size'] or '-'})"
    extra_env = ", ".join(f"`{k}={v}`" for k, v in served["server_env"].items())
    lines = [
        f"# Served vs offline throughput: {data['name']}",
        "",
        *run_header(data),
        f"- model: `{model['package']}` ({model['name']} {model['version']}); {engine['runtime']}, "
        f"{engine['precision']}, {engine['threads']} threads, beam size {beam}",
        f"- sentences: `{Path(data['corpus']).name}` ({off['sentences_rule']}: {off['sentences']} offline; the Locust "
        "users draw from all of it)",
        f"- offline: `Translator.translate` in this process on batches of {engine['batch_size']} sentences in file "
        f"order; {off['passes_per_slot']} timed pass(es) before each mode's server and after the last (each time "
        f"loaded and warmed up on {off['warmup_batches']} batches); the median of the {len(off['passes'])} passes",
        f"- served: `mtgate serve` with {extra_env}; {served['users']} Locust `{served['user']}`s (one sentence per "
        f"`POST /v1/translate`, {served['loop']}) on the same machine; {served['warmup_s']:g} s warm-up, then a "
        f"{served['duration_s']:g} s window measured from the server's `/metrics` (`mtgate_output_tokens_total`); "
        f"saturated: batches at least {SATURATED_FILL:.0%} full on average and sentences queued at "
        f"{SATURATED_QUEUED:.0%} of the scrapes (once a second) or more; latency: Locust's, over its whole run",
        "",
        f"| mode | served tokens/s | offline tokens/s | served / offline (target >= {data['target_ratio']:.2f}) | "
        "served req/s | p50 ms | p95 ms | saturated | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    modes = {mode["mode"]: mode for mode in served["modes"]}
    for row in data["summary"]:
        mode = modes[row["mode"]]
        ratio = row["ratio"]
        verdict = "-" if ratio is None else f"{ratio:.2f} ({'meets' if ratio >= data['target_ratio'] else 'misses'})"
        saturated = {True: "yes", False: "**no**", None: "-"}[row["saturated"]]
        lines.append(f"| {row['mode']} | {_num(row['served_tokens_per_s'])} | {_num(row['offline_tokens_per_s'])} | "
                     f"{verdict} | {_num(mode['requests_per_s'], 1)} | {_num(mode['p50_ms'])} | "
                     f"{_num(mode['p95_ms'])} | {saturated} | {_failed(mode)} |")
    spread = off["spread"]
    if spread is not None and spread > SPREAD_WARNING:
        lines += ["", f"**The offline passes differ by {spread:.0%} ((max - min) / median, more than "
                  f"{SPREAD_WARNING:.0%}): the machine's speed changed during the run; read the ratios as uncertain "
                  "by about as much, and look at each pass's CPU per wall second for load from elsewhere.**"]
    lines += ["", "## Offline", ""]
    if off["error"]:
        lines += [f"Error: {off['error']}", ""]
    lines += [f"{off['sentences']} sentences in {off['batches']} batches; "
              f"{_num(off['output_tokens_per_sentence'], 2)} output tokens per sentence; the package loaded in at "
              f"most {_num(off['load_s'], 2)} s.", "",
              "| pass | when | seconds | output tokens | tokens/s | sentences/s | CPU s per wall s |",
              "|---|---|---|---|---|---|---|"]
    for number, p in enumerate(off["passes"], 1):
        lines.append(f"| {number} | {p['slot']} | {p['seconds']:.2f} | {p['output_tokens']} | "
                     f"{p['tokens_per_s']:.0f} | {p['sentences_per_s']:.1f} | {p['cpu_seconds'] / p['seconds']:.2f} |")
    if off["passes"]:
        lines.append(f"| median | | {off['seconds']:.2f} | | {off['tokens_per_s']:.0f} | "
                     f"{off['sentences_per_s']:.1f} | {off['cpu_per_wall']:.2f} |")
    for mode in served["modes"]:
        lines += ["", f"## {mode['mode']}", ""]
        if mode["error"]:
            lines += [f"Error: {mode['error']}", ""]
        queue, inflight = mode["queue_depths"], mode["inflight"]
        batch = (f"mean sentences per engine batch {_num(mode['mean_batch_size'], 1)}"
                 if mode["mean_step_sentences"] is None else
                 f"mean sentences in flight per decoder step {_num(mode['mean_step_sentences'], 1)}")
        lines += [
            f"- server reports batching: {mode['reported_batching'] or 'nothing (setting ignored?)'}",
            f"- window: {_num(mode['window_s'], 1)} s, {_num(mode['output_tokens'])} output tokens, "
            f"{_num(mode['sentences'])} sentences, {_num(mode['requests'])} requests answered 200 "
            f"({_num(mode['failed_responses'])} otherwise): {_num(mode['tokens_per_s'])} tokens/s, "
            f"{_num(mode['sentences_per_s'], 1)} sentences/s, {_num(mode['output_tokens_per_sentence'], 2)} output "
            "tokens per sentence",
            f"- saturation: {batch} ({_num(None if mode['fill'] is None else 100 * mode['fill'])}% of "
            f"{mode['batch_size']}); queue depth > 0 at {sum(q > 0 for q in queue)} of {len(queue)} scrapes (min "
            f"{_num(min(queue, default=None))}, mean {_num(statistics.mean(queue) if queue else None, 1)}); requests "
            f"in flight min {_num(min(inflight, default=None))}",
            f"- CPU: server {_num(mode['server_cpu_per_wall'], 2)} s per wall s in the window; Locust "
            f"{_num(mode['locust_cpu_s'], 1)} s over its {_num(mode['locust_wall_s'], 1)} s run "
            f"({_num(mode['locust_cpu_per_wall'], 2)} per wall s)",
            "- server threads in the window (cores; involuntary / voluntary context switches per s): "
            + ("; ".join(f"{t['role']} {t['cores']:.2f} ({t['involuntary_per_s']:.0f} / {t['voluntary_per_s']:.0f})"
                         for t in mode.get("server_threads", [])) or "not measured (no /proc)"),
            f"- Locust, whole run: {_num(mode['locust_requests'])} requests, {_num(mode['locust_failures'])} failed, "
            f"{_num(mode['locust_rps'], 1)} req/s; p50 {_num(mode['p50_ms'])} ms, p95 {_num(mode['p95_ms'])} ms, "
            f"p99 {_num(mode['p99_ms'])} ms",
        ]
        lines += [f"- failure: {f}" for f in mode["top_failures"]]
    return "\n".join(lines) + "\n"


def _failed(mode: dict[str, Any]) -> str:
    if mode["locust_failures"] is None:
        return "error" if mode["error"] else "-"
    return str(mode["locust_failures"])


# ---------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = parse_args(args)
        texts = read_lines(default_corpus())
    except (UsageError, CorpusError) as e:
        say(f"served_offline: error: {e}")
        return 2
    except SystemExit as e:  # argparse: --help, or a malformed flag (its usage message is already on stderr)
        return int(e.code or 0)
    started = datetime.now(UTC)
    host = machine()
    offline = OfflineResult()
    modes: list[ModeResult] = []
    report = ReportFiles.of(config.out_dir, config.name)

    def write(complete: bool) -> str:
        return report.write(to_json(config, host, offline, modes, started, complete), to_markdown)

    sentences = texts[:config.sentences]

    def offline_slot(slot: str) -> None:
        if offline.error is None:
            run_offline(offline, config, sentences, slot)
            write(False)

    try:
        for mode in config.modes:  # offline passes before every mode and after the last: drift hits both parts
            offline_slot(f"before {mode}")
            modes.append(ModeResult(mode, config.batch_size))
            run_mode(modes[-1], config)
            write(False)
        offline_slot(f"after {config.modes[-1]}")
    except KeyboardInterrupt:
        say(f"served_offline: interrupted; what was measured is in {report.json_path}")
        return 130
    report.finish(host, lambda: to_json(config, host, offline, modes, started, True), to_markdown)
    return 2 if offline.error or any(m.error for m in modes) else 0


if __name__ == "__main__":
    sys.exit(main())
