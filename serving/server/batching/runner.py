"""The step batcher's runner (``serving.server.batching.step``): what decodes its chunks of payloads together, one
step at a time, on the worker thread. :class:`StepRunner` is the protocol the batcher drives (tests drive fakes of
it); :class:`DecoderRunner` is the one over the engine's ``serving.engine.continuous.ContinuousDecoder``, whose payloads
are prepared sentences (``serving.engine.request.Sentence``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from serving.engine.errors import InferenceFailed, ServingError
from serving.engine.request import OnPartial, Prepared

if TYPE_CHECKING:  # the service builds the decoder; this module only drives it
    from serving.engine.continuous import ContinuousDecoder

OnChunkResult = Callable[[Sequence[Any] | BaseException], None]
"""``on_result(results or error)``: one result per payload of the chunk, in order, or why the chunk failed."""


class StepRunner(Protocol):
    """Decodes chunks of payloads together, one step at a time; used from the worker thread only."""

    def add(
        self,
        key: Hashable,
        payloads: list[Any],
        on_result: OnChunkResult,
        on_partial: OnPartial | None,
        alive: Callable[[], bool],
    ) -> None:
        """Let a chunk join at the next step (``on_partial(i, partial)`` for payload ``i``; ``alive()`` False: drop
        it). Raises for a chunk it refuses (nothing joins)."""
        ...

    def step(self) -> None:
        """One step for every chunk in flight; finished chunks get their ``on_result``."""
        ...

    def fail(self, error: BaseException) -> None:
        """Fail every chunk in flight with ``error``."""
        ...

    def detach(self) -> None:
        """Let other work use the engine between two steps (``StepBatcher.call_in_worker``)."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing in flight."""
        ...

    @property
    def sentences(self) -> int:
        """Sentences in flight."""
        ...


class DecoderRunner:
    """The step runner over the engine's continuous decoder: a chunk's payloads are prepared sentences
    (``serving.engine.request.Sentence``), gathered into one group (they share their search options when they share
    a key)."""

    def __init__(self, decoder: ContinuousDecoder) -> None:
        self.decoder = decoder

    @property
    def idle(self) -> bool:
        return self.decoder.idle

    @property
    def sentences(self) -> int:
        return self.decoder.sentences

    def add(self, key: Hashable, payloads: list[Any], on_result: OnChunkResult, on_partial: OnPartial | None,
            alive: Callable[[], bool]) -> None:
        self.decoder.add(Prepared.gather(payloads), on_result, on_partial=on_partial, alive=alive)

    def step(self) -> None:
        self.decoder.step()

    def fail(self, error: BaseException) -> None:
        self.decoder.fail(error if isinstance(error, ServingError) else InferenceFailed(f"{error}"))

    def detach(self) -> None:
        self.decoder.detach()
