"""``mtgate translate``: translate the arguments, or stdin line by line, with a model package.

One translation per output line, in input order; an empty (or blank) input line gives an empty output line. Stdin is
read and translated in chunks, so output starts before the input ends and memory stays flat on large files.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from collections.abc import Iterable, Iterator

from serving.cli import UsageError
from serving.cli_options import add_decoding, add_model, add_runtime
from serving.settings import DEFAULT_MODEL_DIR, demo_missing, demo_model

logger = logging.getLogger(__name__)

_CHUNK_LINES = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``translate`` options."""
    parser.add_argument("text", nargs="*", metavar="TEXT", help="texts to translate (default: stdin, one per line)")
    add_model(parser, f"model package directory (default: the demo model {DEFAULT_MODEL_DIR})")
    add_runtime(parser)
    add_decoding(parser)


def run(args: argparse.Namespace) -> int:
    """Translate; 0 on success, 1 when the runtime fails.

    Raises:
        UsageError: bad options, a missing or invalid package, an input longer than the model accepts.
    """
    package = args.model if args.model is not None else demo_model()
    if package is None:
        raise UsageError(demo_missing())
    if not package.exists():
        raise UsageError(f"model package not found: {package}")

    from serving.engine import DecodeOptions, Translator
    from serving.errors import InferenceFailed, InvalidInput
    from serving.package import PackageError

    try:
        translator = Translator.load(package, runtime=args.backend, precision=args.precision, threads=args.threads)
    except PackageError as e:
        raise UsageError(str(e)) from e
    options = DecodeOptions(beam_size=args.beam_size, max_length=args.max_length)
    lines: Iterable[str] = args.text if args.text else _stdin_lines()
    line_number = 0
    try:
        for chunk in _chunks(lines, _CHUNK_LINES):
            todo = [i for i, text in enumerate(chunk) if text.strip()]
            outputs = [""] * len(chunk)
            try:
                translations = translator.translate([chunk[i] for i in todo], options)
            except InvalidInput as e:
                index = getattr(e, "index", None)
                where = f"line {line_number + todo[index] + 1}: " if isinstance(index, int) and index < len(todo) else ""
                raise UsageError(f"{where}{e}") from e
            for i, translation in zip(todo, translations, strict=True):
                outputs[i] = translation.text.replace("\r", " ").replace("\n", " ")
            sys.stdout.write("".join(f"{text}\n" for text in outputs))
            sys.stdout.flush()
            line_number += len(chunk)
    except InferenceFailed as e:
        sys.stderr.write(f"mtgate translate: {e}\n")
        return 1
    return 0


def _stdin_lines() -> Iterator[str]:
    for line in sys.stdin:
        yield line.rstrip("\r\n")


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(lines)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
