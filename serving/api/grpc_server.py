"""The KServe v2 / Triton ``GRPCInferenceService`` (``mtgate serve --grpc-port``), over the same service as ``/v2``:
same models, batchers, limits, API key, deadlines, metrics and statistics, in the same process and event loop.

The messages and the service are the published ``grpc_service.proto``, as compiled in the ``tritonclient`` wheel
(``tritonclient.grpc.service_pb2``; the ``grpc`` extra), so that ``tritonclient.grpc`` and ``perf_analyzer -i grpc``
work unchanged. Served: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelConfig``, ``ModelInfer``, ``ModelStatistics`` and ``RepositoryIndex``; the others answer ``UNIMPLEMENTED``
(``RepositoryModelLoad`` / ``Unload`` load and unload with ``--model-repository``, ``UNIMPLEMENTED`` without one).

Errors are the HTTP layer's (``serving.api.errors.STATUS``) with the gRPC code of their status
(``serving.api.errors.GRPC_CODES``): a bad request is ``INVALID_ARGUMENT``, a missing API key ``UNAUTHENTICATED``,
an unknown model ``NOT_FOUND``, a full queue or a model not ready ``UNAVAILABLE``, a deadline ``DEADLINE_EXCEEDED``.
The client's gRPC deadline shortens the request's, as ``timeout_ms`` does on ``/v1``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from serving import __version__
from serving.api.deps import api_key_problem
from serving.api.errors import GRPC_CODES, Unauthorized, status_of
from serving.errors import InvalidInput, ModelNotFound, ModelNotReady, NotSupported, ServingError
from serving.oip import (
    INPUT_NAME,
    NO_REPOSITORY,
    OUTPUT_DATATYPES,
    SERVER_EXTENSIONS,
    InferRequest,
    decode_bytes_tensor,
    encode_binary,
    model_config,
    model_metadata,
    output_values,
)
from serving.repository import ModelRepository
from serving.runner import ModelRunner
from serving.service import TranslationService

logger = logging.getLogger(__name__)

_SERVICE = "/inference.GRPCInferenceService/"
Reply = TypeVar("Reply")


def _rpc(method: Callable[..., Awaitable[Reply]]) -> Callable[..., Awaitable[Reply]]:
    """Map domain errors to gRPC status codes and count the call in ``mtgate_requests_total`` (route: the method)."""

    @functools.wraps(method)
    async def handler(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Reply:
        started = time.monotonic()
        code = "OK"
        try:
            return await method(self, request, context)
        except ServingError as error:
            code = GRPC_CODES.get(status_of(error), "INTERNAL")
            if code == "INTERNAL":
                logger.error("gRPC %s failed: %s", method.__name__, error)
            await context.abort(grpc.StatusCode[code], str(error))
            raise AssertionError("unreachable") from None  # abort raises
        except asyncio.CancelledError:  # the client cancelled, or its deadline passed
            code = "CANCELLED"
            raise
        except Exception:
            code = "UNKNOWN"
            raise
        finally:
            metrics = self.service.metrics
            route = _SERVICE + method.__name__
            metrics.requests.labels(route, "GRPC", code).inc()
            metrics.request_seconds.labels(route).observe(time.monotonic() - started)

    return handler


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Each RPC a thin translation between the proto messages and :class:`TranslationService`."""

    def __init__(self, service: TranslationService, repository: ModelRepository | None) -> None:
        self.service = service
        self.repository = repository

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
        return service_pb2.ServerMetadataResponse(name="mtgate", version=__version__, extensions=SERVER_EXTENSIONS)

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
        config = json_format.ParseDict(document, model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        statistics = self.service.statistics(request.name or None, request.version or None)
        return json_format.ParseDict(statistics, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)

    @_rpc
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        models = [service_pb2.RepositoryIndexResponse.ModelIndex(**entry)
                  for entry in self.service.model_index(request.ready)]
        return service_pb2.RepositoryIndexResponse(models=models)

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self._authorize(context)
        await self._repository().load(request.model_name)
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self._authorize(context)
        await self._repository().unload(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    def _repository(self) -> ModelRepository:
        if self.repository is None:
            raise NotSupported(NO_REPOSITORY)
        return self.repository

    # -- inference -------------------------------------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        started = time.monotonic()
        self._authorize(context)
        service = self.service
        if service.draining:
            raise ModelNotReady("the server is draining; send new requests to another replica")
        runner = self.service.version(request.model_name, request.model_version)
        parsed = parse_infer_request(request)
        service.inflight += 1  # the SIGTERM drain waits for gRPC requests as for HTTP ones
        service.metrics.inflight.inc()
        try:
            return await self._infer(runner, parsed, started, context)
        finally:
            service.inflight -= 1
            service.metrics.inflight.dec()

    async def _infer(self, runner: ModelRunner, parsed: InferRequest, started: float,
                     context: grpc.aio.ServicerContext) -> Any:
        service = self.service
        options = service.limits.options(parsed.decoding(), "parameter {!r}")
        timeouts = [t for t in (_microseconds(parsed.int_parameter("timeout")), context.time_remaining()) if t]
        deadline = service.limits.deadline(started, min(timeouts) if timeouts else None)
        runner, translations = await service.translate(runner, parsed.texts, options, deadline,
                                                       tag=parsed.id or "", target_prefix=parsed.target_prefixes())
        values = output_values(translations)
        names = [name for name, _ in parsed.outputs]
        return service_pb2.ModelInferResponse(
            model_name=runner.name,
            model_version=str(runner.info.version),
            id=parsed.id or "",
            outputs=[service_pb2.ModelInferResponse.InferOutputTensor(
                name=name, datatype=OUTPUT_DATATYPES[name], shape=parsed.shape) for name in names],
            raw_output_contents=[encode_binary(OUTPUT_DATATYPES[name], values[name]) for name in names],
        )

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata() or ())
        problem = api_key_problem(metadata.get("authorization"), self.service.settings.api_key)
        if problem is not None:
            raise Unauthorized(problem)


def _microseconds(value: int | None) -> float | None:
    return None if not value else value / 1e6


def _parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def parse_infer_request(request: Any) -> InferRequest:
    """The sentences of a ``ModelInferRequest`` (``raw_input_contents`` or ``contents.bytes_contents``), its shape,
    parameters and requested outputs (none: all of them).

    Raises:
        InvalidInput: anything malformed, with what is wrong.
    """
    if len(request.inputs) != 1 or request.inputs[0].name != INPUT_NAME:
        names = [tensor.name for tensor in request.inputs]
        raise InvalidInput(f"this model takes one BYTES input {INPUT_NAME!r}, got {names}")
    tensor = request.inputs[0]
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"input {INPUT_NAME!r} must have datatype BYTES, got {tensor.datatype!r}")
    shape = list(tensor.shape)
    if not shape or any(d < 0 for d in shape):
        raise InvalidInput(f"input {INPUT_NAME!r} needs a shape of non-negative dimensions, got {shape}")
    count = 1
    for dimension in shape:
        count *= dimension
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1:
            raise InvalidInput(f"{len(request.raw_input_contents)} raw_input_contents for one input")
        texts = decode_bytes_tensor(request.raw_input_contents[0], count)
    else:
        elements = list(tensor.contents.bytes_contents)
        if len(elements) != count:
            raise InvalidInput(f"input {INPUT_NAME!r} has {len(elements)} elements but its shape {shape} needs {count}")
        try:
            texts = [element.decode("utf-8") for element in elements]
        except UnicodeDecodeError:
            raise InvalidInput(f"an element of {INPUT_NAME!r} is not valid UTF-8") from None
    outputs = [output.name for output in request.outputs] or list(OUTPUT_DATATYPES)
    unknown = [name for name in outputs if name not in OUTPUT_DATATYPES]
    if unknown:
        raise InvalidInput(f"unknown output(s) {unknown}; this model has {list(OUTPUT_DATATYPES)}")
    parameters = {key: _parameter(value) for key, value in request.parameters.items()}
    return InferRequest(id=request.id or None, texts=texts, shape=shape, outputs=[(n, True) for n in outputs],
                        parameters=parameters)


async def start(service: TranslationService, repository: ModelRepository | None, host: str,
                port: int) -> tuple[grpc.aio.Server, int]:
    """Serve :class:`InferenceServicer` on ``host:port`` (0: a free port) in the running event loop.

    Returns:
        The started server and the port it listens on.
    """
    limit = service.settings.max_body_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", max(limit, 64 << 20))])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(service, repository), server)
    bound = server.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
    await server.start()
    logger.info("mtgate gRPC on %s:%d", host, bound)
    return server, bound
