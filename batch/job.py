"""What a batch-score job is: what to read and where to write (:class:`Job`), and how records are translated
(:class:`EngineConfig`); each with the fingerprint that decides whether an unfinished run's state may be resumed.

The records a shard owns (global index ``i`` with ``i % num_shards == shard_index``) are cut into chunks of
``chunk_size`` consecutive owned records: the unit of work and of commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from batch.framing import Format
from batch.inputs import InputFile
from batch.schema import Schema
from serving.engine.options import OPTION_NAMES, DecodeOptions
from serving.server.settings import OFFLINE_MAX_BATCH_SIZE, OFFLINE_MAX_BATCH_TOKENS

STATE_SUFFIX = ".partial"


@dataclass(frozen=True)
class EngineConfig:
    """How records are translated: a local model package or a server.

    Attributes:
        model_dir: model package for in-process translation.
        runtime: ``onnxruntime`` or ``openvino``.
        precision: ``fp32`` or ``int8``.
        beam_size: beam width (None: the package's default).
        max_length: most generated tokens (None: the package's default).
        max_tokens: most padded source tokens in one batch.
        max_batch_size: most sentences in one batch.
        workers: worker processes (local) or concurrent requests (server).
        threads: runtime threads per worker.
        server: Open Inference Protocol server URL; when set, ``model_dir`` is not used.
        model_name: model name on the server.
        decoding: the other decoding options given (``serving.engine.request.OPTION_NAMES`` beyond ``beam_size`` and
            ``max_length``, and ``target_prefix``, the start of every translation), as sorted ``(name, value)``
            pairs, only those that differ from the default: what the fingerprint and the summary show, and
            :meth:`parameters` (what a server gets).
        checked: the :class:`~serving.engine.request.DecodeOptions` these fields were made from (:meth:`of`, where
            the command line was read and checked), kept as they are: :meth:`options`, in every worker, process and
            Ray actor (a config pickles with them). Without it, :meth:`options` are made from the fields, once, when
            first asked for.
    """

    model_dir: Path | None = None
    runtime: str = "onnxruntime"
    precision: str = "fp32"
    beam_size: int | None = None
    max_length: int | None = None
    max_tokens: int = OFFLINE_MAX_BATCH_TOKENS
    max_batch_size: int = OFFLINE_MAX_BATCH_SIZE
    workers: int = 1
    threads: int = 1
    server: str | None = None
    model_name: str | None = None
    decoding: tuple[tuple[str, Any], ...] = ()
    checked: InitVar[DecodeOptions | None] = None
    _options: DecodeOptions | None = field(init=False, repr=False, compare=False)

    def __post_init__(self, checked: DecodeOptions | None) -> None:
        object.__setattr__(self, "_options", checked)

    @classmethod
    def of(cls, options: DecodeOptions, target_prefix: str | None = None, **fields: Any) -> EngineConfig:
        """The config translating with ``options`` (checked where they were read; kept, never rebuilt) and
        ``target_prefix``; ``fields``: the other attributes."""
        return cls(beam_size=options.beam_size, max_length=options.max_length,
                   decoding=cls.decoding_of(options, target_prefix), checked=options, **fields)

    @staticmethod
    def decoding_of(options: DecodeOptions, target_prefix: str | None = None) -> tuple[tuple[str, Any], ...]:
        """:attr:`decoding` for ``options`` and a target prefix: what is not the default (no ``beam_size`` and
        ``max_length``, which have fields of their own; no ``num_hypotheses``: one translation per record)."""
        items = [(name, getattr(options, name)) for name in OPTION_NAMES
                 if name not in ("beam_size", "max_length", "num_hypotheses")]
        if target_prefix:
            items.append(("target_prefix", target_prefix))
        return tuple(sorted((name, value) for name, value in items if value is not None and value is not False))

    @property
    def target_prefix(self) -> str | None:
        """The start every translation is forced to (``--target-prefix``), or None."""
        return dict(self.decoding).get("target_prefix")

    def options(self) -> DecodeOptions:
        """The :class:`~serving.engine.request.DecodeOptions` every local worker translates with: the ones the config
        was made from (:meth:`of`), or else made from the fields at the first call, once."""
        if self._options is None:
            given = {name: value for name, value in self.decoding if name != "target_prefix"}
            object.__setattr__(self, "_options", DecodeOptions(beam_size=self.beam_size, max_length=self.max_length,
                                                               **given))
        assert self._options is not None
        return self._options

    def parameters(self) -> dict[str, Any]:
        """The Open Inference Protocol request parameters of these options (what ``--server`` sends)."""
        given = {"beam_size": self.beam_size, "max_length": self.max_length}
        return {name: value for name, value in (*given.items(), *self.decoding) if value is not None}

    def fingerprint(self) -> dict[str, Any]:
        """What changes translations (not workers/threads: a job may resume with other parallelism)."""
        out: dict[str, Any] = {
            "beam_size": self.beam_size,
            "max_length": self.max_length,
            "max_tokens": self.max_tokens,
            "max_batch_size": self.max_batch_size,
        }
        if self.decoding:  # a run without these options keeps the fingerprint it always had (its state resumes)
            out["decoding"] = dict(self.decoding)
        if self.server:
            out |= {"server": self.server, "model_name": self.model_name}
        else:
            assert self.model_dir is not None
            manifest = self.model_dir / "manifest.json"
            digest = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
            out |= {"model_dir": str(self.model_dir.resolve()), "manifest_sha256": digest, "runtime": self.runtime,
                    "precision": self.precision}
        return out


@dataclass(frozen=True)
class Job:
    """What to read and where to write.

    Attributes:
        inputs: input files, in order.
        schema: where sources and references live.
        vocab: subword vocabulary decoding int64 ids (None when the schema has none).
        output: output file.
        output_format: ``tfrecord``, ``jsonl`` or ``text``.
        rejects: rejects file (JSON lines: index, file, position, reason).
        summary: summary.json path.
        chunk_size: records per chunk (the unit of commit and resume).
        num_shards: how many shards the inputs are split into.
        shard_index: which shard this run handles.
        source_ids: int64 id sources go to the engine as ids (``Record.source_ids``), not as decoded text: the
            records' vocabulary is the model package's own (local engine only).
        score_references: also score each record's reference with the model (``--score-references``: its
            log-likelihood and perplexity in the output records and the summary; local engine only).
    """

    inputs: list[InputFile]
    schema: Schema
    vocab: Path | None
    output: Path
    output_format: Format
    rejects: Path
    summary: Path
    chunk_size: int = 1000
    num_shards: int = 1
    shard_index: int = 0
    source_ids: bool = False
    score_references: bool = False

    @property
    def state_dir(self) -> Path:
        return self.output.with_name(self.output.name + STATE_SUFFIX)

    def owns(self, index: int) -> bool:
        return index % self.num_shards == self.shard_index

    def chunk_of(self, index: int) -> int:
        return (index // self.num_shards) // self.chunk_size

    def fingerprint(self) -> dict[str, Any]:
        # Paths and sizes only, no mtime: the content itself is checked chunk by chunk (batch.state.chunk_digest),
        # so a rewrite that keeps size and mtime (cp -p, rsync -t, tar) is caught and a mere touch is not refused.
        files = []
        for item in self.inputs:
            for path in (item.path, item.references):
                if path is not None:
                    files.append({"path": str(path.resolve()), "size": path.stat().st_size})
        scoring = {"score_references": True} if self.score_references else {}  # runs without it keep their state
        return {
            **scoring,
            "files": files,
            "format": self.inputs[0].format if self.inputs else None,
            "schema": self.schema.to_dict(),
            "vocab": str(self.vocab.resolve()) if self.vocab else None,
            "output_format": self.output_format,
            "chunk_size": self.chunk_size,
            "num_shards": self.num_shards,
            "shard_index": self.shard_index,
        }

