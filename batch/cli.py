"""``batch-score`` (also ``mtgate batch-score``): translate and score TFRecord, JSONL or text files.

    batch-score data/newstest-*.tfrecord -m models/demo-en-de -o scored.tfrecord
    batch-score test.en --references test.de -o test.hyp.de           # plain text, BLEU/chrF/TER
    batch-score input.jsonl --server http://127.0.0.1:8000              # through a running mtgate serve / Triton

Writes the output (by default each input Example plus ``outputs`` and ``score``), ``<output>.rejects.jsonl`` and
``<output>.summary.json``; prints one summary line. Exit codes (the README's): 0 done, 1 some records were rejected
(unless ``--allow-rejects``) or the run failed on the way (a full disk, an I/O error, a server or Ray cluster lost:
one line, and the committed chunks stay for the rerun), 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from batch.engines import check_ray, model_dir_of, options_of, package_engine, package_info, ray_engine, server_engine
from batch.errors import InputError, IOFailure, JobError
from batch.framing import FORMATS, Format
from batch.inputs import resolve_inputs
from batch.job import Job
from batch.outputs import check_outputs, default_output, shard_name, side_file
from batch.report import dry_run_report, empty_warning, summary_line, tensorboard_problem, write_tensorboard
from batch.run_loop import ChunkRunner, run_job
from batch.schema import detect_schema
from batch.workers import Executor
from serving.commands.options import (
    OneLineParser,
    UsageError,
    add_decoding,
    add_decoding_features,
    add_log_level,
    add_max_batch_size,
    add_max_batch_tokens,
    add_model,
    add_runtime,
    add_truncate,
    non_negative_int,
    positive_int,
)
from serving.commands.registry import missing_extra
from serving.package import choose_precision
from serving.server.settings import OFFLINE_MAX_BATCH_SIZE, OFFLINE_MAX_BATCH_TOKENS

logger = logging.getLogger(__name__)

_SHARD_ENV = "JOB_COMPLETION_INDEX"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register batch-score's arguments (shared by ``batch-score`` and ``mtgate batch-score``).

    Names follow ``serving.commands.options``; the old ``--backend`` and ``--max-tokens`` are hidden aliases.
    """
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="input files or globs (data-*.tfrecord); TFRecord of tf.train.Example, JSONL or text")
    src = parser.add_argument_group("model")
    add_model(src, help="model package directory (default: the bundled demo model models/demo-en-de)")
    src.add_argument("--server", default=None, metavar="URL",
                     help="translate through a server (mtgate serve or Triton) over the Open Inference Protocol")
    src.add_argument("--model-name", default=None, metavar="NAME",
                     help="with --server: model name on the server (default: its default model)")
    src.add_argument("--api-key", default=os.environ.get("MTGATE_API_KEY"), metavar="KEY",
                     help="with --server: sent as 'Authorization: Bearer KEY' (default: $MTGATE_API_KEY)")
    src.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                     help="translate on Ray Data, in a pool of actors (--workers actors x --threads each): a local "
                          "Ray started here (no ADDRESS, or local; inside a Ray job, $RAY_ADDRESS), the cluster "
                          "running on this machine (auto), HOST:PORT or ray://HOST:PORT (needs mtgate[ray])")
    add_runtime(src, threads_help="runtime threads per worker (default: cores / workers)")
    decoding = parser.add_argument_group("decoding", "as mtgate translate's (one translation per record: no "
                                          "n-best); sampled output is reproducible only with --seed")
    add_decoding(decoding)
    add_decoding_features(decoding, n_best=False)
    add_truncate(decoding, refused="the record is a reject")
    io = parser.add_argument_group("input and output")
    io.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                    help="output file, in an existing writable directory (default: INPUT.scored.EXT beside the "
                         "input; with --num-shards > 1 the shard is added to the name: OUT-00003-of-00010.EXT)")
    io.add_argument("--input-format", choices=("auto", *FORMATS), default="auto",
                    help="format of the inputs (default auto: from the file suffix, else from the first bytes)")
    io.add_argument("--output-format", choices=FORMATS, default=None,
                    help="default: tfrecord for TFRecord input, jsonl for JSONL, text for text")
    io.add_argument("--input-key", default=None, metavar="KEY",
                    help="feature/field with the source (default: the first of inputs, source, text, src)")
    io.add_argument("--reference-key", default=None, metavar="KEY",
                    help="feature/field with the reference (default: targets, if present)")
    io.add_argument("--references", action="append", default=None, metavar="FILE",
                    help="reference file for plain-text input, one line per input line (repeat, or a glob, for "
                         "several inputs)")
    io.add_argument("--score-references", action="store_true",
                    help="also score each record's reference with the model (teacher-forced): ref_log_prob, "
                         "ref_tokens and ref_perplexity in the output records, the corpus log-likelihood and "
                         "perplexity in the summary (a local package only, not --server or --ray)")
    io.add_argument("--vocab", type=Path, default=None, metavar="FILE",
                    help="T2T .subwords vocabulary decoding int64 id features (default: the package's)")
    io.add_argument("--rejects", type=Path, default=None, metavar="FILE",
                    help="rejects file (default: OUT.rejects.jsonl)")
    io.add_argument("--summary", type=Path, default=None, metavar="FILE",
                    help="summary file (default: OUT.summary.json)")
    run = parser.add_argument_group("throughput and reliability")
    run.add_argument("--workers", type=positive_int, default=None, metavar="N",
                     help="worker processes (default: one per core; with --server: 4 concurrent requests)")
    add_max_batch_tokens(run, help=f"most padded source tokens times beams per batch (default: {OFFLINE_MAX_BATCH_TOKENS}, fewer "
                                   "than mtgate serve's: every worker holds a batch)",
                         default=OFFLINE_MAX_BATCH_TOKENS, aliases=("--max-tokens",))
    add_max_batch_size(run, help=f"most sentences per batch (default: {OFFLINE_MAX_BATCH_SIZE}, more than mtgate "
                                 "serve's: no record waits for a batch)", default=OFFLINE_MAX_BATCH_SIZE)
    run.add_argument("--chunk-size", type=positive_int, default=1000, metavar="N",
                     help="records per committed chunk, the unit of resume (default: 1000)")
    run.add_argument("--num-shards", type=positive_int, default=1, metavar="N",
                     help="split the records over this many jobs (default: 1)")
    run.add_argument("--shard-index", type=non_negative_int, default=None, metavar="I",
                     help=f"which shard this job handles (default: ${_SHARD_ENV}, set by Kubernetes Indexed Jobs, "
                          "else 0)")
    run.add_argument("--allow-rejects", action="store_true", help="exit 0 even if some records were rejected")
    run.add_argument("--dry-run", action="store_true",
                     help="report the detected schema and the record count, translate nothing")
    run.add_argument("--restart", action="store_true",
                     help="discard an unfinished run of a different command (or of a changed input) instead of "
                          "refusing to start")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    run.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                     help="also write the run's scores, counts and speed for TensorBoard into a new run directory "
                          "under DIR (tensorboard --logdir DIR)")


def _shard(args: argparse.Namespace) -> tuple[int, int]:
    num = int(args.num_shards)
    index = args.shard_index
    if index is None:
        env = os.environ.get(_SHARD_ENV)
        if env is not None and num > 1:
            try:
                index = int(env)
            except ValueError:
                raise UsageError(f"${_SHARD_ENV}={env!r} is not an integer") from None
        else:
            index = 0
    if not 0 <= index < num:
        raise UsageError(f"--shard-index {index} out of range for --num-shards {num} (0..{num - 1})")
    return num, index


def run(args: argparse.Namespace) -> int:
    """Run batch-score; returns the exit code (raises UsageError for bad arguments or input)."""
    quiet_tensorflow(str(getattr(args, "log_level", None) or "WARNING").upper())
    if args.server and args.model is not None:
        raise UsageError("give either -m/--model or --server, not both")
    if args.score_references and (args.server or args.ray is not None):
        remote = "--server" if args.server else "--ray"
        raise UsageError(f"--score-references needs a local model package (-m), not {remote}")
    if args.ray is not None:
        check_ray(args)
    options = options_of(args)  # bad options or combinations: exit 2 before any work, as mtgate translate
    num_shards, shard_index = _shard(args)
    try:
        inputs = resolve_inputs(args.inputs, args.input_format, args.references)
    except InputError as e:
        raise UsageError(str(e)) from e

    engine_info: dict[str, Any]
    package_vocab: Path | None = None
    model_dir: Path | None = None
    manifest: dict[str, Any] = {}
    if args.server:
        engine_info = {"server": args.server}
    else:
        engine_info = {}
        try:
            model_dir = model_dir_of(args)
        except UsageError:
            if not (args.dry_run and args.model is None):
                raise
            # A dry run only inspects the inputs: no model needed unless its vocabulary is.
        if model_dir is not None:
            manifest, package_vocab = package_info(model_dir, args.runtime, args.precision)
            choice = choose_precision(manifest, args.runtime, args.precision)
            if args.precision != choice.precision:  # auto: workers, fingerprint and summary get the one loaded
                logger.info("%s", choice.describe(args.runtime))
                args.precision = choice.precision
            engine_info = {"model_dir": str(model_dir), "name": manifest.get("name"),
                           "version": manifest.get("version"), "runtime": args.runtime, "precision": args.precision,
                           "beam_size": args.beam_size or manifest.get("decoding", {}).get("beam_size")}
    vocab_path: Path | None = args.vocab or package_vocab
    if args.vocab is not None and not args.vocab.is_file():
        raise UsageError(f"{args.vocab}: no such vocabulary file")

    try:
        schema = detect_schema(inputs, args.input_key, args.reference_key)
    except (InputError, IOFailure) as e:
        raise UsageError(str(e)) from e
    if schema.needs_vocab and vocab_path is None:
        raise UsageError("the inputs hold int64 token ids (T2T datagen); pass --vocab FILE.subwords (the model "
                         "package has no subword vocabulary)" if model_dir else
                         "the inputs hold int64 token ids (T2T datagen); pass --vocab FILE.subwords to decode them")
    if not schema.needs_vocab:
        vocab_path = None
    if args.score_references and schema.reference_key is None:
        where = ("--references FILE (one reference line per input line)" if schema.format == "text"
                 else "--reference-key KEY (the field holding each record's reference)")
        raise UsageError(f"--score-references: the inputs have no references ({schema.describe()}); give {where}")

    output_format: Format = args.output_format or ("text" if schema.format == "text" else schema.format)
    output = shard_name(args.output or default_output(inputs, output_format), num_shards, shard_index)
    resolved_inputs = {p.resolve() for i in inputs for p in (i.path, i.references) if p is not None}
    if output.resolve() in resolved_inputs:
        raise UsageError(f"{output}: the output would overwrite an input; choose another -o")
    rejects = args.rejects or side_file(output, ".rejects.jsonl")
    summary = args.summary or side_file(output, ".summary.json")
    # Ids written with the package's own vocabulary go to the engine as they are (no decode + re-encode).
    source_ids = (schema.input_kind == "ids" and package_vocab is not None and vocab_path is not None
                  and (vocab_path == package_vocab or vocab_path.read_bytes() == package_vocab.read_bytes()))
    job = Job(inputs=inputs, schema=schema, vocab=vocab_path, output=output, output_format=output_format,
              rejects=rejects, summary=summary, chunk_size=args.chunk_size, num_shards=num_shards,
              shard_index=shard_index, source_ids=source_ids, score_references=args.score_references)

    if args.dry_run:
        try:
            lines, records = dry_run_report(job)
        except (InputError, IOFailure) as e:
            raise UsageError(str(e)) from e
        sys.stdout.write("\n".join(lines) + "\n")
        if not records:
            sys.stderr.write(empty_warning(job) + "\n")
        return 0
    try:
        check_outputs(job)  # before any work: nothing is written when an output cannot be
    except JobError as e:
        raise UsageError(str(e)) from e
    if args.tensorboard is not None and (problem := tensorboard_problem(args.tensorboard)):
        raise UsageError(problem)

    chunk_runner: ChunkRunner | None = None
    make_executor: Callable[[], Executor] | None = None
    if args.server:
        engine, make_executor, engine_info = server_engine(args, options)
    elif args.ray is not None:
        assert model_dir is not None
        engine, chunk_runner, ray_info = ray_engine(args, model_dir, manifest, options)
        engine_info |= {"workers": engine.workers, "threads_per_worker": engine.threads, "ray": ray_info}
    else:
        assert model_dir is not None
        engine, make_executor = package_engine(args, model_dir, manifest, options)
        engine_info |= {"workers": engine.workers, "threads_per_worker": engine.threads}
    if engine.decoding:
        engine_info["decoding"] = dict(engine.decoding)

    logger.info("batch-score: %d input file(s), %s -> %s", len(inputs), schema.describe(), output)
    from serving.package import PackageError

    try:
        if chunk_runner is not None:  # before any work: Ray's read node holds the inputs (ray:// reads elsewhere)
            from batch.ray_runner import check_read_node

            check_read_node(job)
        result = run_job(job, engine, make_executor=make_executor, chunk_runner=chunk_runner,
                         progress=not args.no_progress, restart=args.restart, engine_info=engine_info)
    except (JobError, PackageError) as e:  # PackageError: a worker could not load the package (a corrupt graph)
        raise UsageError(str(e)) from e
    except IOFailure as e:  # a file of the run: one line with the path and what to do
        logger.debug("run failed", exc_info=True)
        sys.stderr.write(f"batch-score: failed: {e}, then rerun the same command to resume{_kept(job)}\n")
        return 1
    except Exception as e:  # noqa: BLE001 - a failed run: one line, committed chunks stay for the rerun
        if not _is_run_failure(e):
            raise
        logger.debug("run failed", exc_info=True)
        then = ("rerun the same command to resume" if getattr(e, "resumable", True)
                else "a rerun fails the same way until that is fixed (--log-level DEBUG shows the task's traceback)")
        sys.stderr.write(f"batch-score: failed: {_one_line(e)}; {then}{_kept(job)}\n")
        return 1
    finally:
        if chunk_runner is not None:
            from batch.ray_session import shutdown

            shutdown()
    sys.stdout.write(summary_line(result.summary, job) + "\n")
    if args.tensorboard is not None:
        sys.stdout.write(f"tensorboard: {write_tensorboard(args.tensorboard, result.summary, job)}\n")
    sys.stdout.flush()
    if not result.summary["records"]:
        sys.stderr.write(empty_warning(job) + "\n")
    if result.rejects and not args.allow_rejects:
        sys.stderr.write(f"batch-score: {result.rejects} record(s) rejected (see {job.rejects}); "
                         "exit 1 (--allow-rejects to accept)\n")
        return 1
    return 0


def quiet_tensorflow(log_level: str) -> None:
    """Keep TensorFlow's start-up log off stderr unless ``log_level`` is DEBUG (set before tensorflow is imported).

    tensorflow (batch-score imports none: TFRecords and TensorBoard events are written without it; a library that
    finds it installed may) logs through absl's C++ logging: "All log messages before
    absl::InitializeLog() ...", cpu_feature_guard's instruction list and, whatever ``TF_CPP_MIN_LOG_LEVEL`` says,
    "oneDNN custom operations are on". batch-score runs no TensorFlow math, so turning oneDNN off changes nothing
    else. A value already in the environment wins; spawned workers inherit these.
    """
    if log_level == "DEBUG":
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # C++ INFO and WARNING
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # the oneDNN line, printed at INFO regardless of the above
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # its Python side (absl.logging routes here)


def _kept(job: Job) -> str:
    committed = sum(1 for _ in job.state_dir.glob("[0-9]*.json")) if job.state_dir.is_dir() else 0
    return f" ({committed} committed chunk(s) are kept in {job.state_dir})" if committed else ""


def _is_run_failure(e: Exception) -> bool:
    from concurrent.futures.process import BrokenProcessPool

    from batch.remote import RemoteError
    from serving.engine.errors import ServingError

    if isinstance(e, BrokenProcessPool | RemoteError | ServingError | OSError):
        return True
    from batch.ray_runner import RayFailure

    if isinstance(e, RayFailure):
        return True
    # tritonclient's InferenceServerException: network errors and 5xx from the server
    return type(e).__name__ == "InferenceServerException"


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="batch-score", description="Translate and score TFRecord, JSONL or text "
                                     "files with a model package or a server.")
    add_log_level(parser, default="WARNING", help="logging level (default WARNING; DEBUG also shows TensorFlow's "
                  "own start-up log, should a library import it)")
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``batch-score``."""
    missing = missing_extra("batch")
    if missing is not None:
        sys.stderr.write(f"batch-score: error: {missing}\n")
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code or 0)
    logging.basicConfig(level=str(args.log_level).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except UsageError as e:
        sys.stderr.write(f"batch-score: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("batch-score: interrupted (rerun the same command to resume)\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
