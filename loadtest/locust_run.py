"""Running Locust: one headless subprocess per scenario, bounded in time, its outputs read back and gated.

Each scenario is ``locust --headless --run-time ... --csv PREFIX --csv-full-history`` in a subprocess, while the
server's ``/metrics`` is scraped (``loadtest.scrape``); its stats CSVs are read back (``loadtest.stats``) and every
target is evaluated (``loadtest.gate``). Every request names the model under test: the one asked for, else the
server's default, looked up on the server before anything runs (``loadtest.server.served_model``), so the report
names what was measured.

Starting Locust (importing it, gevent and the users, reading the corpus) takes seconds of CPU, more than a short
scenario's overhead budget. :func:`run_all` therefore starts every scenario's Locust at once, each waiting at a gate
(``--wait-for-start``) once loaded, and releases them one after another: a scenario's wall time is its run time plus
its requests in flight at the end, and no Locust is still loading while another one measures. While a scenario
runs, a line of live numbers (requests, failures, rate, percentiles) goes to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from loadtest.corpus import default_corpus, read_lines
from loadtest.errors import LoadTestError, log_tail
from loadtest.gate import evaluate
from loadtest.report import ScenarioResult
from loadtest.scrape import scraping
from loadtest.scrape import write as write_metrics
from loadtest.server import ServedModel, served_model
from loadtest.stats import AGGREGATED, RunStats, StatsError, read_entries, read_run
from loadtest.targets import Scenario

logger = logging.getLogger(__name__)

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
STOP_TIMEOUT_S = 5  # lets in-flight requests finish after --run-time, so they are counted
GRACE_S = 60  # beyond run time + stop timeout, a Locust process that has not exited is killed
LOAD_TIMEOUT_S = 120  # longest wait for the Locust processes started ahead to be loaded
LIVE_INTERVAL_S = 5.0  # a line of live numbers this often when stderr is not a terminal (every second when it is)


def locust_command(host: str, scenario: Scenario, prefix: Path, corpus: Path, model_name: str | None) -> list[str]:
    """The headless Locust command line for one scenario (user classes last: --config-users takes the rest)."""
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *scenario.users,
        "--headless", "--host", host,
        "--users", str(scenario.concurrency), "--spawn-rate", f"{scenario.spawn_rate:g}",
        "--run-time", f"{max(1, round(scenario.duration))}s", "--stop-timeout", str(STOP_TIMEOUT_S),
        "--csv", str(prefix), "--csv-full-history", "--only-summary", "--exit-code-on-error", "0",
        "--loglevel", "WARNING",
        "--corpus", str(corpus), "--tokens-file", f"{prefix}_tokens.json",
        "--bulk-size", str(scenario.bulk_size), "--think-time", f"{scenario.think_time_s:g}",
    ]
    if scenario.max_length is not None:
        command += ["--max-length", str(scenario.max_length)]
    if scenario.beam_size is not None:
        command += ["--beam-size", str(scenario.beam_size)]
    if model_name:
        command += ["--model-name", model_name]
    weights = [{"user_class_name": name, "weight": w} for name, w in scenario.users.items()]
    command += ["--config-users", json.dumps(weights)]
    return command


class LocustRun:
    """A headless Locust command (``--csv PREFIX``) in a subprocess, its output in ``<prefix's directory>/locust.log``.

    With ``gated``, Locust loads (imports, corpus) and then waits for :meth:`release` before starting any user, so
    that its start-up overlaps other work; :meth:`loaded` says when it is there.
    """

    def __init__(self, command: Sequence[str], prefix: Path, env: Mapping[str, str] | None = None,
                 gated: bool = False) -> None:
        run_env = {**os.environ, **(env or {})}
        # The locustfile imports loadtest.*; make this checkout importable even when it is not installed.
        run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LOCUSTFILE.parents[1]),
                                                              run_env.get("PYTHONPATH")]))
        self.prefix = prefix
        self.log_path = prefix.parent / "locust.log"
        self.gate = Path(f"{prefix}_loaded") if gated else None
        args = list(command)
        if self.gate is not None:
            self.gate.unlink(missing_ok=True)
            at = args.index("-f") + 2  # after the locustfile, before the user classes
            args[at:at] = ["--wait-for-start", str(self.gate)]
        self._log: IO[bytes] = self.log_path.open("wb")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=run_env,
                                        stdin=subprocess.PIPE if gated else subprocess.DEVNULL)
        self.released = time.monotonic()

    def loaded(self) -> bool:
        """True once a gated Locust waits at its gate (or has exited, e.g. on a bad option)."""
        return self.gate is None or self.gate.exists() or self.process.poll() is not None

    def release(self, model_name: str | None = None) -> None:
        """Let a gated Locust start its users now (sending its requests to ``model_name``, when given)."""
        self.released = time.monotonic()
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.write(f"start {model_name or ''}\n".encode())
                stdin.close()
            except BrokenPipeError:  # it exited already: finish() says how
                pass

    def abandon(self) -> None:
        """Stop a Locust that will not run (a gated one exits at the end of its stdin without starting)."""
        if self.process.poll() is None:
            if self.process.stdin is not None and not self.process.stdin.closed:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def finish(self, duration_s: float, label: str, live: LiveStats | None = None,
               model_name: str | None = None) -> RunStats:
        """Wait for the run (released now, with ``model_name``, if it is not yet), bounded to its run time plus the
        stop timeout and a grace period; return its stats.

        Raises:
            LoadTestError: Locust failed or overran its time, or its output is unreadable (the message starts with
                ``label``).
        """
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.release(model_name)
        timeout = duration_s + STOP_TIMEOUT_S + GRACE_S
        try:
            while True:
                try:
                    code = self.process.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - self.released > timeout:
                        self.process.kill()
                        self.process.wait()
                        raise LoadTestError(f"{label}: Locust still running after {timeout:g} s; killed") from None
                    if live is not None:
                        live.update(self.prefix, time.monotonic() - self.released)
        finally:
            if live is not None:
                live.end()
            self._log.close()
        if code != 0:
            raise LoadTestError(f"{label}: Locust exited with code {code}: {log_tail(self.log_path)}")
        try:
            return read_run(self.prefix)
        except StatsError as e:
            raise LoadTestError(f"{label}: {e}") from e


class LiveStats:
    """A line of live numbers on stderr while a scenario runs, from the stats file Locust rewrites every second:
    rewritten in place on a terminal, else a new line every :data:`LIVE_INTERVAL_S` seconds."""

    def __init__(self, name: str, duration_s: float, stream: IO[str] | None = None) -> None:
        self.name = name
        self.duration_s = duration_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.shown = 0.0
        self.width = 0

    def line(self, prefix: Path, elapsed: float) -> str | None:
        """The numbers so far (None before Locust has written any)."""
        try:
            rows = [e for e in read_entries(Path(f"{prefix}_stats.csv")) if e.name == AGGREGATED and not e.type]
        except StatsError:
            return None  # not written yet
        if not rows:
            return None
        e = rows[-1]
        when = (f"{elapsed:.0f}/{self.duration_s:g} s" if elapsed < self.duration_s else
                f"{self.duration_s:g} s done, finishing the requests in flight")
        if not e.requests:
            return f"  {self.name}: {when}, no answer yet"
        p50, p95 = e.percentile("50%"), e.percentile("95%")
        latency = f", p50 {p50:.0f} ms, p95 {p95:.0f} ms" if p50 is not None and p95 is not None else ""
        return f"  {self.name}: {when}, {e.requests} requests ({e.failures} failed), {e.rps:.1f} req/s{latency}"

    def update(self, prefix: Path, elapsed: float) -> None:
        if not self.tty and elapsed - self.shown < LIVE_INTERVAL_S:
            return
        text = self.line(prefix, elapsed)
        if text is None:
            return
        self.shown = elapsed
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


def run_locust(command: Sequence[str], prefix: Path, duration_s: float, label: str,
               env: Mapping[str, str] | None = None) -> RunStats:
    """Run a headless Locust command (``--csv PREFIX``) in a subprocess, bounded to its run time plus the stop
    timeout and a grace period, its output in ``<prefix's directory>/locust.log``; return its stats.

    Raises:
        LoadTestError: Locust failed or overran its time, or its output is unreadable (the message starts with
            ``label``).
    """
    return LocustRun(command, prefix, env).finish(duration_s, label)


@dataclass(frozen=True)
class LocustOutputs:
    """Copies of Locust's own outputs that a user asked for (``--csv PREFIX``, ``--html FILE``)."""

    csv: Path | None = None
    html: Path | None = None

    def for_scenario(self, name: str, several: bool) -> LocustOutputs:
        """The paths for one scenario: as given for a single scenario, else with ``_<name>`` added."""
        if not several:
            return self
        return LocustOutputs(
            csv=self.csv.with_name(f"{self.csv.name}_{name}") if self.csv else None,
            html=self.html.with_name(f"{self.html.stem}_{name}{self.html.suffix}") if self.html else None)


_CSV_SUFFIXES = ("_stats.csv", "_stats_history.csv", "_failures.csv", "_exceptions.csv")


def copy_csv(prefix: Path, target: Path) -> None:
    """Copy the CSV files Locust wrote with ``--csv prefix`` to ``--csv target`` (atomically, each file)."""
    from serving.package.files import atomic_write_bytes

    for suffix in _CSV_SUFFIXES:
        source = Path(f"{prefix}{suffix}")
        if source.exists():
            atomic_write_bytes(Path(f"{target}{suffix}"), source.read_bytes())


def start_scenario(host: str, scenario: Scenario, directory: Path, corpus: Path, model_name: str | None = None,
                   api_key: str | None = None, outputs: LocustOutputs = LocustOutputs(),
                   gated: bool = False) -> LocustRun:
    """Start one scenario's Locust (``gated``: loaded, then waiting for its release)."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = directory / "locust"
    command = locust_command(host, scenario, prefix, corpus, model_name)
    if outputs.html is not None:
        command[command.index("--config-users"):command.index("--config-users")] = ["--html", str(outputs.html)]
    logger.info("scenario %s: %s", scenario.name, " ".join(command))
    extra_env = {"MTGATE_LOADTEST_API_KEY": api_key} if api_key else {}
    return LocustRun(command, prefix, extra_env, gated=gated)


def run_scenario(host: str, scenario: Scenario, directory: Path, corpus: Path, model_name: str | None = None,
                 api_key: str | None = None, outputs: LocustOutputs = LocustOutputs(),
                 model: ServedModel | None = None, started: LocustRun | None = None,
                 live: bool = False) -> ScenarioResult:
    """Run one scenario with Locust in a subprocess, bounded in time, and evaluate its targets; ``model`` (the
    server's description of ``model_name``) goes into the result for the report. ``started``: its Locust, started
    ahead by :func:`start_scenario` (released now); ``live``: a line of live numbers on stderr meanwhile.

    Raises:
        LoadTestError: Locust failed or overran its time, or its output is unreadable.
    """
    locust = started or start_scenario(host, scenario, directory, corpus, model_name, api_key, outputs)
    prefix = locust.prefix
    with scraping(host) as server:
        run = locust.finish(scenario.duration, f"scenario {scenario.name}",
                            LiveStats(scenario.name, scenario.duration) if live else None, model_name)
    write_metrics(directory / "server_metrics.json", server)
    if outputs.csv is not None:
        copy_csv(prefix, outputs.csv)
    return ScenarioResult(scenario, run, evaluate(scenario.name, scenario.targets, run), server, model)


def resolve_corpus(override: Path | None, scenario: Scenario, default: Path | None = None) -> Path:
    """The sentence file for a scenario, checked to be readable: ``override`` (--corpus), else the scenario's,
    else ``default``, else the bundled test set.

    Raises:
        CorpusError: missing, unreadable or empty.
    """
    path = override or scenario.corpus or default or default_corpus()
    read_lines(path)
    return path


def run_all(host: str, scenarios: list[Scenario], report_dir: Path, corpus: Path | None,
            model_name: str | None, api_key: str | None, default_corpus: Path | None = None,
            outputs: LocustOutputs = LocustOutputs(), ready: Callable[[], None] | None = None) -> list[ScenarioResult]:
    """Run the scenarios in order; every one is bounded in time. Each sends its requests to its own ``model``, else
    ``model_name``, else the server's default model; every one of them is looked up on the server before the first
    run (a model the server does not serve runs nothing).

    ``ready``: returns once the server is ready (a server still starting: the Locust processes load meanwhile).

    Raises:
        LoadTestError: the server does not serve a model asked for, or a run failed; CorpusError: a sentence file is
            unusable.
    """
    from loadtest.charts import preload  # every caller draws the results' charts: import matplotlib meanwhile

    results = []
    with ExitStack() as stack:
        started = []
        for scenario in scenarios:  # every Locust loads at once, then waits at its gate for its turn and model
            path = resolve_corpus(corpus, scenario, default_corpus)
            locust = start_scenario(host, scenario, report_dir / scenario.name, path, None, api_key,
                                    outputs.for_scenario(scenario.name, len(scenarios) > 1), gated=True)
            stack.callback(locust.abandon)
            started.append((path, locust))
        charts = threading.Thread(target=preload, name="preload-matplotlib", daemon=True)
        charts.start()
        if ready is not None:
            ready()
        models: dict[str | None, ServedModel] = {}
        for scenario in scenarios:
            name = scenario.model or model_name
            if name not in models:
                models[name] = served_model(host, name, api_key)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not all(locust.loaded() for _, locust in started) and time.monotonic() < deadline:
            time.sleep(0.05)
        charts.join(timeout=max(0.0, deadline - time.monotonic()))
        for scenario, (path, locust) in zip(scenarios, started, strict=True):
            model = models[scenario.model or model_name]
            sys.stderr.write(f"scenario {scenario.name}: {scenario.concurrency} users for {scenario.duration:g} s "
                             f"against {host}, model {model.describe()}\n")
            results.append(run_scenario(host, scenario, report_dir / scenario.name, path, model.name, api_key,
                                        outputs.for_scenario(scenario.name, len(scenarios) > 1), model,
                                        started=locust, live=True))
    return results
