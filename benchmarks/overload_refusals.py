"""What one refusal costs: ``mtgate serve`` kept saturated, answering nothing but 503 to closed-loop clients. A
benchmark, not a test.

    .venv/bin/python -m benchmarks.overload_refusals --checkout base=../main --checkout new=.

For each ``--checkout NAME=PATH`` in turn, ``mtgate serve`` of that checkout (``benchmarks.overload.serve_checkout``)
runs the demo package with a queue of ``--queue`` sentences; two backlog clients keep it full with requests of 8
paragraphs at beam 4 (seconds of work each), and ``--clients`` closed-loop clients send requests of ``--sentences``
sentences for ``--duration``, each again as soon as it is answered: almost every answer is a 503. Reported per
checkout: refusals answered per second, and the CPU per answer of the server's event-loop thread (where every request
is read, parsed and refused) and of the load generator (this process, on the same cores). Prints Markdown; writes
``<out-dir>/<name>.json`` and ``.md``. Exit code 0, or 2 on a usage error or a failed server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/overload_refusals.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import ReportFiles, UsageError, machine, read_package, run_header, run_name, say  # noqa: E402
from benchmarks.overload import parse_checkouts, serve_checkout  # noqa: E402
from benchmarks.overload_phase import loop_cpu_s  # noqa: E402
from loadtest.corpus import default_corpus, read_lines  # noqa: E402
from loadtest.targets import parse_duration  # noqa: E402


async def _backlog(url: str, paragraphs: list[str], stop: asyncio.Event) -> None:
    """Keep the queue full: requests of seconds of work, sent again as soon as answered (refused: after 50 ms)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                r = await http.post("/v1/translate", json={"text": paragraphs, "beam_size": 4})
                if r.status_code != 200:
                    await asyncio.sleep(0.05)


async def _refused(url: str, texts: list[str], until: float, statuses: Counter[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while time.monotonic() < until:
            try:
                r = await http.post("/v1/translate", json={"text": texts})
                statuses[str(r.status_code)] += 1
            except httpx.HTTPError:
                statuses["error"] += 1


async def measure(url: str, pid: int, clients: int, sentences: int, duration_s: float, corpus: list[str]
                  ) -> dict[str, Any]:
    stop = asyncio.Event()
    paragraphs = [" ".join(corpus[i : i + 5]) for i in range(0, 40, 5)]
    backlog = [asyncio.create_task(_backlog(url, paragraphs, stop)) for _ in range(2)]
    await asyncio.sleep(3)  # the queue fills
    statuses: Counter[str] = Counter()
    loop_before, client_before, started = loop_cpu_s(pid), time.process_time(), time.monotonic()
    until = started + duration_s
    await asyncio.gather(*(_refused(url, corpus[8 * i : 8 * i + sentences], until, statuses)
                           for i in range(clients)))
    elapsed = time.monotonic() - started
    loop_after, client_cpu = loop_cpu_s(pid), time.process_time() - client_before
    stop.set()
    for task in backlog:
        task.cancel()
    answered = sum(statuses.values())
    loop_cpu = None if loop_before is None or loop_after is None else loop_after - loop_before
    return {"statuses": dict(statuses), "seconds": round(elapsed, 2),
            "refusals_per_s": round(statuses["503"] / elapsed, 1),
            "loop_cpu_ms_per_answer": None if loop_cpu is None else round(1000 * loop_cpu / max(1, answered), 3),
            "client_cpu_ms_per_answer": round(1000 * client_cpu / max(1, answered), 3)}


def to_markdown(data: dict[str, Any]) -> str:
    lines = [f"# Refusal cost: {data['name']}", "", *run_header(data),
             f"- model: `{data['model']}`; queue of {data['queue']} sentences kept full; {data['clients']} clients x "
             f"{data['sentences']} sentences, {data['duration_s']:g} s each, sent again as soon as answered", "",
             "| checkout | statuses | refusals/s | server loop CPU ms per answer | clients' CPU ms per answer |",
             "|---|---|---|---|---|"]
    for name, r in data["checkouts"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} | - | - | - |")
            continue
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        loop = "-" if r["loop_cpu_ms_per_answer"] is None else f"{r['loop_cpu_ms_per_answer']:.2f}"
        lines.append(f"| {name} | {statuses} | {r['refusals_per_s']:.1f} | {loop} | "
                     f"{r['client_cpu_ms_per_answer']:.2f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overload_refusals", description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=PATH",
                        help="a checkout to serve from (repeatable; default: this one as 'this')")
    parser.add_argument("-m", "--model", type=Path, help="model package (default: the bundled demo)")
    parser.add_argument("--clients", type=int, default=32, help="refused clients (default: 32)")
    parser.add_argument("--sentences", type=int, default=8, help="sentences per refused request (default: 8)")
    parser.add_argument("--queue", type=int, default=16, help="the server's max_queue_size (default: 16)")
    parser.add_argument("--duration", default="15s", help="per checkout: 15, '15s', '1m' (default: 15s)")
    parser.add_argument("--name", help="result file name (default: overload-refusals-<UTC date>)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--work-dir", type=Path, help="server logs (default: build/overload-refusals/<name>)")
    parser.add_argument("--server-timeout", type=float, default=120.0)
    config = parser.parse_args(argv)
    config.command = "python -m benchmarks.overload_refusals " + " ".join(argv)
    config.checkouts = parse_checkouts(config.checkout)
    try:
        config.duration_s = parse_duration(config.duration)
    except ValueError as e:
        raise UsageError(f"--duration: {e}") from None
    if config.clients < 1 or config.sentences < 1 or config.queue < 8:
        raise UsageError("--clients and --sentences must be at least 1, --queue at least 8 (a backlog request)")
    config.package, _ = read_package(config.model)
    config.name = run_name(config.name, "overload-refusals", config.out_dir)
    config.work_dir = config.work_dir or ROOT / "build" / "overload-refusals" / config.name
    return config


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = parse_args(argv)
    except UsageError as e:
        say(f"overload_refusals: error: {e}")
        return 2
    except SystemExit as e:
        return int(e.code or 0)
    corpus = read_lines(default_corpus())
    host = machine()
    results: dict[str, dict[str, Any]] = {}
    env = {"MTGATE_MAX_QUEUE_SIZE": str(config.queue), "MTGATE_MAX_SENTENCES_PER_REQUEST": str(config.queue)}

    def data(complete: bool = False) -> dict[str, Any]:
        return {"name": config.name, "command": config.command, "started": started, "complete": complete,
                "finished": datetime.now(UTC).isoformat(timespec="seconds") if complete else None, "machine": host,
                "model": str(config.package), "queue": config.queue, "clients": config.clients,
                "sentences": config.sentences, "duration_s": config.duration_s, "checkouts": results}

    started = datetime.now(UTC).isoformat(timespec="seconds")
    report = ReportFiles.of(config.out_dir, config.name)
    for name, path in config.checkouts.items():
        say(f"{name}: {config.clients} clients refused for {config.duration_s:g} s")
        try:
            with serve_checkout(path, config.package, config.work_dir / name / "server.log", env,
                                config.server_timeout) as (url, pid):
                results[name] = asyncio.run(measure(url, pid, config.clients, config.sentences, config.duration_s,
                                                    corpus))
        except RuntimeError as e:
            results[name] = {"error": str(e)}
        say(f"{name}: {results[name]}")
        report.write(data(), to_markdown)
    report.finish(host, lambda: data(True), to_markdown)
    return 2 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
