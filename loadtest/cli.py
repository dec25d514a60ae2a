"""``mtgate loadtest``: run Locust headless against a server, gate on the targets, write a report.

The scenarios come from ``--targets`` or, without it, one ad-hoc scenario from Locust's own options. Each runs in
``loadtest.locust_run`` (a bounded Locust subprocess, the server's /metrics scraped meanwhile); a table goes to stdout,
a Markdown + HTML report to ``--report`` and, with ``--tensorboard DIR``, scalars and the verdict to a new
TensorBoard run directory. Exit 0 when every target passed, 1 when one failed, 2 on a usage or run error.
``--server URL`` loads a running server (Locust's ``--host URL`` is accepted too); ``--start-server -m PKG`` runs
``mtgate serve`` on a free loopback port for the run (``loadtest.server``).

The model under test: ``--model-name NAME``, or with ``--server`` the model of ``-m PKG`` (its manifest's name; the
server must serve that name at the package's version), else each scenario's ``model``, else the server's default;
each is looked up on the server before anything runs, and every report names it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from loadtest.corpus import CorpusError
from loadtest.errors import LoadTestError
from loadtest.gate import format_table
from loadtest.locust_run import (
    GRACE_S,
    LOCUSTFILE,
    STOP_TIMEOUT_S,
    LocustOutputs,
    resolve_corpus,
    run_all,
    run_locust,
)
from loadtest.report import ScenarioResult, write_report
from loadtest.server import check_host, free_port, reachable, served_model, start_server
from loadtest.stats import AGGREGATED, TTFE
from loadtest.targets import USER_CLASSES, Scenario, Targets, TargetsError, load_targets, parse_duration

# Re-exported: loadtest.cli was where these lived (benchmarks/served_batching.py imports them from here).
__all__ = ["GRACE_S", "LOCUSTFILE", "STOP_TIMEOUT_S", "LoadTestError", "add_arguments", "check_host", "free_port",
           "run", "run_locust", "start_server"]

logger = logging.getLogger(__name__)


def _usage_error(message: str) -> Exception:
    # serving.commands.main owns UsageError; imported lazily so this module has no import-time dependency on serving.
    from serving.commands.options import UsageError

    return UsageError(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from serving.commands.options import (
        add_alias,
        add_decoding,
        add_model,
        add_model_name,
        positive_float,
        positive_int,
    )

    # One of the two; Locust's own name for the URL, --host, is accepted too (serve's --host is an address).
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--server", metavar="URL", help="base URL of the server to load, e.g. http://127.0.0.1:8000")
    add_alias(target, "--host", "server", new="--server", deprecated=False, metavar="URL")
    target.add_argument("--start-server", action="store_true",
                        help="start `mtgate serve` locally for the run (with -m PKG)")
    parser.add_argument("--targets", type=Path,
                        help="targets file (YAML), see loadtest/targets/; without it one ad-hoc scenario runs "
                             "(--user-class, -u, -r, -t) and the gate checks only that no request failed")
    parser.add_argument("--scenario", action="append", default=[], metavar="NAME",
                        help="run only this scenario of --targets (repeatable; default: all)")
    add_model(parser, "the model package to test: served by --start-server (default: the bundled demo model "
                      "models/demo-en-de), or with --server the model of that name on the server (checked)")
    add_model_name(parser, "with --server: the model to test, by the name the server serves it under (default: the "
                           "server's default model); for a server with several models")
    parser.add_argument("--corpus", type=Path,
                        help="sentence file, text or .gz (default: each scenario's, else the bundled test set)")
    parser.add_argument("--report", type=Path, help="report directory (default: reports/loadtest-<UTC time>)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a host other than 127.0.0.1/localhost (only against servers you operate)")
    parser.add_argument("--api-key", metavar="KEY", help="bearer token sent to the server (or set $MTGATE_LOADTEST_API_KEY)")
    parser.add_argument("--server-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                        help="seconds to wait for a started server to become ready (default: 120)")
    parser.add_argument("--tensorboard", type=Path, metavar="DIR",
                        help="also write the run's scalars and verdict for TensorBoard into a new run directory "
                             "under DIR (tensorboard --logdir DIR)")
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


# ---------------------------------------------------------------- command


ADHOC = "adhoc"


def check_tensorboard(root: Path) -> None:
    """``--tensorboard DIR`` is writable and tensorboardX is installed, before any work.

    Raises:
        UsageError: either is not the case.
    """
    from batch.tensorboard import TensorBoardUnavailable, check_available

    check_writable(root, "--tensorboard", directory=True)
    try:
        check_available()
    except TensorBoardUnavailable as e:
        raise _usage_error(str(e)) from e


def scenario_scalars(result: ScenarioResult) -> dict[str, float | None]:
    """The numbers of one scenario for TensorBoard: latency percentiles, throughput, errors, server view."""
    run = result.run
    requests = run.request_entries
    total = sum(e.requests for e in requests)
    worst = {p: max((v for e in requests if (v := e.percentile(p)) is not None), default=None)
             for p in ("50%", "95%", "99%")}
    values: dict[str, float | None] = {
        "p50_ms": worst["50%"], "p95_ms": worst["95%"], "p99_ms": worst["99%"],
        "requests_per_s": sum(e.rps for e in requests), "requests": float(total),
        "error_rate": sum(e.failures for e in requests) / total if total else None,
        "output_tokens_per_s": run.tokens.output_tokens_per_s if run.tokens is not None else None,
        "passed": float(result.passed),
    }
    if run.first_event_entries:
        values["ttfe_p95_ms"] = max((v for e in run.first_event_entries if (v := e.percentile("95%")) is not None),
                                    default=None)
    whole = result.server.whole_run() if result.server is not None else None
    if whole is not None:
        values |= {"server_queue_wait_mean_ms": whole.queue_wait_mean_ms,
                   "server_queue_wait_p95_ms": whole.queue_wait_p95_ms, "server_batch_size_mean": whole.batch_size_mean}
    return values


def write_scenarios(writer: Any, results: list[ScenarioResult], prefix: str = "load/") -> None:
    """Each scenario's scalars at step 0, and its latency and throughput over time at each second."""
    from loadtest.report import _origin, throughput_series

    for r in results:
        tag = f"{prefix}{r.scenario.name}/"
        writer.scalars(scenario_scalars(r), prefix=tag)
        origin = _origin(r.run)
        p95: dict[int, float] = {}
        for h in r.run.history:
            if h.type != TTFE and h.name != AGGREGATED and (v := h.percentiles.get("95%")):
                second = int(h.timestamp - origin)
                p95[second] = max(p95.get(second, 0.0), v)
        for second, value in sorted(p95.items()):
            writer.scalar(f"{tag}over_time/p95_ms", value, step=second)
        for label, points in throughput_series(r.run):
            for x, y in points:
                writer.scalar(f"{tag}over_time/{label.replace(' ', '_').replace('/', '_per_')}", y, step=int(x))


def write_tensorboard(root: Path, host: str, results: list[ScenarioResult], ok: bool) -> Path:
    """One TensorBoard run directory for this load test; returns it."""
    from batch.tensorboard import markdown_table, open_run

    with open_run(root, "loadtest") as writer:
        write_scenarios(writer, results)
        rows = [["scenario", "target", "measured", "result"]]
        rows += [[c.scenario, c.target, c.measured_text, "pass" if c.passed else "FAIL"]
                 for r in results for c in r.checks]
        models = "; ".join(dict.fromkeys(r.model.describe() for r in results if r.model is not None))
        tested = f", model {models}" if models else ""
        writer.text("verdict", f"**{'PASS' if ok else 'FAIL'}** against {host}{tested}\n\n{markdown_table(rows)}")
        return writer.directory


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


def package_model(package: Path) -> tuple[str, str | None]:
    """The name and version a package is served under (its manifest's).

    Raises:
        UsageError: not a readable model package.
    """
    from serving.package import PackageError, open_package

    try:
        manifest = open_package(package, verify=False).manifest
    except PackageError as e:
        raise _usage_error(str(e)) from e
    return manifest.name or package.name, manifest.version or None


def _model_under_test(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The model name every scenario is to use (None: each scenario's, else the server's default) and, for
    ``--server URL -m PKG``, the version the server must serve it at."""
    if args.model is not None and args.model_name is not None:
        raise _usage_error("give -m PKG or --model-name NAME, not both (the package's name is the model's name)")
    if args.start_server:
        if args.model_name is not None:
            raise _usage_error("--model-name is for --server: --start-server serves -m PKG under its own name")
        if args.model is None:
            from serving.server.settings import demo_missing, demo_model

            args.model = demo_model()
            if args.model is None:
                raise _usage_error(demo_missing())
        return package_model(args.model)[0], None
    if args.model is not None:
        return package_model(args.model)
    return args.model_name, None


def run(args: argparse.Namespace) -> int:
    scenarios = select_scenarios(args)
    model_name, version = _model_under_test(args)
    if model_name is not None:  # named on the command line: every scenario's, as -u/-r/-t override the file
        scenarios = [s.model_copy(update={"model": model_name}) for s in scenarios]
    report_dir: Path = args.report or default_report_dir("loadtest")
    outputs = LocustOutputs(args.csv, args.html)
    check_writable(report_dir, "--report", directory=True)
    if args.tensorboard is not None:
        check_tensorboard(args.tensorboard)
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
            with start_server(args.model, report_dir / "server.log", args.server_timeout, wait=False) as server:
                results = run_all(server.url, scenarios, report_dir, args.corpus, model_name, args.api_key,
                                  outputs=outputs, ready=server.wait_ready)
            host = server.url
        else:
            try:
                host = check_host(args.server, args.allow_remote)
            except ValueError as e:
                raise _usage_error(str(e)) from e
            if not reachable(host):
                raise _usage_error(f"cannot reach {host}")
            if model_name is not None and version is not None:
                served = served_model(host, model_name, args.api_key)
                if served.version is not None and served.version != version:
                    raise _usage_error(f"the server at {host} serves {model_name} at version {served.version}, not "
                                       f"the version of {args.model} ({version}); pass --model-name {model_name} "
                                       "to test what it serves")
            results = run_all(host, scenarios, report_dir, args.corpus, model_name, args.api_key, outputs=outputs)
    except (LoadTestError, CorpusError) as e:
        sys.stderr.write(f"mtgate loadtest: error: {e}\n")
        return 2
    checks = [c for r in results for c in r.checks]
    sys.stdout.write(format_table(checks))
    for model in dict.fromkeys(r.model.describe() for r in results if r.model is not None):
        sys.stdout.write(f"model tested: {model}\n")
    md, page = write_report(report_dir, host, results)
    ok = all(r.passed for r in results)
    if args.tensorboard is not None:
        sys.stdout.write(f"tensorboard: {write_tensorboard(args.tensorboard, host, results, ok)}\n")
    sys.stdout.write(f"{'PASS' if ok else 'FAIL'}: report {page} and {md}\n")
    return 0 if ok else 1
