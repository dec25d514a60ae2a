"""An independent numpy implementation of tensor2tensor's ``transformer`` inference, for parity tests.

Written from tensor2tensor's own code (``models/transformer.py``, ``layers/common_attention.py``,
``layers/modalities.py``: the forward pass and the checkpoint's variables) and deliberately sharing no code with
``converters/``: it reads the checkpoint with its own byte-level reader of TF's tensor-bundle format (not
``tf.train.load_checkpoint``, which the converter uses), works on the raw T2T variable names, and recomputes the
timing signal itself. The forward pass follows T2T's order of operations in float32.

Usage::

    ref = T2TReference.from_checkpoint(ckpt_dir, target_space_id=0)
    enc_out, enc_bias = ref.encode(src_ids)                    # src_ids [B, L], EOS included, 0-padded
    log_probs = ref.decode_teacher(enc_out, enc_bias, tgt_ids)  # [B, M, V]; position j scores tgt_ids[j]
    cache = ref.new_cache(batch)
    log_probs, cache = ref.decode_step(ids, step, cache, enc_out, enc_bias)   # incremental form
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NEG_INF = np.float32(-1e9)  # T2T's large_compatible_negative for float32

# ---------------------------------------------------------------------------------------------------------------
# TF tensor bundle reader (model.ckpt-N.index + model.ckpt-N.data-SSSSS-of-NNNNN)

_TABLE_MAGIC = 0xDB4775248B80FB57
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of a serialized protobuf message: ints for varints/fixed, bytes for length-delimited."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value = struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value = buf[pos:pos + length]
            pos += length
        elif wire == 5:
            value = struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        fields.append((number, value))
    return fields


def _table_block(data: bytes, offset: int, size: int) -> list[tuple[bytes, bytes]]:
    """Entries (key, value) of one LevelDB table block (keys are prefix-compressed against the previous key)."""
    if data[offset + size] != 0:
        raise ValueError("compressed table blocks are not supported by this reader")
    block = data[offset:offset + size]
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * num_restarts
    entries: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    while pos < end:
        shared, pos = _varint(block, pos)
        non_shared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + non_shared]
        pos += non_shared
        entries.append((key, block[pos:pos + value_len]))
        pos += value_len
    return entries


def read_tensor_bundle(prefix: Path) -> dict[str, np.ndarray]:
    """Every tensor of a TF V2 checkpoint, by name (``prefix`` is e.g. ``dir/model.ckpt-1``)."""
    index = Path(f"{prefix}.index").read_bytes()
    footer = index[-48:]
    if struct.unpack_from("<Q", footer, 40)[0] != _TABLE_MAGIC:
        raise ValueError(f"{prefix}.index: not a TF tensor bundle index")
    pos = 0
    _, pos = _varint(footer, pos)  # metaindex handle (unused)
    _, pos = _varint(footer, pos)
    index_offset, pos = _varint(footer, pos)
    index_size, pos = _varint(footer, pos)
    entries: list[tuple[bytes, bytes]] = []
    for _, handle in _table_block(index, index_offset, index_size):
        offset, p = _varint(handle, 0)
        size, _ = _varint(handle, p)
        entries += _table_block(index, offset, size)
    shard_data: dict[int, bytes] = {}
    tensors: dict[str, np.ndarray] = {}
    for key, value in entries:
        if key == b"":  # BundleHeaderProto
            continue
        entry = dict(_proto_fields(value))
        dtype = _DTYPES[int(entry.get(1, 0))]  # type: ignore[arg-type]
        shape = [int(dict(_proto_fields(dim)).get(1, 0)) for n, dim in _proto_fields(entry.get(2, b""))  # type: ignore[arg-type]
                 if n == 2]
        shard = int(entry.get(3, 0))  # type: ignore[arg-type]
        if shard not in shard_data:
            (path,) = Path(prefix).parent.glob(f"{Path(prefix).name}.data-{shard:05d}-of-*")
            shard_data[shard] = path.read_bytes()
        offset, size = int(entry.get(4, 0)), int(entry.get(5, 0))  # type: ignore[arg-type]
        raw = shard_data[shard][offset:offset + size]
        tensors[key.decode("utf-8")] = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape).copy()
    return tensors


def checkpoint_prefix(ckpt_dir: Path) -> Path:
    """The latest checkpoint named by ``ckpt_dir/checkpoint``."""
    text = (ckpt_dir / "checkpoint").read_text(encoding="utf-8")
    match = re.search(r'^model_checkpoint_path:\s*"(.*)"', text, re.MULTILINE)
    if match is None:
        raise ValueError(f"{ckpt_dir}/checkpoint names no model_checkpoint_path")
    return ckpt_dir / Path(match.group(1)).name


# ---------------------------------------------------------------------------------------------------------------
# Forward pass (reference sections 1.2 - 1.6)


def timing_signal(length: int, channels: int) -> np.ndarray:
    """get_timing_signal_1d in float32: sines of all timescales, then cosines; [length, channels]."""
    n = channels // 2
    inc = np.float32(math.log(1.0e4 / 1.0)) / np.float32(max(n - 1, 1))
    inv = np.float32(1.0) * np.exp(np.arange(n, dtype=np.float32) * -inc)
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv[None, :].astype(np.float32)
    signal = np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)
    if channels % 2:
        signal = np.pad(signal, ((0, 0), (0, 1)))
    return signal.astype(np.float32)


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + np.float32(eps)) * scale + bias).astype(np.float32)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


@dataclass
class DecodeCache:
    """Self-attention keys/values of the steps decoded so far, per layer: [B, heads, T, depth]."""

    keys: list[np.ndarray]
    values: list[np.ndarray]


class T2TReference:
    """T2T ``transformer`` (pre-norm "n"/"da" or post-norm "none"/"dan") on raw checkpoint variables."""

    def __init__(self, variables: dict[str, np.ndarray], hparams: dict[str, object], target_space_id: int = 0) -> None:
        self.hidden = int(hparams["hidden_size"])  # type: ignore[call-overload]
        self.heads = int(hparams["num_heads"])  # type: ignore[call-overload]
        layers = int(hparams["num_hidden_layers"])  # type: ignore[call-overload]
        self.enc_layers = int(hparams.get("num_encoder_layers") or layers)  # type: ignore[call-overload]
        self.dec_layers = int(hparams.get("num_decoder_layers") or layers)  # type: ignore[call-overload]
        self.eps = float(hparams.get("norm_epsilon", 1e-6))  # type: ignore[arg-type]
        self.pre_norm = hparams.get("layer_preprocess_sequence", "n") == "n"
        self.v: dict[str, np.ndarray] = {}
        for name, value in variables.items():
            if name.startswith("transformer/"):
                self.v[name[len("transformer/"):]] = value
        self.input_emb = self._modality("input_emb")
        self.target_emb = self._modality("target_emb")
        self.softmax = self._modality("softmax")
        self.target_space = self.v["body/target_space_embedding/kernel"][target_space_id]

    @classmethod
    def from_checkpoint(cls, ckpt_dir: Path, target_space_id: int = 0,
                        hparams: dict[str, object] | None = None) -> T2TReference:
        if hparams is None:
            hparams = json.loads((ckpt_dir / "hparams.json").read_text(encoding="utf-8"))
        return cls(read_tensor_bundle(checkpoint_prefix(ckpt_dir)), hparams, target_space_id)

    def _modality(self, role: str) -> np.ndarray:
        """The [V, H] matrix of one role: its own sub-scope if present, else the shared one (shards in numeric order)."""
        for sub in (role, "shared"):
            pattern = re.compile(rf"^symbol_modality_\d+_\d+/{sub}/weights_(\d+)$")
            shards = sorted(((int(m.group(1)), value) for name, value in self.v.items()
                             if (m := pattern.match(name))), key=lambda item: item[0])
            if shards:
                return np.concatenate([value for _, value in shards], axis=0)
        raise KeyError(f"no {role} or shared embedding in the checkpoint")

    @property
    def vocab_size(self) -> int:
        return int(self.softmax.shape[0])

    # -- building blocks ------------------------------------------------------------------------------------------

    def _embed(self, matrix: np.ndarray, ids: np.ndarray) -> np.ndarray:
        emb = matrix[ids] * np.float32(self.hidden ** 0.5)
        return (emb * (ids != 0)[..., None]).astype(np.float32)

    def _ln(self, x: np.ndarray, scope: str) -> np.ndarray:
        return layer_norm(x, self.v[f"{scope}/layer_norm/layer_norm_scale"], self.v[f"{scope}/layer_norm/layer_norm_bias"],
                          self.eps)

    def _split(self, x: np.ndarray) -> np.ndarray:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, self.hidden // self.heads).transpose(0, 2, 1, 3)

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, scope: str) -> np.ndarray:
        """q, k, v already split [B, h, n, d]; q NOT yet scaled. Returns [B, n, H] after the output transform."""
        q = q * np.float32((self.hidden // self.heads) ** -0.5)
        logits = q @ k.transpose(0, 1, 3, 2) + bias
        logits = logits - logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = weights.astype(np.float32) @ v
        b, _, n, _ = out.shape
        out = out.transpose(0, 2, 1, 3).reshape(b, n, self.hidden)
        return (out @ self.v[f"{scope}/multihead_attention/output_transform/kernel"]).astype(np.float32)

    def _qkv(self, scope: str, xq: np.ndarray, xm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mha = f"{scope}/multihead_attention"
        return (self._split(xq @ self.v[f"{mha}/q/kernel"]), self._split(xm @ self.v[f"{mha}/k/kernel"]),
                self._split(xm @ self.v[f"{mha}/v/kernel"]))

    def _ffn(self, x: np.ndarray, scope: str) -> np.ndarray:
        h = np.maximum(x @ self.v[f"{scope}/conv1/kernel"] + self.v[f"{scope}/conv1/bias"], 0)
        return (h @ self.v[f"{scope}/conv2/kernel"] + self.v[f"{scope}/conv2/bias"]).astype(np.float32)

    def _pre(self, x: np.ndarray, scope: str) -> np.ndarray:
        return self._ln(x, f"{scope}/layer_prepostprocess") if self.pre_norm else x

    def _post(self, x: np.ndarray, y: np.ndarray, scope: str) -> np.ndarray:
        return x + y if self.pre_norm else self._ln(x + y, f"{scope}/layer_postprocess")

    def _final(self, x: np.ndarray, stack: str) -> np.ndarray:
        return self._ln(x, f"body/{stack}/layer_prepostprocess") if self.pre_norm else x

    # -- encoder / decoder ----------------------------------------------------------------------------------------

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """src [B, L] ids (EOS included, 0-padded) -> (enc_out [B, L, H], bias [B, 1, 1, L])."""
        src = np.asarray(src, dtype=np.int64)
        x = self._embed(self.input_emb, src)
        pad = np.all(x == 0, axis=-1).astype(np.float32)  # embedding_to_padding
        bias = (pad * NEG_INF)[:, None, None, :]
        x = x + self.target_space
        x = x + timing_signal(src.shape[1], self.hidden)
        for i in range(self.enc_layers):
            scope = f"body/encoder/layer_{i}"
            y = self._pre(x, f"{scope}/self_attention")
            q, k, v = self._qkv(f"{scope}/self_attention", y, y)
            x = self._post(x, self._attend(q, k, v, bias, f"{scope}/self_attention"), f"{scope}/self_attention")
            x = self._post(x, self._ffn(self._pre(x, f"{scope}/ffn"), f"{scope}/ffn"), f"{scope}/ffn")
        return self._final(x, "encoder"), bias

    def cross_kv(self, enc_out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per decoder layer: (keys, values) of the encoder-decoder attention, [B, h, L, d] each, unscaled."""
        out = []
        for i in range(self.dec_layers):
            mha = f"body/decoder/layer_{i}/encdec_attention/multihead_attention"
            out.append((self._split(enc_out @ self.v[f"{mha}/k/kernel"]),
                        self._split(enc_out @ self.v[f"{mha}/v/kernel"])))
        return out

    def _decoder_layers(self, y: np.ndarray, self_bias: np.ndarray, enc_out: np.ndarray, enc_bias: np.ndarray,
                        cache: DecodeCache | None) -> np.ndarray:
        for i in range(self.dec_layers):
            scope = f"body/decoder/layer_{i}"
            z = self._pre(y, f"{scope}/self_attention")
            q, k, v = self._qkv(f"{scope}/self_attention", z, z)
            if cache is not None:
                k = np.concatenate([cache.keys[i], k], axis=2)
                v = np.concatenate([cache.values[i], v], axis=2)
                cache.keys[i], cache.values[i] = k, v
            y = self._post(y, self._attend(q, k, v, self_bias, f"{scope}/self_attention"), f"{scope}/self_attention")
            z = self._pre(y, f"{scope}/encdec_attention")
            q, k, v = self._qkv(f"{scope}/encdec_attention", z, enc_out)
            y = self._post(y, self._attend(q, k, v, enc_bias, f"{scope}/encdec_attention"), f"{scope}/encdec_attention")
            y = self._post(y, self._ffn(self._pre(y, f"{scope}/ffn"), f"{scope}/ffn"), f"{scope}/ffn")
        return self._final(y, "decoder")

    def _log_probs(self, dec_out: np.ndarray) -> np.ndarray:
        return log_softmax(dec_out @ self.softmax.T)

    def decode_teacher(self, enc_out: np.ndarray, enc_bias: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Teacher-forced decoder: targets [B, M] -> log-probs [B, M, V]; row j is the distribution of targets[j]."""
        targets = np.asarray(targets, dtype=np.int64)
        emb = self._embed(self.target_emb, targets)
        y = np.concatenate([np.zeros_like(emb[:, :1]), emb[:, :-1]], axis=1)  # shift_right_3d
        m = targets.shape[1]
        y = y + timing_signal(m, self.hidden)
        causal = np.triu(np.full((m, m), NEG_INF, dtype=np.float32), k=1)[None, None]
        return self._log_probs(self._decoder_layers(y, causal, enc_out, enc_bias, None))

    def new_cache(self, batch: int) -> DecodeCache:
        d = self.hidden // self.heads
        empty = [np.zeros((batch, self.heads, 0, d), np.float32) for _ in range(self.dec_layers)]
        return DecodeCache(keys=empty, values=[a.copy() for a in empty])

    def decode_step(self, ids: np.ndarray, step: int, cache: DecodeCache, enc_out: np.ndarray,
                    enc_bias: np.ndarray) -> tuple[np.ndarray, DecodeCache]:
        """Incremental decoder (``_fast_decode``): ids [B] emitted at step-1 (step 0: the start id 0) -> [B, V]."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1, 1)
        y = self._embed(self.target_emb, ids)
        if step == 0:
            y = np.zeros_like(y)
        y = y + timing_signal(step + 1, self.hidden)[step]
        no_bias = np.zeros((1, 1, 1, step + 1), np.float32)
        out = self._decoder_layers(y, no_bias, enc_out, enc_bias, cache)
        return self._log_probs(out)[:, 0], cache

    def greedy(self, src: np.ndarray, extra_length: int = 100) -> list[list[int]]:
        """Greedy decoding as T2T does with beam_size 1: ids up to and including the first EOS (1)."""
        src = np.asarray(src, dtype=np.int64)
        enc_out, enc_bias = self.encode(src)
        batch = src.shape[0]
        cache = self.new_cache(batch)
        ids = np.zeros(batch, dtype=np.int64)
        out: list[list[int]] = [[] for _ in range(batch)]
        done = np.zeros(batch, dtype=bool)
        for step in range(src.shape[1] + extra_length):
            log_probs, cache = self.decode_step(ids, step, cache, enc_out, enc_bias)
            ids = log_probs.argmax(axis=-1)
            for b in np.flatnonzero(~done):
                out[b].append(int(ids[b]))
            done |= ids == 1
            if done.all():
                break
        return out


# ---------------------------------------------------------------------------------------------------------------
# Synthetic T2T checkpoints (variable names of reference section 2), for layouts the real test checkpoint lacks


def synthetic_variables(*, vocab_size: int = 301, hidden: int = 16, filter_size: int = 24, layers: int = 2,
                        shards: int = 16, pre_norm: bool = True, sharing: str = "all", seed: int = 0,
                        with_optimizer_slots: bool = True) -> dict[str, np.ndarray]:
    """Random weights under T2T's variable names.

    ``sharing``: "all" (one ``shared`` matrix), "embeddings" (``shared`` + ``softmax``), "none"
    (``input_emb`` + ``target_emb`` + ``softmax``). Post-norm layers keep their norms in ``layer_postprocess`` and
    have no final norms.
    """
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out: dict[str, np.ndarray] = {}
    modality = f"transformer/symbol_modality_{vocab_size}_{hidden}"
    subs = {"all": ["shared"], "embeddings": ["shared", "softmax"], "none": ["input_emb", "target_emb", "softmax"]}
    for sub in subs[sharing]:
        for i in range(shards):
            rows = vocab_size // shards + (1 if i < vocab_size % shards else 0)
            out[f"{modality}/{sub}/weights_{i}"] = normal(rows, hidden, scale=hidden ** -0.5)
    body = "transformer/body"
    out[f"{body}/target_space_embedding/kernel"] = normal(32, hidden, scale=0.3)
    norm = "layer_prepostprocess" if pre_norm else "layer_postprocess"

    def set_norm(scope: str) -> None:
        out[f"{scope}/layer_norm/layer_norm_scale"] = 1.0 + normal(hidden, scale=0.1)
        out[f"{scope}/layer_norm/layer_norm_bias"] = normal(hidden, scale=0.1)

    def set_attention(scope: str) -> None:
        set_norm(f"{scope}/{norm}")
        for proj in ("q", "k", "v", "output_transform"):
            out[f"{scope}/multihead_attention/{proj}/kernel"] = normal(hidden, hidden, scale=hidden ** -0.5)

    def set_ffn(scope: str) -> None:
        set_norm(f"{scope}/{norm}")
        out[f"{scope}/conv1/kernel"] = normal(hidden, filter_size, scale=hidden ** -0.5)
        out[f"{scope}/conv1/bias"] = normal(filter_size, scale=0.1)
        out[f"{scope}/conv2/kernel"] = normal(filter_size, hidden, scale=filter_size ** -0.5)
        out[f"{scope}/conv2/bias"] = normal(hidden, scale=0.1)

    for i in range(layers):
        set_attention(f"{body}/encoder/layer_{i}/self_attention")
        set_ffn(f"{body}/encoder/layer_{i}/ffn")
        set_attention(f"{body}/decoder/layer_{i}/self_attention")
        set_attention(f"{body}/decoder/layer_{i}/encdec_attention")
        set_ffn(f"{body}/decoder/layer_{i}/ffn")
    if pre_norm:
        set_norm(f"{body}/encoder/layer_prepostprocess")
        set_norm(f"{body}/decoder/layer_prepostprocess")
    if with_optimizer_slots:
        for name in [n for n in out if n.startswith("transformer/")][:6]:
            out[f"training/{name}/Adam"] = np.zeros_like(out[name])
    out["global_step"] = np.array(7, dtype=np.int64)
    return out


def write_checkpoint(ckpt_dir: Path, variables: dict[str, np.ndarray], hparams: dict[str, object] | None,
                     step: int = 7) -> Path:
    """Write ``variables`` as a TF V2 checkpoint ``model.ckpt-<step>`` (+ ``checkpoint`` and ``hparams.json``)."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    prefix = ckpt_dir / f"model.ckpt-{step}"
    names = sorted(variables)
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(variables[n]) for n in names])
    # An absolute path from "another machine", as t2t-trainer writes it.
    (ckpt_dir / "checkpoint").write_text(f'model_checkpoint_path: "/elsewhere/train/{prefix.name}"\n'
                                         f'all_model_checkpoint_paths: "/elsewhere/train/{prefix.name}"\n')
    if hparams is not None:
        (ckpt_dir / "hparams.json").write_text(json.dumps(hparams))
    return prefix


def synthetic_hparams(*, hidden: int = 16, filter_size: int = 24, heads: int = 4, layers: int = 2,
                      pre_norm: bool = True) -> dict[str, object]:
    return {
        "hidden_size": hidden, "filter_size": filter_size, "num_heads": heads, "num_hidden_layers": layers,
        "num_encoder_layers": 0, "num_decoder_layers": 0, "norm_epsilon": 1e-6, "norm_type": "layer",
        "layer_preprocess_sequence": "n" if pre_norm else "none",
        "layer_postprocess_sequence": "da" if pre_norm else "dan",
        "multiply_embedding_mode": "sqrt_depth", "ffn_layer": "dense_relu_dense", "self_attention_type": "dot_product",
        "max_relative_position": 0, "attention_key_channels": 0, "attention_value_channels": 0, "pos": "timing",
        "shared_embedding_and_softmax_weights": True, "symbol_modality_num_shards": 16,
    }


def write_vocab(path: Path, size: int) -> Path:
    """A ``.subwords`` file with ``size`` quoted lines: <pad>, <EOS>, then the letters and made-up subwords."""
    letters = [f"{c}_" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz") + ["_", " _", "._"]
    lines = ["<pad>", "<EOS>", *letters]
    lines += [f"w{i}_" for i in range(size - len(lines))]
    path.write_text("".join(f"'{s}'\n" for s in lines[:size]), encoding="utf-8")
    return path
