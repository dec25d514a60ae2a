"""How batch-score translates, from its arguments: a model package in this process or worker processes, a server
over the Open Inference Protocol (``--server``), or a pool of Ray actors (``--ray``). Each set-up returns the
:class:`~batch.job.EngineConfig` and what ``batch.run_loop.run_job`` runs it with; a bad argument is a
``UsageError`` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batch.job import EngineConfig
from batch.resources import available_cores, available_memory, model_bytes, plan_parallelism
from batch.run_loop import ChunkRunner
from batch.workers import Executor, LocalChunkWorker, ProcessExecutor, ThreadExecutor
from serving.commands.options import UsageError
from serving.commands.registry import missing_extra
from serving.engine.request import DecodeOptions

_REMOTE_WORKERS = 4


def model_dir_of(args: argparse.Namespace) -> Path:
    """The package directory of -m, else the bundled demo model."""
    if args.model is not None:
        model: Path = args.model
        if not model.is_dir():
            from serving.package import hub_hint

            raise UsageError(f"{model}: no such model package directory{hub_hint(model)}")
        return model
    from serving.server.settings import demo_missing, demo_model

    demo = demo_model()
    if demo is None:
        raise UsageError(f"{demo_missing()}, or --server URL")
    return demo


def package_info(model_dir: Path, runtime: str, precision: str) -> tuple[dict[str, Any], Path | None]:
    """(manifest, the package's .subwords vocab or None), checking the requested artifact exists (``auto``: the
    one ``serving.package.choose_precision`` picks)."""
    from serving.package import PackageError, choose_precision, find_artifact, load_manifest

    try:
        # checksums verified here, so a damaged package is a usage error before any worker starts
        manifest = load_manifest(model_dir)
        find_artifact(manifest, runtime, choose_precision(manifest, runtime, precision).precision)
    except PackageError as e:
        raise UsageError(str(e)) from e
    tokenizer = manifest.get("tokenizer", {})
    vocab = None
    if tokenizer.get("kind") == "t2t_subword":
        files = [str(v) for v in (tokenizer.get("files") or {}).values()]
        subwords = [f for f in files if f.endswith(".subwords")] or files
        if subwords:
            vocab = model_dir / subwords[0]
    return manifest, vocab


Decoding = tuple[tuple[str, Any], ...]
"""``EngineConfig.decoding``: the decoding options beyond ``--beam-size`` and ``--max-length``."""


def options_of(args: argparse.Namespace) -> DecodeOptions:
    """The decoding options of the command line, parsed and checked once, as ``mtgate translate`` checks them
    (before any work); they travel as they are (``EngineConfig.of``).

    Raises:
        UsageError: a bad value or options that do not go together (named by their flags), or
            ``--num-hypotheses`` above 1 (batch-score writes one translation per record).
    """
    from serving.commands.options import decoding_values, flag_name
    from serving.engine.errors import InvalidInput

    try:
        options = DecodeOptions.from_parameters(decoding_values(args), flag_name)
    except InvalidInput as e:
        raise UsageError(str(e)) from e
    if (options.num_hypotheses or 1) > 1:
        raise UsageError(f"--num-hypotheses {options.num_hypotheses}: batch-score writes one translation per record "
                         "(n-best lists: mtgate translate --num-hypotheses)")
    return options


def decoding_of(args: argparse.Namespace) -> Decoding:
    """:func:`options_of` and ``--target-prefix`` as ``EngineConfig.decoding`` (what the summary shows)."""
    return EngineConfig.decoding_of(options_of(args), args.target_prefix)


def server_engine(args: argparse.Namespace, options: DecodeOptions | None = None
                  ) -> tuple[EngineConfig, Callable[[], Executor], dict[str, Any]]:
    """(engine, executor factory, engine info) for ``--server``: one client per worker thread; the decoding options
    go with every request as its parameters."""
    from batch.remote import RemoteChunkWorker, RemoteError, connect

    try:
        target = connect(args.server, args.model_name, api_key=args.api_key)
    except RemoteError as e:
        raise UsageError(str(e)) from e
    workers = args.workers or _REMOTE_WORKERS
    engine = EngineConfig.of(options or DecodeOptions(), args.target_prefix, max_tokens=args.max_batch_tokens,
                             max_batch_size=args.max_batch_size, workers=workers, threads=1, server=args.server,
                             model_name=target.model)
    parameters = engine.parameters()

    def make_executor() -> Executor:
        return ThreadExecutor(lambda: RemoteChunkWorker(target, engine.max_batch_size, parameters), threads=workers)

    return engine, make_executor, target.describe()


_RAY_ADDRESS = re.compile(r"^(local|auto|ray://\S+|[\w.\-\[\]:]+:\d+)$")


def check_ray(args: argparse.Namespace) -> None:
    """``--ray [ADDRESS]`` before any work: no --server beside it, an address that is one, the extra installed."""
    if args.server:
        raise UsageError("give either --server or --ray, not both")
    if args.ray and not _RAY_ADDRESS.match(args.ray):
        raise UsageError(f"--ray {args.ray}: not a Ray address (local, auto, HOST:PORT or ray://HOST:PORT); to start "
                         "a local Ray, put --ray after the inputs or write --ray=local")
    missing = missing_extra("ray")
    if missing is not None:
        raise UsageError(f"--ray {missing}")


def ray_engine(args: argparse.Namespace, model_dir: Path, manifest: dict[str, Any],
               options: DecodeOptions | None = None) -> tuple[EngineConfig, ChunkRunner, dict[str, Any]]:
    """(engine, chunk runner, Ray info) for ``--ray``: a Ray started here (as many CPUs as this process may use) or
    the one at ADDRESS; actors x threads from its CPUs. Prints where the Ray dashboard is."""
    from batch.ray_runner import RayChunks
    from batch.ray_session import RayUnavailable, connect, plan_actors

    cores = available_cores()
    debug = str(args.log_level).upper() == "DEBUG"
    try:
        session = connect(args.ray or None, cores, debug=debug)
    except RayUnavailable as e:
        raise UsageError(str(e)) from e
    if session.started_here:
        actors, threads = plan_parallelism(args.workers, args.threads, cores,
                                           model_bytes(model_dir, manifest, args.runtime, args.precision),
                                           available_memory())
    else:
        actors, threads = plan_actors(args.workers, args.threads, session.cpus)
    engine = EngineConfig.of(options or DecodeOptions(), args.target_prefix, model_dir=model_dir.resolve(),
                             runtime=args.runtime, precision=args.precision, max_tokens=args.max_batch_tokens,
                             max_batch_size=args.max_batch_size, workers=actors, threads=threads)
    where = "a local Ray" if session.started_here else f"Ray at {session.address}"
    dashboard = f"; dashboard {session.dashboard_url}" if session.dashboard_url else ""
    sys.stderr.write(f"batch-score: {where} ({session.cpus} CPUs), {actors} actor(s) x {threads} thread(s)"
                     f"{dashboard}\n")
    return engine, RayChunks(engine, actors, threads, debug, session.started), session.describe()


def package_engine(args: argparse.Namespace, model_dir: Path, manifest: dict[str, Any],
                   options: DecodeOptions | None = None) -> tuple[EngineConfig, Callable[[], Executor]]:
    """(engine, executor factory) for a model package: workers x threads planned from the cores and memory."""
    workers, threads = plan_parallelism(args.workers, args.threads, available_cores(),
                                        model_bytes(model_dir, manifest, args.runtime, args.precision),
                                        available_memory())
    engine = EngineConfig.of(options or DecodeOptions(), args.target_prefix, model_dir=model_dir,
                             runtime=args.runtime, precision=args.precision, max_tokens=args.max_batch_tokens,
                             max_batch_size=args.max_batch_size, workers=workers, threads=threads)

    def make_executor() -> Executor:
        if engine.workers > 1:
            return ProcessExecutor(engine)
        first = LocalChunkWorker.load(engine)  # PackageError (the runtime is missing, a corrupt graph): exit 2
        return ThreadExecutor(lambda: first, threads=1, first=first)

    return engine, make_executor
