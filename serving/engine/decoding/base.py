"""What a search is: its options, its results, the plan of each step and the ``Search`` protocol (the logits rules
greedy and beam search both apply are ``serving.engine.decoding.rules``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

LengthPenaltyKind = Literal["hf", "gnmt"]

NEG_INF = np.float32(-np.inf)

OnTokens = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
"""``on_tokens(rows, tokens, lengths)``: the output of sentence ``rows[i]`` (an index into the decoded batch) starts
with ``tokens[i, :lengths[i]]``, which no later step changes (streaming). A search calls it at most once per step.
Greedy search: after every step, for the sentences still decoding (including the step that emits their EOS). Beam
search: the sentences the step finished, with their result, then those whose *stable prefix* grew, with it: the
prefix every hypothesis that can still be the result shares (the alive beams and the finished hypotheses kept), so
that each call extends the one before and the last is the result. Without a hook a search does none of this work."""

Alive = Callable[[np.ndarray], np.ndarray]
"""``alive(ids)`` -> ``[n]`` bool: of the sentences ``ids`` still decoding, which are still wanted (their request's
deadline has not passed, their client is still there). Polled before every decoder step; the sentences it answers
False for leave the batch (their rows are dropped, as finished ones are) and get an empty hypothesis."""


@dataclass(frozen=True)
class SearchOptions:
    """How to search, resolved for one batch (see ````serving.package.DecodingDefaults```` for the meaning of each).

    Attributes:
        eos_id: end-of-sentence id.
        decoder_start_id: the first decoder input.
        beam_size: 1 for greedy search.
        length_penalty: HF exponent, or T2T's alpha.
        length_penalty_kind: ``"hf"`` or ``"gnmt"``; also selects the beam rules (module docstring).
        bad_word_ids: ids that are never generated.
        forced_eos: at each sentence's last allowed step, only EOS may be chosen.
        early_stopping: HF ``early_stopping=True``: a sentence stops once it has ``beam_size`` finished hypotheses.
        renormalize_logits: log-softmax again after the rules above (HF ``renormalize_logits``).
        num_hypotheses: hypotheses returned per sentence, best first (at most ``beam_size``; greedy search: 1).
        min_length: EOS is not chosen before this many tokens after the target prefix (HF ``min_new_tokens``).
        repetition_penalty: HF ``repetition_penalty`` (1: none), on log-probs (``serving.engine.decoding.rules``).
        no_repeat_ngram_size: no n-gram of this size occurs twice in a hypothesis (0: no rule).
        sampling: draw each token from the distribution after the rules (``beam_size`` 1) instead of the arg-max.
        temperature: sampling temperature.
        top_k: sample among the ``top_k`` most likely tokens (0: all).
        top_p: sample among the most likely tokens whose probability reaches ``top_p`` (1: all).
        return_scores: the engine also scores each output token (``Translation.token_scores``); the search is the
            same.
    """

    eos_id: int
    decoder_start_id: int
    beam_size: int = 1
    length_penalty: float = 1.0
    length_penalty_kind: LengthPenaltyKind = "hf"
    bad_word_ids: tuple[int, ...] = ()
    forced_eos: bool = False
    early_stopping: bool = False
    renormalize_logits: bool = False
    num_hypotheses: int = 1
    min_length: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    return_scores: bool = False


@dataclass
class Hypothesis:
    """One decoded sentence.

    Attributes:
        token_ids: generated ids (no start token); ends with EOS unless the length cap cut it.
        score: length-normalized log-probability (HF: ``/ len ** lp``; gnmt: ``/ ((5 + len) / 6) ** alpha``), or, for
            a T2T beam that never finished, its raw log-probability.
        alternatives: the next best hypotheses, best first (``num_hypotheses - 1`` of them; none by default).
    """

    token_ids: list[int]
    score: float
    alternatives: list[Hypothesis] = field(default_factory=list)


@dataclass(frozen=True)
class StepPlan:
    """What the next decoder step runs on, as decided by one search step.

    Attributes:
        tokens: ``[M, 1]`` the next step's inputs, one per row.
        rows: ``[M]`` for each next row, the row of this step whose cache it continues (beam reorder, finished
            sentences dropped).
        encoder_rows: ``[M]`` for each next row, the row of this step's encoder outputs (``cross_kv``, ``src_bias``)
            it attends to; None when they stay as they are.
    """

    tokens: np.ndarray
    rows: np.ndarray
    encoder_rows: np.ndarray | None


class Search(Protocol):
    """A search over encoded sentences, driven one decoder step at a time: feed ``tokens`` (an empty cache) to the
    decoder, pass its log-probs to :meth:`advance`, and continue with the plan it returns until it returns None.
    With a vocabulary shortlist the log-probs have a column per id of the sorted ``columns`` only (the others are
    -inf for every row); None: a column per id of the vocabulary.
    ``results`` collects each finished sentence's hypothesis under its id as soon as it is done.

    Sentences may join a running search (:meth:`join`, for step-level batching): their rows come after the running
    ones, and each sentence counts its own steps."""

    tokens: np.ndarray
    results: dict[int, Hypothesis]

    def advance(self, log_probs: np.ndarray, columns: np.ndarray | None = None) -> StepPlan | None: ...

    def join(self, other: Search) -> None: ...

    def remove(self, ids: np.ndarray) -> np.ndarray | None: ...


class SentenceArrays:
    """A numpy search's state as arrays indexed by sentence on their first axis, and what both numpy searches
    (greedy, beam) do with it for the ``Search`` protocol: :meth:`join` another search of the same options (its
    sentences after these; the token sequences first padded to one width) and :meth:`remove` sentences."""

    options: SearchOptions
    ids: np.ndarray  # of the sentences still decoding

    def _padded(self) -> dict[str, int]:
        """The arrays of token sequences (their last axis grows), each with the fill that pads it."""
        raise NotImplementedError

    def _per_sentence(self) -> tuple[str, ...]:
        """The other arrays indexed by sentence."""
        raise NotImplementedError

    def _rows_per_sentence(self) -> int:
        """How many decoder rows each sentence has now (consecutive, in sentence order)."""
        return 1

    def join(self, other: Search) -> None:
        assert isinstance(other, type(self)) and other.options == self.options
        for name, fill in self._padded().items():
            mine, theirs = getattr(self, name), getattr(other, name)
            width = max(mine.shape[-1], theirs.shape[-1])
            setattr(self, name, np.concatenate([pad_width(mine, width, fill), pad_width(theirs, width, fill)]))
        for name in self._per_sentence():
            setattr(self, name, np.concatenate([getattr(self, name), getattr(other, name)]))

    def remove(self, ids: np.ndarray) -> np.ndarray | None:
        """Drop the sentences ``ids``; return the rows kept (None: nothing is left)."""
        keep = np.flatnonzero(~np.isin(self.ids, ids))
        if keep.size == 0:
            return None
        self._keep(keep)
        rows = self._rows_per_sentence()
        return np.asarray((keep[:, None] * rows + np.arange(rows)).reshape(-1))

    def _keep(self, keep: np.ndarray) -> None:
        for name in (*self._padded(), *self._per_sentence()):
            setattr(self, name, getattr(self, name)[keep])


def normalize_score(log_prob: np.ndarray, length: np.ndarray, options: SearchOptions) -> np.ndarray:
    """Length-normalize summed log-probs the way ``options.length_penalty_kind`` does."""
    return np.asarray(log_prob / length_divisor(length, options))


def length_divisor(length: np.ndarray, options: SearchOptions) -> np.ndarray:
    """What :func:`normalize_score` divides the summed log-probs of ``length`` tokens by (float64)."""
    length = np.maximum(length, 1).astype(np.float64)
    if options.length_penalty_kind == "gnmt":
        return np.asarray(((5.0 + length) / 6.0) ** options.length_penalty)
    return np.asarray(length**options.length_penalty)


def bad_word_index(options: SearchOptions, vocab: int, columns: np.ndarray | None = None) -> np.ndarray:
    """The log-prob columns of ``options.bad_word_ids`` (those in the vocabulary of ``vocab`` ids, or, when a
    shortlist narrowed the step to the sorted ids ``columns``, those among them)."""
    ids = np.asarray(options.bad_word_ids, dtype=np.int64)
    index = ids[(ids >= 0) & (ids < vocab)] if columns is None else column_index(columns, ids)
    return index[index >= 0]


def column_index(columns: np.ndarray | None, ids: np.ndarray) -> np.ndarray:
    """The log-prob column of each id: the id itself (``columns`` None: the whole vocabulary), or its position in the
    sorted ids ``columns`` of a shortlisted step, -1 where it is not among them."""
    ids = np.asarray(ids, dtype=np.int64)
    if columns is None:
        return ids
    at = np.minimum(np.searchsorted(columns, ids), max(columns.size - 1, 0))
    return np.where((columns.size > 0) & (columns[at] == ids), at, -1)


def token_ids(columns: np.ndarray | None, index: np.ndarray) -> np.ndarray:
    """The token ids of log-prob columns (:func:`column_index`'s inverse)."""
    return np.asarray(index if columns is None else columns[index], dtype=np.int64)


def writable(log_probs: np.ndarray) -> np.ndarray:
    """The backend's float32 log-probs, modified in place when its buffer allows (it is ours until the next step)."""
    if log_probs.dtype == np.float32 and log_probs.flags.writeable and log_probs.flags.c_contiguous:
        return log_probs
    return np.array(log_probs, dtype=np.float32)


def pad_width(seqs: np.ndarray, width: int, fill: int) -> np.ndarray:
    """``seqs [n, ..., w]`` padded with ``fill`` to ``width`` on the last axis."""
    pad = width - seqs.shape[-1]
    if pad == 0:
        return seqs
    return np.pad(seqs, [(0, 0)] * (seqs.ndim - 1) + [(0, pad)], constant_values=fill)


def join_seeds(parts: Sequence[tuple[int, np.ndarray | None]]) -> np.ndarray | None:
    """The sampling seeds of sentence groups joined in order (``parts``: each group's size and seeds, None for none;
    a group without seeds gets 0s), or None when no group has any."""
    if all(seeds is None for _, seeds in parts):
        return None
    return np.concatenate([np.zeros(n, np.uint64) if seeds is None else seeds for n, seeds in parts])


def join_prefixes(parts: Sequence[tuple[int, list[list[int]] | None]]) -> list[list[int]] | None:
    """The target prefixes of sentence groups joined in order (``parts``: each group's size and prefixes, None for
    none; a group without prefixes gets empty ones), or None when no group has any."""
    if all(prefixes is None for _, prefixes in parts):
        return None
    return [prefix for n, prefixes in parts for prefix in (prefixes or [[] for _ in range(n)])]
