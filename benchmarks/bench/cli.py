"""``python -m benchmarks.bench``: the options, the resolved :class:`Plan` of a run, and ``main``.

Bad arguments are one line on stderr (``mtgate bench: error: ...``) and exit 2; a run exits 0, or 1 when no engine
ran (or, with ``--check-targets``, a target was missed).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.bench.engines import PEER_ENGINES, TEXT_PEER_ENGINES, mtgate_engines
from benchmarks.bench.measure import Case
from benchmarks.bench.plan import NAME, Plan
from benchmarks.bench.workload import DEFAULT_REFERENCES, DEFAULT_SENTENCES, ROOT
from serving.commands.options import UsageError, add_alias, add_log_level

PROG = "python -m benchmarks.bench"
DEFAULT_PEER_PYTHON = ROOT / "build" / "bench-venv" / "bin" / "python"
DEFAULT_OUTPUT_DIR = ROOT / "benchmarks" / "results"
PRESETS = ("opus-mt-en-de", "tiny")
DEMO_CHECKPOINT = ROOT / "models" / "demo-en-de-src"  # the text mode's default model, and its built package
DEMO_PACKAGE = ROOT / "models" / "demo-en-de"


def _csv_ints(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from e
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {value!r}")
    return numbers


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mtgate" / "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (``--checkpoint`` is a training checkpoint; the old ``--model`` is a hidden alias)."""
    parser.add_argument("--checkpoint", type=Path, default=None, metavar="DIR",
                        help="Hugging Face Marian directory (default: a random-weight model of --preset's shape)")
    add_alias(parser, "--model", "checkpoint", new="--checkpoint", type=Path, metavar="DIR")
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help="shape of the random-weight model (default: opus-mt-en-de; tiny with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model and ids (default 0)")
    parser.add_argument("--sentences", type=Path, default=None, metavar="FILE",
                        help="source sentences, one per line (default: Multi30k test_2016 EN)")
    parser.add_argument("-n", "--num-sentences", type=int, default=None,
                        help="sentences to use (default 64; 256 with --text)")
    parser.add_argument("--new-tokens", type=int, default=None, help="generated tokens per sentence (default 32; --text: until EOS)")
    parser.add_argument("--beams", type=_csv_ints, default=None, help="beam sizes (default 1,4)")
    parser.add_argument("--batch-sizes", type=_csv_ints, default=None, help="sentences per batch (default 1,16; 1,32 with --text)")
    parser.add_argument("--engines", default=None,
                        help="comma-separated engine ids, or 'all', 'mtgate', 'peers' (default all; mtgate with "
                             "--quick); ids: mtgate-{onnxruntime,openvino}-{fp32,int8}, "
                             + ", ".join(e.id for e in PEER_ENGINES) + "; with --text: "
                             + ", ".join(e.id for e in TEXT_PEER_ENGINES))
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds: every engine runs once per round, in a fresh process, the engines' order reversed "
                             "each round; ratios are taken within a round, their median reported (default 3; 1 with "
                             "--quick)")
    parser.add_argument("--interleave", choices=("case", "engine"), default=None,
                        help="case: a process per engine, case and round, so that the engines measured on one case "
                             "run within a minute of each other; engine: a process per engine and round, every case "
                             "in it (fewer model loads; default case, engine with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timed passes per case and round (default 1)")
    parser.add_argument("--warmup-sentences", type=int, default=None,
                        help="sentences decoded before timing each case (default max(4, 2 x batch size))")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--peer-python", type=Path, default=None,
                        help=f"interpreter with the peer engines (benchmarks/setup_peers_venv.sh; default "
                             f"{DEFAULT_PEER_PYTHON} if it exists, else this one)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where models and converted artifacts are kept (default ~/.cache/mtgate/bench)")
    parser.add_argument("-o", "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help=f"where the JSON and Markdown reports go (default {DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--name", default=None, help="report file stem (default bench-<UTC time>)")
    parser.add_argument("--no-verify", action="store_true", help="skip the parity check of mtgate convert")
    parser.add_argument("--engine-timeout", type=float, default=7200.0, help="seconds per engine process")
    parser.add_argument("--check-targets", action="store_true",
                        help="exit 1 when a target is missed or an engine generated the wrong number of tokens")
    parser.add_argument("--text", action="store_true",
                        help="real-text mode: a trained model (default the demo, models/demo-en-de-src, and its "
                             "package models/demo-en-de) translates the sentences text to text, each engine with its "
                             "own tokenizer, until EOS; sentences/s, tokens/s, BLEU and agreement with transformers; "
                             "CTranslate2 converted by ct2-transformers-converter")
    parser.add_argument("--package", type=Path, default=None, metavar="DIR",
                        help="an mtgate package converted from --checkpoint (default: converted once, cached)")
    parser.add_argument("--references", type=Path, default=None, metavar="FILE",
                        help="--text: reference translations of --sentences for BLEU (default: Multi30k "
                             "test_2016 DE with the default sentences)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: tiny model, 4 sentences, 8 tokens, 1 pass, mtgate engines only")
    add_log_level(parser, default="WARNING", help="logging level (default WARNING)")


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan of a run from the parsed options (``--quick`` changes the defaults).

    Raises:
        UsageError: an option value that cannot work (missing files, unknown engines, counts below 1).
    """
    quick = bool(args.quick)
    text = bool(args.text)
    if text and args.checkpoint is None:
        args.checkpoint = DEMO_CHECKPOINT
        if args.package is None and (DEMO_PACKAGE / "manifest.json").is_file():
            args.package = DEMO_PACKAGE
    if args.package is not None and not (args.package / "manifest.json").is_file():
        raise UsageError(f"--package {args.package}: not an mtgate package (no manifest.json)")
    if args.package is not None and args.checkpoint is None:
        raise UsageError("--package needs the --checkpoint it was converted from")
    if args.checkpoint is not None and not (args.checkpoint / "config.json").is_file():
        raise UsageError(f"--checkpoint {args.checkpoint}: not a Hugging Face model directory (no config.json)")
    sentences_file = args.sentences or DEFAULT_SENTENCES
    if not sentences_file.is_file():
        raise UsageError(f"--sentences {sentences_file}: no such file")
    references = args.references or (DEFAULT_REFERENCES if text and args.sentences is None else None)
    if references is not None and not references.is_file():
        raise UsageError(f"--references {references}: no such file")
    for flag, value in (("--num-sentences", args.num_sentences), ("--new-tokens", args.new_tokens),
                        ("--rounds", args.rounds), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    engines = (args.engines or ("mtgate" if quick else "all")).strip()
    families: set[str] = set()
    engine_ids: list[str] | None = None
    if engines in ("all", "mtgate", "peers"):
        families = {"mtgate", "peer"} if engines == "all" else {"mtgate" if engines == "mtgate" else "peer"}
    else:
        engine_ids = [e.strip() for e in engines.split(",") if e.strip()]
        peers = TEXT_PEER_ENGINES if text else PEER_ENGINES
        known = {e.id for e in peers} | {e.id for e in mtgate_engines()}
        unknown = [e for e in engine_ids if e not in known]
        if unknown:
            raise UsageError(f"unknown engine(s) {', '.join(unknown)} (known: all, mtgate, peers, "
                             f"{', '.join(sorted(known))})")
        families = {"mtgate" if e.startswith("mtgate-") else "peer" for e in engine_ids}
    beams = args.beams or [1, 4]
    batch_sizes = args.batch_sizes or ([1, 4] if quick else [1, 32] if text else [1, 16])
    peer_python = args.peer_python or (DEFAULT_PEER_PYTHON if DEFAULT_PEER_PYTHON.exists() else Path(sys.executable))
    if "peer" in families and not peer_python.exists():
        raise UsageError(f"--peer-python {peer_python}: no such interpreter")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Plan(
        checkpoint=args.checkpoint,
        preset=args.preset or ("tiny" if quick else "opus-mt-en-de"),
        seed=args.seed,
        sentences_file=sentences_file,
        num_sentences=args.num_sentences or (4 if quick else 256 if text else 64),
        new_tokens=args.new_tokens or (8 if quick else 32),
        cases=[Case(beam, batch) for beam in beams for batch in batch_sizes],
        engine_ids=engine_ids,
        families=families,
        rounds=args.rounds or (1 if quick else 3),
        interleave=args.interleave or ("engine" if quick else "case"),
        repeats=args.repeats or 1,
        warmup_sentences=args.warmup_sentences if args.warmup_sentences is not None else (1 if quick else None),
        threads=args.threads,
        peer_python=peer_python,
        cache_dir=args.cache_dir or _default_cache(),
        output_dir=args.output_dir,
        name=args.name or f"{'quick' if quick else 'bench'}{'-text' if text else ''}-{stamp}",
        verify=not (args.no_verify or quick),
        timeout=args.engine_timeout,
        precisions=["fp32"] if quick else ["fp32", "int8"],
        check_targets=bool(args.check_targets),
        text=text,
        package=args.package,
        references_file=references,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Generated tokens per second of mtgate's engines side by side with peer engines "
        "(benchmarks/README.md). Run from the repository's root.")
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the exit code."""
    from benchmarks.bench.run import run

    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code or 0)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(make_plan(args), command=[PROG, *(sys.argv[1:] if argv is None else argv)])
    except UsageError as e:
        sys.stderr.write(f"{NAME}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{NAME}: interrupted\n")
        return 130
