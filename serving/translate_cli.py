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
from serving.settings import DEFAULT_MODEL_DIR, MAX_BEAM_SIZE, MAX_OUTPUT_TOKENS, demo_missing, demo_model

logger = logging.getLogger(__name__)

_CHUNK_LINES = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``translate`` options."""
    parser.add_argument("text", nargs="*", metavar="TEXT", help="texts to translate (default: stdin, one per line)")
    add_model(parser, f"model package directory (default: the demo model {DEFAULT_MODEL_DIR})")
    add_runtime(parser)
    add_decoding(parser, max_beam_size=MAX_BEAM_SIZE, max_length=MAX_OUTPUT_TOKENS)


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
    from serving.tokenizers import InvalidText

    try:
        translator = Translator.load(package, runtime=args.backend, precision=args.precision, threads=args.threads)
    except PackageError as e:
        raise UsageError(str(e)) from e
    options = DecodeOptions(beam_size=args.beam_size, max_length=args.max_length)
    subject = "argument" if args.text else "line"
    lines: Iterable[str] = args.text if args.text else _stdin_lines()
    line_number = 0
    try:
        for chunk in _chunks(lines, _CHUNK_LINES):
            todo = [i for i, text in enumerate(chunk) if text.strip()]
            outputs = [""] * len(chunk)
            try:
                translations = translator.translate([chunk[i] for i in todo], options)
            except InvalidText as e:
                raise UsageError(str(e.about(f"{subject} {line_number + chunk.index(e.text) + 1}"))) from None
            except InvalidInput as e:
                index = getattr(e, "index", None)
                where = f"{subject} {line_number + todo[index] + 1}: " if isinstance(index, int) and index < len(todo) else ""
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
    """Stdin's lines without their line ends, decoded as strict UTF-8.

    Raises:
        UsageError: a line that is not UTF-8, named by its number (the chunks of lines before its chunk have been
            translated and written).
    """
    binary = getattr(sys.stdin, "buffer", None)
    if binary is None:  # a text stream (tests)
        yield from (line.rstrip("\r\n") for line in sys.stdin)
        return
    for number, raw in enumerate(binary, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"line {number} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start} of the "
                             "line); translate reads UTF-8 text") from None
        yield line.rstrip("\r\n")


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(lines)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
