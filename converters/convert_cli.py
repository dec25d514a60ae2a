"""``mtgate convert SRC -o DIR``: a checkpoint directory -> a verified model package.

Exit codes: 0 written; 1 an fp32 artifact failed the parity check (nothing written); 2 bad input (not a checkpoint,
a missing vocab, unsupported options, a mis-shaped weight, an existing DIR without ``--overwrite``...: one header
line plus every reason, nothing written).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serving.commands.options import add_alias, comma_list, non_negative_int, positive_int
from serving.package import PRECISIONS, RUNTIMES, PackageError

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from converters.readers import FORMATS
    from converters.shortlist import DEFAULT_CANDIDATES, DEFAULT_FREQUENT

    parser.add_argument("source", type=Path, metavar="SRC",
                        help="checkpoint directory; its format is recognized from its contents (see --format)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="package directory to write")
    parser.add_argument("--format", default=None, metavar="NAME", dest="fmt",
                        help=f"read SRC as this format instead of recognizing it: {', '.join(FORMATS)}")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace DIR if it exists (atomically: the old package stays until the new one is complete)")
    parser.add_argument("--runtimes", type=comma_list, default=list(RUNTIMES), metavar="A,B",
                        help=f"comma-separated runtimes to write artifacts for (default: {','.join(RUNTIMES)})")
    parser.add_argument("--precisions", type=comma_list, default=list(PRECISIONS), metavar="A,B",
                        help=f"comma-separated precisions out of {','.join(PRECISIONS)} (default: "
                             f"{','.join(PRECISIONS)})")
    add_alias(parser, "--precision", "precisions", new="--precisions", type=comma_list)
    parser.add_argument("--name", default=None, help="package name (default: the source directory name)")
    parser.add_argument("--version", default=None, help="package version (default: 1)")
    parser.add_argument("--no-verify", action="store_true", help="skip the parity checks")
    parser.add_argument("--quality", type=Path, metavar="FILE",
                        help="JSON with scores measured on this model (e.g. BLEU/chrF per artifact), recorded in the "
                             "manifest as 'quality'")
    short = parser.add_argument_group(
        "vocabulary shortlist (opt-in at serve time: --shortlist; ONNX Runtime only; converters/shortlist.py)")
    short.add_argument("--shortlist-corpus", nargs=2, type=Path, default=None, metavar=("SRC_TEXT", "TGT_TEXT"),
                       help="parallel text (one sentence per line, .gz read as gzip, e.g. the training data) to build "
                            "a vocabulary shortlist from")
    short.add_argument("--shortlist-eval", nargs=2, type=Path, default=None, metavar=("SRC_TEXT", "REF_TEXT"),
                       help="held-out sources and references: BLEU with and without the shortlist goes into the "
                            "manifest")
    short.add_argument("--shortlist-candidates", type=positive_int, default=DEFAULT_CANDIDATES, metavar="N",
                       help=f"target candidates per source token (default {DEFAULT_CANDIDATES})")
    short.add_argument("--shortlist-frequent", type=non_negative_int, default=DEFAULT_FREQUENT, metavar="N",
                       help=f"most frequent target tokens every sentence may use (default {DEFAULT_FREQUENT})")
    t2t = parser.add_argument_group("tensor2tensor checkpoints")
    t2t.add_argument("--hparams-set", default=None,
                     help="hparams set when the checkpoint has no hparams.json (transformer_base, transformer_big)")
    t2t.add_argument("--vocab", type=Path, default=None, metavar="FILE", help="the .subwords vocabulary file")
    t2t.add_argument("--target-space-id", type=non_negative_int, default=None, metavar="N",
                     help="target space id (default 0)")


def reader_options(args: argparse.Namespace) -> dict[str, Any]:
    """The reader options the user set (unset ones are left to the reader's defaults)."""
    options = {"hparams_set": args.hparams_set, "vocab": args.vocab, "target_space_id": args.target_space_id}
    return {k: v for k, v in options.items() if v is not None}


def shortlist_request(args: argparse.Namespace) -> Any:
    """The shortlist the options ask for (a ``converters.shortlist.ShortlistRequest``), or None."""
    from converters.shortlist import ShortlistRequest
    from serving.commands.options import UsageError

    if args.shortlist_corpus is None:
        if args.shortlist_eval is not None:
            raise UsageError("--shortlist-eval needs --shortlist-corpus")
        return None
    for path in [*args.shortlist_corpus, *(args.shortlist_eval or [])]:
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    return ShortlistRequest(corpus=tuple(args.shortlist_corpus), candidates=args.shortlist_candidates,
                            frequent=args.shortlist_frequent,
                            evaluation=None if args.shortlist_eval is None else tuple(args.shortlist_eval))


def missing_directory(output: Path) -> Path | None:
    """The outermost directory of ``output``'s path that does not exist yet, as the user spelled it (None: the
    package's directory exists). The conversion creates it, and says so."""
    missing = None
    for parent in output.parents:
        if parent.absolute().exists():
            break
        missing = parent
    return missing


def output_problem(output: Path) -> str | None:
    """Why a package cannot be written at ``output``, or None: checked before any work, so that an unwritable place
    is named (not the staging directory beside it) before anything is read or created."""
    if output.exists() and not output.is_dir():
        return "it exists and is not a directory"
    existing = next(p for p in output.absolute().parents if p.exists())
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:  # the test that holds for read-only mounts, /proc and root alike: make a directory there
        probe = tempfile.mkdtemp(dir=existing, prefix=f".{output.name}.", suffix=".probe")
    except OSError as e:
        return f"cannot create directories in {existing} ({e.strerror})"
    os.rmdir(probe)
    return None


def _remove_created(output: Path, created: Path | None) -> None:
    """After a failure, remove the directories this run created for ``output`` (they are empty: the package is
    written in a staging directory that is removed on failure)."""
    if created is None:
        return
    for directory in [output.parent, *output.parent.parents]:
        try:
            directory.rmdir()
        except OSError:
            return
        if directory == created:
            return


@contextmanager
def _cleaned_up_on_failure(output: Path, created: Path | None) -> Iterator[None]:
    try:
        yield
    except BaseException:
        _remove_created(output, created)
        raise


def run(args: argparse.Namespace) -> int:
    from converters.base import ConversionError
    from converters.convert import ParityError, convert
    from serving.commands.options import UsageError

    if problem := output_problem(args.output):
        raise UsageError(f"cannot write the package {args.output}: {problem}; give another -o")
    created = missing_directory(args.output)
    started = time.perf_counter()
    quality = None
    if args.quality is not None:
        try:
            quality = json.loads(args.quality.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"--quality {args.quality}: {e}") from None
    from serving.commands.progress import Stages

    stages = Stages("convert")

    def progress(message: str) -> None:
        logger.info("%s", message)
        stages(message)

    try:
        with stages, _cleaned_up_on_failure(args.output, created):
            manifest = convert(
                args.source,
                args.output,
                runtimes=args.runtimes,
                precisions=args.precisions,
                verify=not args.no_verify,
                name=args.name,
                version=args.version,
                reader_options=reader_options(args),
                fmt=args.fmt,
                progress=progress,
                quality=quality,
                overwrite=args.overwrite,
                shortlist=shortlist_request(args),
            )
    except ParityError as e:
        sys.stderr.write(f"mtgate convert: {e}\n")
        return 1
    except (ConversionError, PackageError, FileExistsError, ValueError) as e:
        raise UsageError(str(e)) from e
    except OSError as e:  # e.g. the output's parent is not writable
        raise UsageError(f"{e.filename or args.output}: {e.strerror or e}") from e
    sys.stdout.write(f"wrote {args.output} ({manifest.name} {manifest.version}) in "
                     f"{time.perf_counter() - started:.1f}s{f'; created the directory {created}' if created else ''}\n")
    evaluation = (manifest.shortlist or {}).get("evaluation")
    if evaluation is not None:
        sys.stdout.write(f"  shortlist ({evaluation['artifact']}, {evaluation['sentences']} sentences): BLEU "
                         f"{evaluation['full_vocabulary']['bleu']:.2f} -> {evaluation['shortlist']['bleu']:.2f}, "
                         f"{100 * evaluation['identical_translations']:.1f}% identical, decoding "
                         f"{evaluation['full_vocabulary']['seconds']:.1f}s -> {evaluation['shortlist']['seconds']:.1f}s\n")
    for artifact in manifest.artifacts:
        row = manifest.parity.get(artifact.key)
        if row is None:
            sys.stdout.write(f"  {artifact.key}: not verified\n")
        elif "log_probs_max_abs" in row and artifact.precision == "fp32":
            sys.stdout.write(f"  {artifact.key}: max abs diff from the source model: log_probs "
                             f"{row['log_probs_max_abs']:.2e}, memory {row['memory_max_abs']:.2e}\n")
        else:
            sys.stdout.write(f"  {artifact.key}: next-token agreement with fp32 {row['next_token_agreement']:.3f}, "
                             f"greedy {row['greedy_token_agreement']:.3f} (sentences identical "
                             f"{row['greedy_sentence_exact']:.3f})\n")
    return 0
