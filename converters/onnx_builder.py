"""The node-by-node ONNX builder ``converters.onnx_emitter`` writes both graphs with: unique names, initializers,
constants (:class:`GraphBuilder`) and the sub-layers every stack is made of (:class:`SubLayers`: linear, norm,
activations, FFN, residual placement, fused QKV, positions, embeddings)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.spec import Stack, TransformerSpec

OPSET = 17


class GraphBuilder:
    """A small builder: unique names, initializers, nodes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counter = 0
        self._consts: dict[tuple[str, bytes], str] = {}

    def _fresh(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}_{self._counter}"

    def weight(self, name: str, array: np.ndarray) -> str:
        # np.ascontiguousarray would turn a 0-d array into 1-d; scalar Gather indices must stay 0-d.
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def const(self, values: int | list[int] | list[float] | np.ndarray, dtype: type = np.int64) -> str:
        array: np.ndarray = np.asarray(values, dtype=dtype)
        key = (str(array.dtype) + str(array.shape), array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight(self._fresh("const"), array)
        return self._consts[key]

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        output = self._fresh(hint or op_type.lower())
        # Nodes are named after their output: quantization and profiling select nodes by name.
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def rename_output(self, value: str, name: str) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [name], name=f"{name}_output"))

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mtgate")
        model.ir_version = 8  # opset 17's IR; readable by every runtime version we support
        model.doc_string = doc
        return model


class SubLayers:
    """Shared sub-layers over one spec, shaped as one of its stacks (heads, activation, norm placement)."""

    def __init__(self, spec: TransformerSpec, g: GraphBuilder, stack: Stack) -> None:
        self.spec = spec
        self.c = spec.config
        self.stack = stack
        self.w = spec.weights
        self.g = g
        self.d = self.c.d_model
        self.h = stack.heads
        self.dh = stack.head_dim

    def linear(self, x: str, prefix: str, kernel: np.ndarray | None = None, bias: np.ndarray | None = None) -> str:
        kernel = self.w[f"{prefix}.weight"] if kernel is None else kernel
        if bias is None:
            bias = self.w.get(f"{prefix}.bias")
        y = self.g.op("MatMul", [x, self.g.weight(f"{prefix}.weight", kernel)], hint=f"{prefix}.matmul")
        if bias is not None:
            y = self.g.op("Add", [y, self.g.weight(f"{prefix}.bias", bias)], hint=f"{prefix}.add")
        return y

    def norm(self, x: str, prefix: str) -> str:
        scale = self.g.weight(f"{prefix}.scale", self.w[f"{prefix}.scale"])
        bias = self.g.weight(f"{prefix}.bias", self.w[f"{prefix}.bias"])
        return self.g.op("LayerNormalization", [x, scale, bias], hint=prefix, axis=-1,
                         epsilon=float(self.c.norm_epsilon))

    def activation(self, x: str) -> str:
        kind, g = self.stack.activation, self.g
        if kind == "relu":
            return g.op("Relu", [x])
        if kind == "swish":
            return g.op("Mul", [x, g.op("Sigmoid", [x])], hint="swish")
        if kind == "gelu_sigmoid":
            return g.op("Mul", [x, g.op("Sigmoid", [g.op("Mul", [x, g.const([1.702], np.float32)])])], hint="gelu_sig")
        if kind == "gelu_tanh":
            # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); ONNX Runtime fuses this pattern into FastGelu.
            cube = g.op("Mul", [g.op("Mul", [x, x]), x])
            inner = g.op("Add", [x, g.op("Mul", [cube, g.const([0.044715], np.float32)])])
            tanh = g.op("Tanh", [g.op("Mul", [inner, g.const([math.sqrt(2.0 / math.pi)], np.float32)])])
            one_plus = g.op("Add", [tanh, g.const([1.0], np.float32)])
            return g.op("Mul", [g.op("Mul", [x, g.const([0.5], np.float32)]), one_plus], hint="gelu_tanh")
        # Exact (erf) GELU; ONNX Runtime fuses this pattern into its Gelu kernel.
        erf = g.op("Erf", [g.op("Mul", [x, g.const([1.0 / math.sqrt(2.0)], np.float32)])])
        one_plus = g.op("Add", [erf, g.const([1.0], np.float32)])
        return g.op("Mul", [g.op("Mul", [x, g.const([0.5], np.float32)]), one_plus], hint="gelu")

    def ffn(self, x: str, prefix: str) -> str:
        return self.linear(self.activation(self.linear(x, f"{prefix}.fc1")), f"{prefix}.fc2")

    def sublayer(self, x: str, prefix: str, body: str, fn: Callable[[str], str]) -> str:
        """Residual + norm around ``fn``: pre-norm ``x + f(LN(x))`` or post-norm ``LN(x + f(x))``."""
        if self.stack.pre_norm:
            return self.g.op("Add", [x, fn(self.norm(x, f"{prefix}.{body}_norm"))], hint=f"{prefix}.{body}_res")
        return self.norm(self.g.op("Add", [x, fn(x)], hint=f"{prefix}.{body}_res"), f"{prefix}.{body}_norm")

    def qkv_weights(self, prefix: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Fused [D, 3D] kernel (q | k | v) with the 1/sqrt(Dh) query scale folded in."""
        scale = np.float32(self.dh ** -0.5)
        kernel = np.concatenate([self.w[f"{prefix}.q.weight"] * scale, self.w[f"{prefix}.k.weight"],
                                 self.w[f"{prefix}.v.weight"]], axis=1)
        bias = None
        if self.c.attention_bias:
            bias = np.concatenate([self.w[f"{prefix}.q.bias"] * scale, self.w[f"{prefix}.k.bias"],
                                   self.w[f"{prefix}.v.bias"]])
        return kernel, bias

    def query(self, x: str, prefix: str) -> str:
        scale = np.float32(self.dh ** -0.5)
        bias = self.w.get(f"{prefix}.q.bias")
        return self.linear(x, f"{prefix}.q", kernel=self.w[f"{prefix}.q.weight"] * scale,
                           bias=None if bias is None else bias * scale)

    def output_projection(self, ctx: str, prefix: str) -> str:
        return self.linear(ctx, f"{prefix}.o")

    def positions(self, side: str) -> str:
        """The position table of ``side`` (``encoder``/``decoder``): the shared one, or the stack's own."""
        name = "positions" if self.c.shared_positions else f"{side}.positions"
        return self.g.weight(name, self.w[name])

    def embed_norm(self, x: str, side: str) -> str:
        """The layer norm after the embedding, when the stack has one."""
        return self.norm(x, f"{side}.embed_norm") if self.stack.embed_norm else x

    def input_embedding_table(self, table: np.ndarray, fold_zero_row: bool) -> np.ndarray:
        """Embedding with the scale folded in (and the zero-embedding row zeroed when allowed)."""
        out = table * np.float32(self.c.embedding_scale)
        zero_id = self.spec.special_ids.zero_embedding_id
        if fold_zero_row and zero_id is not None:
            out[zero_id] = 0.0
        return out.astype(np.float32)
