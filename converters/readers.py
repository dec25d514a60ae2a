"""The checkpoint readers, and the one place that picks a reader from a directory's contents.

A new source framework is one more :class:`~converters.base.Converter` in :data:`READERS`. ``mtgate convert`` and
``mtgate verify --source`` both load a checkpoint with :func:`load_source`; ``--format NAME`` forces a reader
(:data:`FORMATS`), otherwise the first whose ``detect`` accepts the directory reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converters.base import ConversionError, Converter, LoadedModel
from converters.fairseq import FairseqConverter
from converters.fsmt import FsmtConverter
from converters.marian import MarianConverter
from converters.marian_npz import MarianNpzConverter
from converters.opennmt import OpenNmtPyConverter
from converters.t2t import T2TConverter

READERS: tuple[type[Converter], ...] = (MarianConverter, FsmtConverter, FairseqConverter, MarianNpzConverter,
                                        OpenNmtPyConverter, T2TConverter)
"""Every reader, tried in this order: the first whose ``detect`` accepts the directory reads it."""

FORMATS: dict[str, type[Converter]] = {reader.framework: reader for reader in READERS}
"""``--format`` name -> reader."""


def detect_reader(source_dir: Path, fmt: str | None = None) -> type[Converter]:
    """The reader for ``source_dir``: the one named by ``fmt``, else the first that recognizes the directory.

    Raises:
        ConversionError: not a directory, an unknown format, or no reader recognizes it (the message says what
            each format's directory holds).
    """
    if fmt is not None and fmt not in FORMATS:
        raise ConversionError(f"unknown format {fmt!r} (supported formats: {', '.join(FORMATS)})")
    if not source_dir.exists():
        from serving.package import hub_hint

        raise ConversionError(f"{source_dir}: no such directory{hub_hint(source_dir, converting=True)}")
    if not source_dir.is_dir():
        raise ConversionError(f"{source_dir}: not a directory")
    if fmt is not None:
        return FORMATS[fmt]
    for reader in READERS:
        if reader.detect(source_dir):
            return reader
    raise ConversionError(
        f"{source_dir}: not a recognized checkpoint (supported formats: {', '.join(FORMATS)}; expected "
        + "; or ".join(reader.layout for reader in READERS) + ")"
    )


def load_source(source_dir: Path, reader_options: dict[str, Any] | None = None, fmt: str | None = None) -> LoadedModel:
    """Detect (or take ``fmt``'s), load and validate a checkpoint.

    Arguments:
        source_dir: a checkpoint directory.
        reader_options: reader-specific options the user set (``hparams_set``, ``vocab``, ``target_space_id`` for
            tensor2tensor); a reader refuses options that do not apply to it.
        fmt: a :data:`FORMATS` name that forces the reader (None: detected from the directory's contents).

    Raises:
        ConversionError: unrecognized directory, unreadable or unsupported checkpoint, or an invalid spec (every
            reason listed).
    """
    reader = detect_reader(source_dir, fmt)
    loaded = reader(source_dir, **(reader_options or {})).load()
    try:
        loaded.spec.validate()
    except ValueError as e:
        raise ConversionError(f"{source_dir}: {e}") from e
    return loaded
