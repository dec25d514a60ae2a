"""``mtgate serve``: its flags, the settings they make (checked before the port is taken), the listening socket, and
the HTTP server on uvicorn with a graceful SIGTERM drain (``serving.commands.draining``).
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from serving.commands.draining import DrainingServer
from serving.commands.options import (
    UsageError,
    add_max_batch_size,
    add_max_batch_tokens,
    add_max_queue_delay,
    add_max_queue_size,
    add_model,
    add_runtime,
    add_shortlist,
    non_negative_int,
    positive_float,
    positive_int,
)
from serving.commands.registry import missing_extra
from serving.package import PackageError, hub_hint, open_package
from serving.server.settings import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_QUEUE_DELAY_US

if TYPE_CHECKING:
    from serving.server.settings import ServingSettings

logger = logging.getLogger(__name__)

# flag -> ServingSettings field, for flags that simply override a setting
_SETTINGS_FLAGS = {
    "host": "host",
    "port": "port",
    "grpc_port": "grpc_port",
    "model_repository": "model_repository",
    "repository_poll_secs": "repository_poll_secs",
    "repository_version_policy": "repository_version_policy",
    "runtime": "runtime",
    "precision": "precision",
    "threads": "threads",
    "shortlist": "shortlist",
    "max_batch_size": "max_batch_size",
    "max_batch_tokens": "max_batch_tokens",
    "max_queue_delay_us": "max_queue_delay_us",
    "batching": "batching",
    "max_queue_size": "max_queue_size",
    "request_timeout": "request_timeout_s",
    "grace_period": "grace_period_s",
    "drain_delay": "drain_delay_s",
    "log_format": "log_format",
    "shadow": "shadow",
    "shadow_fraction": "shadow_fraction",
    "shadow_precision": "shadow_precision",
    "shadow_threads": "shadow_threads",
    "shadow_queue_size": "shadow_queue_size",
    "shadow_log": "shadow_log",
    "shadow_redact": "shadow_redact",
    "canary_fraction": "canary_fraction",
    "canary_max_error_rate": "canary_max_error_rate",
    "canary_max_p95_ms": "canary_max_p95_ms",
    "canary_window": "canary_window",
    "canary_min_requests": "canary_min_requests",
    "canary_timeout_ms": "canary_timeout_ms",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model(
        parser,
        "model package directory (repeat to serve several; the first is the default; "
        "default: the bundled demo model models/demo-en-de)",
        repeat=True,
        dest="models",
    )
    parser.add_argument("--host", metavar="ADDR", help="address to listen on (default 127.0.0.1; MTGATE_HOST)")
    parser.add_argument("--port", type=non_negative_int, help="port to listen on (default 8000, 0 picks a free one; "
                        "MTGATE_PORT)")
    parser.add_argument("--model-repository", type=Path, metavar="DIR",
                        help="serve DIR/<name>/<version>/ packages (Triton's layout), each model at its highest "
                             "version, instead of -m; load and unload through /v2/repository (MTGATE_MODEL_REPOSITORY)")
    parser.add_argument("--repository-version-policy", metavar="POLICY",
                        help="which versions of each repository model to serve: latest:N, all or specific:V[,V...] "
                             "(default latest:1, as Triton's)")
    parser.add_argument("--repository-poll-secs", type=positive_float, metavar="SECONDS",
                        help="rescan the repository this often and switch to new versions without a restart; "
                             "explicit load and unload are then refused, as in Triton's poll mode (default: only on "
                             "an explicit load)")
    parser.add_argument("--grpc-port", type=non_negative_int, metavar="PORT",
                        help="also serve gRPC (KServe v2 / Triton's GRPCInferenceService) on PORT (Triton's is 8001; "
                             "0 picks a free one; needs the grpc extra; MTGATE_GRPC_PORT)")
    add_runtime(parser, defaults=False)  # the settings' (the same) defaults
    add_shortlist(parser, default=None)
    add_max_batch_size(parser, f"most sentences per engine batch (default {DEFAULT_MAX_BATCH_SIZE})")
    add_max_batch_tokens(parser, f"most padded source tokens times beams per batch (default {DEFAULT_MAX_BATCH_TOKENS})")
    add_max_queue_delay(parser, "longest wait of a queued sentence for a fuller batch, in microseconds (default "
                                f"{DEFAULT_MAX_QUEUE_DELAY_US})")
    parser.add_argument("--batching", choices=["request", "step"],
                        help="request: a batch runs to its end before the next starts; step: new sentences join the "
                             "running batch at the next decoder step (default request; MTGATE_BATCHING)")
    add_max_queue_size(parser, "most sentences waiting per model; beyond it 503 with Retry-After (default 512)")
    parser.add_argument("--request-timeout", type=float, metavar="SECONDS", help="request deadline (default 30)")
    parser.add_argument("--grace-period", type=float, metavar="SECONDS", help="SIGTERM drain limit (default 30)")
    parser.add_argument(
        "--drain-delay",
        type=float,
        metavar="SECONDS",
        help="least time to keep answering 503 after SIGTERM (default 0)",
    )
    parser.add_argument("--log-format", choices=["text", "json"], help="log line format (default text)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="only 1 is supported: one process owns the runtime's threads; scale with replicas and --threads",
    )
    parser.add_argument("--access-log", action="store_true", default=None, help="log one line per HTTP request")
    _add_shadow(parser)
    parser.epilog = (
        "Every setting can also be given as an environment variable MTGATE_<SETTING> (see serving/server/settings.py), "
        "e.g. MTGATE_API_KEY to require 'Authorization: Bearer <key>' on inference routes."
    )


def _add_shadow(parser: argparse.ArgumentParser) -> None:
    from serving.package.precision import PRECISION_CHOICES

    shadow = parser.add_argument_group("shadow traffic (compare a candidate with production on live requests)")
    shadow.add_argument("--shadow", type=Path, metavar="CANDIDATE",
                        help="a candidate model package (or a repository's <name>/<version>/ directory) that also "
                             "translates a sampled share of the default model's requests, off the critical path; "
                             "GET /v1/shadow compares it with production (MTGATE_SHADOW)")
    shadow.add_argument("--shadow-fraction", type=float, metavar="F",
                        help="share of requests shadowed, 0 to 1 (default 1.0; MTGATE_SHADOW_FRACTION)")
    shadow.add_argument("--shadow-precision", choices=PRECISION_CHOICES, help="the candidate's artifact (default auto)")
    shadow.add_argument("--shadow-threads", type=positive_int, metavar="N",
                        help="intra-op threads of the candidate (default 1)")
    shadow.add_argument("--shadow-queue-size", type=positive_int, metavar="N",
                        help="most requests waiting for the candidate; beyond it they are shed and counted "
                             "(default 64)")
    shadow.add_argument("--shadow-log", type=Path, metavar="LOG",
                        help="append every compared pair to this JSONL file (rotated by size; MTGATE_SHADOW_LOG)")
    shadow.add_argument("--shadow-redact", action="store_true", default=None,
                        help="write salted hashes (HMAC-SHA256) of the texts instead of the texts (log and "
                             "/v1/shadow); the salt is random per start unless MTGATE_SHADOW_REDACT_SALT gives one "
                             "(the same on every replica makes their logs comparable)")
    canary = parser.add_argument_group("canary (answer a share of requests from the --shadow candidate)")
    canary.add_argument("--canary-fraction", type=float, metavar="F",
                        help="share of the default model's requests answered by the candidate, 0 to 1, sampled by "
                             "request id (default 0; MTGATE_CANARY_FRACTION); a failed answer falls back to "
                             "production; rolled back to 0 when the candidate breaks its targets")
    canary.add_argument("--canary-max-error-rate", type=float, metavar="R",
                        help="roll back above this error rate of the candidate (default 0.05)")
    canary.add_argument("--canary-max-p95-ms", type=positive_float, metavar="MS",
                        help="roll back above this p95 latency of the candidate (default: no latency target)")
    canary.add_argument("--canary-window", type=positive_int, metavar="N",
                        help="check the targets over the candidate's last N canary requests (default 100)")
    canary.add_argument("--canary-min-requests", type=positive_int, metavar="N",
                        help="requests the window must hold before the targets are checked (default 20)")
    canary.add_argument("--canary-timeout-ms", type=positive_float, metavar="MS",
                        help="longest wait for the candidate's answer before production answers (default 5000)")


def build_settings(args: argparse.Namespace) -> ServingSettings:
    """ServingSettings from the environment, overridden by the flags given.

    Raises:
        UsageError: an invalid value, a missing package or a package that is not a model package.
    """
    from serving.server.settings import DEFAULT_MODEL_DIR, ServingSettings, demo_missing, demo_model

    overrides: dict[str, Any] = {
        field: getattr(args, flag) for flag, field in _SETTINGS_FLAGS.items() if getattr(args, flag, None) is not None
    }
    if args.models:
        overrides["model_dirs"] = args.models
    if getattr(args, "access_log", None):
        overrides["access_log"] = True
    if args.log_level is not None:  # the global --log-level, when given, overrides $MTGATE_LOG_LEVEL
        overrides["log_level"] = args.log_level
    if args.workers != 1:
        raise UsageError("--workers: only 1 worker process is supported (scale with replicas; tune --threads)")
    try:
        settings = ServingSettings(**overrides)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}" for err in e.errors())
        raise UsageError(f"invalid settings: {problems}") from None
    if settings.grpc_port is not None and (missing := missing_extra("grpc")):
        raise UsageError(f"--grpc-port {missing}")
    if settings.shadow is not None and not settings.shadow.is_dir():  # a package that fails to load only logs
        raise UsageError(f"--shadow {settings.shadow}: no such model package directory")
    packages = list(settings.model_dirs)
    if settings.model_repository is not None:
        if args.models:
            raise UsageError("give either -m/--model or --model-repository, not both")
        from serving.server.versions import MANIFEST, VersionPolicy, served_versions

        found = served_versions(settings.model_repository, VersionPolicy.parse(settings.repository_version_policy))
        if not found:
            raise UsageError(f"--model-repository {settings.model_repository}: no model in it (expected "
                             f"{settings.model_repository}/<name>/<version>/{MANIFEST}, <version> a positive integer, "
                             f"chosen by the version policy {settings.repository_version_policy})")
        packages = [version.path for versions in found.values() for version in versions]
    for package in packages:
        if package == DEFAULT_MODEL_DIR and not args.models and demo_model() is None:
            raise UsageError(demo_missing())
        if not package.exists():
            raise UsageError(f"model package {package} does not exist{hub_hint(package)}")
        try:
            # Before the port is taken: paths, checksums, the requested artifact (the engine checks again at load).
            opened = open_package(package)
            artifact = opened.artifact(settings.runtime, settings.precision)  # auto: the package's choice
            if settings.shortlist:
                opened.manifest.shortlist_decoder(artifact)
        except PackageError as e:
            raise UsageError(_one_line(f"{package}: {e}" if str(package) not in str(e) else str(e))) from None
    return settings


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is loaded so that a busy port is one line and exit 2.

    Raises:
        UsageError: the address cannot be resolved or bound (in use, not ours, no permission).
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"cannot listen on {where}: unknown host ({e})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does; a port in use still fails
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        hint = " (another server is listening there: stop it or choose another --port)" if e.errno == errno.EADDRINUSE else ""
        raise UsageError(f"cannot listen on {where}: {e.strerror or e}{hint}") from None
    sock.set_inheritable(True)
    return sock


def settings_line(settings: Any) -> str:
    """The start-up line: the models, then only the settings that differ from their defaults (all of them are
    logged at DEBUG)."""
    values = settings.model_dump(mode="json", exclude={"api_key"})
    defaults = type(settings).model_construct().model_dump(mode="json", exclude={"api_key"})
    models = ("model_repository", "model_dirs") if values["model_repository"] is not None else ("model_dirs",)
    changed = [f"{key}={values[key]}" for key in values if key not in models and values[key] != defaults.get(key)]
    parts = [f"{key}={values[key]}" for key in models[:1]]
    parts.append(", ".join(changed) if changed else "every other setting at its default")
    return f"settings: {'; '.join(parts)}; api key {'required' if settings.api_key is not None else 'not required'}"


def _one_line(message: str) -> str:
    return " ".join(message.split())


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from serving.server.http import create_app
    from serving.server.http.connections import protocol_class
    from serving.server.logging_config import configure_logging
    from serving.server.settings import old_environment_warnings

    settings = build_settings(args)
    sock = bind(settings.host, settings.port)
    if settings.grpc_port:  # a busy gRPC port is one line and exit 2 as well (grpc binds it again at start-up)
        bind(settings.host, settings.grpc_port).close()
    configure_logging(settings)
    for warning in old_environment_warnings():
        logger.warning("%s", warning)
    logger.info("%s", settings_line(settings))
    logger.debug("every setting: %s", settings.model_dump(mode="json", exclude={"api_key"}))
    transports = []
    if settings.grpc_port is not None:
        from serving.server.grpc.servicer import GrpcTransport

        transports.append(GrpcTransport(settings.host, settings.grpc_port))
    try:
        app = create_app(settings, transports=transports)
    except (PackageError, ValueError) as e:
        sock.close()
        raise UsageError(_one_line(str(e))) from None
    service = app.state.service
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=settings.access_log,
        lifespan="on",
        timeout_graceful_shutdown=5,
        server_header=False,
        http=protocol_class(settings.header_timeout_s, settings.max_header_bytes),
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]  # a float works
        limit_concurrency=settings.max_connections,
    )
    server = DrainingServer(config, service)
    service.on_fatal = server.fail
    try:
        server.run(sock)
    finally:
        sock.close()
    if server.failure is not None:
        sys.stderr.write(f"mtgate serve: error: {_one_line(server.failure)}\n")
        return 2 if isinstance(server.failure_cause, PackageError) else 1
    if not server.started:
        sys.stderr.write(f"mtgate serve: error: could not start on {settings.host}:{settings.port}\n")
        return 1
    return 0
