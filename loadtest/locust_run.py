"""Running Locust: one headless subprocess per scenario, bounded in time, its outputs read back and gated.

Each scenario is ``locust --headless --run-time ... --csv PREFIX --csv-full-history`` in a subprocess, while the
server's ``/metrics`` is scraped (``loadtest.scrape``); its stats CSVs are read back (``loadtest.stats``) and every
target is evaluated (``loadtest.gate``). Every request names the model under test: the one asked for, else the
server's default, looked up on the server before anything runs (``loadtest.server.served_model``), so the report
names what was measured.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.corpus import default_corpus, read_lines
from loadtest.errors import LoadTestError, log_tail
from loadtest.gate import evaluate
from loadtest.report import ScenarioResult
from loadtest.scrape import scraping
from loadtest.scrape import write as write_metrics
from loadtest.server import ServedModel, served_model
from loadtest.stats import RunStats, StatsError, read_run
from loadtest.targets import Scenario

logger = logging.getLogger(__name__)

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
STOP_TIMEOUT_S = 5  # lets in-flight requests finish after --run-time, so they are counted
GRACE_S = 60  # beyond run time + stop timeout, a Locust process that has not exited is killed


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
    from serving.package.files import atomic_write_bytes

    for suffix in _CSV_SUFFIXES:
        source = Path(f"{prefix}{suffix}")
        if source.exists():
            atomic_write_bytes(Path(f"{target}{suffix}"), source.read_bytes())


def run_scenario(host: str, scenario: Scenario, directory: Path, corpus: Path, model_name: str | None = None,
                 api_key: str | None = None, outputs: LocustOutputs = LocustOutputs(),
                 model: ServedModel | None = None) -> ScenarioResult:
    """Run one scenario with Locust in a subprocess, bounded in time, and evaluate its targets; ``model`` (the
    server's description of ``model_name``) goes into the result for the report.

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
            outputs: LocustOutputs = LocustOutputs()) -> list[ScenarioResult]:
    """Run the scenarios in order; every one is bounded in time. Each sends its requests to its own ``model``, else
    ``model_name``, else the server's default model; every one of them is looked up on the server before the first
    run (a model the server does not serve runs nothing).

    Raises:
        LoadTestError: the server does not serve a model asked for, or a run failed; CorpusError: a sentence file is
            unusable.
    """
    models: dict[str | None, ServedModel] = {}
    for scenario in scenarios:
        name = scenario.model or model_name
        if name not in models:
            models[name] = served_model(host, name, api_key)
    results = []
    for scenario in scenarios:
        path = resolve_corpus(corpus, scenario, default_corpus)
        model = models[scenario.model or model_name]
        sys.stderr.write(f"scenario {scenario.name}: {scenario.concurrency} users for {scenario.duration:g} s "
                         f"against {host}, model {model.describe()}\n")
        results.append(run_scenario(host, scenario, report_dir / scenario.name, path, model.name, api_key,
                                    outputs.for_scenario(scenario.name, len(scenarios) > 1), model))
    return results
