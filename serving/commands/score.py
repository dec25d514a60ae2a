"""``mtgate score``: the model's log-likelihood of given translations (reference scoring, ``Translator.score``).

``--source`` and ``--target`` are UTF-8 text files with one sentence a line, line N of one paired with line N of the
other. One JSON line per pair (stdout, or ``-o FILE`` written atomically) holds its ``log_prob`` (the sum of its
tokens' natural-log probabilities, EOS included), ``tokens``, ``mean_log_prob``, ``perplexity`` and
``token_log_probs``; a summary line on stderr gives the corpus figures (tokens, mean log-prob per token, perplexity).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.commands.options import UsageError, add_model, add_runtime
from serving.engine.request import ReferenceScore, perplexity
from serving.server.settings import DEFAULT_MODEL_DIR, demo_missing, demo_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``score`` options."""
    add_model(parser, f"model package directory (default: the demo model {DEFAULT_MODEL_DIR})")
    parser.add_argument("--source", type=Path, required=True, metavar="FILE", help="source sentences, one a line")
    parser.add_argument("--target", type=Path, required=True, metavar="FILE",
                        help="the translations to score, one a line (line N goes with line N of --source)")
    add_runtime(parser)
    parser.add_argument("-o", "--output", type=Path, metavar="FILE.jsonl",
                        help="write the JSON lines there (atomically) instead of stdout")


def run(args: argparse.Namespace) -> int:
    """Score every pair; 0 on success, 1 when the runtime fails.

    Raises:
        UsageError: a missing or invalid package or file, files of different lengths, a line that is not UTF-8, a
            sentence longer than the model accepts.
    """
    package = args.model if args.model is not None else demo_model()
    if package is None:
        raise UsageError(demo_missing())
    if not package.exists():
        from serving.package import hub_hint

        raise UsageError(f"model package not found: {package}{hub_hint(package)}")
    sources, targets = read_lines(args.source, "--source"), read_lines(args.target, "--target")
    if len(sources) != len(targets):
        raise UsageError(f"--source {args.source} has {len(sources)} lines but --target {args.target} has "
                         f"{len(targets)}; scoring pairs line N of one with line N of the other")
    if args.output is not None and not args.output.parent.is_dir():
        raise UsageError(f"cannot write {args.output}: no directory {args.output.parent}; give another -o")

    from serving.engine.errors import InferenceFailed, InputTooLong, InvalidInput
    from serving.engine.translator import Translator
    from serving.package import PackageError
    from serving.package.files import atomic_writer

    try:
        translator = Translator.load(package, runtime=args.runtime, precision=args.precision, threads=args.threads)
    except PackageError as e:
        raise UsageError(str(e)) from e
    try:
        scores = translator.score(sources, targets)
    except InputTooLong as e:  # sources are checked first; the message names the side and the pair's index
        side, path = ("--target", args.target) if str(e).startswith("target") else ("--source", args.source)
        raise UsageError(f"{side} {path} line {e.index + 1} has {e.tokens} tokens; the model accepts at most "
                         f"{e.limit}") from None
    except InvalidInput as e:
        raise UsageError(str(e)) from None
    except InferenceFailed as e:
        sys.stderr.write(f"mtgate score: {e}\n")
        return 1
    lines = "".join(json.dumps(score_json(score, index), ensure_ascii=False) + "\n"
                    for index, score in enumerate(scores))
    if args.output is None:
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        try:
            with atomic_writer(args.output) as f:
                f.write(lines)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from None
    sys.stderr.write(summary_line(scores) + "\n")
    return 0


def score_json(score: ReferenceScore, index: int | None = None) -> dict[str, Any]:
    """One pair's score as ``mtgate score`` and ``/v1/score`` write it (``index``: its line, from 0)."""
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(log_prob=score.log_prob, tokens=score.tokens, mean_log_prob=score.mean_log_prob,
               perplexity=_finite(score.perplexity), token_log_probs=score.token_log_probs)
    return out


def summary_line(scores: Sequence[ReferenceScore]) -> str:
    """``scored N pairs: T tokens, mean log-prob M per token, perplexity P`` (corpus figures: over every token)."""
    tokens = sum(s.tokens for s in scores)
    total = math.fsum(s.log_prob for s in scores)
    mean = total / tokens if tokens else 0.0
    return (f"scored {len(scores)} pairs: {tokens} tokens, log-prob {total:.4f}, mean log-prob {mean:.4f} per token, "
            f"perplexity {perplexity(mean):.4f}")


def read_lines(path: Path, flag: str) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends.

    Raises:
        UsageError: the file is missing or unreadable, or a line is not UTF-8 (named by its number).
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[str] = []
    for number, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise UsageError(f"{flag} {path} line {number} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte "
                             f"{e.start} of the line)") from None
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
