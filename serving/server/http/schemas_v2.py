"""The ``/v2`` routes' response schemas (Open Inference Protocol: health, metadata, infer; Triton's extensions:
model configuration, statistics, repository index); the request schemas and error bodies are ``serving.server.http.schemas``'."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class LiveResponse(BaseModel):
    """``GET /v2/health/live``."""

    live: bool


class ReadyResponse(BaseModel):
    """``GET /v2/health/ready``: 200 with ``true`` once every model is loaded and warm, else 503 with ``false``."""

    ready: bool


class ModelReadyResponse(BaseModel):
    """``GET /v2/models/{name}/ready``: 200 with ``true`` when the model can take requests, else 503 with ``false``
    and, as Triton answers, an ``error`` message."""

    name: str
    ready: bool
    error: str | None = None


class ServerMetadata(BaseModel):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """``GET /v2/models/{name}``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ConfigTensor(BaseModel):
    name: str
    data_type: str
    dims: list[int]


class ModelConfig(BaseModel):
    """``GET /v2/models/{name}/config``: Triton's ModelConfig in JSON (``serving.server.oip.model_config``)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    input: list[ConfigTensor]
    output: list[ConfigTensor]
    dynamic_batching: dict[str, Any]
    instance_group: list[dict[str, Any]]


class StatDuration(BaseModel):
    count: int
    ns: int


class InferenceStatistics(BaseModel):
    success: StatDuration
    fail: StatDuration
    queue: StatDuration
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration
    cache_hit: StatDuration
    cache_miss: StatDuration


class BatchSizeStatistics(BaseModel):
    batch_size: int
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration


class ModelStatisticsEntry(BaseModel):
    name: str
    version: str
    last_inference: int = Field(description="milliseconds since the epoch of the last batch, 0 before any")
    inference_count: int = Field(description="sentences translated")
    execution_count: int = Field(description="engine batches run")
    inference_stats: InferenceStatistics
    batch_stats: list[BatchSizeStatistics]
    memory_usage: list[dict[str, Any]]


class ModelStatisticsResponse(BaseModel):
    """``GET /v2/models[/{name}[/versions/{v}]]/stats``: Triton's statistics extension (``serving.server.statistics``)."""

    model_stats: list[ModelStatisticsEntry]


class RepositoryModel(BaseModel):
    """One entry of ``POST /v2/repository/index`` (Triton's model repository extension)."""

    name: str
    version: str | None = Field(default=None, description="absent for a model no version of which was loaded yet")
    state: str | None = Field(default=None, description="READY, LOADING, or UNAVAILABLE (then `reason` says why: "
                              "the loader's refusal, `unloaded`); absent for a model never loaded")
    reason: str | None = None


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = Field(default=None, description="absent when the tensor is sent as binary data")
    parameters: dict[str, Any] | None = Field(default=None, description="binary_data_size for binary outputs")


class InferResponse(BaseModel):
    """The JSON of an infer response (with binary outputs: its header, followed by the tensors' bytes)."""

    id: str | None = None
    model_name: str
    model_version: str
    outputs: list[OutputTensor]
