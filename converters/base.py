"""What every checkpoint reader returns, the base class readers implement, and the helpers they share.

A reader (``MarianConverter``, ``T2TConverter``) only implements :meth:`Converter.detect` and :meth:`Converter.load`;
``converters/readers.py`` picks the reader for a directory, and ``converters/convert.py`` does the rest (validate ->
emit ONNX -> OpenVINO -> int8 -> parity -> package) the same way for every framework.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from converters.spec import TransformerSpec


class ConversionError(Exception):
    """The source cannot be converted; the message lists every reason (one per line after the first)."""


@dataclass
class LoadedModel:
    """A reader's result.

    Attributes:
        spec: the filled, not yet validated, TransformerSpec.
        tokenizer: the manifest's ``tokenizer`` entry; its ``files`` map a role to a package-relative path
            (e.g. ``{"vocab": "tokenizer/vocab.subwords"}``).
        tokenizer_files: package-relative destination path -> source file to copy there.
        source: the manifest's ``source`` entry (framework, path, anything needed to reproduce the conversion).
        name: default package name.
        tokenizer_data: package-relative destination path -> bytes to write there (tokenizer files the reader
            derived from the checkpoint's own, e.g. a vocabulary in the tokenizer's format).
    """

    spec: TransformerSpec
    tokenizer: dict[str, Any]
    tokenizer_files: dict[str, Path]
    source: dict[str, Any]
    name: str
    extra: dict[str, Any] = field(default_factory=dict)
    tokenizer_data: dict[str, bytes] = field(default_factory=dict)


class Converter(ABC):
    """Reads one framework's checkpoint directory."""

    framework: ClassVar[str]
    """The ``--format`` name and the manifest's ``source.framework``."""
    layout: ClassVar[str]
    """What a directory of this format holds, in a few words (for errors and ``mtgate convert --help``)."""

    def __init__(self, source_dir: Path, **options: Any) -> None:
        """Remember the checkpoint directory and the reader options.

        Arguments:
            source_dir: the checkpoint directory.
            **options: framework-specific reader options from the command line (e.g. ``hparams_set``,
                ``vocab``, ``target_space_id`` for tensor2tensor); ``convert`` passes only those the user set.
                A reader raises ConversionError for an option it does not understand.
        """
        self.source_dir = source_dir
        self.options = options

    @classmethod
    @abstractmethod
    def detect(cls, source_dir: Path) -> bool:
        """True when source_dir looks like this framework's checkpoint."""

    @abstractmethod
    def load(self) -> LoadedModel:
        """Read the checkpoint into a TransformerSpec.

        Raises:
            ConversionError: listing every reason the checkpoint cannot be converted.
        """


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint directory.

    Raises:
        ConversionError: unreadable, not JSON, or not an object (naming the file).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return data


def cannot_convert(source_dir: Path, kind: str, problems: list[str]) -> ConversionError:
    """The error for a checkpoint with unsupported options or missing parts: a header line, then one per reason."""
    return ConversionError(f"{source_dir}: cannot convert this {kind} checkpoint:\n  " + "\n  ".join(problems))


class TokenizerFields(TypedDict):
    """:class:`LoadedModel`'s three tokenizer fields, as one reader helper returns them."""

    tokenizer: dict[str, Any]
    tokenizer_files: dict[str, Path]
    tokenizer_data: dict[str, bytes]


def sentencepiece_tokenizer(spm: tuple[Path, Path], vocab: bytes, target_vocab: bytes | None,
                            unk: int | None) -> TokenizerFields:
    """The tokenizer fields of a package whose pieces come from two SentencePiece models (``spm``: source, target)
    and whose ids from vocabularies the reader read (Marian NMT npz, OpenNMT-py): ``vocab`` written as
    ``tokenizer/vocab.json`` and, when the target's differs (else None), ``target_vocab`` as ``target_vocab.json``."""
    files = {"source_spm": "tokenizer/source.spm", "target_spm": "tokenizer/target.spm",
             "vocab": "tokenizer/vocab.json"}
    data = {files["vocab"]: vocab}
    if target_vocab is not None:
        files["target_vocab"] = "tokenizer/target_vocab.json"
        data[files["target_vocab"]] = target_vocab
    return TokenizerFields(tokenizer={"kind": "sentencepiece", "files": files, "unk_id": unk},
                           tokenizer_files={files["source_spm"]: spm[0], files["target_spm"]: spm[1]},
                           tokenizer_data=data)
