"""Parsing ``manifest.json``: :func:`parse_manifest` validates everything it can from the manifest alone and
returns a :class:`~serving.package.manifest.Manifest`, or raises one :class:`PackageError` listing every problem.

Checked: the format, every section's fields and types, that every path the manifest names is a plain relative path
(no ``..``, not absolute), that the special ids and bad words fit the vocabularies, and that every file the loader
opens is in the checksum list. What needs the directory (symlinks, checksums) is :mod:`serving.package.store`'s.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

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
    problems: list[str] = []
    architecture = _section(Architecture, data, "architecture", problems)
    special_ids = _section(SpecialIds, data, "special_ids", problems)
    decoding = _section(DecodingDefaults, data, "decoding", problems, optional=True) or DecodingDefaults()
    tokenizer = _tokenizer(data.get("tokenizer"), problems)
    artifacts = _artifacts(data.get("artifacts", []), problems)
    reference = _graph_files(data.get("reference", DEFAULT_REFERENCE), "reference", problems)
    files = _checksums(data.get("files"), problems)
    text = {k: _optional(data, k, str, problems) for k in ("name", "version", "created", "mtgate_version")}
    objects = {k: _optional(data, k, dict, problems) for k in ("source", "parity", "quality", "conversion",
                                                                "shortlist")}
    if objects["shortlist"] is not None and not isinstance(objects["shortlist"].get("table"), str):
        problems.append("shortlist: expected an object with a 'table' path")
    if problems or architecture is None or special_ids is None or tokenizer is None:
        raise PackageError(f"{where}: " + "; ".join(problems))
    manifest = Manifest(architecture=architecture, special_ids=special_ids, tokenizer=tokenizer, decoding=decoding,
                        artifacts=artifacts, reference=reference or dict(DEFAULT_REFERENCE), files=files,
                        source=objects["source"] or {}, parity=objects["parity"] or {}, quality=objects["quality"],
                        conversion=objects["conversion"], shortlist=objects["shortlist"], **text)
    problems += _id_problems(manifest) + _path_problems(manifest)
    if problems:
        raise PackageError(f"{where}: " + "; ".join(problems))
    return manifest


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
            shortlist_decoder = entry["files"].get("shortlist_decoder")
            if shortlist_decoder is not None and not isinstance(shortlist_decoder, str):
                problems.append(f"artifacts[{i}].files.shortlist_decoder: expected a path, got {shortlist_decoder!r}")
                continue
            found.append(Artifact(entry["runtime"], entry["precision"], graphs["encoder"], graphs["decoder"],
                                  shortlist_decoder))
    return tuple(found)


def _checksums(value: Any, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        problems.append("files: missing, or not an object of path -> sha256")
        return {}
    return dict(value)
