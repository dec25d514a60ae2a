"""Tiny random fairseq Transformer checkpoints, written the way fairseq writes them, without fairseq.

``make_fairseq_dir(path, **options)`` writes ``checkpoint_best.pt`` (``{"args": Namespace, "model": state dict,
"optimizer_history", "extra_state", "last_optimizer_state"}``; with ``cfg_style=True`` fairseq >= 0.10's
``{"args": None, "cfg": <omegaconf DictConfig>}`` instead), ``dict.en.txt`` / ``dict.de.txt`` (fairseq's ``@@``
BPE pieces with counts) and ``bpecodes`` (fastBPE: ``a b count``), from the BPE of tests/utils/fsmt_factory.py.
The state dict has fairseq's parameter names and shapes for the options given (tests/utils/fairseq_reference.py
reads the same names). The pickle names classes of packages that are not installed (fairseq's meters, omegaconf's
containers), as real checkpoints do: mtgate must read it without them.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from tests.utils.fsmt_factory import _bpe

PAD = 1
OPTIONS: dict[str, Any] = {
    "arch": "transformer", "source_lang": "en", "target_lang": "de", "bpe": "fastbpe", "tokenizer": "moses",
    "encoder_embed_dim": 32, "encoder_ffn_embed_dim": 64, "encoder_layers": 2, "encoder_attention_heads": 4,
    "encoder_normalize_before": False, "encoder_learned_pos": False, "decoder_embed_dim": 32,
    "decoder_ffn_embed_dim": 64, "decoder_layers": 2, "decoder_attention_heads": 4, "decoder_normalize_before": False,
    "decoder_learned_pos": False, "activation_fn": "relu", "share_all_embeddings": False,
    "share_decoder_input_output_embed": True, "no_scale_embedding": False, "layernorm_embedding": False,
    "max_source_positions": 128, "max_target_positions": 128, "no_decoder_final_norm": False,
    "adaptive_softmax_cutoff": None, "dropout": 0.1, "lr": [0.0005], "optimizer": "adam", "data": "data-bin/wmt",
}


def dictionaries(joint: bool = False) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(EN symbols, DE symbols, merges) in fairseq's form (``th@@`` inside a word, ``the`` at its end), specials
    not included (fairseq's Dictionary adds them)."""
    merges, en, de = _bpe(300)

    def symbols(pieces: tuple[str, ...]) -> list[str]:
        return list(dict.fromkeys(p[: -len("</w>")] if p.endswith("</w>") else p + "@@" for p in pieces))

    en_symbols, de_symbols = symbols(en), symbols(de)
    if joint:
        en_symbols = de_symbols = list(dict.fromkeys(en_symbols + de_symbols))
    return en_symbols, de_symbols, list(merges)


def state_dict(opts: dict[str, Any], source_vocab: int, target_vocab: int, seed: int = 0,
               std: float = 0.2) -> OrderedDict[str, np.ndarray]:
    """Random float32 tensors under fairseq's names for these options (pad rows of the embeddings zero)."""
    rng = np.random.default_rng(seed)
    d = opts["encoder_embed_dim"]
    out: OrderedDict[str, np.ndarray] = OrderedDict()

    def put(name: str, *shape: int, base: float = 0.0, scale: float = std) -> None:
        out[name] = (base + scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(name: str) -> None:
        put(f"{name}.weight", d, base=1.0, scale=0.1)
        put(f"{name}.bias", d, scale=0.1)

    def linear(name: str, n_in: int, n_out: int) -> None:
        put(f"{name}.weight", n_out, n_in)
        put(f"{name}.bias", n_out, scale=0.1)

    put("encoder.embed_tokens.weight", source_vocab, d)
    out["encoder.embed_tokens.weight"][PAD] = 0
    for side, vocab in (("encoder", source_vocab), ("decoder", target_vocab)):
        if side == "decoder":
            if opts["share_all_embeddings"]:
                out["decoder.embed_tokens.weight"] = out["encoder.embed_tokens.weight"]
            else:
                put("decoder.embed_tokens.weight", vocab, d)
                out["decoder.embed_tokens.weight"][PAD] = 0
        if opts[f"{side}_learned_pos"]:
            put(f"{side}.embed_positions.weight", opts[f"max_{'source' if side == 'encoder' else 'target'}_positions"]
                + PAD + 1, d, scale=0.5)
            out[f"{side}.embed_positions.weight"][PAD] = 0
        else:
            out[f"{side}.embed_positions._float_tensor"] = np.zeros(1, dtype=np.float32)
        if opts["layernorm_embedding"]:
            norm(f"{side}.layernorm_embedding")
        ffn, layers = opts[f"{side}_ffn_embed_dim"], opts[f"{side}_layers"]
        for i in range(layers):
            p = f"{side}.layers.{i}"
            for attn in ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",):
                for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
                    linear(f"{p}.{attn}.{proj}", d, d)
                norm(f"{p}.{attn}_layer_norm")
            linear(f"{p}.fc1", d, ffn)
            linear(f"{p}.fc2", ffn, d)
            norm(f"{p}.final_layer_norm")
        if opts[f"{side}_normalize_before"] and not (side == "decoder" and opts["no_decoder_final_norm"]):
            norm(f"{side}.layer_norm")
        out[f"{side}.version"] = np.array([3.0], dtype=np.float32)
    if opts["share_all_embeddings"] or opts["share_decoder_input_output_embed"]:
        out["decoder.output_projection.weight"] = out["decoder.embed_tokens.weight"]
    else:
        put("decoder.output_projection.weight", target_vocab, d)
    return out


class _Node:
    """Pickles like an omegaconf container or node: its state is ``{"_content": ...}`` or ``{"_val": ...}``."""

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state | {"_metadata": None, "_parent": None})


def _fake_module(name: str, **classes: type) -> types.ModuleType:
    module = types.ModuleType(name)
    for cls_name, cls in classes.items():
        fake = type(cls_name, (cls,), {"__module__": name})
        setattr(module, cls_name, fake)
    return module


def _omegaconf(value: Any, modules: dict[str, types.ModuleType]) -> Any:
    dict_config, any_node = modules["omegaconf.dictconfig"].DictConfig, modules["omegaconf.nodes"].AnyNode
    if isinstance(value, dict):
        return dict_config(_content={k: _omegaconf(v, modules) for k, v in value.items()})
    return any_node(_val=value)


def fairseq_model(*, seed: int = 0, std: float = 0.2, **options: Any) -> tuple[dict[str, Any],
                                                                               OrderedDict[str, np.ndarray]]:
    """(options, state dict) of the model :func:`make_fairseq_dir` writes with the same arguments."""
    opts = OPTIONS | options
    en, de, _ = dictionaries(joint=opts["share_all_embeddings"])
    return opts, state_dict(opts, len(en) + 4, len(de) + 4, seed=seed, std=std)


def make_fairseq_dir(path: Path, *, seed: int = 0, std: float = 0.2, cfg_style: bool = False,
                     extra_state: dict[str, Any] | None = None, **options: Any) -> Path:
    """Write a random fairseq checkpoint directory; ``options`` override :data:`OPTIONS` (fairseq's names);
    ``extra_state`` goes into the checkpoint's ``extra_state`` too."""
    import torch

    path.mkdir(parents=True, exist_ok=True)
    opts, state = fairseq_model(seed=seed, std=std, **options)
    en, de, merges = dictionaries(joint=opts["share_all_embeddings"])
    for lang, symbols in (("en", en), ("de", de)):
        (path / f"dict.{lang}.txt").write_text("".join(f"{s} {1000 - i}\n" for i, s in enumerate(symbols)),
                                               encoding="utf-8")
    (path / "bpecodes").write_text("".join(f"{a} {b} {5000 - i}\n" for i, (a, b) in enumerate(merges)),
                                   encoding="utf-8")
    modules = {"fairseq.logging.meters": _fake_module("fairseq.logging.meters", AverageMeter=_Node),
               "omegaconf.dictconfig": _fake_module("omegaconf.dictconfig", DictConfig=_Node),
               "omegaconf.nodes": _fake_module("omegaconf.nodes", AnyNode=_Node)}
    parents = {".".join(name.split(".")[:i]) for name in modules for i in range(1, name.count(".") + 1)}
    modules |= {name: types.ModuleType(name) for name in parents}  # pickle imports the packages first
    missing = [name for name in modules if name not in sys.modules]
    sys.modules.update({name: modules[name] for name in missing})
    try:
        meters = modules["fairseq.logging.meters"].AverageMeter(val=1.5, sum=3.0, count=2)
        checkpoint: dict[str, Any] = {
            "model": OrderedDict((k, torch.from_numpy(np.ascontiguousarray(v))) for k, v in state.items()),
            "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                   "optimizer_name": "FairseqAdam", "num_updates": 10}],
            "extra_state": {"metrics": {"default": meters}, "train_iterator": {"epoch": 2},
                            "rng": np.random.default_rng(0).random(3)} | (extra_state or {}),
            "last_optimizer_state": {"state": {0: {"exp_avg": torch.zeros(3)}}},
        }
        if cfg_style:
            model_opts = {k: v for k, v in opts.items() if k not in ("source_lang", "target_lang", "bpe", "tokenizer")}
            model_opts["_name"] = model_opts.pop("arch")
            cfg = {"model": model_opts, "task": {"_name": "translation", "source_lang": opts["source_lang"],
                                                 "target_lang": opts["target_lang"]},
                   "bpe": {"_name": opts["bpe"]}, "tokenizer": {"_name": opts["tokenizer"]}}
            checkpoint |= {"args": None, "cfg": _omegaconf(cfg, modules)}
        else:
            checkpoint["args"] = argparse.Namespace(**opts)
        torch.save(checkpoint, path / "checkpoint_best.pt")
    finally:
        for name in missing:
            del sys.modules[name]
    return path
