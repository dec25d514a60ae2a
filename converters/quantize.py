"""ONNX int8: onnxruntime dynamic quantization of the weight matmuls and embeddings.

Weights become int8 (per output channel by default), activations are quantized per batch at run time
(``DynamicQuantizeMatMul``). Only matmuls with a constant weight and the token-embedding gathers are quantized:
attention score/context matmuls, the position table and the caches stay float32.

The logits ``Gemm(h, E, transB=1)`` (fp32 graphs use it so a tied embedding is stored once) is rewritten to
``MatMul(h, E^T)`` first, because onnxruntime quantizes MatMul, not Gemm; the output projection is the largest
matrix of a translation model and must not stay float32.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.onnx_emitter import SHORTLIST_NODES

logger = logging.getLogger(__name__)

# Measured (teacher-forced next-token agreement with fp32 over 48 Multi30k sentences x 30 steps, random-weight
# Marian models: three tiny d32 seeds and one d512 opus-mt-en-de-shaped, on an AVX2 CPU without VNNI):
#   per-channel             0.79 / 0.93 / 0.74 / 0.985
#   per-channel + 7-bit     0.979 / 0.983 / 0.990 / 0.998   <- chosen
#   per-tensor              0.974 / 0.976 / 0.975 / 0.988
#   per-tensor + 7-bit      0.962 / 0.978 / 0.967 / 0.956
# Full-range 8-bit per-channel weights overflow the int16 pair sums of AVX2's u8*s8 kernel (VPMADDUBSW);
# reduce_range (7-bit weights) avoids that and, per channel, keeps the resolution.
PER_CHANNEL = True
REDUCE_RANGE = True


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    # onnxruntime.quantization logs advice and per-tensor notes on the root logger; keep them out of CLI output.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def _gemm_to_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace ``Gemm(x, W, [b], transB=1)`` with constant W by ``MatMul(x, W^T) [+ b]``."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type == "Gemm" and node.input[1] in inits and attrs.get("transB", 0) == 1
                and attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0):
            kernel = numpy_helper.to_array(inits[node.input[1]]).T
            kernel_name = node.input[1] + ".T"
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(kernel), kernel_name))
            has_bias = len(node.input) > 2 and node.input[2] != ""
            matmul_out = node.output[0] + ".matmul" if has_bias else node.output[0]
            nodes.append(helper.make_node("MatMul", [node.input[0], kernel_name], [matmul_out],
                                          name=node.name + ".matmul"))
            if has_bias:
                nodes.append(helper.make_node("Add", [matmul_out, node.input[2]], [node.output[0]],
                                              name=node.name + ".bias"))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    # The original [V, D] matrix may now only feed the embedding Gather, or nothing.
    used = {name for node in graph.node for name in node.input}
    keep = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return model


def _quantized_shortlist_projection(model: onnx.ModelProto, reduce_range: bool) -> onnx.ModelProto:
    """A shortlist decoder's projection onto the gathered output rows (``Gather(table, vocab_ids)`` then ``Gemm(h,
    rows, [bias], transB=1)``) in int8, as the other matmuls: the table quantized per row (per output channel, 7-bit
    with ``reduce_range``), its gathered rows multiplied with ONNX Runtime's ``DynamicQuantizeMatMul`` (the hidden
    states quantized per call), scaled by their rows' scales. quantize_dynamic cannot do it (the rows are not a
    constant), and quantizing a tied embedding table for the input gather would otherwise make the gather read the
    whole table dequantized, every step."""
    inits = {init.name: init for init in model.graph.initializer}
    gathers = {node.output[0]: node for node in model.graph.node
               if node.name.startswith(f"{SHORTLIST_NODES}.rows") and node.op_type == "Gather"}
    if not gathers:
        return model
    limit = 63.0 if reduce_range else 127.0
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.output[0] in gathers:
            continue  # replaced with the int8 gather below, at its Gemm
        if node.op_type != "Gemm" or node.input[1] not in gathers:
            nodes.append(node)
            continue
        gather = gathers[node.input[1]]
        table = numpy_helper.to_array(inits[gather.input[0]]).astype(np.float32)
        scale = np.abs(table).max(axis=1) / limit
        scale[scale == 0] = 1.0
        quantized = np.clip(np.round(table / scale[:, None]), -limit, limit).astype(np.int8)
        prefix = f"{SHORTLIST_NODES}.int8"
        model.graph.initializer.extend([numpy_helper.from_array(quantized, f"{prefix}.table"),
                                        numpy_helper.from_array(scale.astype(np.float32), f"{prefix}.scale")])
        ids = gather.input[1]
        nodes += [
            helper.make_node("Gather", [f"{prefix}.table", ids], [f"{prefix}.rows"], name=f"{prefix}.rows", axis=0),
            helper.make_node("Transpose", [f"{prefix}.rows"], [f"{prefix}.columns"], name=f"{prefix}.columns",
                             perm=[1, 0]),
            helper.make_node("Gather", [f"{prefix}.scale", ids], [f"{prefix}.scales"], name=f"{prefix}.scales", axis=0),
            helper.make_node("DynamicQuantizeMatMul",
                             [node.input[0], f"{prefix}.columns", f"{prefix}.scales", "",
                              *(node.input[2:3] if len(node.input) > 2 else [])],
                             [node.output[0]], name=f"{prefix}.matmul", domain="com.microsoft"),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in model.graph.node for name in node.input}
    keep = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _nodes_to_quantize(model: onnx.ModelProto) -> list[str]:
    """MatMuls with a constant weight and Gathers from a token-embedding table (a shortlist decoder's projection is
    already int8: ``_quantized_shortlist_projection``)."""
    inits = {init.name for init in model.graph.initializer}
    names: list[str] = []
    for node in model.graph.node:
        if node.name.startswith(SHORTLIST_NODES):  # the shortlist projection: int8 already (its bias stays float32)
            continue
        if node.op_type == "MatMul" and node.input[1] in inits:
            names.append(node.name)
        elif node.op_type == "Gather" and node.input[0] in inits and node.input[0].endswith("embed_tokens"):
            names.append(node.name)
    return names


def quantize_onnx_int8(onnx_path: Path, out_path: Path, *, per_channel: bool = PER_CHANNEL,
                       reduce_range: bool = REDUCE_RANGE) -> Path:
    """Write the int8 version of one fp32 graph.

    Arguments:
        onnx_path: an fp32 graph written by ``emit_onnx``.
        out_path: where to write the int8 graph.
        per_channel: one scale per output channel (else per tensor).
        reduce_range: 7-bit weights.

    Returns:
        ``out_path``.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = _quantized_shortlist_projection(_gemm_to_matmul(onnx.load(str(onnx_path))), reduce_range)
    nodes = _nodes_to_quantize(model)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp, _quiet_root_logger():
        prepared = Path(tmp) / onnx_path.name
        onnx.save_model(model, str(prepared))
        quantize_dynamic(
            str(prepared),
            str(out_path),
            per_channel=per_channel,
            reduce_range=reduce_range,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes,
            # DefaultTensorType: shape inference cannot type the outputs of contrib ops (the stationary decoder's
            # GroupQueryAttention); every activation of these graphs is float32.
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    logger.info("wrote %s (%d nodes quantized, per_channel=%s, reduce_range=%s)", out_path, len(nodes), per_channel,
                reduce_range)
    return out_path
