"""Step-level batching under a bounded stress, with the process's memory over time. Not a test: it runs for minutes.

    .venv/bin/python -m benchmarks.step_stress -m models/demo-en-de --seconds 120

Sentences of the bundled test set join a ``ContinuousDecoder`` at random steps with random options (greedy, beam 2-5,
n-best, sampling, max lengths), one to four at a time, up to ``--in-flight`` in flight; about one group in five is
abandoned at a random later step (its request cancelled or expired). Every ``--every`` seconds the script prints the
resident set size (``/proc/self/statm``), the sentences done and abandoned, and the shapes the decoder's caches hold;
at the end the first and last RSS and the largest. Memory is bounded when the RSS stops growing once every shape has
been seen. Exit code 0, or 1 if a group got no result or a kept group got an error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadtest.corpus import default_corpus, read_lines  # noqa: E402
from serving.engine.continuous import ContinuousDecoder  # noqa: E402
from serving.engine.errors import ServingError  # noqa: E402
from serving.engine.rows import SlotRows  # noqa: E402
from serving.engine.translator import DecodeOptions, Translation, Translator  # noqa: E402
from serving.server.settings import demo_model  # noqa: E402


def rss_mib() -> float:
    """This process's resident set size in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def random_options(rng: np.random.Generator) -> DecodeOptions:
    kind = rng.integers(0, 4)
    max_length = int(rng.choice([8, 32, 128]))
    if kind == 0:
        return DecodeOptions(beam_size=1, max_length=max_length)
    if kind == 1:
        return DecodeOptions(beam_size=1, do_sample=True, seed=int(rng.integers(0, 1000)), top_k=20)
    beam = int(rng.integers(2, 6))
    return DecodeOptions(beam_size=beam, max_length=max_length,
                         num_hypotheses=int(rng.integers(1, beam + 1)) if kind == 3 else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, default=demo_model())
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between memory readings (default 10)")
    parser.add_argument("--in-flight", type=int, default=32, help="most sentences in flight (default 32)")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--runtime", default="onnxruntime")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.model is None:
        parser.error("no model: pass -m PKG (or run `make demo`)")
    rng = np.random.default_rng(args.seed)
    sentences = read_lines(default_corpus())
    translator = Translator.load(args.model, runtime=args.runtime, precision=args.precision, threads=args.threads)
    decoder = ContinuousDecoder(translator)
    results: dict[int, list[Translation] | ServingError] = {}
    wanted: dict[int, bool] = {}
    quit_at: dict[int, int] = {}  # group -> step at which it is abandoned
    shapes: set[tuple[int, ...]] = set()
    groups = steps = 0
    started = last = time.monotonic()
    readings = [rss_mib()]
    print(f"{args.runtime} {args.precision}, {args.threads} threads, up to {args.in_flight} sentences in flight; "
          f"RSS at start {readings[0]:.0f} MiB", flush=True)
    while time.monotonic() - started < args.seconds:
        while decoder.sentences < args.in_flight and rng.random() < 0.5:
            group = groups
            groups += 1
            texts = [sentences[int(i)] for i in rng.integers(0, len(sentences), int(rng.integers(1, 5)))]
            wanted[group] = True
            if rng.random() < 0.2:
                quit_at[group] = steps + int(rng.integers(1, 30))
            decoder.add(translator.prepare(texts, random_options(rng)),
                        lambda value, g=group: results.__setitem__(g, value), alive=lambda g=group: wanted[g])
        for group, at in list(quit_at.items()):
            if steps >= at:
                wanted[group] = False
                del quit_at[group]
        decoder.step()
        steps += 1
        for lane in decoder._lanes:
            rows = lane.decode_rows
            if isinstance(rows, SlotRows) and rows.cache is not None and rows.cross is not None:
                shapes.add((rows.cache.shape[2], rows.cache.shape[4], rows.cross.shape[4]))
        if time.monotonic() - last >= args.every:
            last = time.monotonic()
            readings.append(rss_mib())
            abandoned = sum(isinstance(v, ServingError) for v in results.values())
            print(f"{last - started:6.0f} s: RSS {readings[-1]:.0f} MiB, {groups} groups, {len(results) - abandoned} "
                  f"done, {abandoned} abandoned, {steps} steps, cache shapes seen {sorted(shapes)[-3:]}", flush=True)
    while not decoder.idle:
        decoder.step()
    readings.append(rss_mib())
    missing = [g for g in range(groups) if g not in results]
    failed = [g for g, v in results.items() if isinstance(v, ServingError) and wanted.get(g, True)]
    print(f"RSS first {readings[0]:.0f} MiB, at the first reading {readings[min(1, len(readings) - 1)]:.0f} MiB, "
          f"last {readings[-1]:.0f} MiB, largest {max(readings):.0f} MiB; {groups} groups, "
          f"{len(missing)} without a result, {len(failed)} kept groups failed")
    return 1 if missing or failed else 0


if __name__ == "__main__":
    sys.exit(main())
