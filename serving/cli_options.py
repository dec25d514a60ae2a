"""One vocabulary of command-line options for every ``mtgate`` subcommand and ``batch-score``.

The same thing has the same name in every command, Triton's name where Triton has one: :data:`VOCABULARY` lists
each option, what it is and its old spellings (README.md's option table is generated from it).

Each ``add_*`` function registers one option with its help text; an old spelling is registered with
``argparse.SUPPRESS`` help (so ``--help`` shows only the new name) and writes the same destination.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn


class Term(NamedTuple):
    """One option of the vocabulary: its spelling, what it is, and the old spellings still accepted (hidden)."""

    option: str
    meaning: str
    old: str = ""


VOCABULARY: tuple[Term, ...] = (
    Term("-m, --model PKG", "a model package (what `mtgate convert` writes); `serve` takes several",
         "`--candidate` (validate)"),
    Term("--baseline PKG", "the package a candidate is compared with (validate)"),
    Term("--backend NAME", "the runtime: `onnxruntime` or `openvino` (Triton's `backend`)", "`--runtime`"),
    Term("--precision NAME", "which artifact of the package: `fp32` or `int8`"),
    Term("--threads N", "intra-op threads of the runtime"),
    Term("--shortlist", "decode with the package's vocabulary shortlist (`mtgate convert --shortlist-corpus`; "
         "onnxruntime)"),
    Term("--beam-size N", "beams (1: greedy search); at most the server's `max_beam_size`"),
    Term("--max-length N", "most generated tokens per sentence, EOS excluded"),
    Term("--num-hypotheses N", "n-best: translations per sentence, best first (beam search)"),
    Term("--min-length N", "fewest generated tokens per sentence, after the target prefix"),
    Term("--repetition-penalty X", "above 1 discourages repeating a token (transformers' `repetition_penalty`)"),
    Term("--no-repeat-ngram-size N", "no n-gram of this size occurs twice in a translation"),
    Term("--disable-unk", "never generate the unknown token"),
    Term("--temperature X, --top-k N, --top-p X", "sample instead of searching (beam 1), from the model's "
         "distribution warped by these"),
    Term("--seed N", "makes sampling reproducible (and turns it on)"),
    Term("--target-prefix TEXT", "the start every translation is forced to (CTranslate2's `target_prefix`)"),
    Term("--max-batch-size N", "most sentences in one engine batch (Triton's `max_batch_size`)",
         "`--max-batch-sentences`"),
    Term("--max-batch-tokens N", "most padded source tokens in one engine batch", "`--max-tokens` (batch-score)"),
    Term("--max-queue-delay-us US", "longest wait of a queued sentence for a fuller batch, in microseconds "
         "(Triton's `max_queue_delay_microseconds`)", "`--max-batch-delay-ms` (milliseconds)"),
    Term("--max-queue-size N", "most sentences waiting; beyond it 503 with Retry-After (Triton's `max_queue_size`)",
         "`--queue-capacity`"),
    Term("--api-key KEY", "sent or required as `Authorization: Bearer KEY` (default `$MTGATE_API_KEY`)"),
    Term("--model-name NAME", "a model a server serves, by its name (loadtest, batch-score --server)"),
    Term("-o, --output PATH", "where a command writes its result (atomically; refused before any work when it "
         "cannot be written)"),
    Term("--log-level LEVEL", "DEBUG, INFO, WARNING, ERROR; before or after the subcommand"),
    Term("--checkpoint DIR", "a training checkpoint (`python -m benchmarks.bench`)", "`--model` (bench)"),
)
"""Every shared option, in the order README.md's table lists them."""


def vocabulary_table() -> str:
    """README.md's option table (Markdown), from :data:`VOCABULARY`."""
    rows = ["| option | what it is | old spelling (hidden, still accepted) |", "|---|---|---|"]
    rows += [f"| `{t.option}` | {t.meaning} | {t.old or '-'} |" for t in VOCABULARY]
    return "\n".join(rows) + "\n"


BACKENDS = ("onnxruntime", "openvino")
PRECISIONS = ("fp32", "int8")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``mtgate translate: error: argument --beam-size: ...`` (no usage block);
    subcommand parsers made from it are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(value: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def non_negative_int(value: str) -> int:
    """argparse type: an integer of at least 0."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {number}")
    return number


def int_between(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an integer from ``low`` to ``high`` (the message names the range)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {number}")
        return number

    return parse


def positive_float(value: str) -> float:
    """argparse type: a number above 0."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return number


def log_level(value: str) -> str:
    """argparse type: a logging level name (any case)."""
    upper = value.upper()
    if upper not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"unknown level {value!r} (choose from {', '.join(LOG_LEVELS)})")
    return upper


class _MillisecondsToMicroseconds(argparse.Action):
    """An old option given in milliseconds that fills a destination in microseconds."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, int(round(float(values) * 1000)))


def add_alias(parser: argparse.ArgumentParser | Any, old: str, dest: str, **kwargs: Any) -> None:
    """Accept the old spelling ``old`` for ``dest`` without showing it in ``--help``."""
    parser.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_model(parser: argparse.ArgumentParser | Any, help: str, *, repeat: bool = False, required: bool = False,
              aliases: Sequence[str] = (), dest: str = "model") -> None:
    """``-m/--model PKG``: a model package (``repeat``: the option may be given several times, a list)."""
    kwargs: dict[str, Any] = {"type": Path, "metavar": "PKG"}
    if repeat:
        kwargs["action"] = "append"
    parser.add_argument("-m", "--model", dest=dest, required=required, help=help, **kwargs)
    for old in aliases:
        add_alias(parser, old, dest, **kwargs)


def add_model_name(parser: argparse.ArgumentParser | Any, help: str) -> None:
    """``--model-name NAME``: a model of a server, by the name it serves it under."""
    parser.add_argument("--model-name", metavar="NAME", help=help)


def add_runtime(parser: argparse.ArgumentParser | Any, *, default_backend: str | None = "onnxruntime",
                default_precision: str | None = "fp32", threads_help: str = "intra-op threads of the runtime "
                "(default: the engine's choice for this machine)") -> None:
    """``--backend``, ``--precision`` and ``--threads`` (the old ``--runtime`` hidden)."""
    shown = f" (default {default_backend})" if default_backend else ""
    parser.add_argument("--backend", choices=BACKENDS, default=default_backend,
                        help=f"runtime that runs the graphs{shown}")
    add_alias(parser, "--runtime", "backend", choices=BACKENDS)
    shown = f" (default {default_precision})" if default_precision else ""
    parser.add_argument("--precision", choices=PRECISIONS, default=default_precision,
                        help=f"which artifact of the package to load{shown}")
    parser.add_argument("--threads", type=positive_int, metavar="N", help=threads_help)


def add_shortlist(parser: argparse.ArgumentParser | Any, *, default: bool | None = False) -> None:
    """``--shortlist``: decode with the package's vocabulary shortlist (``serving.shortlist``)."""
    parser.add_argument("--shortlist", action="store_true", default=default,
                        help="score only each sentence's vocabulary shortlist candidates (built by mtgate convert "
                             "--shortlist-corpus, its BLEU cost in the manifest; onnxruntime only)")


def add_decoding(parser: argparse.ArgumentParser | Any, *, max_beam_size: int | None = None,
                 max_length: int | None = None) -> None:
    """``--beam-size`` and ``--max-length`` (default: the package's decoding defaults), each at most its cap if given
    (``serving.settings.MAX_BEAM_SIZE``, ``MAX_OUTPUT_TOKENS``: the server's caps)."""
    beam_type = positive_int if max_beam_size is None else int_between(1, max_beam_size)
    cap = "" if max_beam_size is None else f", at most {max_beam_size}"
    parser.add_argument("--beam-size", type=beam_type, metavar="N",
                        help=f"beams (1: greedy search{cap}; default: the package's)")
    length_type = positive_int if max_length is None else int_between(1, max_length)
    cap = "" if max_length is None else f" (at most {max_length})"
    parser.add_argument("--max-length", type=length_type, metavar="N",
                        help=f"at most N generated tokens per sentence, EOS excluded{cap}; default: the package's")


def add_decoding_features(parser: argparse.ArgumentParser | Any, *, n_best: bool = True) -> None:
    """n-best, the logits rules, sampling and the target prefix (``serving.request.DecodeOptions``, whose check
    names options that do not go together); :func:`decoding_values` reads them back. ``n_best=False``: a command
    that writes one translation per input (``batch-score``) still parses ``--num-hypotheses`` but says only 1
    goes (it refuses more itself)."""
    parser.add_argument("--num-hypotheses", type=positive_int, metavar="N",
                        help="n-best: N translations per sentence, best first (widens the beam to at least N)"
                        if n_best else "only 1 here: one translation per input (n-best lists: mtgate translate)")
    parser.add_argument("--min-length", type=positive_int, metavar="N",
                        help="at least N generated tokens per sentence before EOS (after the target prefix)")
    parser.add_argument("--repetition-penalty", type=positive_float, metavar="X",
                        help="above 1 discourages repeating a token (transformers' repetition_penalty)")
    parser.add_argument("--no-repeat-ngram-size", type=positive_int, metavar="N",
                        help="no n-gram of N tokens occurs twice in a translation")
    parser.add_argument("--disable-unk", action="store_true", help="never generate the unknown token")
    parser.add_argument("--temperature", type=positive_float, metavar="X",
                        help="sample (beam 1) from the distribution at this temperature")
    parser.add_argument("--top-k", type=positive_int, metavar="N", help="sample among the N most likely tokens")
    parser.add_argument("--top-p", type=_probability, metavar="X",
                        help="sample among the most likely tokens whose probability reaches X")
    parser.add_argument("--seed", type=non_negative_int, metavar="N",
                        help="sample reproducibly: the same seed gives the same translations")
    parser.add_argument("--target-prefix", metavar="TEXT",
                        help="force every translation to start with TEXT (CTranslate2's target_prefix)")


def add_truncate(parser: argparse.ArgumentParser | Any, refused: str = "refuse it, exit 2") -> None:
    """``--truncate``: the over-long policy (``serving.request.DecodeOptions.truncate``); ``refused`` says what the
    command does without it."""
    parser.add_argument("--truncate", action="store_true",
                        help=f"cut a sentence longer than the model's positions to them (default: {refused})")


def decoding_values(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding options of :func:`add_decoding`, :func:`add_decoding_features` and :func:`add_truncate` by their
    ``serving.request.OPTION_NAMES`` (None where not given)."""
    names = ("beam_size", "max_length", "num_hypotheses", "min_length", "repetition_penalty", "no_repeat_ngram_size",
             "disable_unk", "temperature", "top_k", "top_p", "seed", "truncate")
    return {name: getattr(args, name, None) for name in names}


def flag_name(option: str) -> str:
    """The command-line flag of a decoding option (``beam_size`` -> ``--beam-size``): how CLI messages name it."""
    return "--" + option.replace("_", "-")


def _probability(value: str) -> float:
    number = positive_float(value)
    if number > 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {value}")
    return number


def add_max_batch_size(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None) -> None:
    """``--max-batch-size N`` (the old ``--max-batch-sentences`` hidden)."""
    parser.add_argument("--max-batch-size", type=positive_int, default=default, metavar="N", help=help)
    add_alias(parser, "--max-batch-sentences", "max_batch_size", type=positive_int)


def add_max_batch_tokens(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None,
                         aliases: Sequence[str] = ()) -> None:
    """``--max-batch-tokens N``."""
    parser.add_argument("--max-batch-tokens", type=positive_int, default=default, metavar="N", help=help)
    for old in aliases:
        add_alias(parser, old, "max_batch_tokens", type=positive_int)


def add_max_queue_delay(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None) -> None:
    """``--max-queue-delay-us N`` (the old ``--max-batch-delay-ms`` hidden, converted to microseconds)."""
    parser.add_argument("--max-queue-delay-us", type=non_negative_int, default=default, metavar="US", help=help)
    parser.add_argument("--max-batch-delay-ms", dest="max_queue_delay_us", action=_MillisecondsToMicroseconds,
                        type=float, help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def add_max_queue_size(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None) -> None:
    """``--max-queue-size N`` (the old ``--queue-capacity`` hidden)."""
    parser.add_argument("--max-queue-size", type=positive_int, default=default, metavar="N", help=help)
    add_alias(parser, "--queue-capacity", "max_queue_size", type=positive_int)


def add_log_level(parser: argparse.ArgumentParser | Any, *, default: Any = argparse.SUPPRESS,
                  help: str = "logging level (default WARNING)") -> None:
    """``--log-level LEVEL``; with the default ``SUPPRESS`` a subcommand parser leaves the global value alone."""
    parser.add_argument("--log-level", type=log_level, default=default, metavar="LEVEL", help=help)
