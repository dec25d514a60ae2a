"""``start_search`` picks the search for a set of options; ``search`` drives one over a backend to the end."""

from __future__ import annotations

import numpy as np

from serving.engine.backends.base import Backend
from serving.engine.decoding.base import Alive, Hypothesis, OnTokens, Search, SearchOptions
from serving.engine.decoding.beam import HFBeamSearch, T2TBeamSearch
from serving.engine.decoding.greedy import GreedySearch
from serving.engine.decoding.native import native_search
from serving.engine.rows import is_identity, open_rows, take_rows

__all__ = ["is_identity", "numpy_search", "search", "start_search", "take_rows"]


def start_search(
    max_steps: np.ndarray,
    options: SearchOptions,
    on_tokens: OnTokens | None = None,
    *,
    ids: np.ndarray | None = None,
    prefixes: list[list[int]] | None = None,
    seeds: np.ndarray | None = None,
) -> Search:
    """A step-wise search for sentences with the per-sentence caps ``max_steps`` (``[B]``, EOS included, >= 1): the
    native core's where it is built (``serving.decoding.native``), else the numpy reference.

    Arguments:
        max_steps: per-sentence caps.
        options: search options.
        on_tokens: streaming hook; its ``rows`` are sentence ids.
        ids: the sentences' ids in ``results`` and ``on_tokens`` (default ``0..B-1``).
        prefixes: each sentence's forced target prefix (ids, no EOS; the caps count it), or None.
        seeds: ``[B]`` each sentence's sampling seed (``options.sampling``; None: 0).

    Raises:
        ValueError: an empty batch, a cap below 1, a beam size below 1, or sampling with beams.
    """
    caps = np.asarray(max_steps, dtype=np.int64).reshape(-1)
    if caps.size == 0:
        raise ValueError("a search needs at least one sentence")
    if caps.min() < 1:
        raise ValueError("max_steps must be at least 1")
    if options.beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {options.beam_size}")
    if options.sampling and options.beam_size != 1:
        raise ValueError("sampling needs beam_size 1")
    sentence_ids = np.arange(caps.size) if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1)
    native = native_search(caps, options, on_tokens, sentence_ids, prefixes, seeds)
    if native is not None:
        return native
    return numpy_search(caps, options, on_tokens, sentence_ids, prefixes, seeds)


def numpy_search(caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None, ids: np.ndarray,
                 prefixes: list[list[int]] | None = None, seeds: np.ndarray | None = None) -> Search:
    """The numpy search for ``options`` (the native core's reference); arguments as :func:`start_search` checked
    them."""
    if options.beam_size == 1:
        return GreedySearch(caps, options, on_tokens, ids, prefixes, seeds)
    if options.length_penalty_kind == "gnmt":
        return T2TBeamSearch(caps, options, on_tokens, ids, prefixes)
    return HFBeamSearch(caps, options, on_tokens, ids, prefixes)


def search(
    decoder: Backend,
    cross_kv: np.ndarray,
    src_bias: np.ndarray,
    max_steps: np.ndarray,
    options: SearchOptions,
    on_tokens: OnTokens | None = None,
    *,
    prefixes: list[list[int]] | None = None,
    seeds: np.ndarray | None = None,
    candidates: np.ndarray | None = None,
    alive: Alive | None = None,
) -> list[Hypothesis]:
    """Decode a batch of encoded sentences.

    Arguments:
        decoder: the backend (``decode_step``).
        cross_kv: the encoder's cross-attention keys/values ``[L, 2, B, H, S, Dh]``.
        src_bias: the encoder's source mask bias ``[B, 1, 1, S]``.
        max_steps: ``[B]`` per-sentence cap on generated tokens, EOS included (>= 1).
        options: search options.
        on_tokens: optional streaming hook (:data:`OnTokens`).
        prefixes: each sentence's forced target prefix, or None.
        seeds: ``[B]`` each sentence's sampling seed, or None.
        candidates: ``[B, V]`` the target ids each sentence may produce (a vocabulary shortlist's), or None.
        alive: polled before every decoder step with the sentences still decoding (:data:`Alive`); those no longer
            wanted leave the batch, the others decode exactly as they would have (their rows' arithmetic does not
            depend on their neighbours': fp32; an int8 graph quantizing activations per batch may differ).

    Returns:
        One :class:`Hypothesis` per sentence, in batch order (an empty one for a sentence ``alive`` dropped).
    """
    caps = np.asarray(max_steps, dtype=np.int64).reshape(-1)
    if caps.shape[0] != cross_kv.shape[2] or caps.shape[0] != src_bias.shape[0]:
        raise ValueError(f"max_steps has {caps.shape[0]} entries for a batch of {cross_kv.shape[2]}")
    if caps.size == 0:
        return []
    state = start_search(caps, options, on_tokens, prefixes=prefixes, seeds=seeds)
    rows = open_rows(decoder)
    rows.arrange(-1 - np.arange(caps.size), cross_kv, src_bias, candidates)
    tokens = state.tokens
    decoding = np.arange(caps.size)  # the sentences not finished (nor dropped): their rows, in order
    while True:
        if alive is not None:
            decoding = decoding[~np.isin(decoding, list(state.results))]
            wanted = np.asarray(alive(decoding), dtype=bool).reshape(-1)
            if not wanted.all():
                kept = state.remove(decoding[~wanted])
                if kept is None:
                    break
                decoding = decoding[wanted]
                rows.arrange(kept)
                tokens = tokens[kept]
        log_probs = rows.decode(tokens)
        plan = state.advance(log_probs, rows.columns)
        if plan is None:
            break
        rows.advance(plan.rows, plan.encoder_rows)
        tokens = plan.tokens
    return [state.results.get(i, Hypothesis([], 0.0)) for i in range(caps.size)]
