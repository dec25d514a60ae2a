"""OpenVINO backend: the IR (``encoder.xml``/``decoder.xml``) compiled for CPU, f32 inference precision.

OpenVINO's CPU plugin would otherwise pick bf16 on CPUs that have it, which changes results well beyond 1e-4;
the precision hint keeps activations in f32 (int8 artifacts only compress weights).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.backends.base import BackendUnavailable, EncoderOutput, as_ids, decoder_feeds, open_graph
from serving.package import present_names, stacked

logger = logging.getLogger(__name__)


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as e:  # pragma: no cover - openvino is a runtime dependency
        raise BackendUnavailable("the openvino backend needs the 'openvino' package") from e
    return openvino


def compile_config(threads: int | None, precision: str = "f32") -> dict[str, Any]:
    """CPU plugin properties: latency hint, one stream, ``threads`` inference threads, f32 activations."""
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": "1",
        "INFERENCE_PRECISION_HINT": precision,
    }
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


class OpenVinoBackend:
    """Runs the OpenVINO IR of the encoder and decoder-step graphs on CPU.

    Arguments:
        encoder_path: ``encoder.xml`` (its ``.bin`` beside it).
        decoder_path: ``decoder.xml``.
        threads: inference threads per compiled model (None: OpenVINO's default).
    """

    runtime = "openvino"

    def __init__(self, encoder_path: Path, decoder_path: Path, threads: int | None = None) -> None:
        ov = _openvino()
        core = ov.Core()
        config = compile_config(threads)
        self.encoder = open_graph(self.runtime, encoder_path,
                                  lambda: core.compile_model(str(encoder_path), "CPU", config))
        self.decoder = open_graph(self.runtime, decoder_path,
                                  lambda: core.compile_model(str(decoder_path), "CPU", config))
        # One request per graph, reused: the backend is used from one thread at a time.
        self._encoder_request = self.encoder.create_infer_request()
        self._decoder_request = self.decoder.create_infer_request()
        self.threads = threads
        used = self.encoder.get_property("INFERENCE_NUM_THREADS")  # what the plugin chose when not told
        logger.info("openvino %s: loaded %s, %s (threads=%s%s)", ov.__version__, encoder_path, decoder_path, used,
                    "" if threads is not None else ", OpenVINO's default")

    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        # share_outputs=False: the results must survive the next call, which reuses the request's buffers.
        result = self._encoder_request.infer({"input_ids": as_ids(input_ids)}, share_inputs=True,
                                             share_outputs=False)
        return EncoderOutput(memory=result["memory"], cross_kv=result["cross_kv"], src_bias=result["src_bias"])

    def decode_step(
        self,
        input_ids: np.ndarray,
        step: int | np.ndarray,
        past_kv: np.ndarray,
        cross_kv: np.ndarray,
        src_bias: np.ndarray,
        self_bias: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        feeds = decoder_feeds(input_ids, step, past_kv, cross_kv, src_bias, self_bias)
        # share_outputs=True: views of the request's buffers, copied once into the stacked cache below.
        result = self._decoder_request.infer(feeds, share_inputs=True, share_outputs=True)
        layers, _, rows, heads, past_len, head_dim = past_kv.shape
        present_kv = np.empty((layers, 2, rows, heads, past_len + 1, head_dim), dtype=np.float32)
        for name, index in stacked(present_names(layers)):
            present_kv[index] = result[name]
        return np.array(result["log_probs"], dtype=np.float32), present_kv
