"""A ``Backend`` over transformers' torch ``MarianMTModel``: the reference the numpy decoding is tested against.

``encode`` runs the Marian encoder and projects every decoder layer's cross-attention keys/values once;
``decode_step`` runs the real ``MarianMTModel.forward`` for one token with an ``EncoderDecoderCache`` rebuilt from the
``[L, 2, B, H, T, Dh]`` arrays of the backend contract, so beam reordering and batch shrinking happen in numpy exactly
as with the ONNX/OpenVINO backends, while every number comes from transformers.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import MarianMTModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from serving.engine.backends import EncoderOutput

_MASK = -1.0e9


class HFMarianBackend:
    """``encode`` / ``decode_step`` of the backend contract, computed by ``MarianMTModel`` in float32 on CPU."""

    def __init__(self, model: MarianMTModel) -> None:
        self.model = model.eval()
        self.pad_id = int(model.config.pad_token_id)
        self.layers = model.model.decoder.layers
        self.heads = model.config.decoder_attention_heads
        self.steps = 0  # decode_step calls, for tests that count work

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        return x.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)

    @torch.no_grad()
    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        ids = torch.from_numpy(np.ascontiguousarray(input_ids, dtype=np.int64))
        mask = (ids != self.pad_id).long()
        memory = self.model.model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        cross = []
        for layer in self.layers:
            attn = layer.encoder_attn
            cross.append(torch.stack([self._split_heads(attn.k_proj(memory)), self._split_heads(attn.v_proj(memory))]))
        src_bias = ((1 - mask).float() * _MASK)[:, None, None, :]
        return EncoderOutput(memory.numpy(), torch.stack(cross).numpy(), src_bias.numpy())

    @torch.no_grad()
    def decode_step(
        self, input_ids: np.ndarray, step: int | np.ndarray, past_kv: np.ndarray, cross_kv: np.ndarray,
        src_bias: np.ndarray, self_bias: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``serving.engine.backends.Backend`` step, for rows that are all at one step (what ``search`` runs)."""
        self.steps += 1
        assert np.ndim(step) == 0 or np.all(np.asarray(step) == past_kv.shape[4]), "rows at different steps"
        assert self_bias is None or not self_bias.any(), "masked cache slots"
        assert past_kv.shape[4] == int(np.asarray(step).reshape(-1)[0]), (past_kv.shape, step)
        past = torch.from_numpy(np.ascontiguousarray(past_kv))
        cross = torch.from_numpy(np.ascontiguousarray(cross_kv))
        self_cache = DynamicCache(ddp_cache_data=[(past[i, 0], past[i, 1]) for i in range(past.shape[0])])
        cross_cache = DynamicCache(ddp_cache_data=[(cross[i, 0], cross[i, 1]) for i in range(cross.shape[0])])
        cache = EncoderDecoderCache(self_cache, cross_cache)
        batch, source_len = src_bias.shape[0], src_bias.shape[-1]
        encoder_mask = torch.from_numpy(np.ascontiguousarray(src_bias[:, 0, 0, :] == 0)).long()
        # The cross-attention K/V come from the cache (is_updated); the hidden states only give the source length.
        placeholder = torch.zeros(batch, source_len, self.model.config.d_model)
        out = self.model(
            encoder_outputs=(placeholder,),
            attention_mask=encoder_mask,
            decoder_input_ids=torch.from_numpy(np.ascontiguousarray(input_ids, dtype=np.int64)),
            past_key_values=cache,
            use_cache=True,
            return_dict=True,
        )
        log_probs = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)
        layers = out.past_key_values.self_attention_cache.layers
        present = torch.stack([torch.stack([layer.keys, layer.values]) for layer in layers])
        return log_probs.numpy(), present.numpy()
