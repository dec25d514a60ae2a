"""Where the source and the reference live in the records: found once, from the first readable records.

TFRecord inputs hold ``tf.train.Example``s: the source is a ``bytes_list`` (text) or an ``int64_list`` (what T2T
datagen writes: the subword ids of the text, then EOS 1). JSONL objects hold a string or a list of ints. The first
of :data:`INPUT_KEYS` / :data:`REFERENCE_KEYS` present is used unless a key is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from batch.errors import InputError
from batch.example import example_class
from batch.framing import Format
from batch.inputs import InputFile, count_entries, scan

Kind = Literal["text", "ids"]

# Feature / field names tried in order when --input-key / --reference-key are not given.
INPUT_KEYS: tuple[str, ...] = ("inputs", "source", "text", "src")
REFERENCE_KEYS: tuple[str, ...] = ("targets", "target", "reference", "ref", "tgt")
SCHEMA_SAMPLE = 64


@dataclass(frozen=True)
class Schema:
    """Where the source text and the reference live in each record.

    Attributes:
        format: input format.
        input_key: feature / field holding the source (None for plain text).
        input_kind: ``text`` (bytes / string) or ``ids`` (int64 subword ids ending in EOS).
        reference_key: feature / field holding the reference, or None.
        reference_kind: ``text`` or ``ids`` (None without references).
    """

    format: Format
    input_key: str | None
    input_kind: Kind
    reference_key: str | None = None
    reference_kind: Kind | None = None

    @property
    def needs_vocab(self) -> bool:
        return self.input_kind == "ids" or self.reference_kind == "ids"

    def describe(self) -> str:
        """One line for humans, e.g. ``inputs (int64 ids) -> references targets (int64 ids)``."""
        names = {"text": "text", "ids": "int64 ids"} if self.format == "tfrecord" else {"text": "string", "ids": "ids"}
        if self.format == "text":
            src = "one sentence per line"
            ref = "references from a file" if self.reference_key else "no references"
        else:
            src = f"source {self.input_key!r} ({names[self.input_kind]})"
            ref = (f"reference {self.reference_key!r} ({names[self.reference_kind or 'text']})"
                   if self.reference_key else "no references")
        return f"{self.format}: {src}, {ref}"

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "input_key": self.input_key, "input_kind": self.input_kind,
                "reference_key": self.reference_key, "reference_kind": self.reference_kind}


def feature_kind(feature: Any) -> str:
    kind: str | None = feature.WhichOneof("kind")
    return kind or "empty"


def _tf_kind(kind: str) -> Kind | None:
    return {"bytes_list": "text", "int64_list": "ids"}.get(kind)  # type: ignore[return-value]


def _named_kind(kind: str) -> Kind | None:
    return "text" if kind == "text" else "ids" if kind == "ids" else None


def json_kind(value: Any) -> Kind | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "ids"
    return None


def _sample_fields(inputs: Sequence[InputFile], limit: int) -> list[dict[str, str | None]]:
    """Field name -> kind name (bytes_list / int64_list / float_list or a JSON type) of the first readable records."""
    samples: list[dict[str, str | None]] = []
    example_cls = example_class() if inputs[0].format == "tfrecord" else None
    for entry in scan(inputs, want=lambda i: True):
        if len(samples) >= limit:
            break
        if entry.data is None:
            continue
        if example_cls is not None:
            try:
                example = example_cls.FromString(entry.data)
            except Exception:  # noqa: BLE001 - google.protobuf.message.DecodeError; skipped while sampling
                continue
            samples.append({k: feature_kind(v) for k, v in example.features.feature.items()})
        else:
            try:
                obj = json.loads(entry.data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                samples.append({k: json_kind(v) or type(v).__name__ for k, v in obj.items()})
    return samples


def _pick(samples: list[dict[str, str | None]], key: str | None, candidates: Sequence[str],
          to_kind: Callable[[str], Kind | None], role: str, required: bool) -> tuple[str | None, Kind | None]:
    keys = [key] if key else list(candidates)
    for name in keys:
        kinds = [s[name] for s in samples if name in s and s[name] != "empty"]
        if not kinds:
            continue
        kind = to_kind(str(kinds[0]))
        if kind is None:
            raise InputError(f"{role} field {name!r} holds {kinds[0]}; it must be text (bytes / string) "
                             "or int64 token ids")
        return name, kind
    if key or required:
        seen = sorted({k for s in samples for k in s})
        wanted = repr(key) if key else "any of " + ", ".join(candidates)
        flag = "--input-key" if role == "source" else "--reference-key"
        raise InputError(f"no {role} field {wanted} in the first {len(samples)} records "
                         f"(fields: {', '.join(seen) or 'none'}); pass {flag}")
    return None, None


def detect_schema(inputs: Sequence[InputFile], input_key: str | None = None,
                  reference_key: str | None = None) -> Schema:
    """Find the source and reference fields from the first readable records.

    Raises:
        InputError: no readable record, or no usable source field (the message lists the fields found).
    """
    fmt = inputs[0].format
    if fmt == "text":
        has_refs = any(i.references for i in inputs)
        return Schema("text", None, "text", "references" if has_refs else None, "text" if has_refs else None)
    samples = _sample_fields(inputs, SCHEMA_SAMPLE)
    if not samples:
        what = "tf.train.Example" if fmt == "tfrecord" else "JSON object"
        if count_entries(inputs) == 0:
            # An empty input is valid: nothing to translate. Assume the usual field names.
            return Schema(fmt, input_key or INPUT_KEYS[0], "text")
        raise InputError(f"no readable {what} in {inputs[0].path}" + (" (and the other inputs)" if len(inputs) > 1
                                                                       else ""))
    to_kind = _tf_kind if fmt == "tfrecord" else _named_kind
    src_key, src_kind = _pick(samples, input_key, INPUT_KEYS, to_kind, "source", required=True)
    candidates = [k for k in REFERENCE_KEYS if k != src_key]
    ref_key, ref_kind = _pick(samples, reference_key, candidates, to_kind, "reference", required=False)
    assert src_key is not None and src_kind is not None
    return Schema(fmt, src_key, src_kind, ref_key, ref_kind)

