"""ONNX -> OpenVINO IR (``openvino.convert_model`` + ``save_model``), and int8 weight compression with NNCF.

The IR is always derived from the package's ONNX graphs, never from a checkpoint, so both runtimes run the same
graph. fp32 IR keeps float32 weights (``compress_to_fp16=False``); the int8 IR compresses the weights of every
MatMul/Gemm/Gather (embedding) to 8 bits with NNCF, activations stay f32.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# NNCF's weight-compression mode for the int8 artifact (per-output-channel, activations stay f32). Teacher-forced
# next-token agreement with fp32 (same protocol as converters/quantize.py): INT8_ASYM 0.993 / 0.992 / 0.992 / 0.998,
# INT8_SYM 0.987 / 0.990 / 0.988 / 0.999 on the four random-weight test models.
INT8_MODE = "INT8_ASYM"


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as e:  # pragma: no cover - a conversion dependency
        raise RuntimeError("OpenVINO artifacts need the 'openvino' package (pip install openvino)") from e
    return openvino


def onnx_to_openvino(onnx_path: Path, xml_path: Path) -> Path:
    """Convert one ONNX graph to IR at ``xml_path`` (``.bin`` beside it), weights kept in float32.

    Returns:
        ``xml_path``.
    """
    ov = _openvino()
    model = ov.convert_model(str(onnx_path))
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(xml_path), compress_to_fp16=False)
    logger.info("wrote %s", xml_path)
    return xml_path


def compress_int8(model_path: Path, out_xml: Path, mode: str = INT8_MODE) -> Path:
    """Compress an fp32 graph's weights to 8 bits with NNCF (data-free) and save the IR at ``out_xml``.

    Arguments:
        model_path: the fp32 ONNX graph (or IR).
        out_xml: where to write the int8 IR.
        mode: an ``nncf.CompressWeightsMode`` name (``INT8_ASYM`` or ``INT8_SYM``).
    """
    ov = _openvino()
    try:
        import nncf
    except ImportError as e:  # pragma: no cover - a conversion dependency
        raise RuntimeError("int8 OpenVINO artifacts need the 'nncf' package (pip install nncf)") from e
    nncf.set_log_level(logging.WARNING)
    model = ov.Core().read_model(str(model_path))
    # NNCF draws a rich progress bar and a statistics table on stdout; a CLI's stdout is for its own results.
    with contextlib.redirect_stdout(io.StringIO()):
        compressed = nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, mode))
    out_xml.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(compressed, str(out_xml), compress_to_fp16=False)
    logger.info("wrote %s (%s)", out_xml, mode)
    return out_xml
