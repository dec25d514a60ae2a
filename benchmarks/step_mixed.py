"""Step-level against request-level batching on one seeded arrival trace, in process (no HTTP). Not a test.

    .venv/bin/python -m benchmarks.step_mixed --rates 20 40 --seconds 20 --repeat 2
    .venv/bin/python -m benchmarks.step_mixed --paragraphs 0 --saturate 600   # uniform workload, at saturation

The trace: Poisson arrivals at each ``--rate`` (seeded), each request a single sentence of the bundled test set or,
with probability ``--paragraphs`` (default 0.25), a paragraph of 4-8 consecutive test sentences sent as one text.
The same trace is replayed in real time against the server's two batchers over one ``Translator``:
``StepBatcher`` + ``DecoderRunner`` (``MTGATE_BATCHING=step``) and ``DynamicBatcher`` + ``decode_together`` (the
default), alternating the modes ``--repeat`` times (each repeat starting with the next mode), after a discarded
warm-up replay per mode. Each request is prepared on the event loop and enqueued as the
server does (one key, beam width); its latency runs from its arrival to its result. Per mode and rate it prints the
short and long requests' p50/p95 latency (ms), the requests/s finished, and the medians over the repeats
(``--modes`` adds ``step-uncapped``: the step batcher without its cap on long items in flight).
``--saturate N`` instead sends N requests at once and reports the sentences/s each mode serves against offline
(``Translator.translate`` in batches of ``--max-batch`` sentences, sorted by length).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadtest.corpus import default_corpus, read_lines  # noqa: E402
from serving.engine.continuous import ContinuousDecoder  # noqa: E402
from serving.engine.planner import decode_together  # noqa: E402
from serving.engine.translator import DecodeOptions, Translator  # noqa: E402
from serving.server.batching import BatchLimits, DecoderRunner, DynamicBatcher, StepBatcher  # noqa: E402
from serving.server.batching.queue import Batcher  # noqa: E402
from serving.server.settings import demo_model  # noqa: E402

MODES = ("step", "request", "step-uncapped")


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the start
    text: str
    long: bool


def trace(sentences: list[str], rate: float, seconds: float, paragraphs: float, seed: int) -> list[Arrival]:
    """Poisson arrivals at ``rate`` for ``seconds``; a fraction ``paragraphs`` of them are 4-8 consecutive sentences
    joined into one text."""
    rng = np.random.default_rng(seed)
    arrivals: list[Arrival] = []
    at = float(rng.exponential(1 / rate))
    while at < seconds:
        if rng.random() < paragraphs:
            size = int(rng.integers(4, 9))
            start = int(rng.integers(0, len(sentences) - size))
            arrivals.append(Arrival(at, " ".join(sentences[start : start + size]), True))
        else:
            arrivals.append(Arrival(at, sentences[int(rng.integers(0, len(sentences)))], False))
        at += float(rng.exponential(1 / rate))
    return arrivals


def make_batcher(mode: str, translator: Translator, limits: BatchLimits) -> Batcher[Any, Any]:
    if mode.startswith("step"):  # step-uncapped: long items may hold every row (no max_long)
        return StepBatcher(lambda: DecoderRunner(ContinuousDecoder(translator)), limits, name="step",
                           max_long=limits.max_items if mode == "step-uncapped" else None)
    return DynamicBatcher(lambda key, payloads, on_partial, alive: decode_together(translator, payloads, on_partial,
                                                                                   alive), limits, name="request")


async def replay(mode: str, translator: Translator, arrivals: list[Arrival], options: DecodeOptions,
                 limits: BatchLimits) -> tuple[list[tuple[bool, float]], float, int]:
    """Run the trace against one mode: ``(long, latency s)`` per request, the seconds from the first arrival to the
    last result, and the requests that failed."""
    batcher = make_batcher(mode, translator, limits)
    batcher.start()
    warm = translator.prepare(["A man is walking.", "Two dogs play in the snow."], options)
    await batcher.enqueue(warm.sentences(), warm.lengths, key=warm.search, width=warm.search.beam_size).wait()
    latencies: list[tuple[bool, float]] = []
    failed = 0

    async def one(arrival: Arrival, start: float) -> None:
        nonlocal failed
        arrived = time.perf_counter()
        prepared = translator.prepare([arrival.text], options)
        try:
            pending = batcher.enqueue(prepared.sentences(), prepared.lengths, key=prepared.search,
                                      width=prepared.search.beam_size)
            await pending.wait()
        except Exception:
            failed += 1
            return
        latencies.append((arrival.long, time.perf_counter() - arrived))

    start = time.perf_counter()
    tasks = []
    for arrival in arrivals:
        delay = start + arrival.at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(arrival, start)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    await batcher.stop()
    return latencies, elapsed, failed


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_mixed", description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, default=demo_model())
    parser.add_argument("--rates", type=float, nargs="+", default=[20.0], help="requests/s (default 20)")
    parser.add_argument("--seconds", type=float, default=20.0, help="arrivals per run (default 20 s)")
    parser.add_argument("--paragraphs", type=float, default=0.25, help="fraction of paragraph requests (0.25)")
    parser.add_argument("--saturate", type=int, default=0, help="send this many requests at once instead")
    parser.add_argument("--repeat", type=int, default=1, help="alternate the modes this many times (default 1)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES[:2]),
                        help="step (as served), request, step-uncapped (without max_long); default step request")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=32, help="max_batch_size (default 32, the server's)")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--runtime", default="onnxruntime")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.model is None:
        parser.error("no model: pass -m PKG (or run `make demo`)")
    sentences = read_lines(default_corpus())
    translator = Translator.load(args.model, runtime=args.runtime, precision=args.precision, threads=args.threads,
                                 max_batch_size=args.max_batch)
    options = DecodeOptions(beam_size=args.beam)
    limits = BatchLimits(max_items=args.max_batch, queue_capacity=100_000)
    print(f"{args.runtime} {args.precision}, {args.threads} threads, beam {args.beam}, max batch {args.max_batch}, "
          f"paragraphs {args.paragraphs:.0%}", flush=True)
    if args.saturate:
        return saturate(args, translator, sentences, options, limits)
    summary: dict[tuple[str, float], list[tuple[float, ...]]] = {}
    for mode in args.modes:  # the runtime's first runs of paragraph shapes are slow: not in the first measured mode
        asyncio.run(replay(mode, translator, trace(sentences, 4.0, 5.0, 0.5, args.seed + 1), options, limits))
    for rate in args.rates:
        arrivals = trace(sentences, rate, args.seconds, args.paragraphs, args.seed)
        longs = sum(a.long for a in arrivals)
        for repeat in range(args.repeat):
            for mode in args.modes[repeat % len(args.modes):] + args.modes[: repeat % len(args.modes)]:
                latencies, elapsed, failed = asyncio.run(replay(mode, translator, arrivals, options, limits))
                short = [s for long, s in latencies if not long]
                long_ = [s for long, s in latencies if long]
                row = (percentile(short, 50), percentile(short, 95), percentile(long_, 50), percentile(long_, 95),
                       len(latencies) / elapsed)
                summary.setdefault((mode, rate), []).append(row)
                print(f"rate {rate:5.1f} run {repeat} {mode:7s}: {len(arrivals) - longs} short p50/p95 "
                      f"{row[0]:6.0f}/{row[1]:6.0f} ms, {longs} long p50/p95 {row[2]:6.0f}/{row[3]:6.0f} ms, "
                      f"{row[4]:5.1f} req/s, {failed} failed", flush=True)
    print("medians over the repeats (ms; req/s):")
    for (mode, rate), rows in summary.items():
        med = [statistics.median(column) for column in zip(*rows, strict=True)]
        print(f"  rate {rate:5.1f} {mode:7s}: short p50 {med[0]:6.0f} p95 {med[1]:6.0f}, long p50 {med[2]:6.0f} "
              f"p95 {med[3]:6.0f}, {med[4]:5.1f} req/s")
    return 0


def saturate(args: argparse.Namespace, translator: Translator, sentences: list[str], options: DecodeOptions,
             limits: BatchLimits) -> int:
    """Every request at once: sentences/s served by each mode against offline decoding of the same texts."""
    arrivals = [Arrival(0.0, a.text, a.long) for a in trace(sentences, 1000.0, args.saturate / 1000.0 * 10,
                                                             args.paragraphs, args.seed)][: args.saturate]
    texts = [a.text for a in arrivals]
    rates: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        ordered = sorted(texts, key=len)
        started = time.perf_counter()
        for i in range(0, len(ordered), args.max_batch):
            translator.translate(ordered[i : i + args.max_batch], options)
        rates.setdefault("offline", []).append(len(texts) / (time.perf_counter() - started))
        for mode in args.modes:
            latencies, elapsed, failed = asyncio.run(replay(mode, translator, arrivals, options, limits))
            rates.setdefault(mode, []).append(len(latencies) / elapsed)
        print("  ".join(f"{name} {values[-1]:.1f}" for name, values in rates.items()) + " requests/s", flush=True)
    offline = statistics.median(rates["offline"])
    for name, values in rates.items():
        print(f"{name:8s}: median {statistics.median(values):6.1f} requests/s ({statistics.median(values) / offline:.2f}"
              f" of offline) over {len(values)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
