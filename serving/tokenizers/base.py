"""The ``Tokenizer`` protocol every tokenizer of a model package satisfies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids for one model.

    ``encode`` returns the source ids *without* EOS (the engine appends the package's EOS id); ``decode`` turns
    target ids back into text, skipping special tokens. The engine cuts a hypothesis at its first EOS before decoding.
    """

    def encode(self, text: str) -> list[int]:
        """Source text to ids, without EOS."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids to text."""
        ...
