"""ONNX Runtime backend: one InferenceSession per graph, CPU execution provider, all graph optimizations on."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from serving.backends.base import BackendUnavailable, EncoderOutput, as_floats, as_ids

logger = logging.getLogger(__name__)

_ENCODER_OUTPUTS = ["memory", "cross_kv", "src_bias"]
_DECODER_OUTPUTS = ["log_probs", "present_kv"]


def session_options(threads: int | None) -> Any:
    """SessionOptions for one graph: ``threads`` intra-op threads (None: ONNX Runtime's default, all cores)."""
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover - onnxruntime is a runtime dependency
        raise BackendUnavailable("the onnxruntime backend needs the 'onnxruntime' package") from e
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    options.log_severity_level = 3
    return options


class OnnxRuntimeBackend:
    """Runs ``encoder.onnx`` and ``decoder.onnx`` with ONNX Runtime on CPU.

    Arguments:
        encoder_path: the encoder graph.
        decoder_path: the decoder-step graph.
        threads: intra-op threads per session (None: all cores).
    """

    runtime = "onnxruntime"

    def __init__(self, encoder_path: Path, decoder_path: Path, threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:  # pragma: no cover
            raise BackendUnavailable("the onnxruntime backend needs the 'onnxruntime' package") from e
        providers = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(encoder_path), session_options(threads), providers=providers)
        self.decoder = ort.InferenceSession(str(decoder_path), session_options(threads), providers=providers)
        self.threads = threads
        logger.info("onnxruntime %s: loaded %s, %s (threads=%s)", ort.__version__, encoder_path, decoder_path,
                    threads)

    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        memory, cross_kv, src_bias = self.encoder.run(_ENCODER_OUTPUTS, {"input_ids": as_ids(input_ids)})
        return EncoderOutput(memory=memory, cross_kv=cross_kv, src_bias=src_bias)

    def decode_step(
        self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray, src_bias: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        log_probs, present_kv = self.decoder.run(
            _DECODER_OUTPUTS,
            {
                "input_ids": as_ids(input_ids),
                "step": np.array(step, dtype=np.int64),
                "past_kv": as_floats(past_kv),
                "cross_kv": as_floats(cross_kv),
                "src_bias": as_floats(src_bias),
            },
        )
        return log_probs, present_kv
