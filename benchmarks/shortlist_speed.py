"""Decoding speed with and without a vocabulary shortlist, paired round by round (serving/engine/shortlist.py).

    .venv/bin/python benchmarks/shortlist_speed.py --package PKG --precision int8 --beam 4 --batch 16

``PKG`` is a package converted with ``--shortlist-corpus`` (its shortlist decoders are used). The workload is the
benchmark's (``python -m benchmarks.bench``): random source ids with Multi30k test_2016 lengths, exactly
``--new-tokens`` tokens per sentence (EOS banned). Random ids would find few candidates in a table built from real
text, so the shortlist is a synthetic table: ``--per-token`` random candidates per source id and 500 always-allowed
ids; the report gives the union a batch decodes (what the speed depends on) next to the tokens/s of each round, in
the order full vocabulary, then shortlist (the ratio within a round is what to read; this machine's speed drifts).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench.mtgate_worker import forced_length_translator  # noqa: E402
from benchmarks.bench.workload import DEFAULT_SENTENCES, random_ids_like, read_sentences, special_ids  # noqa: E402
from serving.engine.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from serving.engine.shortlist import Shortlist  # noqa: E402
from serving.engine.translator import DecodeOptions  # noqa: E402
from serving.package import open_package  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", type=Path, required=True)
    parser.add_argument("--precision", choices=["fp32", "int8"], default="int8")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--per-token", type=int, default=10, help="synthetic candidates per source id")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    package = open_package(args.package)
    artifact = package.artifact("onnxruntime", args.precision)
    if artifact.shortlist_decoder is None:
        parser.error(f"{args.package}: no shortlist decoder (convert with --shortlist-corpus)")
    translator = forced_length_translator(args.package, "onnxruntime", args.precision, args.threads, args.new_tokens)
    vocab = translator.info.target_vocab_size
    ids = random_ids_like(read_sentences(DEFAULT_SENTENCES, args.sentences), translator.info.source_vocab_size,
                          special_ids(package.manifest), seed=0)
    rng = np.random.default_rng(1)
    sources = translator.info.source_vocab_size
    table = Shortlist(np.arange(sources + 1, dtype=np.int64) * args.per_token,
                      rng.integers(0, vocab, sources * args.per_token).astype(np.int64),
                      np.arange(2, 502, dtype=np.int64), vocab)
    backends = {"full": translator.backend,
                "shortlist": OnnxRuntimeBackend(package.path(artifact.encoder), package.path(artifact.shortlist_decoder),
                                                args.threads, reuse_buffers=True, shortlist=table)}
    options = DecodeOptions(beam_size=args.beam)
    translator.max_batch_tokens = 10**9

    def tokens_per_s(name: str) -> float:
        translator.backend = backends[name]
        started = time.perf_counter()
        for i in range(0, len(ids), args.batch):
            translator.run(translator.prepare_ids(ids[i : i + args.batch], options))
        return len(ids) * args.new_tokens / (time.perf_counter() - started)

    for name in backends:  # warm-up
        tokens_per_s(name)
    lengths = max(len(s) for s in ids[: args.batch]) + 1
    first = np.array([s + [translator.ids.eos] + [-1] * (lengths - len(s) - 1) for s in ids[: args.batch]])
    union = int(table.candidates(first).any(axis=0).sum())
    sys.stdout.write(f"{args.precision} beam {args.beam} batch {args.batch}, {vocab} target ids, union of the first "
                     f"batch's candidates {union}\n")
    ratios = []
    for r in range(args.rounds):
        full, short = tokens_per_s("full"), tokens_per_s("shortlist")
        ratios.append(short / full)
        sys.stdout.write(f"  round {r + 1}: full {full:.0f} tokens/s, shortlist {short:.0f} tokens/s, "
                         f"{short / full:.2f}x\n")
    sys.stdout.write(f"  median {float(np.median(ratios)):.2f}x\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
