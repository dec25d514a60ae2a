"""The runtime contract: one encoder call per batch, one decoder-step call per generated token.

Graph I/O is fixed in docs/architecture.md; every backend runs the same two graphs (ONNX, or OpenVINO IR derived
from it). A backend owns one session per graph and is used from one thread at a time (the batcher's worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from serving.package import PackageError, cross_names, past_names, stacked


@dataclass(frozen=True)
class EncoderOutput:
    """What the encoder returns for a batch.

    Attributes:
        memory: final encoder states ``[B, S, D]``.
        cross_kv: every decoder layer's cross-attention keys (0) and values (1), ``[L, 2, B, H, S, Dh]``.
        src_bias: additive attention bias ``[B, 1, 1, S]``: 0 at tokens, a large negative number at padding.
        candidates: ``[B, V]`` bool, the target ids each sentence may produce, from a backend that decodes with a
            vocabulary shortlist (``serving.engine.shortlist``); None: every id.
    """

    memory: np.ndarray
    cross_kv: np.ndarray
    src_bias: np.ndarray
    candidates: np.ndarray | None = None


@runtime_checkable
class Backend(Protocol):
    """Runs the encoder and the decoder-step graphs; rows of one decoder call may be at different steps (what
    step-level batching needs; request-level decoding runs them all at one step)."""

    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        """Encode right-padded source ids ``[B, S]`` (int64)."""
        ...

    def decode_step(
        self,
        input_ids: np.ndarray,
        step: int | np.ndarray,
        past_kv: np.ndarray,
        cross_kv: np.ndarray,
        src_bias: np.ndarray,
        self_bias: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Feed one token per row (``[B, 1]``) at position ``step`` (one for every row, or ``[B]``: one per row);
        return ``(log_probs [B, V], present_kv)``. ``self_bias [B, 1, 1, T]`` masks cache slots (None: none)."""
        ...


class BackendUnavailable(RuntimeError):
    """The runtime a backend needs is not installed (the message says which package to install)."""


_Session = TypeVar("_Session")


def open_graph(runtime: str, path: Path, load: Callable[[], _Session]) -> _Session:
    """``load()`` (the runtime's session creation for the graph at ``path``), its failure as one line.

    Raises:
        PackageError: the runtime cannot load the file (truncated, corrupt, not a graph), naming the file.
    """
    try:
        return load()
    except Exception as e:  # each runtime raises its own types (InvalidProtobuf, RuntimeError, ...)
        lines = str(e).strip().splitlines() or [type(e).__name__]
        reason = lines[0] if len(lines[0]) <= 300 else lines[0][:300] + "..."
        raise PackageError(f"{path}: {runtime} cannot load this graph (truncated or corrupt?): {reason}") from e


def empty_past(cross_kv: np.ndarray) -> np.ndarray:
    """The step-0 self-attention cache ``[L, 2, B, H, 0, Dh]`` matching an encoder output's ``cross_kv``."""
    layers, _, batch, heads, _, head_dim = cross_kv.shape
    return np.zeros((layers, 2, batch, heads, 0, head_dim), dtype=np.float32)


def decoder_feeds(
    input_ids: np.ndarray,
    step: int | np.ndarray,
    past_kv: np.ndarray,
    cross_kv: np.ndarray,
    src_bias: np.ndarray,
    self_bias: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The decoder-step graph's inputs: the stacked caches ``[L, 2, ...]`` become one view per layer and kind
    (``past_k.0``, ``past_v.0``, ...; no copy when they are float32 and C-contiguous); ``step`` becomes one position
    per row, and a missing ``self_bias`` masks nothing."""
    past_kv, cross_kv = as_floats(past_kv), as_floats(cross_kv)
    layers, _, rows, _, past_len, _ = past_kv.shape
    if np.ndim(step) == 0:
        position_ids = np.full((rows, 1), int(step), dtype=np.int64)
    else:
        position_ids = np.ascontiguousarray(np.reshape(step, (rows, 1)), dtype=np.int64)
    if self_bias is None:
        self_bias = np.zeros((rows, 1, 1, past_len), dtype=np.float32)
    feeds = {"input_ids": as_ids(input_ids), "position_ids": position_ids, "src_bias": as_floats(src_bias),
             "self_bias": as_floats(self_bias)}
    for names, cache in ((past_names(layers), past_kv), (cross_names(layers), cross_kv)):
        for name, index in stacked(names):
            feeds[name] = cache[index]
    return feeds


def as_ids(input_ids: np.ndarray) -> np.ndarray:
    """int64, C-contiguous (no copy when it already is)."""
    return np.ascontiguousarray(input_ids, dtype=np.int64)


def as_floats(array: np.ndarray) -> np.ndarray:
    """float32, C-contiguous (no copy when it already is)."""
    return np.ascontiguousarray(array, dtype=np.float32)
