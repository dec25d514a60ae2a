"""``mtgate loadtest``: run Locust headless against a server, gate on the targets file, write a report.

Each scenario is one Locust subprocess (``--headless --run-time`` bounded, ``--csv --csv-full-history``); its
stats CSVs are read back, every target is evaluated, a table goes to stdout and a Markdown + HTML report to
``--report``. Exit 0 when every target passed, 1 when one failed, 2 on a usage or run error.
``--start-server -m PKG`` runs ``mtgate serve`` on a free loopback port for the duration of the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError

from loadtest.corpus import CorpusError, default_corpus, read_lines
from loadtest.gate import evaluate, format_table
from loadtest.report import ScenarioResult, write_report
from loadtest.scrape import scraping
from loadtest.scrape import write as write_metrics
from loadtest.stats import RunStats, StatsError, read_run
from loadtest.targets import USER_CLASSES, Scenario, Targets, TargetsError, load_targets, parse_duration

logger = logging.getLogger(__name__)

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
STOP_TIMEOUT_S = 5  # lets in-flight requests finish after --run-time, so they are counted
GRACE_S = 60  # beyond run time + stop timeout, a Locust process that has not exited is killed


class LoadTestError(Exception):
    """A run could not be carried out (server did not start, Locust failed): exit code 2."""


def _usage_error(message: str) -> Exception:
    # serving.cli owns UsageError; imported lazily so this module has no import-time dependency on serving.
    from serving.cli import UsageError

    return UsageError(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from serving.cli_options import add_decoding, add_model, positive_float, positive_int

    parser.add_argument("--host", help="server base URL, e.g. http://127.0.0.1:8000 (not with --start-server)")
    parser.add_argument("--targets", type=Path,
                        help="targets file (YAML), see loadtest/targets/; without it one ad-hoc scenario runs "
                             "(--user-class, -u, -r, -t) and the gate checks only that no request failed")
    parser.add_argument("--scenario", action="append", default=[], metavar="NAME",
                        help="run only this scenario of --targets (repeatable; default: all)")
    parser.add_argument("--start-server", action="store_true", help="start `mtgate serve` locally for the run")
    add_model(parser, "model package for --start-server (default: the bundled demo model models/demo-en-de)")
    parser.add_argument("--corpus", type=Path,
                        help="sentence file, text or .gz (default: each scenario's, else the bundled test set)")
    parser.add_argument("--report", type=Path, help="report directory (default: reports/loadtest-<UTC time>)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a host other than 127.0.0.1/localhost (only against servers you operate)")
    parser.add_argument("--api-key", help="bearer token sent to the server (or set $MTGATE_LOADTEST_API_KEY)")
    parser.add_argument("--server-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                        help="seconds to wait for a started server to become ready (default: 120)")
    adhoc = parser.add_argument_group(
        "Locust's options", "-u, -r and -t also override every scenario of --targets; the others describe the "
                            "ad-hoc scenario run without --targets")
    adhoc.add_argument("-u", "--users", type=positive_int, metavar="N",
                       help="concurrent simulated users (ad-hoc default: 1)")
    adhoc.add_argument("-r", "--spawn-rate", type=positive_float, metavar="R",
                       help="users started per second (ad-hoc default: all at once)")
    adhoc.add_argument("-t", "--run-time", metavar="TIME",
                       help="how long to run: 30, 30s, 2m, 1m30s (ad-hoc default: 10s)")
    adhoc.add_argument("--user-class", action="append", default=[], choices=USER_CLASSES, metavar="NAME",
                       help=f"ad-hoc user class, repeatable for a mix ({', '.join(USER_CLASSES)}; "
                            "default: TranslateUser)")
    add_decoding(adhoc)
    adhoc.add_argument("--csv", type=Path, metavar="PREFIX",
                       help="also write Locust's CSV files as PREFIX_stats.csv, PREFIX_stats_history.csv, "
                            "PREFIX_failures.csv (several scenarios: PREFIX_<scenario>_...)")
    adhoc.add_argument("--html", type=Path, metavar="FILE",
                       help="also write Locust's own HTML report to FILE (several scenarios: FILE's name gets "
                            "_<scenario> before its suffix)")


# ---------------------------------------------------------------- host and server


def check_host(url: str, allow_remote: bool) -> str:
    """Normalise and check a base URL; only loopback hosts unless ``allow_remote``.

    Raises:
        ValueError: not an http(s) URL with a host, or a remote host without ``allow_remote``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--host {url!r} is not an http:// or https:// URL with a host")
    if parts.hostname not in LOCAL_HOSTS and not allow_remote:
        raise ValueError(f"--host {parts.hostname} is not 127.0.0.1 or localhost; pass --allow-remote to load-test "
                         "a server you operate elsewhere")
    return url.rstrip("/")


def _reachable(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"{host}/v2/health/live", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError):
        return False


def _ready(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"{host}/v2/health/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def start_server(package: Path, log_path: Path, timeout_s: float = 120.0, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> Iterator[LocalServer]:
    """Run ``mtgate serve -m PACKAGE [extra_args]`` on a free 127.0.0.1 port until the block ends (then SIGTERM).

    ``env`` is added to this process's environment for the server (settings such as ``MTGATE_THREADS``).

    Raises:
        LoadTestError: the server exited or was not ready within ``timeout_s`` (the log's tail is in the message).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "serving.cli", "serve", "-m", str(package), "--host", "127.0.0.1",
               "--port", str(port), *extra_args]
    logger.info("starting server: %s", " ".join(command))
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **env} if env else None)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(url):
            if process.poll() is not None:
                raise LoadTestError(f"server exited with code {process.returncode}: {log_tail(log_path)}")
            if time.monotonic() > deadline:
                raise LoadTestError(f"server not ready after {timeout_s:g} s: {log_tail(log_path)}")
            time.sleep(0.2)
        logger.info("server ready at %s (pid %d)", url, process.pid)
        yield LocalServer(url, process, log_path)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def log_tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a log file on one line (for error messages)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def package_model_name(package: Path) -> str | None:
    """The model name in a package's manifest (what the server calls it), or None when unreadable."""
    try:
        name = json.loads((package / "manifest.json").read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name else None


# ---------------------------------------------------------------- Locust


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


def run_locust(command: Sequence[str], prefix: Path, duration_s: float, label: str,
               env: Mapping[str, str] | None = None) -> RunStats:
    """Run a headless Locust command (``--csv PREFIX``) in a subprocess, bounded to its run time plus the stop
    timeout and a grace period, its output in ``<prefix's directory>/locust.log``; return its stats.

    Raises:
        LoadTestError: Locust failed or overran its time, or its output is unreadable (the message starts with
            ``label``).
    """
    run_env = {**os.environ, **(env or {})}
    # The locustfile imports loadtest.*; make this checkout importable even when it is not installed.
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LOCUSTFILE.parents[1]), run_env.get("PYTHONPATH")]))
    timeout = duration_s + STOP_TIMEOUT_S + GRACE_S
    log_path = prefix.parent / "locust.log"
    with log_path.open("wb") as log:
        try:
            code = subprocess.run(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout, env=run_env).returncode
        except subprocess.TimeoutExpired as e:
            raise LoadTestError(f"{label}: Locust still running after {timeout:g} s; killed") from e
    if code != 0:
        raise LoadTestError(f"{label}: Locust exited with code {code}: {log_tail(log_path)}")
    try:
        return read_run(prefix)
    except StatsError as e:
        raise LoadTestError(f"{label}: {e}") from e


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
    from serving.files import atomic_write_bytes

    for suffix in _CSV_SUFFIXES:
        source = Path(f"{prefix}{suffix}")
        if source.exists():
            atomic_write_bytes(Path(f"{target}{suffix}"), source.read_bytes())


def run_scenario(host: str, scenario: Scenario, directory: Path, corpus: Path, model_name: str | None = None,
                 api_key: str | None = None, outputs: LocustOutputs = LocustOutputs()) -> ScenarioResult:
    """Run one scenario with Locust in a subprocess, bounded in time, and evaluate its targets.

    Raises:
        LoadTestError: Locust failed or overran its time, or its output is unreadable.
    """
    directory.mkdir(parents=True, exist_ok=True)
    prefix = directory / "locust"
    command = locust_command(host, scenario, prefix, corpus, model_name)
    if outputs.html is not None:
        command[command.index("--config-users"):command.index("--config-users")] = ["--html", str(outputs.html)]
    logger.info("scenario %s: %s", scenario.name, " ".join(command))
    extra_env = {"MTGATE_LOADTEST_API_KEY": api_key} if api_key else {}
    with scraping(host) as server:
        run = run_locust(command, prefix, scenario.duration, f"scenario {scenario.name}", extra_env)
    write_metrics(directory / "server_metrics.json", server)
    if outputs.csv is not None:
        copy_csv(prefix, outputs.csv)
    return ScenarioResult(scenario, run, evaluate(scenario.name, scenario.targets, run), server)


def resolve_corpus(override: Path | None, scenario: Scenario, default: Path | None = None) -> Path:
    """The sentence file for a scenario, checked to be readable: ``override`` (--corpus), else the scenario's,
    else ``default``, else the bundled test set.

    Raises:
        CorpusError: missing, unreadable or empty.
    """
    path = override or scenario.corpus or default or default_corpus()
    read_lines(path)
    return path


def check_writable(path: Path, what: str, *, directory: bool = False) -> None:
    """Refuse an output that cannot be written, before any work: a report directory (``directory``: created later,
    so its nearest existing ancestor must be a writable directory) or a file (its directory must exist and be
    writable).

    Raises:
        UsageError: the output cannot be written there.
    """
    if directory:
        if path.exists() and not path.is_dir():
            raise _usage_error(f"{what} {path}: exists and is not a directory")
        existing = next(p for p in (path, *path.parents) if p.exists())
    else:
        if path.is_dir():
            raise _usage_error(f"{what} {path}: is a directory")
        existing = path.parent
        if not existing.is_dir():
            raise _usage_error(f"{what} {path}: no such directory {existing}")
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise _usage_error(f"{what} {path}: cannot write in {existing}")


def default_report_dir(kind: str) -> Path:
    return Path("reports") / f"{kind}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def run_all(host: str, scenarios: list[Scenario], report_dir: Path, corpus: Path | None,
            model_name: str | None, api_key: str | None, default_corpus: Path | None = None,
            outputs: LocustOutputs = LocustOutputs()) -> list[ScenarioResult]:
    """Run the scenarios in order; every one is bounded in time.

    Raises:
        LoadTestError: a run failed; CorpusError: a sentence file is unusable.
    """
    results = []
    for scenario in scenarios:
        path = resolve_corpus(corpus, scenario, default_corpus)
        sys.stderr.write(f"scenario {scenario.name}: {scenario.concurrency} users for {scenario.duration:g} s "
                         f"against {host}\n")
        results.append(run_scenario(host, scenario, report_dir / scenario.name, path,
                                    scenario.model or model_name, api_key,
                                    outputs.for_scenario(scenario.name, len(scenarios) > 1)))
    return results


# ---------------------------------------------------------------- command


ADHOC = "adhoc"


def select_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios to run: those of ``--targets`` (with ``-u/-r/-t`` overriding each), else one ad-hoc scenario.

    Raises:
        UsageError: a bad targets file, an unknown scenario, or options that do not go together.
    """
    try:
        duration = parse_duration(args.run_time) if args.run_time is not None else None
    except ValueError as e:
        raise _usage_error(f"-t/--run-time: {e}") from e
    if args.targets is None:
        if args.scenario:
            raise _usage_error("--scenario needs --targets")
        try:
            return [Scenario(name=ADHOC, users=dict.fromkeys(args.user_class or ["TranslateUser"], 1),
                             concurrency=args.users or 1, spawn_rate=args.spawn_rate or args.users or 1,
                             duration=duration or 10.0, beam_size=args.beam_size, max_length=args.max_length,
                             targets=Targets())]
        except ValidationError as e:
            raise _usage_error("; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())) from e
    given = [name for name, value in (("--user-class", args.user_class), ("--beam-size", args.beam_size),
                                      ("--max-length", args.max_length)) if value]
    if given:
        raise _usage_error(f"{', '.join(given)} describe the ad-hoc scenario; with --targets, set them in the file")
    try:
        scenarios = load_targets(args.targets).select(args.scenario)
    except TargetsError as e:
        raise _usage_error(str(e)) from e
    overrides = {key: value for key, value in (("concurrency", args.users), ("spawn_rate", args.spawn_rate),
                                               ("duration", duration)) if value is not None}
    return [s.model_copy(update=overrides) for s in scenarios]


def run(args: argparse.Namespace) -> int:
    scenarios = select_scenarios(args)
    if args.start_server == bool(args.host):
        raise _usage_error("give either --host URL or --start-server -m PKG")
    if args.start_server and args.model is None:
        from serving.settings import demo_missing, demo_model

        args.model = demo_model()
        if args.model is None:
            raise _usage_error(demo_missing())
    report_dir: Path = args.report or default_report_dir("loadtest")
    outputs = LocustOutputs(args.csv, args.html)
    check_writable(report_dir, "--report", directory=True)
    for scenario in scenarios:
        paths = outputs.for_scenario(scenario.name, len(scenarios) > 1)
        if paths.csv is not None:
            check_writable(Path(f"{paths.csv}_stats.csv"), "--csv")
        if paths.html is not None:
            check_writable(paths.html, "--html")
    try:
        for scenario in scenarios:  # check every corpus before starting anything
            resolve_corpus(args.corpus, scenario)
    except CorpusError as e:
        raise _usage_error(str(e)) from e
    try:
        if args.start_server:
            with start_server(args.model, report_dir / "server.log", args.server_timeout) as server:
                results = run_all(server.url, scenarios, report_dir, args.corpus,
                                  package_model_name(args.model), args.api_key, outputs=outputs)
            host = server.url
        else:
            try:
                host = check_host(args.host, args.allow_remote)
            except ValueError as e:
                raise _usage_error(str(e)) from e
            if not _reachable(host):
                raise _usage_error(f"cannot reach {host}")
            results = run_all(host, scenarios, report_dir, args.corpus, None, args.api_key, outputs=outputs)
    except (LoadTestError, CorpusError) as e:
        sys.stderr.write(f"mtgate loadtest: error: {e}\n")
        return 2
    checks = [c for r in results for c in r.checks]
    sys.stdout.write(format_table(checks))
    md, page = write_report(report_dir, host, results)
    ok = all(r.passed for r in results)
    sys.stdout.write(f"{'PASS' if ok else 'FAIL'}: report {page} and {md}\n")
    return 0 if ok else 1
