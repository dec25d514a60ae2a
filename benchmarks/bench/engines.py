"""The engines of the comparison: mtgate's (one per runtime x precision of the package) and the peers'."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serving.package import PRECISIONS, RUNTIMES


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the comparison.

    Attributes:
        id: stable identifier (``mtgate-onnxruntime-fp32``, ``ct2-int8``...).
        label: what the tables show.
        family: ``mtgate`` or ``peer``.
        precision: weights/compute precision as the engine's users name it.
        fp32: float32 weights and compute: must generate the reference's tokens.
        runtime: the mtgate runtime (mtgate engines only).
        artifact: the peer artifact it loads (``benchmarks/peers.py prepare``), None for the HF directory itself.
    """

    id: str
    label: str
    family: str
    precision: str
    fp32: bool
    runtime: str | None = None
    artifact: str | None = None


PEER_ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("transformers-fp32", "transformers fp32", "peer", "fp32", True),
    EngineSpec("ct2-float32", "CTranslate2 float32", "peer", "float32", True, artifact="ct2-float32"),
    EngineSpec("ct2-int8", "CTranslate2 int8", "peer", "int8", False, artifact="ct2-int8"),
    EngineSpec("ort-fp32", "optimum ONNX Runtime fp32", "peer", "fp32", True, artifact="ort-fp32"),
    EngineSpec("ort-int8", "optimum ONNX Runtime int8 (dynamic)", "peer", "int8", False, artifact="ort-int8"),
    EngineSpec("ov-fp32", "optimum-intel OpenVINO fp32", "peer", "fp32", True, artifact="ov-fp32"),
    EngineSpec("ov-default", "optimum-intel OpenVINO default", "peer", "default", False, artifact="ov-fp32"),
    EngineSpec("ov-int8", "optimum-intel OpenVINO int8 weights", "peer", "int8-weights", False, artifact="ov-int8"),
)

# The real-text mode's peers (``--text``, benchmarks/peers_text.py): text in, text out. CTranslate2 converted by its
# own ``ct2-transformers-converter`` (int8 weights for both int8 compute types, float32 weights for float32).
TEXT_PEER_ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("transformers-fp32", "transformers fp32", "peer", "fp32", True),
    EngineSpec("ct2-int8", "CTranslate2 int8", "peer", "int8", False, artifact="ct2-cli-int8"),
    EngineSpec("ct2-int8_float32", "CTranslate2 int8_float32", "peer", "int8_float32", False,
               artifact="ct2-cli-int8"),
    EngineSpec("ct2-float32", "CTranslate2 float32", "peer", "float32", True, artifact="ct2-cli-float32"),
)


def mtgate_engines(runtimes: Sequence[str] = RUNTIMES, precisions: Sequence[str] = PRECISIONS) -> list[EngineSpec]:
    """The mtgate engines for the given runtimes x precisions."""
    names = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}
    return [
        EngineSpec(f"mtgate-{runtime}-{precision}", f"mtgate {names.get(runtime, runtime)} {precision}", "mtgate",
                   precision, precision == "fp32", runtime=runtime)
        for runtime in runtimes
        for precision in precisions
    ]
