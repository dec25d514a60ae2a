"""The command-line options of every ``mtgate`` subcommand and ``batch-score``, registered by one function each, and
:class:`UsageError`, what a command raises for bad arguments or input.

The same thing has the same name in every command (plural where a command takes several, comma-separated:
``convert --runtimes A,B --precisions A,B``): ``serving.commands.vocabulary.VOCABULARY`` lists each option, what it
is and its old spellings.

Each ``add_*`` function registers one option with its help text; an old spelling is registered with
``argparse.SUPPRESS`` help (so ``--help`` shows only the new name), writes the same destination and prints one
warning line naming the new one (:func:`add_alias`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn


class UsageError(Exception):
    """Bad arguments or input: reported as one line on stderr, exit code 2."""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _PackageArgument(argparse._StoreAction):
    """The positional package of :func:`add_package`, which ``-m PKG`` may replace (one of the two is needed)."""


class _UsageFormatter(argparse.HelpFormatter):
    """argparse's usage, with :func:`add_package`'s choice shown as required, ``(PKG | -m PKG)``, where argparse
    would show ``[-m PKG] ... [PKG]``."""

    def _format_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        for action in actions:
            if isinstance(action, _PackageArgument) and usage is None:
                text = text.replace(" [-m PKG]", "").replace(f"[{action.metavar}]", f"({action.metavar} | -m PKG)")
        return text


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``mtgate translate: error: argument --beam-size: ...`` (no usage block);
    subcommand parsers made from it are of the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _UsageFormatter)
        super().__init__(*args, **kwargs)

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


def comma_list(value: str) -> list[str]:
    """argparse type: a comma-separated list (``fp32,int8``); an option that takes one is spelled in the plural."""
    return [v.strip() for v in value.split(",") if v.strip()]


def _warn_old(parser: argparse.ArgumentParser, old: str | None, new: str) -> None:
    sys.stderr.write(f"{parser.prog}: warning: {old} is deprecated, use {new} (the old spelling goes in the next "
                     "release)\n")


class _OldSpelling(argparse._StoreAction):
    """An old spelling: stores as the new option does, after one warning line naming the new one."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _warn_old(parser, option_string, self.new)
        super().__call__(parser, namespace, values, option_string)


class _MillisecondsToMicroseconds(argparse.Action):
    """An old option given in milliseconds that fills a destination in microseconds (with the warning line)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _warn_old(parser, option_string, "--max-queue-delay-us (microseconds)")
        setattr(namespace, self.dest, int(round(float(values) * 1000)))


def add_alias(parser: argparse.ArgumentParser | Any, old: str, dest: str, *, new: str, deprecated: bool = True,
              **kwargs: Any) -> None:
    """Accept the old spelling ``old`` for ``dest`` (the option ``new``) without showing it in ``--help``; a
    ``deprecated`` one prints one warning line when used, a synonym that stays (another tool's name) does not."""
    if deprecated:
        kwargs |= {"action": _OldSpelling, "new": new}
    parser.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_model(parser: argparse.ArgumentParser | Any, help: str, *, repeat: bool = False, required: bool = False,
              aliases: Sequence[str] = (), dest: str = "model") -> None:
    """``-m/--model PKG``: a model package (``repeat``: the option may be given several times, a list). A
    ``required`` one with ``aliases`` is a required group of the option and its old spellings, so that either
    does and ``--help`` shows ``-m PKG`` as required."""
    kwargs: dict[str, Any] = {"type": Path, "metavar": "PKG"}
    if repeat:
        kwargs["action"] = "append"
    where = parser.add_mutually_exclusive_group(required=True) if required and aliases else parser
    where.add_argument("-m", "--model", dest=dest, required=required and not aliases, help=help, **kwargs)
    for old in aliases:
        add_alias(where, old, dest, new="-m/--model", **kwargs)


def add_model_name(parser: argparse.ArgumentParser | Any, help: str) -> None:
    """``--model-name NAME``: a model of a server, by the name it serves it under."""
    parser.add_argument("--model-name", metavar="NAME", help=help)


def add_package(parser: argparse.ArgumentParser | Any, metavar: str, help: str) -> None:
    """The package as the first argument (``args.package``) or, as in every other command, ``-m PKG``
    (``args.model``): one of the two is needed (:func:`package_of`)."""
    parser.add_argument("package", type=Path, nargs="?", metavar=metavar, action=_PackageArgument,
                        help=f"{help}; or -m PKG")
    add_model(parser, f"the same as {metavar}")


def package_of(args: argparse.Namespace, usage: str) -> Path:
    """The package of :func:`add_package`'s arguments.

    Raises:
        ValueError: neither or two different ones were given (the message says so, with ``usage``).
    """
    if args.package is not None and args.model is not None and args.package != args.model:
        raise ValueError(f"two packages: {args.package} and -m {args.model}; give one")
    package: Path | None = args.package or args.model
    if package is None:
        raise ValueError(f"which package? {usage}")
    return package


def add_runtime(parser: argparse.ArgumentParser | Any, *, defaults: bool = True, threads_help: str = "intra-op "
                "threads of the runtime (default: the engine's choice for this machine)") -> None:
    """``--runtime``, ``--precision`` and ``--threads`` (the old ``--backend`` hidden). The defaults are shown in
    the help; ``defaults=False`` leaves the values None for the caller to fill (``serve``: its settings, whose
    defaults are the same)."""
    # here, not at the top: `mtgate` imports this module for every command, serving.package only those that load one
    from serving.package import AUTO, DEFAULT_RUNTIME, PRECISION_CHOICES, RUNTIMES
    from serving.package.precision import INT8_MAX_BLEU_DROP

    parser.add_argument("--runtime", choices=RUNTIMES, default=DEFAULT_RUNTIME if defaults else None,
                        help=f"runtime that runs the graphs (default {DEFAULT_RUNTIME})")
    add_alias(parser, "--backend", "runtime", new="--runtime", choices=RUNTIMES)
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default=AUTO if defaults else None,
                        help=f"which artifact of the package to load (default {AUTO}: int8 "
                             f"where the package's manifest shows it costs at most {INT8_MAX_BLEU_DROP:g} BLEU, "
                             "else fp32)")
    parser.add_argument("--threads", type=positive_int, metavar="N", help=threads_help)


def add_shortlist(parser: argparse.ArgumentParser | Any, *, default: bool | None = False) -> None:
    """``--shortlist``: decode with the package's vocabulary shortlist (``serving.engine.shortlist``)."""
    parser.add_argument("--shortlist", action="store_true", default=default,
                        help="score only each sentence's vocabulary shortlist candidates (built by mtgate convert "
                             "--shortlist-corpus, its BLEU cost in the manifest; onnxruntime only)")


def add_decoding(parser: argparse.ArgumentParser | Any, *, max_beam_size: int | None = None,
                 max_length: int | None = None) -> None:
    """``--beam-size`` and ``--max-length`` (default: the package's decoding defaults), each at most its cap if given
    (``serving.server.settings.MAX_BEAM_SIZE``, ``MAX_OUTPUT_TOKENS``: the server's caps)."""
    beam_type = positive_int if max_beam_size is None else int_between(1, max_beam_size)
    cap = "" if max_beam_size is None else f", at most {max_beam_size}"
    parser.add_argument("--beam-size", type=beam_type, metavar="N",
                        help=f"beams (1: greedy search{cap}; default: the package's)")
    length_type = positive_int if max_length is None else int_between(1, max_length)
    cap = "" if max_length is None else f" (at most {max_length})"
    parser.add_argument("--max-length", type=length_type, metavar="N",
                        help=f"at most N generated tokens per sentence, EOS excluded{cap}; default: the package's")


def add_decoding_features(parser: argparse.ArgumentParser | Any, *, n_best: bool = True) -> None:
    """n-best, the logits rules, sampling and the target prefix (``serving.engine.request.DecodeOptions``, whose check
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
    """``--truncate``: the over-long policy (``serving.engine.request.DecodeOptions.truncate``); ``refused`` says what the
    command does without it."""
    parser.add_argument("--truncate", action="store_true",
                        help=f"cut a sentence longer than the model's positions to them (default: {refused})")


def decoding_values(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding options of :func:`add_decoding`, :func:`add_decoding_features` and :func:`add_truncate` by their
    ``serving.engine.request.OPTION_NAMES`` (None where not given)."""
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


def add_max_batch_size(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None,
                       aliases: Sequence[str] = ()) -> None:
    """``--max-batch-size N`` (the old ``--max-batch-sentences`` and ``aliases`` hidden)."""
    parser.add_argument("--max-batch-size", type=positive_int, default=default, metavar="N", help=help)
    for old in ("--max-batch-sentences", *aliases):
        add_alias(parser, old, "max_batch_size", new="--max-batch-size", type=positive_int)


def add_max_batch_tokens(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None,
                         aliases: Sequence[str] = ()) -> None:
    """``--max-batch-tokens N``."""
    parser.add_argument("--max-batch-tokens", type=positive_int, default=default, metavar="N", help=help)
    for old in aliases:
        add_alias(parser, old, "max_batch_tokens", new="--max-batch-tokens", type=positive_int)


def add_max_queue_delay(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None) -> None:
    """``--max-queue-delay-us N`` (the old ``--max-batch-delay-ms`` hidden, converted to microseconds)."""
    parser.add_argument("--max-queue-delay-us", type=non_negative_int, default=default, metavar="US", help=help)
    parser.add_argument("--max-batch-delay-ms", dest="max_queue_delay_us", action=_MillisecondsToMicroseconds,
                        type=float, help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def add_max_queue_size(parser: argparse.ArgumentParser | Any, help: str, default: int | None = None) -> None:
    """``--max-queue-size N`` (the old ``--queue-capacity`` hidden)."""
    parser.add_argument("--max-queue-size", type=positive_int, default=default, metavar="N", help=help)
    add_alias(parser, "--queue-capacity", "max_queue_size", new="--max-queue-size", type=positive_int)


def add_log_level(parser: argparse.ArgumentParser | Any, *, default: Any = argparse.SUPPRESS,
                  help: str = "logging level (default WARNING)") -> None:
    """``--log-level LEVEL``; with the default ``SUPPRESS`` a subcommand parser leaves the global value alone."""
    parser.add_argument("--log-level", type=log_level, default=default, metavar="LEVEL", help=help)
