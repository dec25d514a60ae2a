"""Open Inference Protocol (KServe v2) routes, enough for the stock ``tritonclient.http`` client.

Health answers 200 or 503 with a JSON body (``{"live": true}``, ``{"ready": false}``: what the KServe SDK reads;
tritonclient and probes look at the status only); every error is ``{"error": "<message>"}``. The infer route reads
the raw body itself: tritonclient sends no Content-Type and, by default, the binary tensor extension.
"""

from __future__ import annotations

import zlib
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from serving import __version__
from serving.engine.errors import InvalidInput, LimitExceeded
from serving.server.client_json import parse_client_json
from serving.server.http.deps import ApiKeyDep, ServiceDep, request_id, request_started, unless_disconnected
from serving.server.http.schemas import (
    error_responses,
)
from serving.server.http.schemas_v2 import (
    InferResponse,
    LiveResponse,
    ModelConfig,
    ModelMetadata,
    ModelReadyResponse,
    ModelStatisticsResponse,
    ReadyResponse,
    RepositoryModel,
    ServerMetadata,
)
from serving.server.infer_header import infer_request_schema
from serving.server.oip import (
    INPUT_NAME,
    encode_infer_response,
    model_config,
    model_metadata,
    parse_infer_request,
)
from serving.server.repository import ModelControl

router = APIRouter(prefix="/v2", tags=["v2 (Open Inference Protocol)"])

_INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": infer_request_schema(),
                "example": {
                    "inputs": [{"name": INPUT_NAME, "shape": [2, 1], "datatype": "BYTES", "data": ["Hello.", "Thanks."]}]
                },
            }
        },
        "description": "an inference request with one BYTES input INPUT_TEXT whose shape matches its data. With an "
        "Inference-Header-Content-Length header the body is that many bytes of this JSON followed by the binary "
        "tensors (Triton's binary tensor data extension; each BYTES element a 4-byte little-endian length and its "
        "UTF-8 bytes). Any Content-Type (or none) is accepted.",
    }
}
_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": InferResponse,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "description": "the outputs as JSON, or (binary outputs requested) a JSON header of "
        "Inference-Header-Content-Length bytes followed by the tensors' bytes",
    },
    **error_responses(400, 401, 404, 408, 413, 500, 503, 504, oip=True),
}
_NOT_READY: dict[int | str, dict[str, Any]] = {503: {"model": ReadyResponse, "description": "loading, warming up, draining or failed"}}


def _control(request: Request) -> ModelControl:
    control: ModelControl = request.app.state.control
    return control


@router.get("", include_in_schema=False)
@router.get("/", response_model=ServerMetadata)
async def server_metadata(request: Request) -> ServerMetadata:
    """Server metadata: the protocol extensions (``model_repository`` with ``--model-repository``)."""
    return ServerMetadata(name="mtgate", version=__version__, extensions=_control(request).extensions)


@router.get("/health/live", response_model=LiveResponse)
async def live() -> LiveResponse:
    """200 while the process is up."""
    return LiveResponse(live=True)


@router.get("/health/ready", response_model=ReadyResponse, responses=_NOT_READY)
async def ready(service: ServiceDep) -> JSONResponse:
    """200 once every model is loaded and warm; 503 while loading, draining or failed."""
    return JSONResponse({"ready": service.ready}, status_code=200 if service.ready else 503)


_MODEL_READY: dict[int | str, dict[str, Any]] = {
    **error_responses(404, oip=True),
    503: {"model": ModelReadyResponse, "description": "the model is loading, warming up, or the server is draining"},
}


@router.get("/models/{name}/ready", response_model=ModelReadyResponse, responses=_MODEL_READY)
@router.get("/models/{name}/versions/{version}/ready", response_model=ModelReadyResponse, responses=_MODEL_READY)
async def model_ready(name: str, service: ServiceDep, version: str | None = None) -> JSONResponse:
    """200 when the model can take requests, 503 while it cannot."""
    runner = service.version(name, version)
    if runner.ready and not service.draining:
        return JSONResponse({"name": runner.name, "ready": True})
    reason = "the server is draining" if service.draining else "loading and warming up"
    body = {"name": runner.name, "ready": False, "error": f"model {runner.name!r} is not ready ({reason})"}
    return JSONResponse(body, status_code=503)


_METADATA_ERRORS = error_responses(404, 503, oip=True)


# Before /models/{name}: "stats" is this route, not a model's metadata.
@router.get("/models/stats", response_model=ModelStatisticsResponse)
async def all_statistics(service: ServiceDep) -> dict[str, object]:
    """Triton's statistics extension for every model: requests, queue and compute time, batches (cumulative)."""
    return service.statistics()


@router.get("/models/{name}/stats", response_model=ModelStatisticsResponse, responses=_METADATA_ERRORS)
@router.get("/models/{name}/versions/{version}/stats", response_model=ModelStatisticsResponse,
            responses=_METADATA_ERRORS)
async def model_statistics(name: str, service: ServiceDep, version: str | None = None) -> dict[str, object]:
    """Triton's statistics extension for one model (what perf_analyzer's "Server:" section shows)."""
    return service.statistics(name, version)


@router.get("/models/{name}", response_model=ModelMetadata, responses=_METADATA_ERRORS)
@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata, responses=_METADATA_ERRORS)
async def get_model_metadata(name: str, service: ServiceDep, version: str | None = None) -> dict[str, object]:
    """Model metadata: one BYTES input INPUT_TEXT, outputs OUTPUT_TEXT, INPUT_TOKENS, OUTPUT_TOKENS, SCORE."""
    runner = service.version(name, version)
    info = runner.info
    return model_metadata(runner.name, str(info.version), f"mtgate_{info.runtime}")


@router.get("/models/{name}/config", response_model=ModelConfig, responses=_METADATA_ERRORS)
@router.get("/models/{name}/versions/{version}/config", response_model=ModelConfig, responses=_METADATA_ERRORS)
async def get_model_config(name: str, service: ServiceDep, version: str | None = None) -> dict[str, object]:
    """Triton's model configuration (what perf_analyzer reads first): the tensors, the batching limits."""
    runner = service.version(name, version)
    settings = service.settings
    return model_config(runner.name, f"mtgate_{runner.info.runtime}", max_batch_size=settings.max_batch_size,
                        max_queue_delay_us=settings.max_queue_delay_us, max_queue_size=settings.max_queue_size)


@router.post("/repository/index", response_model=list[RepositoryModel], response_model_exclude_none=True,
             responses=error_responses(400, oip=True))
async def repository_index(request: Request) -> list[dict[str, str]]:
    """Triton's repository index: each model, its versions and their state (a model never loaded by its name
    alone); body ``{"ready": true}`` for ready ones only."""
    options = _json_object(await request.body())
    if not isinstance(options.get("ready", False), bool):
        raise InvalidInput('the body must be a JSON object, {"ready": true} or {"ready": false}')
    return _control(request).index(bool(options.get("ready", False)))


def _json_object(body: bytes) -> dict[str, Any]:
    """An optional JSON object body ({} when empty)."""
    if not body.strip():
        return {}
    document = parse_client_json(body, "the request body")
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object")
    return document


def _parameters(body: bytes) -> dict[str, object]:
    """The ``parameters`` of a load or unload body (``{"parameters": {...}}``, tritonclient's)."""
    parameters = _json_object(body).get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput('"parameters" must be a JSON object')
    return parameters


_CONTROL_ERRORS = error_responses(400, 401, 404, 500, 501, 503, oip=True)


@router.post("/repository/models/{name}/load", responses=_CONTROL_ERRORS)
async def repository_load(name: str, request: Request, _: ApiKeyDep) -> dict[str, object]:
    """Load ``name`` from ``--model-repository`` at the versions its policy chooses (warm before they take requests;
    the versions they replace finish what they admitted); parameter ``config`` may override the version policy. 400
    with the loader's reason when a version fails, 501 without a repository, 503 when the repository is polled."""
    await _control(request).load(name, _parameters(await request.body()))
    return {}


@router.post("/repository/models/{name}/unload", responses=_CONTROL_ERRORS)
async def repository_unload(name: str, request: Request, _: ApiKeyDep) -> dict[str, object]:
    """Stop serving ``name`` (its admitted requests finish first). 501 without a repository, 503 when the repository
    is polled."""
    _parameters(await request.body())  # unload_dependents: there are no dependent models (no ensembles)
    await _control(request).unload(name)
    return {}


@router.post("/models/{name}/infer", openapi_extra=_INFER_BODY, responses=_INFER_RESPONSES)
@router.post("/models/{name}/versions/{version}/infer", openapi_extra=_INFER_BODY, responses=_INFER_RESPONSES)
async def infer(name: str, request: Request, service: ServiceDep, _: ApiKeyDep, version: str | None = None) -> Response:
    """Translate the BYTES input INPUT_TEXT (JSON or binary tensor data)."""
    runner = service.version(name, version)
    body = _decompress(await request.body(), request.headers.get("content-encoding"), service.settings.max_body_bytes)
    parsed = parse_infer_request(body, request.headers.get("inference-header-content-length"))
    timeout_us = parsed.int_parameter("timeout")
    admission = service.limits.admission(parsed.decoding(), request_started(request),
                                         None if not timeout_us else timeout_us / 1e6, label="parameter {!r}",
                                         tag=request_id(request), target_prefix=parsed.target_prefixes())
    runner, translations = await unless_disconnected(request, service.translate(runner, parsed.texts, admission))
    content, headers = encode_infer_response(parsed, runner.name, str(runner.info.version), translations)
    return Response(content=content, headers=headers)


def _decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    if not encoding or encoding.strip().lower() == "identity":
        return body
    kind = encoding.strip().lower()
    if kind not in ("gzip", "deflate"):
        raise InvalidInput(f"unsupported Content-Encoding {encoding!r} (supported: gzip, deflate)")
    decoder = zlib.decompressobj(wbits=31 if kind == "gzip" else 15)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as e:
        raise InvalidInput(f"body is not valid {kind} data ({e})") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise LimitExceeded(f"decompressed body larger than {limit} bytes (max_body_bytes)", limit="max_body_bytes")
    return out
