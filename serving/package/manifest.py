"""``manifest.json`` as types: :class:`Manifest` and its sections, parsed and validated once.

:func:`parse_manifest` checks everything it can from the manifest alone -- the format, every section's fields and
types, that every path it names is a plain relative path, that the special ids fit the vocabularies, that every
file the loader opens is in the checksum list -- and raises one :class:`PackageError` listing every problem.
What needs the directory (files inside it, checksums) is :mod:`serving.package.store`'s.

:meth:`Manifest.to_dict` writes the same JSON ``converters`` always wrote (format ``mtgate-model/3``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

FORMAT = "mtgate-model/3"
MANIFEST = "manifest.json"
RUNTIMES = ("onnxruntime", "openvino")
PRECISIONS = ("fp32", "int8")
DEFAULT_REFERENCE = {"encoder": "onnx/encoder.onnx", "decoder": "onnx/decoder.onnx"}

Activation = Literal["relu", "swish", "gelu"]
LengthPenaltyKind = Literal["hf", "gnmt"]


class PackageError(Exception):
    """The directory is not a usable model package (the message says why, naming the file)."""


@dataclass(frozen=True)
class Architecture:
    """The model's hyperparameters (``converters.spec.TransformerConfig`` is this class). Booleans say which
    optional weights exist and where norms go."""

    source_vocab_size: int
    target_vocab_size: int
    d_model: int
    num_heads: int
    encoder_layers: int
    decoder_layers: int
    ffn_dim: int
    activation: Activation
    pre_norm: bool
    encoder_final_norm: bool
    decoder_final_norm: bool
    norm_epsilon: float
    embedding_scale: float
    max_positions: int
    shared_embeddings: bool
    tied_output: bool
    attention_bias: bool
    ffn_bias: bool
    logits_bias: bool
    encoder_embed_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclass(frozen=True)
class SpecialIds:
    """Token ids with a fixed meaning. ``zero_embedding_id``: this id embeds to an all-zero vector (T2T's PAD 0)."""

    pad: int
    eos: int
    decoder_start: int
    unk: int | None = None
    zero_embedding_id: int | None = None


@dataclass(frozen=True)
class DecodingDefaults:
    """How the source framework decodes by default.

    ``length_penalty_kind``: ``"hf"`` divides the summed log-prob by ``len ** length_penalty`` (transformers beam
    search); ``"gnmt"`` divides by ``((5 + len) / 6) ** length_penalty`` (tensor2tensor). ``max_length`` caps generated
    tokens including EOS (HF ``max_length - 1`` since HF counts the start token); ``extra_length``, when set, caps them at
    ``source tokens (incl. EOS) + extra_length`` instead (T2T ``decode_length``). ``bad_word_ids`` are never generated;
    ``forced_eos``: at the last allowed step only EOS may be chosen (HF ``forced_eos_token_id``).
    ``renormalize_logits``: log-softmax again after the decoding rules (bad words, forced EOS) masked some ids, so beam
    scores are over the allowed ids only (HF ``renormalize_logits``; opus-mt generation configs set it).
    """

    beam_size: int = 4
    length_penalty: float = 1.0
    length_penalty_kind: LengthPenaltyKind = "hf"
    max_length: int = 256
    extra_length: int | None = None
    bad_word_ids: tuple[int, ...] = ()
    forced_eos: bool = False
    early_stopping: bool = False
    renormalize_logits: bool = False


@dataclass(frozen=True)
class TokenizerEntry:
    """Which tokenizer, and its files (role -> package-relative path); ``settings``: the entry's other keys
    (``unk_id`` for sentencepiece), as ``serving.tokenizers.load_tokenizer`` reads them."""

    kind: str
    files: dict[str, str]
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> TokenizerEntry:
        """The entry as written in a manifest (``kind``, ``files``, other keys as ``settings``), unchecked."""
        settings = {k: v for k, v in entry.items() if k not in ("kind", "files")}
        return cls(kind=str(entry["kind"]), files=dict(entry.get("files") or {}), settings=settings)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": dict(self.files), **self.settings}


@dataclass(frozen=True)
class Artifact:
    """One runtime/precision variant: its encoder and decoder-step graphs (package-relative paths)."""

    runtime: str
    precision: str
    encoder: str
    decoder: str

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.precision}"

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "precision": self.precision,
                "files": {"encoder": self.encoder, "decoder": self.decoder}}


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated ``manifest.json``.

    Attributes:
        name: package name (None: unnamed; serving uses the directory name).
        version: package version.
        architecture: the model's hyperparameters.
        special_ids: pad, EOS, decoder start (and unk, the zero-embedding id).
        decoding: the source framework's decoding defaults.
        tokenizer: which tokenizer and its files.
        reference: the fp32 ONNX graphs (``encoder``, ``decoder``): the package's own parity reference.
        artifacts: every runtime/precision variant.
        files: package-relative path -> sha256 of every file but the manifest.
        source, parity, quality, conversion: what conversion recorded (free-form JSON objects).
    """

    architecture: Architecture
    special_ids: SpecialIds
    tokenizer: TokenizerEntry
    decoding: DecodingDefaults = DecodingDefaults()
    artifacts: tuple[Artifact, ...] = ()
    reference: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_REFERENCE))
    name: str | None = None
    version: str | None = None
    created: str | None = None
    mtgate_version: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] | None = None
    conversion: dict[str, Any] | None = None
    files: dict[str, str] = field(default_factory=dict)

    @property
    def source_framework(self) -> str:
        return str(self.source.get("framework") or "unknown")

    def opened_files(self, artifact: Artifact | None = None) -> list[str]:
        """Every file the loader opens: the tokenizer's, the reference graphs, and each artifact's graphs with the
        files beside them (OpenVINO's ``.bin``); only ``artifact``'s graphs when given."""
        graphs = [artifact] if artifact is not None else [*self.artifacts]
        paths = [*self.tokenizer.files.values()]
        if artifact is None:
            paths += [self.reference["encoder"], self.reference["decoder"]]
        for a in graphs:
            paths += [a.encoder, a.decoder]
        paths += [c for c in map(companion, paths) if c is not None]
        return list(dict.fromkeys(paths))

    def to_dict(self) -> dict[str, Any]:
        """The manifest as written (keys in the order ``converters`` always wrote them)."""
        data: dict[str, Any] = {"name": self.name, "version": self.version, "created": self.created,
                                "mtgate_version": self.mtgate_version, "source": self.source,
                                "architecture": asdict(self.architecture), "special_ids": asdict(self.special_ids),
                                "decoding": _jsonable(asdict(self.decoding)), "tokenizer": self.tokenizer.to_dict(),
                                "reference": dict(self.reference),
                                "artifacts": [a.to_dict() for a in self.artifacts], "parity": self.parity,
                                "quality": self.quality, "conversion": self.conversion}
        data = {k: v for k, v in data.items() if v is not None}
        return data | {"format": FORMAT, "files": dict(self.files)}


def companion(path: str) -> str | None:
    """The file a runtime opens beside a graph: ``x.bin`` for OpenVINO's ``x.xml`` (None for other graphs)."""
    return str(PurePosixPath(path).with_suffix(".bin")) if path.endswith(".xml") else None


def find_artifact(manifest: Manifest | Mapping[str, Any], runtime: str, precision: str) -> Artifact:
    """The artifact for ``runtime``/``precision`` (``manifest``: a Manifest, or the dict ``read_manifest`` returns).

    Raises:
        PackageError: the package has none (the message lists what it has).
    """
    if not isinstance(manifest, Manifest):
        manifest = parse_manifest(manifest)
    for artifact in manifest.artifacts:
        if artifact.runtime == runtime and artifact.precision == precision:
            return artifact
    have = ", ".join(a.key for a in manifest.artifacts) or "none"
    raise PackageError(f"package has no {runtime}/{precision} artifact (available: {have})")


# --- parsing ---------------------------------------------------------------------------------------------------


def parse_manifest(data: Any, where: str = MANIFEST) -> Manifest:
    """Validate a decoded ``manifest.json`` and return it typed.

    Arguments:
        data: the decoded JSON.
        where: how to name the manifest in messages (its path).

    Raises:
        PackageError: one message (one line) listing every problem.
    """
    if not isinstance(data, dict):
        raise PackageError(f"{where}: manifest is not a JSON object")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise PackageError(f"{where}: unsupported package format {fmt!r} (this mtgate reads {FORMAT!r}; "
                           "convert the checkpoint again with `mtgate convert`)")
    problems: list[str] = []
    architecture = _section(Architecture, data, "architecture", problems)
    special_ids = _section(SpecialIds, data, "special_ids", problems)
    decoding = _section(DecodingDefaults, data, "decoding", problems, optional=True) or DecodingDefaults()
    tokenizer = _tokenizer(data.get("tokenizer"), problems)
    artifacts = _artifacts(data.get("artifacts", []), problems)
    reference = _graph_files(data.get("reference", DEFAULT_REFERENCE), "reference", problems)
    files = _checksums(data.get("files"), problems)
    text = {k: _optional(data, k, str, problems) for k in ("name", "version", "created", "mtgate_version")}
    objects = {k: _optional(data, k, dict, problems) for k in ("source", "parity", "quality", "conversion")}
    if problems or architecture is None or special_ids is None or tokenizer is None:
        raise PackageError(f"{where}: " + "; ".join(problems))
    manifest = Manifest(architecture=architecture, special_ids=special_ids, tokenizer=tokenizer, decoding=decoding,
                        artifacts=artifacts, reference=reference or dict(DEFAULT_REFERENCE), files=files,
                        source=objects["source"] or {}, parity=objects["parity"] or {}, quality=objects["quality"],
                        conversion=objects["conversion"], **text)
    problems += _id_problems(manifest) + _path_problems(manifest)
    if problems:
        raise PackageError(f"{where}: " + "; ".join(problems))
    return manifest


def _id_problems(manifest: Manifest) -> list[str]:
    """Special ids and bad words outside the vocabulary they index."""
    arch, ids = manifest.architecture, manifest.special_ids
    source, target = arch.source_vocab_size, arch.target_vocab_size
    checks: list[tuple[str, int | None, int, str]] = [
        ("special_ids.pad", ids.pad, min(source, target), "vocabularies"),  # pads sources; never generated
        ("special_ids.eos", ids.eos, min(source, target), "vocabularies"),  # ends sources and translations
        ("special_ids.decoder_start", ids.decoder_start, target, "target vocabulary"),
        ("special_ids.unk", ids.unk, source, "source vocabulary"),
        ("special_ids.zero_embedding_id", ids.zero_embedding_id, min(source, target), "vocabularies"),
        ("tokenizer.unk_id", _int_or_none(manifest.tokenizer.settings.get("unk_id")), source, "source vocabulary"),
    ]
    checks += [(f"decoding.bad_word_ids[{i}]", v, target, "target vocabulary")
               for i, v in enumerate(manifest.decoding.bad_word_ids)]
    return [f"{name}={value} is outside the {vocab} ({size} ids)" for name, value, size, vocab in checks
            if value is not None and not 0 <= value < size]


def _path_problems(manifest: Manifest) -> list[str]:
    """Paths that are not plain relative paths inside the package, and opened files missing from ``files``."""
    named = [(f"tokenizer.files.{role}", rel) for role, rel in manifest.tokenizer.files.items()]
    named += [(f"reference.{role}", rel) for role, rel in manifest.reference.items()]
    named += [(f"artifacts[{i}].files.{role}", rel) for i, a in enumerate(manifest.artifacts)
              for role, rel in (("encoder", a.encoder), ("decoder", a.decoder))]
    named += [("files", rel) for rel in manifest.files]
    problems = [f"{label} {rel!r}: {why}" for label, rel in named if (why := unsafe_path(rel))]
    if not manifest.files:
        return [*problems, "the checksum list ('files') is empty: every file must be listed with its sha256"]
    return problems + [f"{rel}: not in the checksum list ('files')" for rel in manifest.opened_files()
                       if rel not in manifest.files and unsafe_path(rel) is None]


def unsafe_path(rel: str) -> str | None:
    """Why ``rel`` is not a plain relative path inside the package (None when it is)."""
    path = PurePosixPath(rel)
    if not rel or rel != rel.strip() or "\\" in rel or "\0" in rel:
        return "not a plain relative path"
    if path.is_absolute():
        return "an absolute path (paths must be relative to the package directory)"
    if ".." in path.parts:
        return "points outside the package ('..')"
    return None


_T = TypeVar("_T")


def _section(cls: type[_T], data: dict[str, Any], key: str, problems: list[str],
             optional: bool = False) -> _T | None:
    """``data[key]`` as the dataclass ``cls`` (unknown keys ignored; a missing field with a default takes it)."""
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        problems.append(f"{key}: missing or not an object")
        return None
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    before = len(problems)
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in value:
            if f.default is MISSING and f.default_factory is MISSING:
                problems.append(f"{key}.{f.name}: missing")
            continue
        values[f.name] = _typed(value[f.name], hints[f.name], f"{key}.{f.name}", problems)
    return cls(**values) if len(problems) == before else None


def _typed(value: Any, hint: Any, label: str, problems: list[str]) -> Any:
    """``value`` checked against a field's type (bool, int, float, str, a Literal, ``X | None``, ``tuple[int, ...]``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if value in args:
            return value
        problems.append(f"{label}: {value!r} (expected one of: {', '.join(map(str, args))})")
    elif origin is tuple:
        if isinstance(value, list) and all(_is_int(v) for v in value):
            return tuple(value)
        problems.append(f"{label}: expected a list of integers, got {value!r}")
    elif hint is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{label}: expected true or false, got {value!r}")
    elif hint is int:
        if _is_int(value):
            return value
        problems.append(f"{label}: expected an integer, got {value!r}")
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        problems.append(f"{label}: expected a number, got {value!r}")
    elif hint is str:
        if isinstance(value, str):
            return value
        problems.append(f"{label}: expected a string, got {value!r}")
    else:  # pragma: no cover - a field type this parser does not know
        raise TypeError(f"{label}: unsupported field type {hint!r}")
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def _optional(data: dict[str, Any], key: str, kind: type, problems: list[str]) -> Any:
    value = data.get(key)
    if value is not None and not isinstance(value, kind):
        problems.append(f"{key}: expected {'a string' if kind is str else 'an object'}, got {value!r}")
        return None
    return value


def _graph_files(value: Any, label: str, problems: list[str]) -> dict[str, str] | None:
    if isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("encoder", "decoder")):
        return {"encoder": value["encoder"], "decoder": value["decoder"]}
    problems.append(f"{label}: expected {{\"encoder\": path, \"decoder\": path}}, got {value!r}")
    return None


def _tokenizer(value: Any, problems: list[str]) -> TokenizerEntry | None:
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        problems.append("tokenizer: missing, or without a 'kind'")
        return None
    files = value.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        problems.append(f"tokenizer.files: expected an object of paths, got {files!r}")
        return None
    unk_id = value.get("unk_id")
    if unk_id is not None and not _is_int(unk_id):
        problems.append(f"tokenizer.unk_id: expected an integer, got {unk_id!r}")
        return None
    return TokenizerEntry.from_dict(value)


def _artifacts(value: Any, problems: list[str]) -> tuple[Artifact, ...]:
    if not isinstance(value, list):
        problems.append(f"artifacts: expected a list, got {value!r}")
        return ()
    found: list[Artifact] = []
    for i, entry in enumerate(value):
        kind_ok = isinstance(entry, dict) and isinstance(entry.get("runtime"), str) and isinstance(
            entry.get("precision"), str)
        graphs = _graph_files(entry.get("files") if isinstance(entry, dict) else None, f"artifacts[{i}].files",
                              problems)
        if not kind_ok:
            problems.append(f"artifacts[{i}]: expected runtime and precision strings, got {entry!r}")
        elif graphs is not None:
            found.append(Artifact(entry["runtime"], entry["precision"], graphs["encoder"], graphs["decoder"]))
    return tuple(found)


def _checksums(value: Any, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        problems.append("files: missing, or not an object of path -> sha256")
        return {}
    return dict(value)


def _jsonable(value: Any) -> Any:
    """Tuples as lists (what JSON holds)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
