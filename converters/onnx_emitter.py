"""TransformerSpec -> two ONNX graphs: ``encoder.onnx`` and the one-token ``decoder.onnx`` step.

Built node by node with ``onnx.helper`` (no tracing, ``converters.onnx_builder``), opset 17: standard ops only, but
for the stationary decoder's self-attention (ONNX Runtime's ``com.microsoft.GroupQueryAttention``), so that the
encoder and the growing decoder run on ONNX Runtime and OpenVINO alike. I/O names and shapes are the contract in
docs/architecture.md:

- encoder: ``input_ids [B,S]`` -> ``memory [B,S,D]``, ``cross_kv [L,2,B,H,S,Dh]``, ``src_bias [B,1,1,S]``
- decoder, two cache contracts (``DecoderCache``); each row has its own position, so rows at different steps share
  one batch (step-level batching):

  - ``stationary`` (ONNX Runtime; package format 4): ``input_ids [B,1]``, ``position_ids [B,1]`` (int64), the caches
    ``past_k.{i}``/``past_v.{i}`` ``[B,H,M,Dh]`` (a fixed capacity ``M``; row ``b`` has filled slots
    ``0..position_ids[b]-1``), ``cross_k.{i}``/``cross_v.{i}``, ``src_bias [B,1,1,S]``, ``row_order [B]`` (int64:
    output row ``i`` is input row ``row_order[i]``) -> ``log_probs [B,V]`` (in ``row_order``),
    ``present_k.{i}``/``present_v.{i}`` ``[B,H,M,Dh]``: the past caches with each row's new key/value written at its
    position. Self-attention is ONNX Runtime's ``com.microsoft.GroupQueryAttention`` (one kv head per head), which
    attends over each row's own slots only and, when the caller binds each present cache to its past one, writes
    in place: nothing is copied per step (``serving.engine.rows.SlotRows``).
  - ``growing`` (OpenVINO IR is derived from it): standard ops only; the caches are ``[B,H,T,Dh]`` with a
    ``self_bias [B,1,1,T]`` input masking slots a row has not filled, and the present caches ``[B,H,T+1,Dh]``.

Speed choices:
- the encoder projects every decoder layer's cross-attention keys/values in ONE matmul (``[D, L*2*D]``), once per
  sentence;
- self-attention uses one fused QKV matmul; ``1/sqrt(Dh)`` is folded into the query weights;
- the growing decoder never concatenates a layer's cache: it scores the past keys and the new key separately and
  softmaxes the concatenated scores, then grows the whole cache with one concat at the end (one cache copy per
  step); the stationary one copies nothing;
- the encoder's embedding copy has the scale (and a zero row for ``zero_embedding_id``) folded in;
- logits use ``Gemm(transB=1)`` on the [V, D] embedding, so a tied matrix is stored once in the decoder.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper

from converters.onnx_builder import GraphBuilder, SubLayers
from converters.spec import MASK_VALUE, TransformerSpec, cross_names, past_names, present_names

logger = logging.getLogger(__name__)


DecoderCache = Literal["stationary", "growing"]
STATIONARY_HEAD_MULTIPLE = 8  # ONNX Runtime's GroupQueryAttention refuses other head sizes
SHORTLIST_NODES = "decoder.shortlist"  # name prefix of the shortlist decoder's vocabulary gathers
# Protobuf cannot serialize more than 2 GiB; bigger models keep their weights in an external data file.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def _encoder(spec: TransformerSpec) -> onnx.ModelProto:
    c = spec.config
    g = GraphBuilder("mtgate_encoder")
    e = SubLayers(spec, g, c.encoder)
    d, h, dh = c.d_model, c.encoder.heads, c.encoder.head_dim

    ids = "input_ids"
    table = g.weight("encoder.embed_tokens", e.input_embedding_table(spec.weights["encoder.embed_tokens"], True))
    x = g.op("Gather", [table, ids], hint="embed", axis=0)
    if c.encoder_embed_bias:
        x = g.op("Add", [x, g.weight("encoder.embed_bias", spec.weights["encoder.embed_bias"])], hint="embed_bias")
    seq_len = g.op("Slice", [g.op("Shape", [ids]), g.const([1]), g.const([2])], hint="src_len")
    positions = g.op("Slice", [e.positions("encoder"), g.const([0]), seq_len, g.const([0])], hint="positions")
    x = e.embed_norm(g.op("Add", [x, positions], hint="embed_pos"), "encoder")

    masked = g.op("Equal", [ids, g.const([spec.special_ids.pad])])
    if c.mask_source_eos:  # the model never saw a source EOS: attend as if it were padding
        masked = g.op("Or", [masked, g.op("Equal", [ids, g.const([spec.special_ids.eos])])])
    bias = g.op("Mul", [g.op("Cast", [masked], to=TensorProto.FLOAT), g.const([MASK_VALUE], np.float32)])
    g.rename_output(g.op("Unsqueeze", [bias, g.const([1, 2])]), "src_bias")

    for i in range(c.encoder.layers):
        p = f"encoder.layers.{i}"

        def self_attention(y: str, p: str = p) -> str:
            kernel, qkv_bias = e.qkv_weights(f"{p}.self_attn")
            qkv = e.linear(y, f"{p}.self_attn.qkv", kernel=kernel, bias=qkv_bias)  # [B,S,3D]
            qkv = g.op("Reshape", [qkv, g.const([0, 0, 3, h, dh])])
            qkv = g.op("Transpose", [qkv], perm=[2, 0, 3, 1, 4])  # [3,B,H,S,Dh]
            q, k, v = (g.op("Gather", [qkv, g.const(j)], axis=0) for j in range(3))
            scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])], hint=f"{p}.scores")
            probs = g.op("Softmax", [g.op("Add", [scores, "src_bias"])], axis=-1)
            ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])  # [B,S,H,Dh]
            return e.output_projection(g.op("Reshape", [ctx, g.const([0, 0, d])]), f"{p}.self_attn")

        x = e.sublayer(x, p, "self_attn", self_attention)
        x = e.sublayer(x, p, "ffn", functools.partial(e.ffn, prefix=f"{p}.ffn"))
    if c.encoder.final_norm:
        x = e.norm(x, "encoder.final_norm")
    g.rename_output(x, "memory")

    # Every decoder layer's cross-attention K and V from one [D, L*2*D] matmul, split into the decoder's heads.
    dec = c.decoder
    kernels, biases = [], []
    for i in range(dec.layers):
        for proj in ("k", "v"):
            kernels.append(spec.weights[f"decoder.layers.{i}.cross_attn.{proj}.weight"])
            if c.attention_bias:
                biases.append(spec.weights[f"decoder.layers.{i}.cross_attn.{proj}.bias"])
    kv = e.linear(x, "decoder.cross_kv", kernel=np.concatenate(kernels, axis=1),
                  bias=np.concatenate(biases) if biases else None)
    kv = g.op("Reshape", [kv, g.const([0, 0, dec.layers, 2, dec.heads, dec.head_dim])])
    g.rename_output(g.op("Transpose", [kv], perm=[2, 3, 0, 4, 1, 5]), "cross_kv")

    float_t = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "src_len"])]
    outputs = [
        helper.make_tensor_value_info("memory", float_t, ["batch", "src_len", d]),
        helper.make_tensor_value_info("cross_kv", float_t,
                                      [dec.layers, 2, "batch", dec.heads, "src_len", dec.head_dim]),
        helper.make_tensor_value_info("src_bias", float_t, ["batch", 1, 1, "src_len"]),
    ]
    return g.model(inputs, outputs, "mtgate encoder: input_ids -> memory, cross_kv, src_bias")


def _decoder(spec: TransformerSpec, stationary: bool, shortlist: bool = False) -> onnx.ModelProto:
    c = spec.config
    g = GraphBuilder("mtgate_decoder")
    e = SubLayers(spec, g, c.decoder)
    d, h, dh, n_layers = c.d_model, c.decoder.heads, c.decoder.head_dim, c.decoder.layers
    zero_id = spec.special_ids.zero_embedding_id

    embed_name = "encoder.embed_tokens" if c.shared_embeddings else "decoder.embed_tokens"
    embed = spec.weights[embed_name]
    output_table: str | None = None
    if c.tied_output:
        # One matrix for input and output: keep it raw and apply scale / zero row as cheap [B,1,D] ops.
        table = output_table = g.weight(embed_name, embed)
        x = g.op("Gather", [table, "input_ids"], hint="embed", axis=0)
        if c.embedding_scale != 1.0:
            x = g.op("Mul", [x, g.const([c.embedding_scale], np.float32)], hint="embed_scale")
        if zero_id is not None:
            keep = g.op("Cast", [g.op("Not", [g.op("Equal", [g.op("Unsqueeze", ["input_ids", g.const([2])]),
                                                              g.const([zero_id])])])], to=TensorProto.FLOAT)
            x = g.op("Mul", [x, keep], hint="zero_embedding")
    else:
        table = g.weight(embed_name, e.input_embedding_table(embed, True))
        x = g.op("Gather", [table, "input_ids"], hint="embed", axis=0)
    if c.decoder_start_zero:  # the first step embeds to zeros, whatever its id (Marian NMT)
        started = g.op("Cast", [g.op("Not", [g.op("Equal", ["position_ids", g.const([0])])])], to=TensorProto.FLOAT)
        x = g.op("Mul", [x, g.op("Unsqueeze", [started, g.const([2])])], hint="zero_start")
    position = g.op("Gather", [e.positions("decoder"), "position_ids"], hint="position", axis=0)  # [B,1,D]
    x = e.embed_norm(g.op("Add", [x, position], hint="embed_pos"), "decoder")

    # The caches come and go one tensor per layer and kind ([B,H,T,Dh] each): the runtime reads them where the
    # caller keeps them, with no Gather copying a layer out of a stacked cache.
    if stationary:
        # Each row's cache holds its own positions 0..p-1 in a buffer of fixed capacity; GroupQueryAttention writes
        # the new key/value at the row's position p, in place when the caller binds present to past, and attends
        # over 0..p of that row only.
        seqlens = g.op("Cast", [g.op("Reshape", ["position_ids", g.const([-1])])], to=TensorProto.INT32)
        total = g.op("Cast", [g.op("Add", [g.op("ReduceMax", ["position_ids"], keepdims=0), g.const(1)])],
                     to=TensorProto.INT32)

    def stationary_attention(qkv: str, i: int) -> str:
        out = f"{i}.gqa_out"
        # Packed QKV ([B,1,3D], the fused projection's output as it is): no Split before the attention.
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", [qkv, "", "", f"past_k.{i}", f"past_v.{i}", seqlens, total],
            [out, f"present_k.{i}", f"present_v.{i}"], name=f"decoder.layers.{i}.self_attn.gqa",
            domain="com.microsoft", num_heads=h, kv_num_heads=h, scale=1.0))
        return out

    for i in range(n_layers):
        p = f"decoder.layers.{i}"

        def self_attention(y: str, p: str = p, i: int = i) -> str:
            kernel, qkv_bias = e.qkv_weights(f"{p}.self_attn")
            qkv = e.linear(y, f"{p}.self_attn.qkv", kernel=kernel, bias=qkv_bias)  # [B,1,3D]
            if stationary:
                return e.output_projection(stationary_attention(qkv, i), f"{p}.self_attn")
            qkv = g.op("Transpose", [g.op("Reshape", [qkv, g.const([0, 3, h, 1, dh])])], perm=[1, 0, 2, 3, 4])
            q = g.op("Gather", [qkv, g.const(0)], axis=0)  # [B,H,1,Dh]
            k_new = g.op("Gather", [qkv, g.const(1)], axis=0)
            v_new = g.op("Gather", [qkv, g.const(2)], axis=0)
            past_k, past_v = f"past_k.{i}", f"past_v.{i}"  # [B,H,T,Dh]
            g.rename_output(g.op("Concat", [past_k, k_new], axis=2, hint=f"{p}.present_k"), f"present_k.{i}")
            g.rename_output(g.op("Concat", [past_v, v_new], axis=2, hint=f"{p}.present_v"), f"present_v.{i}")
            # Score the cached keys and the new key apart; no per-layer cache concat.
            scores_past = g.op("MatMul", [q, g.op("Transpose", [past_k], perm=[0, 1, 3, 2])])  # [B,H,1,T]
            scores_past = g.op("Add", [scores_past, "self_bias"])  # masks cache slots a row has not filled
            score_new = g.op("ReduceSum", [g.op("Mul", [q, k_new]), g.const([3])], keepdims=1)  # [B,H,1,1]
            probs = g.op("Softmax", [g.op("Concat", [scores_past, score_new], axis=3)], axis=-1)
            probs_past = g.op("Slice", [probs, g.const([0]), g.const([-1]), g.const([3])])
            prob_new = g.op("Slice", [probs, g.const([-1]), g.const([np.iinfo(np.int64).max]), g.const([3])])
            ctx = g.op("Add", [g.op("MatMul", [probs_past, past_v]), g.op("Mul", [prob_new, v_new])])
            # [B,H,1,Dh] has the memory order of [B,1,H*Dh]: a reshape, no transpose.
            return e.output_projection(g.op("Reshape", [ctx, g.const([0, 1, d])]), f"{p}.self_attn")

        def cross_attention(y: str, p: str = p, i: int = i) -> str:
            q = g.op("Reshape", [e.query(y, f"{p}.cross_attn"), g.const([0, h, 1, dh])])  # [B,H,1,Dh]
            k, v = f"cross_k.{i}", f"cross_v.{i}"  # [B,H,S,Dh]
            scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])  # [B,H,1,S]
            probs = g.op("Softmax", [g.op("Add", [scores, "src_bias"])], axis=-1)
            ctx = g.op("MatMul", [probs, v])
            return e.output_projection(g.op("Reshape", [ctx, g.const([0, 1, d])]), f"{p}.cross_attn")

        x = e.sublayer(x, p, "self_attn", self_attention)
        x = e.sublayer(x, p, "cross_attn", cross_attention)
        x = e.sublayer(x, p, "ffn", functools.partial(e.ffn, prefix=f"{p}.ffn"))
    if c.decoder.final_norm:
        x = e.norm(x, "decoder.final_norm")

    hidden = g.op("Reshape", [x, g.const([0, d])], hint="last_hidden")  # [B,D]
    if stationary:
        # Rows live in cache slots in no particular order; the caller's searches read them in theirs: output row i
        # is the row of slot row_order[i] (gathering [B,D] states here instead of [B,V] log-probs after).
        hidden = g.op("Gather", [hidden, "row_order"], hint="ordered_hidden", axis=0)
    if output_table is None:
        output_table = g.weight("decoder.output_proj", spec.weights["decoder.output_proj"])
    bias = g.weight("decoder.output_bias", spec.weights["decoder.output_bias"]) if c.logits_bias else None
    if shortlist:
        # Only the rows of the vocabulary the caller names: log_probs [B, K] over vocab_ids [K] (a log-softmax over
        # those K tokens). int8 quantization rewrites this projection (``converters.quantize``, ``SHORTLIST_NODES``).
        output_table = g.op("Gather", [output_table, "vocab_ids"], hint=f"{SHORTLIST_NODES}.rows", axis=0)
        if bias is not None:
            bias = g.op("Gather", [bias, "vocab_ids"], hint=f"{SHORTLIST_NODES}.bias", axis=0)
    logits = g.op("Gemm", [hidden, output_table, *([bias] if bias is not None else [])], hint="logits", transB=1)
    if shortlist:  # each row's own candidates: 0 for them, -inf for the rest of the step's union
        logits = g.op("Add", [logits, "vocab_bias"], hint=f"{SHORTLIST_NODES}.own")
    g.rename_output(g.op("LogSoftmax", [logits], axis=-1), "log_probs")

    float_t = TensorProto.FLOAT
    cache_len = "capacity" if stationary else "past_len"
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", 1]),
        *(helper.make_tensor_value_info(name, float_t, ["batch", h, cache_len, dh]) for name in past_names(n_layers)),
        *(helper.make_tensor_value_info(name, float_t, ["batch", h, "src_len", dh]) for name in cross_names(n_layers)),
        helper.make_tensor_value_info("src_bias", float_t, ["batch", 1, 1, "src_len"]),
        *([helper.make_tensor_value_info("row_order", TensorProto.INT64, ["batch"])] if stationary
          else [helper.make_tensor_value_info("self_bias", float_t, ["batch", 1, 1, "past_len"])]),
        *([helper.make_tensor_value_info("vocab_ids", TensorProto.INT64, ["shortlist"]),
           helper.make_tensor_value_info("vocab_bias", float_t, ["batch", "shortlist"])] if shortlist else []),
    ]
    outputs = [
        helper.make_tensor_value_info("log_probs", float_t, ["batch", "shortlist" if shortlist else c.target_vocab_size]),
        *(helper.make_tensor_value_info(name, float_t, ["batch", h, "capacity" if stationary else "present_len", dh])
          for name in present_names(n_layers)),
    ]
    model = g.model(inputs, outputs, "mtgate decoder step: one token per sequence + caches -> log_probs, present caches")
    if stationary:
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _save(model: onnx.ModelProto, path: Path) -> None:
    if model.ByteSize() > _EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def _write(model: onnx.ModelProto, path: Path) -> Path:
    _save(model, path)
    # The path form also checks models whose weights went to an external file.
    onnx.checker.check_model(str(path))
    logger.info("wrote %s (%.1f MB)", path, path.stat().st_size / 1e6)
    return path


def emit_onnx(spec: TransformerSpec, out_dir: Path, cache: DecoderCache = "stationary") -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``decoder.onnx`` for a validated spec into ``out_dir``.

    Arguments:
        spec: a spec that passed ``validate()``.
        out_dir: directory to write into (created).
        cache: the decoder's cache contract (module docstring): ``"stationary"`` for ONNX Runtime (the package's
            graphs), ``"growing"`` for the graph the OpenVINO IR is derived from.

    Returns:
        (encoder path, decoder path).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    return _write(_encoder(spec), out_dir / "encoder.onnx"), emit_decoder(spec, out_dir / "decoder.onnx", cache)


def emit_decoder(spec: TransformerSpec, path: Path, cache: DecoderCache, *, shortlist: bool = False) -> Path:
    """Write the decoder-step graph with the ``cache`` contract at ``path`` (its directory must exist).

    GroupQueryAttention needs a head size that is a multiple of 8 (every published translation model's is: 64); a
    decoder whose head size is not gets the growing contract instead, which the ONNX Runtime backend also runs.

    ``shortlist``: the vocabulary-shortlist variant (``serving.engine.shortlist``): two more inputs, ``vocab_ids [K]``
    (int64: the step's union of candidates) and ``vocab_bias [B, K]`` (0 where the output row may produce the id,
    -inf elsewhere), and ``log_probs [B, K]``, each row's log-softmax over its own candidates. Stationary cache only.

    Raises:
        ValueError: a shortlist decoder for a model whose decoder cannot keep a stationary cache.
    """
    stationary = cache == "stationary" and spec.config.decoder.head_dim % STATIONARY_HEAD_MULTIPLE == 0
    if shortlist and not stationary:
        raise ValueError("a vocabulary shortlist needs the stationary decoder (ONNX Runtime, a head size that is a "
                         f"multiple of {STATIONARY_HEAD_MULTIPLE})")
    return _write(_decoder(spec, stationary=stationary, shortlist=shortlist), path)
