"""Overload: far more clients than the server can serve, on one or more checkouts side by side. A benchmark, not a test.

    .venv/bin/python -m benchmarks.overload --checkout main=../main --checkout new=.
    .venv/bin/python -m benchmarks.overload --clients 100 --sentences 8 --duration 30s --honour-retry-after

For each ``--checkout NAME=PATH`` (default: this checkout), ``mtgate serve`` runs from that checkout (its own
``serving``: the working directory and ``PYTHONPATH`` of the process) on a free loopback port, on the same package
(``-m``, default the bundled demo) at the server's defaults plus ``--server-env``, logging JSON. All servers start
first and stay up (an idle server uses no CPU) and get ``--settle`` of the reference load, not measured (a server
that has just started has timed none of its batches yet). Then, in each of ``--rounds`` rounds, each phase runs on
every checkout in turn, after it is idle, every other round in the reverse order (so that a change in the machine's
speed, which on a shared VM is tens of percent within minutes, favours no checkout and no phase):

1. reference: ``--reference-clients`` closed-loop clients (each sends ``--sentences`` sentences of the bundled
   Multi30k test set per ``POST /v1/translate`` as soon as its last request is answered) for ``--duration``: enough
   to keep full batches queued at a latency far below the deadline. Its rate of successful requests is the rate the
   server holds with p95 below the deadline (the table shows its p95 and statuses).
2. overload: ``--clients`` such clients for ``--duration``. A client refused with 503 sends again at once, or after
   the ``Retry-After`` it was given with ``--honour-retry-after``. Requests still open at the end are abandoned (the
   client disconnects, as a load test's clients do when it stops).

The deadline is ``--timeout-ms`` (sent as ``timeout_ms``), else the server's ``request_timeout_s``. Every request
carries an ``X-Request-ID``; the server's per-batch log lines (request ids, batch size, when done) then show which
computed sentences were done after their request's deadline (send time + deadline + 50 ms): a whole batch when every
request in it was late, otherwise at least one sentence per late request (a lower bound that needs only the log). A
server that counts them itself also reports ``mtgate_late_sentences_total``. Per phase the report also gives the
share of computed sentences that were useful (of requests answered 200; the batch still running when the clients
stop counts against it) and the engine seconds of its batches (``infer_ms``; request-level batching).

Verdict per checkout: overload's ok requests/s at least 80% of the reference's (the median over the rounds of the
ratio within a round), and no computed sentence done after its deadline. Writes ``<out-dir>/<name>.json`` and ``.md``
and prints the Markdown (with the CPU per answered request of the server's event loop and of the load generator:
under overload, mostly what a refusal costs); server logs stay in ``--work-dir``. Exit code 0, or 2 on a usage error or a failed server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/overload.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    ReportFiles,
    UsageError,
    machine,
    read_package,
    run_header,
    say,
)
from benchmarks.overload_phase import (  # noqa: E402
    Phase,
    batches_logged,
    late_metric,
    loop_cpu_s,
    run_clients,
    summarize,
)
from benchmarks.served_batching import (  # noqa: E402
    parse_server_env,
    wait_until_idle,
)
from loadtest.corpus import default_corpus, read_lines  # noqa: E402
from loadtest.errors import log_tail  # noqa: E402
from loadtest.server import free_port  # noqa: E402
from loadtest.targets import parse_duration  # noqa: E402

MIN_GOODPUT = 0.8  # overload's successful requests/s over the reference's


@dataclass
class CheckoutResult:
    name: str
    path: str
    phases: list[Phase] = field(default_factory=list)
    error: str | None = None

    def ratios(self) -> list[float]:
        """Overload's ok req/s over the reference's, per round that has both."""
        by_round: dict[int, dict[str, float]] = {}
        for p in self.phases:
            by_round.setdefault(p.round, {})[p.phase] = p.ok_rps
        return [r["overload"] / r["reference"] for r in by_round.values()
                if r.get("reference") and "overload" in r]

    def late(self) -> int:
        """Computed sentences done after their deadline, in every phase (the server's count when it is higher)."""
        return sum(max(p.late_sentences_log, int(p.late_sentences_metric or 0)) for p in self.phases)


# ---------------------------------------------------------------- the server of a checkout


def entry_module(path: Path) -> str:
    """The ``mtgate`` command's module in the checkout at ``path`` (``serving.commands.main``; ``serving.cli`` before
    serving/ was cut into rooms), so that a checkout from before the move can be measured beside one from after."""
    return "serving.commands.main" if (path / "serving" / "commands" / "main.py").is_file() else "serving.cli"


def parse_checkouts(pairs: Sequence[str]) -> dict[str, Path]:
    """``--checkout NAME=PATH`` options (none: this checkout, as ``this``), each PATH a checkout of mtgate.

    Raises:
        UsageError: not NAME=PATH, or PATH is not a checkout.
    """
    checkouts = {}
    for pair in pairs or [f"this={ROOT}"]:
        name, sep, path = pair.partition("=")
        module = Path(path) / Path(*entry_module(Path(path)).split(".")).with_suffix(".py")
        if not sep or not name or not module.is_file():
            raise UsageError(f"--checkout {pair!r}: expected NAME=PATH of a checkout of mtgate (with {module})")
        checkouts[name] = Path(path).resolve()
    return checkouts


@contextlib.contextmanager
def serve_checkout(path: Path, package: Path, log_path: Path, env: dict[str, str],
                   timeout_s: float) -> Iterator[tuple[str, int]]:
    """``mtgate serve`` of the checkout at ``path`` on a free port until the block ends (SIGTERM); yields its URL and
    process id."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", entry_module(path), "serve", "-m", str(package.resolve()), "--host", "127.0.0.1",
               "--port", str(port)]
    environment = {**os.environ, **env, "PYTHONPATH": str(path), "MTGATE_LOG_FORMAT": "json"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=path, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server of {path} not ready: {log_tail(log_path)}")
            time.sleep(0.2)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def settle(url: str, deadline_s: float, rid: str) -> None:
    """Return once the server has finished the work of the clients that left: nothing in flight or queued, and the
    batch the worker was running (for requests already abandoned, which no gauge shows) done, as the answer to one
    short probe request shows (one worker thread: the probe's batch runs after it; a step batch: its abandoned rows
    leave at the next step)."""
    wait_until_idle(url, timeout_s=deadline_s + 60)
    httpx.post(f"{url}/v1/translate", json={"text": "Hello."}, headers={"X-Request-ID": rid},
               timeout=deadline_s + 60)


def run_phase(name: str, round_: int, server: tuple[str, int], log_path: Path, clients: int,
              config: argparse.Namespace, corpus: list[str], deadline_s: float, label: str) -> Phase:
    url, pid = server
    wait_until_idle(url, timeout_s=deadline_s + 60)
    offset = log_path.stat().st_size
    before = late_metric(url)
    cpu_before, client_before = loop_cpu_s(pid), time.process_time()
    say(f"{label}: round {round_} {name}, {clients} clients x {config.sentences} sentences, {config.duration_s:g} s")
    sent = asyncio.run(run_clients(url, clients, config.sentences, config.duration_s, corpus,
                                   config.seed + round_, config.honour_retry_after, config.timeout_ms,
                                   f"{label}-{round_}-{name}"))
    cpu_after, client_cpu_s = loop_cpu_s(pid), time.process_time() - client_before
    settle(url, deadline_s, f"{label}-{round_}-{name}-probe")
    after = late_metric(url)
    counter = None if before is None or after is None else after - before
    batches = [b for b in batches_logged(log_path, offset) if not all(r.endswith("-probe") for r in b[2])]
    phase = summarize(name, round_, clients, config.duration_s, sent, config.sentences, deadline_s, batches, counter)
    phase.client_cpu_s = client_cpu_s
    if cpu_before is not None and cpu_after is not None:
        phase.loop_cpu_s = cpu_after - cpu_before
    say(f"{label}: {name}: {phase.ok_rps:.2f} ok req/s, statuses {phase.statuses}, late >= "
        f"{phase.late_sentences_log}" + ("" if counter is None else f" (server: {counter:g})"))
    return phase


# ---------------------------------------------------------------- command line and report


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=PATH",
                        help="a checkout to serve from (repeatable; default: this one, as 'this')")
    parser.add_argument("-m", "--model", type=Path, help="model package (default: the bundled demo)")
    parser.add_argument("--clients", type=int, default=100, help="overload clients (default: 100)")
    parser.add_argument("--reference-clients", type=int, default=8, help="reference clients (default: 8)")
    parser.add_argument("--sentences", type=int, default=8, help="sentences per request (default: 8)")
    parser.add_argument("--duration", default="30s", help="per phase: 30, '30s', '2m' (default: 30s)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both phases (default: 1)")
    parser.add_argument("--settle", default="15s", help="reference load before the first round, not measured "
                        "(default: 15s; 0: none)")
    parser.add_argument("--timeout-ms", type=int, help="timeout_ms sent with every request (default: none, the "
                        "server's request_timeout_s)")
    parser.add_argument("--honour-retry-after", action="store_true", help="a refused client waits its Retry-After")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="another server setting, e.g. MTGATE_THREADS=2 (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", help="result file name (default: overload-<UTC date>)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--work-dir", type=Path, help="server logs (default: build/overload/<name>)")
    parser.add_argument("--server-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    args.checkouts = parse_checkouts(args.checkout)
    try:
        args.duration_s = parse_duration(args.duration)
        args.settle_s = parse_duration(args.settle) if args.settle not in ("0", "0s") else 0.0
    except ValueError as e:
        raise UsageError(f"--duration / --settle: {e}") from None
    if min(args.clients, args.reference_clients, args.sentences, args.rounds) < 1 or (args.timeout_ms or 1) < 1:
        raise UsageError("--clients, --reference-clients, --sentences, --rounds and --timeout-ms must be positive")
    args.env = parse_server_env(args.server_env)
    args.package, args.model_info = read_package(args.model)
    args.name = args.name or f"overload-{datetime.now(UTC):%Y-%m-%d}"
    args.work_dir = args.work_dir or ROOT / "build" / "overload" / args.name
    args.command = shlex.join(["python", "-m", "benchmarks.overload", *argv])
    return args


def verdict(result: CheckoutResult) -> str:
    ratios = result.ratios()
    if not ratios:
        return "not measured" + (f": {result.error}" if result.error else "")
    share, late = statistics.median(ratios), result.late()
    held = "yes" if share >= MIN_GOODPUT and late == 0 else "no"
    rounds = ", ".join(f"{r:.0%}" for r in ratios)
    return f"{held}: {share:.0%} of the reference's rate (rounds: {rounds}), {late} late sentences"


def to_markdown(data: dict[str, Any]) -> str:
    lines = [f"# Overload: {data['name']}", "", *run_header(data),
             f"- model: `{data['model']['package']}`; server settings: defaults"
             + (f" plus {data['server_env']}" if data["server_env"] else "") + "; JSON logs",
             f"- deadline {data['deadline_s']:g} s; {data['sentences']} sentences per request; "
             f"{data['duration_s']:g} s per phase, {data['rounds']} round(s) after {data['settle_s']:g} s of settling; "
             "refused clients "
             + ("wait their Retry-After" if data["honour_retry_after"] else "send again at once"),
             f"- holds when overload's ok req/s >= {MIN_GOODPUT:.0%} of the reference's and no computed sentence "
             "was done after its deadline", "",
             "| round | checkout | phase | clients | statuses | ok req/s | p50 s | p95 s | Retry-After (median) | "
             "computed sentences | useful | engine s | late (log, at least) | late (server) | CPU ms per answer: server loop, clients |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    phases = sorted(((p, r["name"]) for r in data["checkouts"] for p in r["phases"]),
                    key=lambda pr: (pr[0]["round"], pr[0]["phase"] != "reference"))
    for p, name in phases:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(p["statuses"].items()))
        useful = f"{p['useful_sentences']} ({p['useful_sentences'] / max(1, p['computed_sentences']):.0%})"
        lines.append(
            f"| {p['round']} | {name} | {p['phase']} | {p['clients']} | {statuses} | {p['ok_rps']:.2f} | "
            f"{_num(p['p50_s'])} | {_num(p['p95_s'])} | {_num(p['retry_after_median_s'])} | "
            f"{p['computed_sentences']} | {useful} | {p['engine_s']:.1f} | {p['late_sentences_log']} | "
            f"{_num(p['late_sentences_metric'])} | {_per_answer(p)} |")
    lines += ["", *(f"- {r['name']} (`{r['path']}`): holds: {r['verdict']}" for r in data["checkouts"])]
    return "\n".join(lines) + "\n"


def _per_answer(phase: dict[str, Any]) -> str:
    """The CPU per request answered (mostly refusals under overload), in ms: the server's event loop, and the load
    generator's clients (on the same cores: what a refusal costs the machine beyond the server)."""
    answered = sum(phase["statuses"].values())
    if not answered:
        return "-"
    cpu, clients = phase.get("loop_cpu_s"), phase.get("client_cpu_s")
    return ", ".join("-" if value is None else f"{1000 * value / answered:.2f}" for value in (cpu, clients))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = parse_args(argv)
    except UsageError as e:
        say(f"overload: error: {e}")
        return 2
    except SystemExit as e:
        return int(e.code or 0)
    from serving.server.settings import ServingSettings

    deadline_s = config.timeout_ms / 1000 if config.timeout_ms else ServingSettings().request_timeout_s
    corpus = read_lines(default_corpus())
    host, started = machine(), datetime.now(UTC)
    results = [CheckoutResult(name, str(path)) for name, path in config.checkouts.items()]

    def data(complete: bool) -> dict[str, Any]:
        return {"name": config.name, "command": config.command, "started": started.isoformat(timespec="seconds"),
                "finished": datetime.now(UTC).isoformat(timespec="seconds") if complete else None,
                "complete": complete, "machine": host, "model": {"package": str(config.package), **config.model_info},
                "server_env": config.env, "deadline_s": deadline_s, "sentences": config.sentences,
                "duration_s": config.duration_s, "honour_retry_after": config.honour_retry_after,
                "rounds": config.rounds, "settle_s": config.settle_s,
                "checkouts": [{**asdict(r), "verdict": verdict(r)} for r in results]}

    report = ReportFiles.of(config.out_dir, config.name)
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[tuple[str, int], Path]] = {}
        for result in results:
            log = config.work_dir / result.name / "server.log"
            try:
                server = stack.enter_context(serve_checkout(Path(result.path), config.package, log, config.env,
                                                            config.server_timeout))
            except RuntimeError as e:
                result.error = str(e)
                say(f"{result.name}: error: {e}")
                continue
            servers[result.name] = (server, log)
        if config.settle_s > 0:
            for name, ((url, _), _) in servers.items():
                say(f"{name}: settling, {config.reference_clients} clients, {config.settle_s:g} s")
                asyncio.run(run_clients(url, config.reference_clients, config.sentences, config.settle_s, corpus,
                                        config.seed, True, config.timeout_ms, f"{name}-settle"))
        order = [("reference", config.reference_clients), ("overload", config.clients)]
        for round_ in range(1, config.rounds + 1):
            turn = 1 if round_ % 2 else -1  # every other round in reverse: a drift in speed favours no phase
            for phase, clients in order[::turn]:
                for result in results[::turn]:
                    if result.name not in servers or result.error is not None:
                        continue
                    server, log = servers[result.name]
                    try:
                        result.phases.append(run_phase(phase, round_, server, log, clients, config, corpus,
                                                       deadline_s, result.name))
                    except Exception as e:  # a measurement that failed is reported, the others go on
                        result.error = f"{type(e).__name__}: {e}"
                        say(f"{result.name}: error: {result.error}")
                    report.write(data(False), to_markdown)
    report.finish(host, lambda: data(True), to_markdown)
    return 2 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
