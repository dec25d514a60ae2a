"""What ``serving.engine.translator.Translator.prepare`` does once per sentence after tokenizing it: ids checked
against the source vocabulary, target prefixes as target ids, the over-long policy (``serving.engine.request``), each
sentence's cap on generated tokens and its sampling seed, gathered into a :class:`~serving.engine.request.Prepared`.

Output length (``DecodeOptions.max_length`` and the package's decoding defaults), :func:`max_steps`:

- no override: the package's cap on generated tokens *including* EOS -- ``decoding.max_length`` (HF: the checkpoint's
  ``max_length - 1``), or, when ``decoding.extra_length`` is set (tensor2tensor), ``source tokens incl. EOS +
  extra_length`` per sentence (T2T uses the padded length of its own batch; per sentence keeps a result independent
  of how requests were batched), bounded by ``decoding.max_length``; ``decoding.forced_eos`` as configured.
- ``max_length=N``: at most N tokens *excluding* EOS: the cap is N + 1 and EOS is forced at that last step, so the
  output always ends properly.
- always bounded by the model's position table (``max_positions``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

import numpy as np

from serving.engine.decoding import SearchOptions
from serving.engine.decoding.rules import sentence_seeds
from serving.engine.errors import InvalidInput
from serving.engine.request import DecodeOptions, ModelInfo, Prepared, fit_sources


def source_ids(ids: Sequence[Sequence[int]], vocab_size: int, eos: int) -> list[list[int]]:
    """Each sentence's ids with EOS appended, checked against the source vocabulary.

    Raises:
        InvalidInput: an id outside the vocabulary (``text {index} holds the id ...``).
    """
    sources: list[list[int]] = []
    for index, sentence in enumerate(ids):
        source = [int(i) for i in sentence]
        bad = next((i for i in source if not 0 <= i < vocab_size), None)
        if bad is not None:
            raise InvalidInput(f"text {index} holds the id {bad}, outside the source vocabulary of {vocab_size}")
        sources.append([*source, eos])
    return sources


def prefix_ids(encode_target: Callable[[str], list[int]], target_prefix: Sequence[str] | None,
               count: int) -> list[list[int]] | None:
    """Each sentence's target prefix as target ids (no EOS; [] for ""), or None.

    Raises:
        InvalidInput: not ``count`` prefixes.
    """
    if target_prefix is None:
        return None
    if len(target_prefix) != count:
        raise InvalidInput(f"{len(target_prefix)} target prefixes for {count} texts")
    return [encode_target(prefix) if prefix else [] for prefix in target_prefix]


def max_steps(info: ModelInfo, source_lengths: np.ndarray, options: DecodeOptions) -> np.ndarray:
    """Per-sentence cap on generated tokens, EOS included (module docstring)."""
    defaults = info.decoding
    if options.max_length is not None:
        caps = np.full(source_lengths.shape, int(options.max_length) + 1, dtype=np.int64)
    elif defaults.extra_length is not None:
        caps = np.minimum(source_lengths + int(defaults.extra_length), int(defaults.max_length))
    else:
        caps = np.full(source_lengths.shape, int(defaults.max_length), dtype=np.int64)
    return np.clip(caps, 1, info.max_input_tokens).astype(np.int64)


def prepared(info: ModelInfo, sources: list[list[int]], options: DecodeOptions, search: SearchOptions,
             prefixes: list[list[int]] | None = None) -> Prepared:
    """Sources (EOS appended) ready to decode: fitted to the model's positions, capped, seeded (sentence ``i`` of a
    request samples with the ``i``-th stream of its seed, a random one without ``seed``).

    Raises:
        InputTooLong: a source longer than the model's positions (unless ``options.truncate``).
        InvalidInput: a target prefix as long as its translation may be.
    """
    sources, truncated = fit_sources(sources, info.max_input_tokens, options.truncate)
    lengths = np.array([len(source) for source in sources], dtype=np.int64)
    caps = max_steps(info, lengths, options)
    if prefixes is not None and any(prefixes):
        prefix_lengths = np.array([len(prefix) for prefix in prefixes], dtype=np.int64)
        caps = np.minimum(caps + prefix_lengths, info.max_input_tokens)
        if (prefix_lengths >= caps).any():
            index = int(np.argmax(prefix_lengths >= caps))
            raise InvalidInput(f"target_prefix {index} has {prefix_lengths[index]} tokens; this translation may "
                               f"have at most {caps[index] - 1}")
    else:
        prefixes = None
    seeds = None
    if options.sampling:
        seeds = sentence_seeds(secrets.randbits(63) if options.seed is None else options.seed, len(sources))
    return Prepared(sources, caps, search, truncated=truncated, seeds=seeds, prefixes=prefixes)
