"""Hugging Face weight files -> float32 numpy arrays: ``model.safetensors`` (bf16 decoded by hand), a sharded
``model.safetensors.index.json``, or a legacy ``pytorch_model.bin`` (the only format that needs torch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from converters.base import ConversionError, read_json

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
"""The weight files of a Hugging Face checkpoint directory, in the order they are looked for."""


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    # numpy has no bfloat16: a bf16 value is the high half of the float32 with the same bits.
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as float32 (other float dtypes cast; bf16 decoded by hand)."""
    from safetensors import safe_open

    header_len = int.from_bytes(_head(path, 8), "little")
    header = json.loads(_head(path, 8 + header_len)[8:])
    tensors: dict[str, np.ndarray] = {}
    bf16 = {name for name, info in header.items() if name != "__metadata__" and info.get("dtype") == "BF16"}
    if bf16:
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
        for name in bf16:
            begin, end = header[name]["data_offsets"]
            raw = np.frombuffer(data[begin:end].tobytes(), dtype="<u2").reshape(header[name]["shape"])
            tensors[name] = _bf16_to_f32(raw)
    with safe_open(str(path), framework="numpy") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if name not in bf16:
                tensors[name] = f.get_tensor(name)
    return tensors


def _head(path: Path, n: int) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def _load_torch_bin(path: Path) -> dict[str, np.ndarray]:
    # Only the legacy PyTorch format needs torch; imported here so nothing else pulls it in.
    try:
        import torch
    except ImportError:
        raise ConversionError(
            f"{path}: reading pytorch_model.bin needs torch (pip install 'mtgate[torch]'), "
            "or save the checkpoint as model.safetensors"
        ) from None

    state = torch.load(path, map_location="cpu", weights_only=True)
    if "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    return {name: t.detach().to(torch.float32).numpy() for name, t in state.items() if t.is_floating_point()}


def load_hf_weights(source_dir: Path) -> dict[str, np.ndarray]:
    """Every floating tensor of the checkpoint, keyed by its HF name, as float32 numpy arrays."""
    try:
        if (source_dir / "model.safetensors").is_file():
            raw = _load_safetensors(source_dir / "model.safetensors")
        elif (source_dir / "model.safetensors.index.json").is_file():
            index = read_json(source_dir / "model.safetensors.index.json")
            raw = {}
            for shard in sorted(set(index.get("weight_map", {}).values())):
                raw |= _load_safetensors(source_dir / shard)
        elif (source_dir / "pytorch_model.bin").is_file():
            raw = _load_torch_bin(source_dir / "pytorch_model.bin")
        else:
            raise ConversionError(f"{source_dir}: no weights (expected one of: {', '.join(WEIGHT_FILES)})")
    except ConversionError:
        raise
    except Exception as e:  # a corrupt file raises anything from OSError to safetensors' own errors
        raise ConversionError(f"{source_dir}: unreadable weights ({type(e).__name__}: {e})") from e
    weights: dict[str, np.ndarray] = {}
    for name, array in raw.items():
        if np.issubdtype(array.dtype, np.floating):
            # fp16 -> fp32 is exact, so the converted model equals what transformers runs after loading.
            weights[name] = np.ascontiguousarray(array, dtype=np.float32)
    return weights
