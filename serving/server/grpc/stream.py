"""Token streaming on ``ModelStreamInfer`` (``serving.server.grpc.servicer``), Triton's decoupled way, for the requests
that ask for it with the parameter ``stream: true``: partial responses as the translation becomes stable (the engine's
``OnPartial`` deltas: greedy, every token; with a beam, the prefix all live beams share; never rewritten), each flagged
``triton_final_response: false``; then the whole response, as ``ModelInfer`` answers it. The whole response is the
request's last (``triton_final_response: true``) unless the client asked for Triton's empty final response
(``triton_enable_empty_final_response``): then an empty response with the request's id follows it, flagged final.

A partial response holds ``OUTPUT_TEXT`` in the request's shape: each element the text its sentence continues with
since the previous partial response (empty: nothing new), so that a sentence's partial texts, in order, concatenate
to its ``OUTPUT_TEXT`` in the whole response. Deltas that arrive while a response is being written go out together in
the next one (a slow client gets fewer, longer partials, never a queue that grows with each token).

Requests without the parameter are answered once, as by ``ModelInfer`` (flagged final); ``ModelInfer`` refuses it.
The model configuration keeps ``decoupled`` false: one response per request is what every request gets unless it
asks (Triton refuses ``ModelInfer`` for decoupled models, mtgate does not), and says so in its ``streaming`` parameter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from serving.engine.errors import InvalidInput
from serving.server.grpc.messages import parameter_value, partial_response
from serving.server.oip import InferRequest

logger = logging.getLogger(__name__)

STREAM = "stream"
"""The request parameter that asks ``ModelStreamInfer`` for partial responses."""
EMPTY_FINAL = "triton_enable_empty_final_response"
"""The request parameter of Triton's clients (``async_stream_infer(enable_empty_final_response=True)``)."""
STREAMING_NOTE = (f"ModelStreamInfer streams partial responses (OUTPUT_TEXT deltas) to requests with the parameter "
                  f"{STREAM}=true, then the whole response; triton_final_response flags the last; "
                  f"{EMPTY_FINAL} is honoured")
"""What the model configuration says of streaming (its ``parameters``)."""

Result = TypeVar("Result")
Write = Callable[[Any], Awaitable[None]]


def stream_options(request: Any) -> tuple[bool, bool]:
    """Whether a ``ModelInferRequest`` asks for partial responses, and for an empty final response.

    Raises:
        InvalidInput: either parameter is not a boolean.
    """
    return _flag(request, STREAM), _flag(request, EMPTY_FINAL)


def _flag(request: Any, name: str) -> bool:
    if name not in request.parameters:
        return False
    value = parameter_value(request.parameters[name])
    if not isinstance(value, bool):
        raise InvalidInput(f"parameter {name!r} must be a boolean, got {value!r}")
    return value


class Partials:
    """One streamed request's text, sentence by sentence: :meth:`add` is its ``OnPartial`` hook, :meth:`follow`
    writes what it gathers as partial responses while the translation runs, :meth:`rest` is what the engine did not
    stream of the final texts.

    Arguments:
        write: writes a response on the stream (one writer at a time).
    """

    def __init__(self, write: Write) -> None:
        self._write = write
        self._ready = asyncio.Event()
        self._waiting: dict[int, list[str]] = {}
        self._sent: dict[int, list[str]] = {}
        self._head: tuple[str, str, InferRequest] | None = None

    def start(self, name: str, version: str, parsed: InferRequest) -> None:
        """The request is admitted for model ``name`` at ``version``: what its partial responses carry."""
        self._head = (name, version, parsed)

    def add(self, index: int, delta: str) -> None:
        """``OnPartial``: sentence ``index`` continues with ``delta`` (called on the event loop)."""
        self._waiting.setdefault(index, []).append(delta)
        self._ready.set()

    async def follow(self, work: Awaitable[Result]) -> Result:
        """Await ``work`` (the translation), writing partial responses as text arrives; the last ones before it."""
        task = asyncio.ensure_future(work)
        waiter: asyncio.Future[Any] | None = None
        try:
            while not task.done():
                waiter = asyncio.ensure_future(self._ready.wait())
                await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                await self._flush()
            result = task.result()
            await self._flush()
            return result
        finally:
            task.cancel()
            if waiter is not None:
                waiter.cancel()

    async def rest(self, texts: list[str]) -> None:
        """Write what each final text has beyond its streamed part (an engine that streams less, or nothing, of a
        sentence), so that the partial texts concatenate to the final ones."""
        for index, text in enumerate(texts):
            sent = "".join(self._sent.get(index, ()))
            if sent == text:
                continue
            if text.startswith(sent):
                self.add(index, text[len(sent):])
            else:
                logger.error("the streamed text of sentence %d is not the start of its translation", index)
        await self._flush()

    async def _flush(self) -> None:
        self._ready.clear()
        if not self._waiting or self._head is None:
            return
        name, version, parsed = self._head
        deltas = [""] * len(parsed.texts)
        for index, parts in self._waiting.items():
            deltas[index] = "".join(parts)
            self._sent.setdefault(index, []).extend(parts)
        self._waiting.clear()
        await self._write(partial_response(name, version, parsed, deltas))
