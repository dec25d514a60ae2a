"""Triton's version policy for a model repository: which of a model's versions to serve (``latest:N``, ``all``,
``specific:V[,V...]``). Parsed by the settings, applied by ``serving.repository``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model to serve: ``latest`` N, ``all``, or ``specific`` ones."""

    kind: str
    latest: int = 1
    specific: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        """``latest:N``, ``all`` or ``specific:V[,V...]``.

        Raises:
            ValueError: anything else, with what is accepted.
        """
        kind, _, value = text.strip().partition(":")
        try:
            if kind == "all" and not value:
                return cls("all")
            if kind == "latest" and int(value) >= 1:
                return cls("latest", latest=int(value))
            if kind == "specific" and value:
                numbers = frozenset(int(v) for v in value.split(","))
                if min(numbers) >= 1:
                    return cls("specific", specific=numbers)
        except ValueError:
            pass
        raise ValueError(f"version policy {text!r}: expected latest:N (N >= 1), all, or specific:V[,V...]")

    def choose(self, numbers: list[int]) -> list[int]:
        """The versions to serve among ``numbers``, ascending."""
        ordered = sorted(numbers)
        if self.kind == "latest":
            return ordered[-self.latest:]
        if self.kind == "specific":
            return [n for n in ordered if n in self.specific]
        return ordered
