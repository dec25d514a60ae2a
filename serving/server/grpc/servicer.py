"""The KServe v2 / Triton ``GRPCInferenceService`` (``mtgate serve --grpc-port``), over the same service as ``/v2``:
same models, batchers, limits, API key, deadlines, metrics and statistics, in the same process and event loop.

The messages and the service are the published ``grpc_service.proto``, as compiled in the ``tritonclient`` wheel
(``tritonclient.grpc.service_pb2``; the ``grpc`` extra), so that ``tritonclient.grpc`` and ``perf_analyzer -i grpc``
work unchanged. Served: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelConfig``, ``ModelInfer``, ``ModelStreamInfer``, ``ModelStatistics``, ``RepositoryIndex`` and
``RepositoryModelLoad`` / ``Unload`` (through ``serving.server.repository``, as ``/v2/repository``: with ``--model-repository``;
``UNIMPLEMENTED`` without one); the others (shared memory, trace and log settings) answer ``UNIMPLEMENTED`` at once,
counted in the metrics and logged once per method. ``ModelStreamInfer`` answers each request of the stream as
``ModelInfer`` would, as soon as it is ready (a failed request is an ``error_message`` in the stream, which goes
on), so ``perf_analyzer --streaming`` works; a request with the parameter ``stream: true`` gets partial responses
first (``serving.server.grpc.stream``).

Every RPC goes through :func:`_rpc` (``ModelStreamInfer``: through the same mapping per request): the API key is
checked first for the methods that need it (inference and repository control, as on HTTP), then the request bytes
are parsed (the service is registered without deserializers: gRPC would log a traceback for a malformed message
and answer ``UNKNOWN``). Errors are the HTTP layer's (``serving.server.errors.STATUS``) with the gRPC code of their
status (``serving.server.errors.GRPC_CODES``): a bad or unparsable request is ``INVALID_ARGUMENT``, a missing API key
``UNAUTHENTICATED``, an unknown model ``NOT_FOUND``, a full queue or a model not ready ``UNAVAILABLE``, a deadline
``DEADLINE_EXCEEDED``; a client's error is not logged, a crash is logged once and answered ``INTERNAL``. The
client's gRPC deadline shortens the request's, as ``timeout_ms`` does on ``/v1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from serving import __version__
from serving.engine.errors import InvalidInput, ModelNotFound, ModelNotReady, ServingError
from serving.engine.request import Translation
from serving.server.errors import GRPC_CODES, Unauthorized, api_key_problem, status_of
from serving.server.grpc.messages import (
    METHODS,
    SERVICE_NAME,
    empty_final_response,
    infer_response,
    message_type,
    parameter_value,
    parse_infer_request,
    parse_message,
    stream_error,
    stream_response,
)
from serving.server.grpc.stream import STREAM, STREAMING_NOTE, Partials, stream_options
from serving.server.model_runner import ModelRunner
from serving.server.oip import InferRequest, model_config, model_metadata
from serving.server.repository import ModelControl
from serving.server.service import TranslationService
from serving.server.shadow.canary import ANSWERED_BY, ANSWERED_BY_HEADER, ANSWERED_MODEL_HEADER

logger = logging.getLogger(__name__)

_SERVICE = "/" + SERVICE_NAME + "/"
# The methods that need the API key, as on HTTP (inference and repository control; health and metadata are open).
_KEYED = frozenset({"ModelInfer", "ModelStreamInfer", "RepositoryModelLoad", "RepositoryModelUnload"})
Reply = TypeVar("Reply")


def _code_of(error: ServingError) -> str:
    """The gRPC status code of a domain error (serving.server.http.errors: its HTTP status's); INTERNAL ones are logged."""
    code = GRPC_CODES.get(status_of(error), "INTERNAL")
    if code == "INTERNAL":
        logger.error("gRPC request failed: %s", error)
    return code


def _rpc(method: Callable[..., Awaitable[Reply]]) -> Callable[..., Awaitable[Reply]]:
    """A unary RPC on the request's bytes: the API key checked first (:data:`_KEYED`), then the bytes parsed, the
    method run, its domain errors mapped to gRPC status codes, a crash logged once and answered INTERNAL; the call
    counted in ``mtgate_requests_total`` (route: the method)."""
    name = method.__name__
    request_type = message_type(METHODS[name].input_type)

    @functools.wraps(method)
    async def handler(self: InferenceServicer, raw: bytes, context: grpc.aio.ServicerContext) -> Reply:
        started = time.monotonic()
        code = "OK"
        try:
            if name in _KEYED:
                self._authorize(context)
            return await method(self, parse_message(request_type, raw), context)
        except ServingError as error:
            code = _code_of(error)
            await context.abort(grpc.StatusCode[code], str(error))
            raise AssertionError("unreachable") from None  # abort raises
        except asyncio.CancelledError:  # the client cancelled, or its deadline passed
            code = "CANCELLED"
            raise
        except Exception as error:
            code = "INTERNAL"
            logger.exception("gRPC %s crashed", name)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}")
            raise AssertionError("unreachable") from None
        finally:
            self._count(name, code, started)

    return handler


class InferenceServicer:
    """Each RPC a thin translation between the proto messages and :class:`TranslationService`; the methods of the
    service not defined here answer UNIMPLEMENTED (:meth:`unimplemented`)."""

    def __init__(self, service: TranslationService, control: ModelControl) -> None:
        self.service = service
        self.control = control
        self._told: set[str] = set()  # unimplemented methods already logged

    # -- health and metadata ---------------------------------------------------------------------------------------

    @_rpc
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.service.ready)

    @_rpc
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        try:
            runner = self.service.version(request.name, request.version)
        except ModelNotFound:
            return service_pb2.ModelReadyResponse(ready=False)  # as Triton: not ready, not an error
        return service_pb2.ModelReadyResponse(ready=runner.ready and not self.service.draining)

    @_rpc
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return service_pb2.ServerMetadataResponse(name="mtgate", version=__version__,
                                                  extensions=self.control.extensions)

    @_rpc
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        runner = self.service.version(request.name, request.version)
        document = model_metadata(runner.name, str(runner.info.version), f"mtgate_{runner.info.runtime}")
        return json_format.ParseDict(document, service_pb2.ModelMetadataResponse())

    @_rpc
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        runner = self.service.version(request.name, request.version)
        settings = self.service.settings
        document = model_config(runner.name, f"mtgate_{runner.info.runtime}", max_batch_size=settings.max_batch_size,
                                max_queue_delay_us=settings.max_queue_delay_us,
                                max_queue_size=settings.max_queue_size)
        document["parameters"] = {"streaming": {"string_value": STREAMING_NOTE}}  # decoupled stays false: see stream
        config = json_format.ParseDict(document, model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        statistics = self.service.statistics(request.name or None, request.version or None)
        return json_format.ParseDict(statistics, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)

    @_rpc
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        models = [service_pb2.RepositoryIndexResponse.ModelIndex(**entry) for entry in self.control.index(request.ready)]
        return service_pb2.RepositoryIndexResponse(models=models)

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        parameters = {key: parameter_value(value) for key, value in request.parameters.items()}
        await self.control.load(request.model_name, parameters)
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self.control.unload(request.model_name)  # unload_dependents: there are no dependent models
        return service_pb2.RepositoryModelUnloadResponse()

    # -- inference -------------------------------------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        if stream_options(request)[0]:
            raise InvalidInput(f"parameter {STREAM!r}: partial responses are sent on ModelStreamInfer; ModelInfer "
                               "answers once")
        marks: list[tuple[str, str]] = []  # who answered, with a canary: in the trailing metadata
        token = ANSWERED_BY.set(marks)
        try:
            runner, parsed, translations = await self._translate(request, context, time.monotonic())
        finally:
            ANSWERED_BY.reset(token)
        if marks:
            context.set_trailing_metadata(((ANSWERED_BY_HEADER, marks[-1][0]), (ANSWERED_MODEL_HEADER, marks[-1][1])))
        return infer_response(runner.name, str(runner.info.version), parsed, translations)

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes],  # noqa: N802
                               context: grpc.aio.ServicerContext) -> None:
        """Each request of the stream answered as by ``ModelInfer`` as soon as it is ready (Triton's order: the
        client matches responses by ``id``), after its partial responses if it asked for them
        (``serving.server.grpc.stream``); a failed request is an ``error_message`` and the stream goes on. Each
        request is counted as a ``ModelStreamInfer`` call; a wrong API key ends the stream before it is read."""
        try:
            self._authorize(context)
        except Unauthorized as error:
            self._count("ModelStreamInfer", "UNAUTHENTICATED", time.monotonic())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))
        writing = asyncio.Lock()

        async def write(reply: Any) -> None:
            async with writing:
                with contextlib.suppress(Exception):  # the stream is gone (the client left): nothing to answer
                    await context.write(reply)

        async def answer(raw: bytes) -> None:
            started = time.monotonic()
            code, request = "OK", None
            try:
                request = parse_message(service_pb2.ModelInferRequest, raw)
                replies = await self._stream_answer(request, context, started, write)
            except ServingError as error:
                code = _code_of(error)
                replies = [stream_error(request, str(error))]
            except Exception as error:  # noqa: BLE001 - a crash answers its request, the stream goes on
                code = "INTERNAL"
                logger.exception("gRPC ModelStreamInfer crashed")
                replies = [stream_error(request, f"internal error: {type(error).__name__}")]
            finally:
                self._count("ModelStreamInfer", code, started)
            for reply in replies:
                await write(reply)

        tasks: list[asyncio.Task[None]] = []
        try:
            async for raw in requests:
                tasks = [task for task in tasks if not task.done()]
                tasks.append(asyncio.ensure_future(answer(raw)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _stream_answer(self, request: Any, context: grpc.aio.ServicerContext, started: float,
                             write: Callable[[Any], Awaitable[None]]) -> list[Any]:
        """The last responses of a stream's request; its partial ones (parameter ``stream``) written on the way."""
        stream, empty_final = stream_options(request)
        if not stream:
            runner, parsed, translations = await self._translate(request, context, started)
            return [stream_response(infer_response(runner.name, str(runner.info.version), parsed, translations),
                                    final=True)]
        partials = Partials(write)
        runner, parsed, translations = await partials.follow(self._translate(request, context, started, partials))
        await partials.rest([translation.text for translation in translations])
        name, version = runner.name, str(runner.info.version)
        whole = stream_response(infer_response(name, version, parsed, translations), final=not empty_final)
        return [whole, empty_final_response(name, version, parsed)] if empty_final else [whole]

    async def _translate(self, request: Any, context: grpc.aio.ServicerContext, started: float,
                         partials: Partials | None = None) -> tuple[ModelRunner, InferRequest, list[Translation]]:
        """A ``ModelInferRequest`` translated (with ``partials``: streamed to them as well)."""
        service = self.service
        if service.draining:
            raise ModelNotReady("the server is draining; send new requests to another replica")
        runner = self.service.version(request.model_name, request.model_version)
        parsed = parse_infer_request(request)
        if partials is not None:
            partials.start(runner.name, str(runner.info.version), parsed)
        service.inflight += 1  # the SIGTERM drain waits for gRPC requests as for HTTP ones
        service.metrics.inflight.inc()
        try:
            timeouts = [t for t in (_microseconds(parsed.int_parameter("timeout")), context.time_remaining()) if t]
            admission = service.limits.admission(parsed.decoding(), started, min(timeouts) if timeouts else None,
                                                 label="parameter {!r}", tag=parsed.id or "",
                                                 target_prefix=parsed.target_prefixes())
            runner, translations = await service.translate(runner, parsed.texts, admission,
                                                           None if partials is None else partials.add)
            return runner, parsed, translations
        finally:
            service.inflight -= 1
            service.metrics.inflight.dec()

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata() or ())
        problem = api_key_problem(metadata.get("authorization"), self.service.settings.api_key)
        if problem is not None:
            raise Unauthorized(problem)

    def _count(self, name: str, code: str, started: float) -> None:
        metrics = self.service.metrics
        metrics.requests.labels(_SERVICE + name, "GRPC", code).inc()
        metrics.request_seconds.labels(_SERVICE + name).observe(time.monotonic() - started)

    def unimplemented(self, name: str) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
        """The handler of a method mtgate does not serve: UNIMPLEMENTED before the request is read, counted, and
        logged the first time only (a client probing shared memory or tracing would otherwise fill the log)."""

        async def answer(request: Any, context: grpc.aio.ServicerContext) -> None:
            self._count(name, "UNIMPLEMENTED", time.monotonic())
            if name not in self._told:
                self._told.add(name)
                logger.info("gRPC %s is not implemented by mtgate: answered UNIMPLEMENTED (logged once)", name)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"mtgate does not implement {name}")

        return answer


def handlers(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """Every method of ``GRPCInferenceService``: those :class:`InferenceServicer` defines, on the request's raw
    bytes (parsed by :func:`_rpc` after the API key check); the others, :meth:`InferenceServicer.unimplemented`."""
    table: dict[str, grpc.RpcMethodHandler] = {}
    for name, method in METHODS.items():
        serialize = message_type(method.output_type).SerializeToString
        behaviour = getattr(servicer, name) if name in vars(InferenceServicer) else servicer.unimplemented(name)
        make = grpc.stream_stream_rpc_method_handler if method.client_streaming else grpc.unary_unary_rpc_method_handler
        table[name] = make(behaviour, request_deserializer=None, response_serializer=serialize)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, table)


def _microseconds(value: int | None) -> float | None:
    return None if not value else value / 1e6


class GrpcTransport:
    """The gRPC transport (``serving.server.transport.Transport``) on ``host:port`` (0: a free port, then
    :attr:`port` says which)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._server: grpc.aio.Server | None = None

    async def start(self, service: TranslationService, control: ModelControl) -> None:
        self._server, self.port = await start(service, control, self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=2)


async def start(service: TranslationService, control: ModelControl, host: str,
                port: int) -> tuple[grpc.aio.Server, int]:
    """Serve :class:`InferenceServicer` on ``host:port`` (0: a free port) in the running event loop.

    Returns:
        The started server and the port it listens on.
    """
    limit = service.settings.max_body_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", max(limit, 64 << 20))])
    server.add_generic_rpc_handlers((handlers(InferenceServicer(service, control)),))
    bound = server.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
    await server.start()
    logger.info("mtgate gRPC on %s:%d", host, bound)
    return server, bound
