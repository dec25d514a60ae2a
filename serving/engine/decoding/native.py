"""The native search core: greedy search, sampling and both beam rule sets behind the ``Search`` protocol, each step
one call into C++ (``serving.engine._native_core`` from ``_native/``, loaded by ``serving.engine.native``) that reads the log-probs
in place and holds the GIL released for all of its work, so a server's event loop and the runtime's threads run
beside it. The numpy searches (``greedy``, ``beam``) are its reference: the same tokens, scores, plans
and streaming calls (``tests/serving/engine/test_native_core.py`` runs both on the same random inputs).

``start_search`` uses it wherever it is built, except for top-p sampling (its float arithmetic stays numpy's), and
falls back to numpy, with one log line, where the extension is missing; ``MTGATE_NATIVE=0`` in the environment
forces the numpy searches (to compare, or to rule the core out).

What stays in Python: renormalization's log-softmax (numpy's ``exp``/``log`` are not libm's, so the core hands the
rows to ``rules._log_softmax`` between its two halves of the rules), the length-penalty tables (computed once by the
reference's own numpy expressions) and the ``Hypothesis`` objects of the sentences a step finished.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np

from serving.engine.decoding.base import Hypothesis, OnTokens, Search, SearchOptions, StepPlan, length_divisor, writable
from serving.engine.decoding.beam import hf_alternative_penalty, hf_length_penalty, t2t_length_penalty
from serving.engine.decoding.rules import _log_softmax
from serving.engine.native import native_core


def native_search(caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None, ids: np.ndarray,
                  prefixes: list[list[int]] | None = None, seeds: np.ndarray | None = None) -> Search | None:
    """The search ``start_search`` would build, on the native core; None where the core is unavailable or declines
    the options (top-p sampling). Arguments as ``start_search`` checked them."""
    core = native_core()
    if core is None or (options.sampling and options.top_p < 1.0):
        return None
    if options.beam_size == 1:
        return NativeGreedySearch(core, caps, options, on_tokens, ids, prefixes, seeds)
    return NativeBeamSearch(core, caps, options, on_tokens, ids, prefixes)


class _NativeSearch:
    """What both native searches share: the core's state, the Python side of a step and the Search protocol."""

    _state: Any  # the core's Greedy or Beam

    def __init__(self, options: SearchOptions, on_tokens: OnTokens | None, count: int) -> None:
        self.options = options
        self.on_tokens = on_tokens
        self.tokens = np.full((count, 1), options.decoder_start_id, dtype=np.int64)
        self.results: dict[int, Hypothesis] = {}

    def advance(self, log_probs: np.ndarray, columns: np.ndarray | None = None) -> StepPlan | None:
        log_probs = writable(log_probs)
        if columns is not None:
            columns = np.ascontiguousarray(columns, dtype=np.int64)
        renormalize = self.options.renormalize_logits
        if renormalize:
            self._state.before_renormalize(log_probs, columns)
            _log_softmax(log_probs)
        plan, finished, stream = self._state.advance(log_probs, columns, renormalize)
        for sentence, token_ids, score, alternatives in finished:
            self.results[sentence] = Hypothesis(token_ids, score, [Hypothesis(t, s) for t, s in alternatives])
        if stream is not None and self.on_tokens is not None:
            self.on_tokens(*stream)
        return None if plan is None else StepPlan(*plan)

    def join(self, other: Search) -> None:
        assert isinstance(other, type(self)) and other.options == self.options
        self._state.join(other._state)

    def remove(self, ids: np.ndarray) -> np.ndarray | None:
        """Drop the sentences ``ids``; return the rows kept (None: nothing is left)."""
        kept: np.ndarray | None = self._state.remove(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1))
        return kept


class NativeGreedySearch(_NativeSearch):
    """``serving.engine.decoding.greedy.GreedySearch`` on the native core."""

    def __init__(self, core: ModuleType, caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None,
                 ids: np.ndarray, prefixes: list[list[int]] | None = None, seeds: np.ndarray | None = None) -> None:
        super().__init__(options, on_tokens, caps.size)
        seeds = None if seeds is None else np.ascontiguousarray(seeds, dtype=np.uint64).reshape(-1)
        self._state = core.Greedy(_core_options(core, options, on_tokens is not None), *_sentences(caps, ids, prefixes),
                                  seeds, _greedy_divisors(options.length_penalty_kind, options.length_penalty,
                                                          _table_size(caps)))


class NativeBeamSearch(_NativeSearch):
    """``serving.engine.decoding.beam.HFBeamSearch`` (or, with ``length_penalty_kind="gnmt"``, ``T2TBeamSearch``) on the
    native core."""

    def __init__(self, core: ModuleType, caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None,
                 ids: np.ndarray, prefixes: list[list[int]] | None = None) -> None:
        super().__init__(options, on_tokens, caps.size)
        penalty, normalizer = _beam_penalties(options.length_penalty_kind, options.length_penalty, _table_size(caps))
        self._state = core.Beam(_core_options(core, options, on_tokens is not None), *_sentences(caps, ids, prefixes),
                                penalty, normalizer)


def _sentences(caps: np.ndarray, ids: np.ndarray,
               prefixes: list[list[int]] | None) -> tuple[np.ndarray, np.ndarray, list[list[int]] | None]:
    return (np.ascontiguousarray(caps, dtype=np.int64).reshape(-1), np.ascontiguousarray(ids, dtype=np.int64).reshape(-1),
            None if prefixes is None else [[int(t) for t in prefix] for prefix in prefixes])


@functools.lru_cache(maxsize=256)
def _core_options(core: ModuleType, options: SearchOptions, stream: bool) -> Any:
    """``options`` as the core reads them (the core copies them into each search)."""
    out = core.Options()
    out.eos_id = options.eos_id
    out.decoder_start_id = options.decoder_start_id
    out.beam_size = options.beam_size
    out.gnmt = options.length_penalty_kind == "gnmt"
    out.forced_eos = options.forced_eos
    out.early_stopping = options.early_stopping
    out.renormalize_logits = options.renormalize_logits
    out.num_hypotheses = options.num_hypotheses
    out.min_length = options.min_length
    out.repetition_penalty = float(options.repetition_penalty)
    out.no_repeat_ngram_size = options.no_repeat_ngram_size
    out.bad_word_ids = [int(i) for i in options.bad_word_ids]
    out.sampling = options.sampling
    out.temperature = float(options.temperature)
    out.top_k = options.top_k
    out.stream = stream
    return out


def _table_size(caps: np.ndarray) -> int:
    """Entries of a length table covering every length up to the longest cap (a power of two: tables are shared)."""
    return 1 << max(6, int(np.max(caps)).bit_length())


@functools.lru_cache(maxsize=64)
def _greedy_divisors(kind: str, length_penalty: float, size: int) -> np.ndarray:
    """``[size]`` what greedy search divides a summed log-prob of ``l`` tokens by, at index ``l``."""
    options = SearchOptions(eos_id=0, decoder_start_id=0, length_penalty=length_penalty,
                            length_penalty_kind="gnmt" if kind == "gnmt" else "hf")
    table = length_divisor(np.arange(size), options).astype(np.float64)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=64)
def _beam_penalties(kind: str, length_penalty: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``[size]`` float32 tables indexed by the tokens generated after the prefix: beam search's length penalty, and
    the divisor of an alive alternative's log-prob (``beam.py``'s ``_normalized``)."""
    lengths = np.maximum(np.arange(size), 1)
    if kind == "gnmt":
        penalty = t2t_length_penalty(lengths, length_penalty).astype(np.float32)
        normalizer = penalty
    else:
        penalty = hf_length_penalty(lengths, length_penalty)
        normalizer = np.array([hf_alternative_penalty(int(g), length_penalty) for g in lengths], dtype=np.float32)
    for table in (penalty, normalizer):
        table.flags.writeable = False
    return penalty, normalizer
