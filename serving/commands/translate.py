"""``mtgate translate``: translate the arguments, or stdin line by line, with a model package.

One translation per output line, in input order; an empty (or blank) input line gives an empty output line. Stdin is
read and translated in chunks, so output starts before the input ends and memory stays flat on large files.

Over stdin, a progress bar (lines done, lines/s) goes to stderr when it is a terminal other than the output's and the
work takes more than a couple of seconds (``serving.commands.progress``).

``--split-sentences`` translates each line as a document (``serving.engine.documents``: split into sentences, the sentences
of a chunk in one batch, joined with the line's own spaces). ``--truncate`` cuts a sentence longer than the model's
positions instead of refusing it (exit 2 and one line, the default).

``--stream`` translates each line as soon as it is read and prints its translation as it becomes stable (the engine's
``OnPartial`` deltas: greedy, every token; with a beam, the prefix all live beams share; never rewritten), flushing
each piece; the line ends when the translation does, so the output is byte for byte the one without ``--stream``. Not
with ``--num-hypotheses`` above 1 (n-best lists) or ``--split-sentences`` (sentences translated together and joined).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from serving.commands.options import (
    UsageError,
    add_decoding,
    add_decoding_features,
    add_model,
    add_runtime,
    add_shortlist,
    add_truncate,
    decoding_values,
    flag_name,
)
from serving.server.settings import DEFAULT_MODEL_DIR, MAX_BEAM_SIZE, MAX_OUTPUT_TOKENS, demo_missing, demo_model

if TYPE_CHECKING:
    from serving.engine.request import DecodeOptions, Engine, OnPartial

logger = logging.getLogger(__name__)

_CHUNK_LINES = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``translate`` options."""
    parser.add_argument("text", nargs="*", metavar="TEXT", help="texts to translate (default: stdin, one per line)")
    add_model(parser, f"model package directory (default: the demo model {DEFAULT_MODEL_DIR})")
    add_runtime(parser)
    add_shortlist(parser)
    add_decoding(parser, max_beam_size=MAX_BEAM_SIZE, max_length=MAX_OUTPUT_TOKENS)
    add_decoding_features(parser)
    parser.add_argument("--split-sentences", action="store_true",
                        help="split each line into sentences, translate them as one batch and join them with the "
                        "line's spaces (for lines of several sentences)")
    add_truncate(parser)
    parser.add_argument("--stream", action="store_true",
                        help="print each translation as it becomes stable, a line at a time as lines are read (the "
                        "output is the same as without it)")


def run(args: argparse.Namespace) -> int:
    """Translate; 0 on success, 1 when the runtime fails.

    Raises:
        UsageError: bad options, a missing or invalid package, an input longer than the model accepts.
    """
    package = args.model if args.model is not None else demo_model()
    if package is None:
        raise UsageError(demo_missing())
    if not package.exists():
        from serving.package import hub_hint

        raise UsageError(f"model package not found: {package}{hub_hint(package)}")

    from serving.engine.errors import InferenceFailed, InvalidInput
    from serving.engine.translator import DecodeOptions, Translator
    from serving.package import PackageError

    try:
        options = DecodeOptions.from_parameters(decoding_values(args), flag_name)
    except InvalidInput as e:
        raise UsageError(str(e)) from e
    if args.split_sentences and (args.target_prefix is not None or (options.num_hypotheses or 1) > 1):
        raise UsageError("--split-sentences translates sentences and joins them: not with --target-prefix or "
                         "--num-hypotheses above 1")
    if args.stream and (args.split_sentences or (options.num_hypotheses or 1) > 1):
        flag = "--split-sentences" if args.split_sentences else "--num-hypotheses above 1"
        raise UsageError(f"--stream prints one translation per line as it grows: not with {flag}")

    try:
        translator = Translator.load(package, runtime=args.runtime, precision=args.precision, threads=args.threads,
                                     shortlist=args.shortlist)
    except PackageError as e:
        raise UsageError(str(e)) from e
    from serving.commands.progress import bar, on_terminal

    subject = "argument" if args.text else "line"
    lines: Iterable[str] = args.text if args.text else _stdin_lines()
    line_number = 0
    streamed = _Streamed(sys.stdout) if args.stream else None
    try:
        with bar("translate", "lines", enabled=not args.text and not args.stream and on_terminal(beside_output=True)
                 ) as done:
            for chunk in _chunks(lines, 1 if args.stream else _CHUNK_LINES):
                try:
                    _write(_translate(translator, chunk, options, subject, line_number, args.target_prefix,
                                      args.split_sentences, streamed))
                except _BadLine as bad:  # the lines before it are written, then the one-line error
                    _write(bad.done)
                    raise UsageError(bad.message) from None
                line_number += len(chunk)
                done.update(len(chunk))
    except InferenceFailed as e:
        if streamed is not None:
            streamed.end_line()
        sys.stderr.write(f"mtgate translate: {e}\n")
        return 1
    return 0


class _Streamed:
    """``--stream``'s output of the line being translated: its deltas written as they come (on one line), then
    :meth:`rest` of its translation."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._text = ""

    def partial(self, index: int, delta: str) -> None:
        """``OnPartial`` for a one-line chunk."""
        delta = _one_line(delta)
        self._text += delta
        self._out.write(delta)
        self._out.flush()

    def rest(self, line: str) -> str:
        """What the translation ``line`` has beyond what was streamed of it (all of it, if the streamed text is not
        its start: it is then printed on a line of its own); the next line starts afresh."""
        text, self._text = self._text, ""
        if line.startswith(text):
            return line[len(text):]
        logger.error("the streamed text is not the start of the translation; the translation follows")
        return "\n" + line

    def end_line(self) -> None:
        """A line cut short (the runtime failed) is ended, so the error goes to the next."""
        if self._text:
            self._text = ""
            self._out.write("\n")
            self._out.flush()


class _BadLine(Exception):
    """A line that cannot be translated: ``done`` holds the translations of the lines of its chunk before it."""

    def __init__(self, message: str, done: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.done = done


def _translate(translator: Engine, chunk: list[str], options: DecodeOptions, subject: str, first: int,
               target_prefix: str | None = None, split: bool = False, streamed: _Streamed | None = None) -> list[str]:
    """One output line per input line (blank for a blank input); with ``num_hypotheses`` above 1, the n-best lines
    of each input line, Marian's way: ``LINE ||| TEXT ||| SCORE`` (LINE counts from 0). With ``streamed`` (a chunk of
    one line), the translation is written there as it grows, and the line returned is the rest of it.

    Raises:
        _BadLine: a line the engine refuses (not Unicode, too long, ...), with the lines before it translated.
    """
    from serving.engine.errors import InputTooLong, InvalidInput
    from serving.engine.tokenizers import InvalidText

    todo = [i for i, text in enumerate(chunk) if text.strip()]
    prefixes = None if target_prefix is None else [target_prefix] * len(todo)
    try:
        translations = _translations(translator, [chunk[i] for i in todo], options, split, prefixes,
                                     None if streamed is None else streamed.partial)
    except InvalidInput as e:
        index = getattr(e, "index", None)
        bad = chunk.index(e.text) if isinstance(e, InvalidText) else (todo[index] if isinstance(index, int)
                                                                       and index < len(todo) else None)
        if bad is None:
            raise UsageError(str(e)) from e
        where = f"{subject} {first + bad + 1}"
        if isinstance(e, InvalidText):
            message = str(e.about(where))
        elif isinstance(e, InputTooLong):  # in this command's words: where, and the flag that cuts it
            what = str(e).split(" (max_input_tokens")[0] if split else \
                f"{e.tokens} tokens, the model accepts at most {e.limit}"
            message = f"{where}: {what}; --truncate cuts it to the model's positions"
        else:
            message = f"{where}: {e}"
        done = _translate(translator, chunk[:bad], options, subject, first, target_prefix, split) if bad else []
        raise _BadLine(message, done) from e
    if (options.num_hypotheses or 1) > 1:
        return [f"{first + i} ||| {_one_line(t.text)} ||| {t.score:.6f}" for i, translation in zip(todo, translations,
                strict=True) for t in (translation, *translation.alternatives)]
    outputs = [""] * len(chunk)
    for i, translation in zip(todo, translations, strict=True):
        outputs[i] = _one_line(translation.text) if streamed is None else streamed.rest(_one_line(translation.text))
    return outputs


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def _translations(translator: Engine, texts: list[str], options: DecodeOptions, split: bool,
                  prefixes: list[str] | None, on_partial: OnPartial | None = None) -> list[Any]:
    """The engine's translations of ``texts`` (each with ``text``); with ``split`` (``--split-sentences``), of
    ``texts`` as documents; ``on_partial``: streamed (not with ``split``)."""
    if split:
        from serving.engine.documents import translate_documents

        return translate_documents(translator, texts, options)
    return list(translator.run(translator.prepare(texts, options, prefixes), on_partial))


def _write(outputs: list[str]) -> None:
    sys.stdout.write("".join(f"{text}\n" for text in outputs))
    sys.stdout.flush()


def _stdin_lines() -> Iterator[str]:
    """Stdin's lines without their line ends, decoded as strict UTF-8.

    Raises:
        UsageError: a line that is not UTF-8, named by its number (every line before it is translated and
            written first: see :func:`_chunks`).
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
    """Lists of up to ``size`` lines; when reading fails (a line that is not UTF-8), the lines read before it come
    out first as a shorter chunk, then the error."""
    iterator = iter(lines)
    while True:
        chunk: list[str] = []
        try:
            chunk.extend(itertools.islice(iterator, size))
        except UsageError:
            if chunk:
                yield chunk
            raise
        if not chunk:
            return
        yield chunk
