"""Parsing ``manifest.json``: :func:`parse_manifest` validates everything it can from the manifest alone and
returns a :class:`~serving.package.manifest.Manifest`, or raises one :class:`PackageError` listing every problem.

Checked: the format; every section's fields and types, by strict pydantic models over the manifest's own dataclasses
(:class:`_ManifestJson`: JSON types as they are, no coercion: ``"2"`` or ``true`` is not an integer); that every path
the manifest names is a plain relative path (no ``..``, not absolute), that the special ids and bad words fit the
vocabularies, and that every file the loader opens is in the checksum list. What needs the directory (symlinks,
checksums) is :mod:`serving.package.store`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from serving.package.manifest import (
    DEFAULT_REFERENCE,
    FORMAT,
    MANIFEST,
    Architecture,
    Artifact,
    DecodingDefaults,
    Manifest,
    PackageError,
    SpecialIds,
    TokenizerEntry,
)


class _Strict(BaseModel):
    # unknown keys are ignored (a newer writer may add some); the manifest's dataclasses inherit this config
    model_config = ConfigDict(strict=True, extra="ignore")


class _GraphFiles(_Strict):
    encoder: str
    decoder: str


class _ArtifactFiles(_GraphFiles):
    shortlist_decoder: str | None = None


class _ArtifactJson(_Strict):
    runtime: str
    precision: str
    files: _ArtifactFiles


class _TokenizerJson(_Strict):
    kind: str
    files: dict[str, str] | None = None
    unk_id: int | None = None  # sentencepiece's; the entry's other keys are settings of its tokenizer, unchecked


class _ShortlistJson(_Strict):
    table: str


class _ManifestJson(_Strict):
    """``manifest.json``'s sections as typed, in the order their problems are listed."""

    architecture: Architecture
    special_ids: SpecialIds
    decoding: DecodingDefaults | None = None
    tokenizer: _TokenizerJson
    artifacts: list[_ArtifactJson] = []
    reference: _GraphFiles = _GraphFiles(**DEFAULT_REFERENCE)
    files: dict[str, str]
    name: str | None = None
    version: str | None = None
    created: str | None = None
    mtgate_version: str | None = None
    source: dict[str, Any] | None = None
    parity: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    conversion: dict[str, Any] | None = None
    shortlist: _ShortlistJson | None = None


def find_artifact(manifest: Manifest | Mapping[str, Any], runtime: str, precision: str) -> Artifact:
    """``manifest.artifact(runtime, precision)``, for a Manifest or the dict ``read_manifest`` returns.

    Raises:
        PackageError: the package has no such artifact (the message lists what it has).
    """
    typed = manifest if isinstance(manifest, Manifest) else parse_manifest(manifest)
    return typed.artifact(runtime, precision)


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
    try:
        # validated as the JSON it is: strict JSON mode takes an array for a tuple (bad_word_ids), nothing else
        typed = _ManifestJson.model_validate_json(json.dumps(data))
    except ValidationError as e:
        raise PackageError(f"{where}: " + "; ".join(map(_problem, e.errors()))) from None
    # the free-form objects and the tokenizer's settings as written (validated above: objects, strings)
    manifest = Manifest(
        architecture=typed.architecture, special_ids=typed.special_ids, tokenizer=TokenizerEntry.from_dict(
            data["tokenizer"]), decoding=typed.decoding or DecodingDefaults(),
        artifacts=tuple(Artifact(a.runtime, a.precision, a.files.encoder, a.files.decoder, a.files.shortlist_decoder)
                        for a in typed.artifacts),
        reference={"encoder": typed.reference.encoder, "decoder": typed.reference.decoder}, files=dict(data["files"]),
        name=typed.name, version=typed.version, created=typed.created, mtgate_version=typed.mtgate_version,
        source=data.get("source") or {}, parity=data.get("parity") or {}, quality=data.get("quality"),
        conversion=data.get("conversion"), shortlist=data.get("shortlist"))
    problems = _id_problems(manifest) + _path_problems(manifest)
    if problems:
        raise PackageError(f"{where}: " + "; ".join(problems))
    return manifest


_EXPECTED = {"bool_type": "true or false", "int_type": "an integer", "float_type": "a number",
             "string_type": "a string", "list_type": "a list", "tuple_type": "a list", "dict_type": "an object",
             "model_type": "an object", "dataclass_type": "an object"}


def _problem(error: ErrorDetails) -> str:
    """One pydantic error as ``field.path: what is wrong`` (``artifacts[0].files.encoder: missing``)."""
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    kind, value = error["type"], error["input"]
    if kind == "missing":
        return f"{path}: missing"
    if kind == "literal_error":
        return f"{path}: {value!r} (expected {error.get('ctx', {}).get('expected')})"
    if kind in _EXPECTED:
        return f"{path}: expected {_EXPECTED[kind]}, got {value!r}"
    return f"{path}: {error['msg']}, got {value!r}"


def _id_problems(manifest: Manifest) -> list[str]:
    """Special ids and bad words outside the vocabulary they index."""
    arch, ids = manifest.architecture, manifest.special_ids
    source, target = arch.source_vocab_size, arch.target_vocab_size
    checks: list[tuple[str, int | None, int, str]] = [
        ("special_ids.pad", ids.pad, source, "source vocabulary"),  # pads sources; never fed to the decoder
        ("special_ids.eos", ids.eos, min(source, target), "vocabularies"),  # ends sources and translations
        ("special_ids.decoder_start", ids.decoder_start, target, "target vocabulary"),
        ("special_ids.unk", ids.unk, source, "source vocabulary"),
        ("special_ids.zero_embedding_id", ids.zero_embedding_id, min(source, target), "vocabularies"),
        ("tokenizer.unk_id", manifest.tokenizer.settings.get("unk_id"), source, "source vocabulary"),
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
              for role, rel in (("encoder", a.encoder), ("decoder", a.decoder), ("shortlist_decoder",
                                                                                 a.shortlist_decoder)) if rel is not None]
    if manifest.shortlist is not None:
        named.append(("shortlist.table", manifest.shortlist["table"]))
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
