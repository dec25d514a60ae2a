"""Streaming over a served model: time to the first stable text vs time to the full sentence, and that the streamed
text is exactly the translation. A benchmark, not a test.

    .venv/bin/python -m benchmarks.stream_latency                      # beam 4, int8, 1,000 sentences, both modes
    .venv/bin/python -m benchmarks.stream_latency --check --precision fp32

For each batching mode of ``--modes``, ``mtgate serve --batching MODE --precision P`` runs the package on a free
loopback port (``--threads`` intra-op threads; the decoding core is this process's: native where it is built,
numpy with ``MTGATE_NATIVE=0``). **Latency**: each of the first ``--sentences`` lines of ``--sources`` (default the
Multi30k test sentences, models/data/multi30k/test_2016_flickr.en.gz), one request at a time, is sent to ``POST /v1/translate/stream`` with
``beam_size`` ``--beam``; per sentence, the time from sending the request to its first ``partial`` event (the first
stable text: with a beam, the prefix all live beams share) and to its ``final`` event (the full sentence), their
medians and 95th percentiles, and how much of the text the first event carries.

**Check** (``--check``), per mode, for beam ``--beam`` with the package's decoding rules and for beam
``--check-beam`` with length penalty ``--length-penalty`` (a copy of the package whose manifest says so, served
beside it): every sentence alone (a request of one sentence, non-streamed ``/v1/translate`` then streamed) and in
mixed batches (``--clients`` concurrent clients sending requests of 1 to 4 sentences, streamed and non-streamed, at
that beam and greedy): the partial events of each sentence must concatenate to its final text, and that text must be
the non-streamed translation of the sentence alone. With int8, whose dynamic quantization scales activations over
the whole batch, a translation can depend on the batch it ran in; the mixed batches' non-streamed answers are
compared the same way, so that the report shows what the batch, not streaming, changed. fp32 is batch-invariant.
Each check reports the SHA-256 of the non-streamed translations alone, one per line, so that two runs (the native
core's and numpy's) can be compared. The beam-``--beam`` check reuses the latency measurement's streams as the
sentences' streams alone; ``--checks`` and ``--no-latency`` split a run over processes (e.g. one per mode and check).

Writes ``<out-dir>/stream-latency-<UTC date>.json`` and ``.md`` and prints the Markdown. Exit code 0; 1 when a check
failed (the streamed text was not its final text, or, at fp32, not the translation alone); 2 on a usage error or
when a server could not start.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import queue
import random
import shlex
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/stream_latency.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import ReportFiles, machine, run_header, say  # noqa: E402
from loadtest.errors import LoadTestError  # noqa: E402
from loadtest.server import start_server  # noqa: E402
from serving.engine.native import native_core  # noqa: E402

SOURCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
MODES = ("request", "step")
CHECKS = ("beam", "length-penalty")  # --beam with the package's rules; --check-beam with --length-penalty
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Config:
    package: Path
    sources: Path
    precision: str
    beam: int
    sentences: int
    modes: tuple[str, ...]
    threads: int
    check: bool
    check_beam: int
    length_penalty: float
    clients: int
    checks: tuple[str, ...]
    latency: bool
    out_dir: Path
    work_dir: Path
    command: str


def parse_args(argv: Sequence[str]) -> Config:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_latency", description=__doc__.split("\n")[0])
    parser.add_argument("--package", type=Path, default=ROOT / "models" / "demo-en-de")
    parser.add_argument("--sources", type=Path, default=SOURCES, help="gzip text, one sentence per line")
    parser.add_argument("--precision", default="int8", choices=["fp32", "int8"])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--check", action="store_true", help="also check the streamed text (module docstring)")
    parser.add_argument("--check-beam", type=int, default=5)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help="which checks --check runs, comma-separated (to split a run over processes)")
    parser.add_argument("--latency", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the latency (--no-latency: only the checks)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "build" / "stream-latency")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {' and/or '.join(MODES)}, comma-separated")
    if not (args.package / "manifest.json").is_file():
        parser.error(f"--package {args.package}: not a model package")
    checks = tuple(c for c in args.checks.split(",") if c)
    if not checks or any(c not in CHECKS for c in checks):
        parser.error(f"--checks takes {' and/or '.join(CHECKS)}, comma-separated")
    if not args.latency and not args.check:
        parser.error("--no-latency without --check measures nothing")
    if not args.sources.is_file():
        parser.error(f"--sources {args.sources}: no such file")
    if min(args.beam, args.check_beam, args.sentences, args.threads, args.clients) < 1:
        parser.error("--beam, --check-beam, --sentences, --threads and --clients must be at least 1")
    command = " ".join(["python -m benchmarks.stream_latency", *map(shlex.quote, argv)])
    return Config(args.package.resolve(), args.sources, args.precision, args.beam, args.sentences, modes, args.threads, args.check,
                  args.check_beam, args.length_penalty, args.clients, checks, args.latency, args.out_dir,
                  args.work_dir, command)


def sources(path: Path, count: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()[:count]


# ---------------------------------------------------------------- requests


@dataclass
class Streamed:
    """One streamed request: each sentence's deltas, the times of its first and last partial events, the final texts
    and when the final event came (seconds from sending)."""

    deltas: dict[int, list[str]]
    first: dict[int, float]
    texts: list[str]
    final: float


def stream(client: httpx.Client, url: str, texts: list[str], body: dict[str, Any]) -> Streamed:
    started = time.perf_counter()
    deltas: dict[int, list[str]] = {}
    first: dict[int, float] = {}
    event = ""
    with client.stream("POST", url + "/v1/translate/stream", json={"text": texts, **body}, timeout=TIMEOUT_S) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "partial":
                    first.setdefault(data["index"], time.perf_counter() - started)
                    deltas.setdefault(data["index"], []).append(data["delta"])
                elif event == "final":
                    return Streamed(deltas, first, [t["text"] for t in data["translations"]],
                                    time.perf_counter() - started)
                else:
                    raise RuntimeError(f"stream error: {data}")
    raise RuntimeError("the stream ended without a final event")


def translate(client: httpx.Client, url: str, texts: list[str], body: dict[str, Any]) -> list[str]:
    r = client.post(url + "/v1/translate", json={"text": texts, **body}, timeout=TIMEOUT_S)
    r.raise_for_status()
    return [t["text"] for t in r.json()["translations"]]


# ---------------------------------------------------------------- measurements


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


def latency(url: str, texts: list[str], beam: int) -> tuple[dict[str, Any], list[Streamed]]:
    """Every sentence alone, streamed: time to its first partial event and to its final event; the streams."""
    streams: list[Streamed] = []
    first: list[float] = []
    full: list[float] = []
    share: list[float] = []
    no_partial = 0
    with httpx.Client() as client:
        for i, text in enumerate(texts):
            got = stream(client, url, [text], {"beam_size": beam})
            streams.append(got)
            full.append(got.final * 1000)
            if 0 in got.first:
                first.append(got.first[0] * 1000)
                share.append(len(got.deltas[0][0]) / max(1, len(got.texts[0])))
            else:
                no_partial += 1
            if (i + 1) % 100 == 0:
                say(f"  {i + 1}/{len(texts)}: first median {statistics.median(first):.0f} ms, "
                    f"full median {statistics.median(full):.0f} ms")

    def summary(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 1), "p95": round(percentile(values, 95), 1)}

    return {"sentences": len(texts), "first_event_ms": summary(first), "full_ms": summary(full),
            "first_over_full_median": round(statistics.median([f / t for f, t in zip(first, full, strict=False)]), 3)
            if no_partial == 0 else None,
            "first_event_text_share_median": round(statistics.median(share), 3),
            "without_partial_event": no_partial}, streams


def check(url: str, texts: list[str], beam: int, model: str | None, clients: int, strict: bool,
          alone: list[Streamed] | None = None) -> dict[str, Any]:
    """The streamed text of every sentence, alone and in mixed batches, against its final text and against its
    non-streamed translation alone (module docstring); ``alone``: the sentences already streamed alone at this beam
    and model (the latency measurement's), else they are streamed here."""
    body: dict[str, Any] = {"beam_size": beam, **({"model": model} if model else {})}
    problems: list[str] = []
    reference: list[str] = []
    with httpx.Client() as client:
        for i, text in enumerate(texts):
            plain = translate(client, url, [text], body)[0]
            got = alone[i] if alone is not None else stream(client, url, [text], body)
            reference.append(plain)
            streamed = "".join(got.deltas.get(0, []))
            if streamed != got.texts[0]:
                problems.append(f"alone {i}: streamed {streamed!r}, final {got.texts[0]!r}")
            if got.texts[0] != plain:
                problems.append(f"alone {i}: final {got.texts[0]!r}, non-streamed {plain!r}")
    alone_failures = len(problems)
    mixed = mixed_batches(url, texts, reference, body, clients)
    problems += mixed["problems"]
    failed = alone_failures + mixed["streamed_not_final"] + (mixed["streamed_not_alone"] if strict else 0)
    digest = hashlib.sha256("".join(text + "\n" for text in reference).encode("utf-8")).hexdigest()
    return {"beam": beam, "model": model, "sentences": len(texts), "alone_failures": alone_failures,
            **{k: v for k, v in mixed.items() if k != "problems"}, "failed": failed, "problems": problems[:20],
            "translations_sha256": digest}


def mixed_batches(url: str, texts: list[str], reference: list[str], body: dict[str, Any],
                  clients: int) -> dict[str, Any]:
    """``clients`` threads send the sentences in requests of 1 to 4, streamed or not, with greedy requests beside
    them; every sentence is sent streamed once and non-streamed once."""
    rng = random.Random(0)
    work: queue.Queue[tuple[str, list[int]]] = queue.Queue()
    for kind in ("stream", "plain"):
        start = 0
        while start < len(texts):
            size = rng.randint(1, 4)
            work.put((kind, list(range(start, min(start + size, len(texts))))))
            start += size
    items = list(work.queue)
    rng.shuffle(items)
    work = queue.Queue()
    for item in items:
        work.put(item)
    counts = {"streamed_not_final": 0, "streamed_not_alone": 0, "plain_not_alone": 0, "requests": len(items)}
    problems: list[str] = []
    lock = threading.Lock()

    def client_loop(seed: int) -> None:
        local = random.Random(seed)
        with httpx.Client() as client:
            while True:
                try:
                    kind, indices = work.get_nowait()
                except queue.Empty:
                    return
                batch = [texts[i] for i in indices]
                if local.random() < 0.3:  # greedy traffic in the same server
                    stream(client, url, batch[:1], {"beam_size": 1})
                if kind == "plain":
                    got_plain = translate(client, url, batch, body)
                    with lock:
                        for i, text in zip(indices, got_plain, strict=True):
                            if text != reference[i]:
                                counts["plain_not_alone"] += 1
                    continue
                got = stream(client, url, batch, body)
                with lock:
                    for j, i in enumerate(indices):
                        streamed = "".join(got.deltas.get(j, []))
                        if streamed != got.texts[j]:
                            counts["streamed_not_final"] += 1
                            problems.append(f"mixed {i}: streamed {streamed!r}, final {got.texts[j]!r}")
                        if got.texts[j] != reference[i]:
                            counts["streamed_not_alone"] += 1
                            problems.append(f"mixed {i}: final {got.texts[j]!r}, alone {reference[i]!r}")

    threads = [threading.Thread(target=client_loop, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**counts, "problems": problems}


# ---------------------------------------------------------------- servers


def length_penalty_copy(config: Config) -> tuple[Path, str]:
    """A copy of the package (its files hard-linked where possible, its own manifest) with ``length_penalty`` set;
    its model name."""
    manifest = json.loads((config.package / "manifest.json").read_text(encoding="utf-8"))
    copy = config.work_dir / "package-length-penalty"
    if copy.exists():
        shutil.rmtree(copy)
    for rel in manifest["files"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link((config.package / rel).resolve(), copy / rel)
        except OSError:  # another file system
            shutil.copy2(config.package / rel, copy / rel)
    name = f"{manifest.get('name') or config.package.name}-lp{config.length_penalty:g}"
    manifest["name"] = name
    manifest["decoding"]["length_penalty"] = config.length_penalty
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return copy, name


def run(config: Config) -> dict[str, Any]:
    texts = sources(config.sources, config.sentences)
    results: dict[str, Any] = {}
    extra: list[str] = []
    lp_name = None
    if config.check and "length-penalty" in config.checks:
        lp_package, lp_name = length_penalty_copy(config)
        extra = ["-m", str(lp_package)]
    for mode in config.modes:
        say(f"{mode}: starting mtgate serve ({config.precision}, {config.threads} thread(s))")
        with start_server(config.package, config.work_dir / mode / "server.log", extra_args=[
                *extra, "--batching", mode, "--precision", config.precision, "--threads", str(config.threads)]) as server:
            result: dict[str, Any] = {}
            alone = None
            if config.latency:
                say(f"{mode}: latency, beam {config.beam}, {len(texts)} sentences one at a time")
                result["latency"], alone = latency(server.url, texts, config.beam)
            if config.check:
                strict = config.precision == "fp32"
                result["checks"] = []
                if "beam" in config.checks:
                    default = default_model(server.url)
                    say(f"{mode}: check, beam {config.beam} ({default})")
                    result["checks"].append(check(server.url, texts, config.beam, default, config.clients, strict,
                                                  alone))
                if "length-penalty" in config.checks:
                    say(f"{mode}: check, beam {config.check_beam} ({lp_name})")
                    result["checks"].append(check(server.url, texts, config.check_beam, lp_name, config.clients,
                                                  strict))
            results[mode] = result
    return results


def default_model(url: str) -> str | None:
    """The name of the model a request without ``model`` goes to."""
    models = httpx.get(url + "/v1/models", timeout=10).json()["models"]
    return next((str(m["name"]) for m in models if m.get("default")), None)


# ---------------------------------------------------------------- report


def to_markdown(data: dict[str, Any]) -> str:
    c = data["config"]
    lines = ["# Streaming latency and exactness (benchmarks/stream_latency.py)", "", *run_header(data),
             f"- package {c['package']} ({c['precision']}, {c['core']} core), {c['threads']} intra-op thread(s), "
             f"beam {c['beam']}, the first {c['sentences']} sentences of {c['sources']}, one request at a time"]
    if any("latency" in result for result in data["modes"].values()):
        lines += ["", "| batching | first stable text: median / p95 ms | full sentence: median / p95 ms | first / full "
                  "(median) | text in the first event (median) |", "|---|---|---|---|---|"]
    for mode, result in data["modes"].items():
        if "latency" not in result:
            continue
        lat = result["latency"]
        lines.append(f"| {mode} | {lat['first_event_ms']['median']:.0f} / {lat['first_event_ms']['p95']:.0f} | "
                     f"{lat['full_ms']['median']:.0f} / {lat['full_ms']['p95']:.0f} | "
                     f"{lat['first_over_full_median']} | {lat['first_event_text_share_median']:.0%} |")
    checks = [(mode, check) for mode, result in data["modes"].items() for check in result.get("checks", [])]
    if checks:
        lines += ["", "| batching | beam (model) | sentences | alone: failures | mixed: streamed != final | "
                  "mixed: streamed != alone | mixed: non-streamed != alone | translations alone (SHA-256) |",
                  "|---|---|---|---|---|---|---|---|"]
        for mode, check in checks:
            lines.append(f"| {mode} | {check['beam']} ({check['model']}) | {check['sentences']} | "
                         f"{check['alone_failures']} | {check['streamed_not_final']} | {check['streamed_not_alone']} "
                         f"| {check['plain_not_alone']} | {check['translations_sha256'][:16]} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code or 0)
    started = datetime.now(UTC)
    host = machine()
    report = ReportFiles.of(config.out_dir, f"stream-latency-{started:%Y-%m-%d}")
    try:
        modes = run(config)
    except (LoadTestError, httpx.HTTPError, RuntimeError) as e:
        say(f"stream_latency: error: {e}")
        return 2
    data = {"command": config.command, "started": started.isoformat(timespec="seconds"),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"), "complete": True, "machine": host,
            "config": {"package": str(config.package), "sources": str(config.sources),
                       "core": "numpy" if native_core() is None else "native", "precision": config.precision,
                       "beam": config.beam,
                       "sentences": config.sentences, "threads": config.threads, "check_beam": config.check_beam,
                       "length_penalty": config.length_penalty, "clients": config.clients,
                       "checks": list(config.checks) if config.check else []},
            "modes": modes}
    report.finish(host, lambda: data, to_markdown)
    failed = any(check["failed"] for result in modes.values() for check in result.get("checks", []))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
