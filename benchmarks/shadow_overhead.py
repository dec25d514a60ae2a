"""What a shadow costs production (``mtgate serve --shadow``). A benchmark, not a test.

    .venv/bin/python -m benchmarks.shadow_overhead
    .venv/bin/python -m benchmarks.shadow_overhead --rate 4 --window 20 --rounds 3 --shadow-precision int8
    .venv/bin/python -m benchmarks.shadow_overhead --rate 4 --canary-fraction 0.5 --shadow-fraction 0
    .venv/bin/python -m benchmarks.shadow_overhead --pin --rate 150 --window 15 --rounds 2   # overload, own cores

Two servers of the bundled demo model (fp32, ``--threads 1``) run side by side: one plain, one with the demo's
``--shadow-precision`` artifact as its shadow at ``--shadow-fraction`` (default 1.0). In each round each server in
turn (the order reversed every round, so that a drift of the machine's speed hits both alike) gets ``--window``
seconds of open-loop load: one sentence of the bundled Multi30k test set per ``POST /v1/translate``, ``--rate``
requests per second, sent on schedule whatever the latency (above the server's capacity: an overload test, whose
503s are the queue's). ``--pin`` (Linux) puts both servers, and the shadow's child, on the first CPU and the load
generator on the second: at several times the server's capacity the generator's own thousands of open requests
would otherwise take the server's cores, and the wait would be in the client, not in the server. With ``--canary-fraction`` that share of the second server's requests is answered by the
candidate instead (``--canary-*`` defaults otherwise: no latency target, so a slow candidate is not rolled back). Prints, per server, the statuses and the p50/p95/p99 latency of the 200s over all rounds, and the shadow's counts (compared, shed) from ``/v1/shadow``. On a shared machine, say so
with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402

from loadtest.corpus import default_corpus  # noqa: E402
from loadtest.metrics_text import read_metrics  # noqa: E402
from loadtest.server import start_server  # noqa: E402
from serving.server.settings import DEFAULT_MODEL_DIR  # noqa: E402


class Sent(NamedTuple):
    """One request of the open loop."""

    latency_s: float  # from its scheduled send time to its answer
    status: int  # 0: no answer
    lag_s: float  # how late it left this generator's event loop


async def _post(http: aiohttp.ClientSession, url: str, text: str, due: float) -> Sent:
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    lag = time.perf_counter() - due
    try:
        async with http.post(url + "/v1/translate", json={"text": text}) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    return Sent(time.perf_counter() - due, status, lag)


def _server_seconds(url: str) -> tuple[float, float]:
    """The server's own ``/v1/translate`` time so far (``mtgate_request_duration_seconds``: from reading the request to
    the response): sum and count."""
    found = {"sum": 0.0, "count": 0.0}
    for family in read_metrics(url, timeout_s=10.0):
        for sample in family.samples:
            if sample.labels.get("route") == "/v1/translate":
                for part in found:
                    if sample.name == f"mtgate_request_duration_seconds_{part}":
                        found[part] += sample.value
    return found["sum"], found["count"]


def _window(url: str, sentences: list[str], rate: float, seconds: float) -> list[Sent]:
    """``rate`` requests a second for ``seconds``, each sent at its time whatever the others' latency (an open loop:
    one task per request on an unbounded connection pool, so that a rate above the server's capacity stays offered)."""

    async def run() -> list[Sent]:
        connector = aiohttp.TCPConnector(limit=0)  # no pool limit: every request on time
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60.0)) as http:
            start = time.perf_counter()
            return list(await asyncio.gather(*(
                _post(http, url, sentences[i % len(sentences)], start + i / rate)
                for i in range(int(rate * seconds)))))

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second (default 4)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per server per round (default 20)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shadow-precision", default="int8")
    parser.add_argument("--shadow-fraction", default="1.0")
    parser.add_argument("--canary-fraction", default="0", help="share answered by the candidate (default 0)")
    parser.add_argument("--pin", action="store_true",
                        help="Linux: the servers (and their shadow children) on CPU 0, this load generator on CPU 1, "
                             "so that an overload's client work does not take the servers' core")
    args = parser.parse_args(argv)
    if args.pin:
        if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
            print("shadow_overhead: --pin needs Linux and 2 usable CPUs", file=sys.stderr)
            return 2
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0]})  # the servers started below inherit it
    corpus = default_corpus()
    with (gzip.open(corpus, "rt", encoding="utf-8") if corpus.suffix == ".gz" else corpus.open(encoding="utf-8")) as f:
        sentences = [line.strip() for line in f if line.strip()]
    common = ["--precision", "fp32", "--threads", "1"]
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        plain = stack.enter_context(start_server(DEFAULT_MODEL_DIR, logs / "plain.log", extra_args=common))
        shadowed = stack.enter_context(start_server(
            DEFAULT_MODEL_DIR, logs / "shadow.log", extra_args=[
                *common, "--shadow", str(DEFAULT_MODEL_DIR), "--shadow-precision", args.shadow_precision,
                "--shadow-fraction", args.shadow_fraction, "--canary-fraction", args.canary_fraction]))
        servers = {"plain": plain.url, "shadow": shadowed.url}
        if args.pin:
            os.sched_setaffinity(0, {cpus[1]})
        while json.load(urllib.request.urlopen(shadowed.url + "/v1/shadow"))["state"] == "loading":
            time.sleep(0.2)
        measured: dict[str, list[Sent]] = {name: [] for name in servers}
        before = {name: _server_seconds(url) for name, url in servers.items()}
        for round_ in range(args.rounds):
            for name in (list(servers) if round_ % 2 == 0 else list(reversed(servers))):
                measured[name] += _window(servers[name], sentences, args.rate, args.window)
                time.sleep(2)  # let the shadow's backlog drain before the other server's window
        after = {name: _server_seconds(url) for name, url in servers.items()}
        summary = json.load(urllib.request.urlopen(shadowed.url + "/v1/shadow"))
    where = f"servers on CPU {cpus[0]}, load generator on CPU {cpus[1]}" if args.pin else "all on every CPU"
    print(f"rate {args.rate:g} req/s, {args.rounds} rounds x {args.window:g} s per server, demo fp32, --threads 1 "
          f"({where}); "
          f"shadow: demo {args.shadow_precision}, fraction {args.shadow_fraction}, canary {args.canary_fraction}")
    for name, results in measured.items():
        latencies = np.array([sent.latency_s for sent in results if sent.status == 200]) * 1000
        statuses = dict(sorted(Counter(sent.status for sent in results).items()))
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99]) if len(latencies) else (np.nan,) * 3
        print(f"{name:7s} requests {len(results)}  statuses {statuses}  p50 {p50:.0f} ms  p95 {p95:.0f} ms  "
              f"p99 {p99:.0f} ms (of the 200s)")
        server_sum, server_count = (a - b for a, b in zip(after[name], before[name], strict=True))
        lags = np.array([sent.lag_s for sent in results]) * 1000
        lag_p50, lag_p95 = np.percentile(lags, [50, 95]) if len(lags) else (np.nan,) * 2
        inside = server_sum / server_count * 1000 if server_count else float("nan")
        print(f"{'':7s} of which: sent late by the generator p50 {lag_p50:.0f} ms, p95 {lag_p95:.0f} ms; in the "
              f"server (read to response, mean over {server_count:.0f}) {inside:.0f} ms; the rest is before the "
              f"server reads a request (connect, accept backlog)")
    print(f"shadow: {summary['requests']}, agreement {summary['agreement']}, chrF mean {summary['chrf']['mean']}")
    if "canary" in summary:
        canary = summary["canary"]
        print(f"canary: {canary['state']} (fraction {canary['fraction']}), {canary['requests']}, window p95 "
              f"{canary['window']['p95_ms']} ms, error rate {canary['window']['error_rate']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
