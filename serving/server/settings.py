"""Every setting of the HTTP server, in one pydantic-settings class (environment prefix ``MTGATE_``).

Build it once (``ServingSettings()`` reads the environment, keyword arguments override it) and pass it to
``serving.server.http.create_app``; nothing reads settings from a module global. Invalid values refuse to start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from serving.package.manifest import DEFAULT_RUNTIME, Runtime
from serving.server.versions import VersionPolicy

# The caps on what a client may ask for, shared by the server (defaults of its settings) and `mtgate translate`.
MAX_BEAM_SIZE = 8
MAX_OUTPUT_TOKENS = 512

# The batch limits, one place for every command. The server (and validate, export-triton and a sweep's space, which
# measure or deploy it) batches requests that wait for each other: 32 sentences (Triton's and CTranslate2's
# translate_file default), 4096 padded source tokens times beams (32 sentences of 128 tokens greedy, of 32 at beam 4:
# the engine batches the server decoded before the batcher and the engine shared one budget).
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_MAX_BATCH_TOKENS = 4096
# No wait for a fuller batch (Triton's default): while a batch runs the next one fills anyway, and an idle engine
# starts at once. Against 5000 us (the demo, uniform served ladder, 2026-12-07; "Queue delay" in the benchmark notes):
# p50 22-24 against 29-32 ms at 8 req/s, p95 250-320 against 480-490 ms at 72 req/s, the same highest rate or higher.
DEFAULT_MAX_QUEUE_DELAY_US = 0
# batch-score's records wait for nothing and it runs a worker per core, each holding a batch: more sentences per batch
# (64 gave 1.1x the tokens/s of 32 on the demo, 1 worker x 1 thread, beam 4) but fewer tokens (a batch of long
# sentences is smaller). Its state records both, so a run started with these resumes with them.
OFFLINE_MAX_BATCH_SIZE = 64
OFFLINE_MAX_BATCH_TOKENS = 2048

# models/demo-en-de beside the source tree (also where the Docker image puts it).
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "demo-en-de"


def demo_model() -> Path | None:
    """The model every command uses when given none: the bundled demo package, if ``make demo`` has built it.

    A demo package this user may not look into is still returned: opening it then says so in one line
    (``serving.package.PackageError``) instead of "not built".
    """
    try:
        return DEFAULT_MODEL_DIR if (DEFAULT_MODEL_DIR / "manifest.json").is_file() else None
    except PermissionError:
        return DEFAULT_MODEL_DIR


def demo_missing() -> str:
    """What every command says when it was given no model and the demo package has not been built from its source."""
    return (f"no model given and the bundled demo model is not built ({DEFAULT_MODEL_DIR}): run `make demo` "
            "(converts models/demo-en-de-src), or pass -m PKG (a directory written by 'mtgate convert')")


class ServingSettings(BaseSettings):
    """Settings of ``mtgate serve``; each field can be set as ``MTGATE_<FIELD>`` in the environment.

    Attributes:
        model_dirs: model packages to serve; the first one is the default model (``MTGATE_MODEL_DIRS='["a","b"]'``).
        model_repository: serve the models of this directory instead, in Triton's layout ``<name>/<version>/``, each
            at its highest version (``serving.server.repository``); load and unload through the repository extension.
        repository_version_policy: which versions of each repository model to serve: ``latest:N`` (default
            ``latest:1``), ``all`` or ``specific:V[,V...]``, as Triton's version policy.
        repository_poll_secs: with a repository, rescan it every so many seconds and switch to new versions, as
            Triton's poll mode (explicit load and unload are then refused; None: explicit mode, only on a load).
        runtime: runtime to run the graphs with; the old ``MTGATE_BACKEND`` still works.
        precision: which artifact of each package to load: ``auto`` (int8 where the package's manifest shows it
            costs at most 1 BLEU, else fp32; ``serving.package.precision``), ``fp32`` or ``int8``.
        threads: intra-op threads of the runtime (None: the engine's default for this machine).
        shortlist: decode with the packages' vocabulary shortlists (``serving.engine.shortlist``; onnxruntime).
        spin: let the runtime's decoder threads spin between decoder calls (ONNX Runtime's allow_spinning): faster
            steps (p95 150-190 against 290-300 ms at 96 req/s on the demo); turn it off when other busy processes
            share the server's cores, whose spinning threads would take them (benchmarks/README.md, "Spinning").
        host: address to listen on.
        port: TCP port to listen on.
        grpc_port: when set, also serve the KServe v2 / Triton gRPC protocol on this port (Triton's is 8001; 0 picks
            a free one; needs the ``grpc`` extra).
        batching: ``request``: queued sentences form a batch that runs to its end before the next one starts;
            ``step``: they join the running decode batch at the next decoder step and leave it when done
            (``serving.server.batching.step``).
        max_batch_size: most sentences in one engine batch (with ``step`` batching: in flight at once); the old
            ``MTGATE_MAX_BATCH_SENTENCES`` still works.
        max_batch_tokens: most padded source tokens times beams (sentences x beams x longest) in one engine batch
            (``request`` only); the batcher cuts under it and the engine is loaded with it
            (``serving.engine.planner``), so a batch is never cut twice.
        max_queue_delay_us: how long the oldest queued sentence may wait for a fuller batch, in microseconds
            (``request`` only; 0, as Triton's default: a batch starts as soon as the engine is free, and fills while
            the one before it runs); the old ``MTGATE_MAX_BATCH_DELAY_MS`` (milliseconds) still works.
        max_queue_size: most sentences waiting per model; beyond it requests get 503 with Retry-After; the old
            ``MTGATE_QUEUE_CAPACITY`` still works.
        retry_after_s: the least Retry-After sent with a 503 for a full queue or a deadline the queued work would
            make a request miss (the estimated wait until it would fit, when longer).
        request_timeout_s: default deadline of a request; a client may only shorten it. Behind queued work, a request
            whose estimated completion (learned from the batches run) falls after its deadline gets 503 at once
            (``serving.server.batching.queue``).
        max_sentences_per_request: most sentences in one /v1/translate or /v2 infer request.
        max_chars_per_sentence: longest sentence accepted, in characters (with ``split_sentences``: each sentence
            after splitting).
        max_document_sentences: most sentences of one /v1/translate request with ``split_sentences``, all its texts
            together (the texts themselves count against ``max_sentences_per_request``); ``max_queue_size`` when
            that is lower (more could never be queued).
        max_body_bytes: largest request body (bulk requests excepted).
        max_bulk_body_bytes: largest body of a bulk NDJSON request.
        bulk_window: sentences of one bulk request in flight at a time.
        max_beam_size: largest beam a client may ask for.
        max_output_tokens: largest ``max_length`` a client may ask for.
        api_key: when set, inference routes require ``Authorization: Bearer <api_key>``.
        header_timeout_s: a connection must send a complete request line and headers within this long of opening
            (and of the first byte of each further request on it); otherwise it is closed.
        body_timeout_s: a request body must arrive within this long of its headers, otherwise 408 (bulk requests:
            the longest pause between two parts of the body). Requests count as in flight only once it has.
        keep_alive_timeout_s: an idle kept-alive connection is closed after this long.
        max_connections: most connections and requests at once; beyond it requests get 503 (uvicorn's
            ``limit_concurrency``).
        max_header_bytes: largest request line plus headers; beyond it 431 and the connection is closed.
        grace_period_s: after SIGTERM, how long in-flight requests may take to finish.
        drain_delay_s: after SIGTERM, keep answering (503 on new work) at least this long so that load balancers
            notice the failing readiness probe before the socket closes.
        warmup: translate a sentence before reporting ready.
        log_level: logging level name.
        log_format: ``text`` or ``json`` (one JSON object per line).
        access_log: also log one line per HTTP request (uvicorn's access log).
        shadow: a candidate model package (a repository's ``<name>/<version>/`` directory too) that also translates
            a sampled share of the default model's requests, off the critical path, to compare with it
            (``serving.server.shadow``); production answers exactly as without it.
        shadow_fraction: the share of requests shadowed (0 to 1).
        shadow_precision: which artifact of the candidate to load (as ``precision``).
        shadow_threads: intra-op threads of the candidate's runtime (its own budget, beside the production model's).
        shadow_queue_size: most requests waiting for the candidate; beyond it they are shed (counted).
        shadow_cross_score: also score, with the candidate, its own translation and production's (cross-likelihood).
        shadow_production_score: also score both with production's model (a second copy of it, loaded in the
            candidate's process; memory for one more model).
        shadow_log: append each compared pair to this JSONL file (whole lines; rotated by size).
        shadow_log_max_bytes: rotate the pair log beyond this size.
        shadow_log_max_files: rotated pair logs kept (``PATH.1`` ... ``PATH.N``); older ones are deleted.
        shadow_redact: the pair log and ``/v1/shadow`` hold salted hashes (HMAC-SHA256) of the texts instead of
            the texts.
        shadow_redact_salt: the key of those hashes; give every replica the same one to compare their logs (default:
            a random salt per server start, so hashes of two servers or two runs never match).
        canary_fraction: the share of the default model's requests answered by the ``shadow`` candidate instead of
            production (``serving.server.shadow.canary``; sampled by request id); set to 0 by a rollback, set again
            by ``POST /v1/shadow/canary``.
        canary_max_error_rate: roll the canary back when more of the candidate's answers fail (error, crash,
            timeout) over the window.
        canary_max_p95_ms: roll it back when the candidate's p95 latency over the window is above this (None: no
            latency target; ``canary_timeout_ms`` still bounds each answer).
        canary_window: the sliding window the targets are checked over (the candidate's last N canary requests).
        canary_min_requests: requests the window must hold before the targets are checked.
        canary_timeout_ms: longest wait for the candidate's answer; past it production answers (counted as an error).
    """

    # validate_by_name: ServingSettings(max_batch_size=...) works although the field's aliases are env var names.
    model_config = SettingsConfigDict(env_prefix="MTGATE_", extra="ignore", validate_default=True, validate_by_name=True)

    model_dirs: list[Path] = Field(default_factory=lambda: [DEFAULT_MODEL_DIR], min_length=1)
    model_repository: Path | None = None
    repository_version_policy: str = "latest:1"
    repository_poll_secs: float | None = Field(default=None, gt=0)
    # An alias is the whole environment variable name (the prefix does not apply to aliases).
    runtime: Runtime = Field(
        default=DEFAULT_RUNTIME, validation_alias=AliasChoices("mtgate_runtime", "mtgate_backend")
    )
    precision: Literal["auto", "fp32", "int8"] = "auto"
    threads: int | None = Field(default=None, ge=1)
    shortlist: bool = False
    spin: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    grpc_port: int | None = Field(default=None, ge=0, le=65535)

    batching: Literal["request", "step"] = "request"
    max_batch_size: int = Field(
        default=DEFAULT_MAX_BATCH_SIZE, ge=1,
        validation_alias=AliasChoices("mtgate_max_batch_size", "mtgate_max_batch_sentences"),
    )
    max_batch_tokens: int = Field(default=DEFAULT_MAX_BATCH_TOKENS, ge=1)
    max_queue_delay_us: int = Field(default=DEFAULT_MAX_QUEUE_DELAY_US, ge=0)  # MTGATE_MAX_BATCH_DELAY_MS: _LegacyEnvironment
    max_queue_size: int = Field(
        default=512, ge=1, validation_alias=AliasChoices("mtgate_max_queue_size", "mtgate_queue_capacity")
    )
    retry_after_s: int = Field(default=1, ge=0)
    request_timeout_s: float = Field(default=30.0, gt=0)

    max_sentences_per_request: int = Field(default=128, ge=1)
    max_chars_per_sentence: int = Field(default=2000, ge=1)
    max_document_sentences: int = Field(default=256, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_bulk_body_bytes: int = Field(default=64 << 20, ge=1024)
    bulk_window: int = Field(default=64, ge=1)
    max_beam_size: int = Field(default=MAX_BEAM_SIZE, ge=1)
    max_output_tokens: int = Field(default=MAX_OUTPUT_TOKENS, ge=1)

    api_key: SecretStr | None = None
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    max_header_bytes: int = Field(default=64 << 10, ge=1024)
    grace_period_s: float = Field(default=30.0, ge=0)
    drain_delay_s: float = Field(default=0.0, ge=0)
    warmup: bool = True
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    access_log: bool = False

    shadow: Path | None = None
    shadow_fraction: float = Field(default=1.0, ge=0, le=1)
    shadow_precision: Literal["auto", "fp32", "int8"] = "auto"
    shadow_threads: int = Field(default=1, ge=1)
    shadow_queue_size: int = Field(default=64, ge=1)
    shadow_cross_score: bool = True
    shadow_production_score: bool = False
    shadow_log: Path | None = None
    shadow_log_max_bytes: int = Field(default=64 << 20, ge=4096)
    shadow_log_max_files: int = Field(default=5, ge=1)
    shadow_redact: bool = False
    shadow_redact_salt: SecretStr | None = None
    canary_fraction: float = Field(default=0.0, ge=0, le=1)
    canary_max_error_rate: float = Field(default=0.05, ge=0, le=1)
    canary_max_p95_ms: float | None = Field(default=None, gt=0)
    canary_window: int = Field(default=100, ge=1)
    canary_min_requests: int = Field(default=20, ge=1)
    canary_timeout_ms: float = Field(default=5000.0, gt=0)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The old variables in other units come after the current environment: a new name given too wins.
        legacy = _LegacyEnvironment(settings_cls)
        return init_settings, env_settings, legacy, dotenv_settings, file_secret_settings

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in logging.getLevelNamesMapping():
            allowed = ", ".join(sorted(n for n in logging.getLevelNamesMapping() if n != "NOTSET"))
            raise ValueError(f"unknown log level {value!r} (allowed: {allowed})")
        return level

    @field_validator("repository_version_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        VersionPolicy.parse(value)  # ValueError says what is accepted
        return value.strip()

    @field_validator("api_key")
    @classmethod
    def _non_empty_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("api_key is empty; unset it to disable authentication")
        return value

    @model_validator(mode="after")
    def _consistent_limits(self) -> ServingSettings:
        problems = []
        if self.max_sentences_per_request > self.max_queue_size:
            problems.append(
                f"max_sentences_per_request ({self.max_sentences_per_request}) exceeds max_queue_size "
                f"({self.max_queue_size}): such a request could never be queued"
            )
        if self.canary_fraction > 0 and self.shadow is None:
            problems.append("canary_fraction needs a candidate to answer from (shadow)")
        if self.canary_min_requests > self.canary_window:
            problems.append(f"canary_min_requests ({self.canary_min_requests}) exceeds canary_window "
                            f"({self.canary_window}): the targets would never be checked")
        names = [p.name for p in self.model_dirs]
        if len(set(self.model_dirs)) != len(self.model_dirs):
            problems.append(f"a model directory is listed twice: {names}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


OLD_ENVIRONMENT = {
    "MTGATE_BACKEND": "MTGATE_RUNTIME",
    "MTGATE_MAX_BATCH_SENTENCES": "MTGATE_MAX_BATCH_SIZE",
    "MTGATE_MAX_BATCH_DELAY_MS": "MTGATE_MAX_QUEUE_DELAY_US (microseconds)",
    "MTGATE_QUEUE_CAPACITY": "MTGATE_MAX_QUEUE_SIZE",
}
"""Old environment variable -> its new name: still read, one warning line each at start-up."""


def old_environment_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per old variable set in ``environ`` (default ``os.environ``), naming the new one."""
    names = {name.upper() for name in (os.environ if environ is None else environ)}
    return [f"{old} is deprecated, use {new} (the old name goes in the next release)"
            for old, new in OLD_ENVIRONMENT.items() if old in names]


class _LegacyEnvironment(PydanticBaseSettingsSource):
    """Old environment variables whose unit changed with their name (an alias cannot convert):
    ``MTGATE_MAX_BATCH_DELAY_MS`` (milliseconds) fills ``max_queue_delay_us``."""

    _OLD = {"MTGATE_MAX_BATCH_DELAY_MS": ("max_queue_delay_us", 1000.0)}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        environment = {name.upper(): value for name, value in os.environ.items()}
        values: dict[str, Any] = {}
        for old, (field, factor) in self._OLD.items():
            if old in environment:
                try:
                    values[field] = round(float(environment[old]) * factor)
                except (ValueError, OverflowError):
                    values[field] = environment[old]  # let the field's validation name the bad value
        return values
