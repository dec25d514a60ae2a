"""The checkpoint readers, and the one place that picks a reader from a directory's contents.

A new source framework is one more :class:`~converters.base.Converter` in :data:`READERS`. ``mtgate convert`` and
``mtgate verify --source`` both load a checkpoint with :func:`load_source`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converters.base import ConversionError, Converter, LoadedModel
from converters.marian import MarianConverter
from converters.t2t import T2TConverter

READERS: tuple[type[Converter], ...] = (MarianConverter, T2TConverter)
"""Every reader, tried in this order: the first whose ``detect`` accepts the directory reads it."""


def detect_reader(source_dir: Path) -> type[Converter]:
    """The reader for ``source_dir``.

    Raises:
        ConversionError: not a directory, or no reader recognizes it.
    """
    if not source_dir.exists():
        raise ConversionError(f"{source_dir}: no such directory")
    if not source_dir.is_dir():
        raise ConversionError(f"{source_dir}: not a directory")
    for reader in READERS:
        if reader.detect(source_dir):
            return reader
    kinds = ", ".join(reader.framework for reader in READERS)
    raise ConversionError(
        f"{source_dir}: not a recognized checkpoint (supported: {kinds}; expected a Hugging Face Marian directory "
        "with config.json of model_type 'marian', or a tensor2tensor checkpoint directory)"
    )


def load_source(source_dir: Path, reader_options: dict[str, Any] | None = None) -> LoadedModel:
    """Detect, load and validate a checkpoint.

    Arguments:
        source_dir: a checkpoint directory.
        reader_options: reader-specific options the user set (``hparams_set``, ``vocab``, ``target_space_id`` for
            tensor2tensor); a reader refuses options that do not apply to it.

    Raises:
        ConversionError: unrecognized directory, unreadable or unsupported checkpoint, or an invalid spec (every
            reason listed).
    """
    reader = detect_reader(source_dir)
    loaded = reader(source_dir, **(reader_options or {})).load()
    try:
        loaded.spec.validate()
    except ValueError as e:
        raise ConversionError(f"{source_dir}: {e}") from e
    return loaded
