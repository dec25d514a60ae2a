"""Greedy and beam search in numpy over a decoder-step backend.

The backend contract (``docs/architecture.md``): ``decode_step(input_ids [N, 1], step, past_kv [L, 2, N, H, T, Dh],
cross_kv [L, 2, N, H, S, Dh], src_bias [N, 1, 1, S]) -> (log_probs [N, V], present_kv [L, 2, N, H, T + 1, Dh])``.
Every operation here works on whole arrays: there is no Python loop over sentences or beams, only over steps.

Two sets of beam rules, chosen by ``SearchOptions.length_penalty_kind``:

``"hf"`` -- exactly what transformers 4.57 ``generate(num_beams=K)`` does (``GenerationMixin._beam_search`` and its
helpers), so that a converted Marian model returns the tokens of the original:

- candidate score = running beam log-prob + log-softmax of the next token, after the logits processors (bad words
  -> -inf; ``forced_eos``: at the last allowed step every token but EOS -> -inf and EOS -> 0). All K beams start from
  the same prefix; beams 1..K-1 start at -1e9 so that only beam 0 spawns candidates at the first step.
- the top 2K candidates of the flattened ``K x V`` scores are kept. One that ends with EOS, or any candidate at the
  last allowed step, is a finished hypothesis, but only if it ranks among the first K of the 2K; its score is
  ``log_prob / generated_len ** length_penalty`` (``generated_len`` counts EOS, not the start token). Finished ones
  are merged with the K best finished so far and the best K kept. The best K unfinished candidates stay alive.
- a sentence is done once all K finished slots are filled and the best alive beam, normalized by its current length,
  cannot beat the worst finished one (the ``early_stopping=False`` heuristic), or, with ``early_stopping=True``, as
  soon as all K slots are filled; or at the length cap. Its result is the best finished hypothesis.
- score arithmetic is float32 like the torch reference, including the ``-1e9`` masks.

``"gnmt"`` -- tensor2tensor's ``beam_search`` (``../shared/reference/t2t-transformer.md`` section 3): alive beams
start at ``[0, -1e7, ...]``; candidates are ranked by ``log_prob / ((5 + len) / 6) ** alpha``; any EOS candidate
of the 2K may finish; the length cap ends a hypothesis without adding it to the finished set; a sentence is done when
its best finished score beats ``best alive log-prob / ((5 + cap) / 6) ** alpha``; with nothing finished, the best
alive hypothesis is returned with its raw log-prob.

Both: ties between exactly equal scores go to the lower flat index ``beam * V + token`` (``tf.nn.top_k``'s order;
``torch.topk`` leaves it unspecified). Finished sentences leave the batch: their rows are dropped from the cache,
``cross_kv`` and ``src_bias`` with ``np.take`` (axis 2 / axis 0); the beam reorder and the drop share one ``take``
of the self-attention cache per step. Greedy search (``beam_size == 1``) takes the arg-max after the same logits
processors, as transformers does for ``num_beams=1``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

logger = logging.getLogger(__name__)

LengthPenaltyKind = Literal["hf", "gnmt"]

# transformers masks with -1e9 (float32); tensor2tensor's INF is 1e7.
_HF_MASK = np.float32(-1.0e9)
_T2T_INF = np.float32(1.0e7)
_NEG_INF = np.float32(-np.inf)

StepCallback = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
"""``on_step(rows, tokens, lengths)``: sentence ``rows[i]`` (an index into the decoded batch) now has the output
``tokens[i, :lengths[i]]``. Greedy search calls it after every step for the sentences still decoding (including the
step that emits their EOS); beam search calls it once per sentence, with its final hypothesis, when it is done."""


class DecoderStep(Protocol):
    """The part of the ``Backend`` protocol decoding needs."""

    def decode_step(
        self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray, src_bias: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class SearchOptions:
    """How to search, resolved for one batch (see ``serving.package.DecodingDefaults`` for the meaning of each).

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


@dataclass
class Hypothesis:
    """One decoded sentence.

    Attributes:
        token_ids: generated ids (no start token); ends with EOS unless the length cap cut it.
        score: length-normalized log-probability (HF: ``/ len ** lp``; gnmt: ``/ ((5 + len) / 6) ** alpha``), or, for
            a T2T beam that never finished, its raw log-probability.
    """

    token_ids: list[int]
    score: float


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
    ``results`` collects each finished sentence's hypothesis under its id as soon as it is done.

    Sentences may join a running search (:meth:`join`, for step-level batching): their rows come after the running
    ones, and each sentence counts its own steps."""

    tokens: np.ndarray
    results: dict[int, Hypothesis]

    def advance(self, log_probs: np.ndarray) -> StepPlan | None: ...

    def join(self, other: Search) -> None: ...

    def remove(self, ids: np.ndarray) -> np.ndarray | None: ...


def start_search(
    max_steps: np.ndarray,
    options: SearchOptions,
    on_step: StepCallback | None = None,
    *,
    ids: np.ndarray | None = None,
    joinable: bool = False,
) -> Search:
    """A step-wise search for sentences with the per-sentence caps ``max_steps`` (``[B]``, EOS included, >= 1).

    Arguments:
        max_steps: per-sentence caps.
        options: search options.
        on_step: streaming hook; its ``rows`` are sentence ids.
        ids: the sentences' ids in ``results`` and ``on_step`` (default ``0..B-1``).
        joinable: beam search starts with ``beam_size`` rows per sentence (identical; beams 1..K-1 masked), so that
            it can join or be joined at any step; otherwise its first step runs one row per sentence.

    Raises:
        ValueError: an empty batch, a cap below 1, or a beam size below 1.
    """
    caps = np.asarray(max_steps, dtype=np.int64).reshape(-1)
    if caps.size == 0:
        raise ValueError("a search needs at least one sentence")
    if caps.min() < 1:
        raise ValueError("max_steps must be at least 1")
    if options.beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {options.beam_size}")
    sentence_ids = np.arange(caps.size) if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1)
    if options.beam_size == 1:
        return _GreedySearch(caps, options, on_step, sentence_ids)
    if options.length_penalty_kind == "gnmt":
        return _T2TBeamSearch(caps, options, on_step, sentence_ids, joinable)
    return _HFBeamSearch(caps, options, on_step, sentence_ids, joinable)


def search(
    decoder: DecoderStep,
    cross_kv: np.ndarray,
    src_bias: np.ndarray,
    max_steps: np.ndarray,
    options: SearchOptions,
    on_step: StepCallback | None = None,
) -> list[Hypothesis]:
    """Decode a batch of encoded sentences.

    Arguments:
        decoder: the backend (``decode_step``).
        cross_kv: the encoder's cross-attention keys/values ``[L, 2, B, H, S, Dh]``.
        src_bias: the encoder's source mask bias ``[B, 1, 1, S]``.
        max_steps: ``[B]`` per-sentence cap on generated tokens, EOS included (>= 1).
        options: search options.
        on_step: optional streaming hook (:data:`StepCallback`).

    Returns:
        One :class:`Hypothesis` per sentence, in batch order.
    """
    caps = np.asarray(max_steps, dtype=np.int64).reshape(-1)
    if caps.shape[0] != cross_kv.shape[2] or caps.shape[0] != src_bias.shape[0]:
        raise ValueError(f"max_steps has {caps.shape[0]} entries for a batch of {cross_kv.shape[2]}")
    if caps.size == 0:
        return []
    state = start_search(caps, options, on_step)
    tokens, past, step = state.tokens, _empty_cache(cross_kv, caps.size), 0
    while True:
        log_probs, past = decoder.decode_step(tokens, step, past, cross_kv, src_bias)
        plan = state.advance(log_probs)
        if plan is None:
            break
        if not is_identity(plan.rows, past.shape[2]):
            past = take_rows(decoder, past, plan.rows)
        if plan.encoder_rows is not None:
            cross_kv = np.take(cross_kv, plan.encoder_rows, axis=2)
            src_bias = np.take(src_bias, plan.encoder_rows, axis=0)
        tokens, step = plan.tokens, step + 1
    return [state.results.get(i, Hypothesis([], 0.0)) for i in range(caps.size)]


def is_identity(rows: np.ndarray, size: int) -> bool:
    """``rows`` is ``0..size-1`` in order: taking them would copy the array unchanged."""
    return rows.size == size and bool((rows == np.arange(size)).all())


def normalize_score(log_prob: np.ndarray, length: np.ndarray, options: SearchOptions) -> np.ndarray:
    """Length-normalize summed log-probs the way ``options.length_penalty_kind`` does."""
    length = np.maximum(length, 1).astype(np.float64)
    if options.length_penalty_kind == "gnmt":
        return np.asarray(log_prob / ((5.0 + length) / 6.0) ** options.length_penalty)
    return np.asarray(log_prob / length**options.length_penalty)


def take_rows(decoder: DecoderStep, cache: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The cache rows ``rows`` (axis 2), in that order: the backend's ``take_rows`` when it has one (it may write
    into a buffer it reuses), else ``np.take``."""
    backend_take = getattr(decoder, "take_rows", None)
    return np.asarray(backend_take(cache, rows)) if backend_take is not None else np.take(cache, rows, axis=2)


def _empty_cache(cross_kv: np.ndarray, rows: int) -> np.ndarray:
    layers, _, _, heads, _, head_dim = cross_kv.shape
    return np.zeros((layers, 2, rows, heads, 0, head_dim), dtype=np.float32)


def _bad_word_index(options: SearchOptions, vocab: int) -> np.ndarray:
    ids = np.asarray(options.bad_word_ids, dtype=np.int64)
    return ids[(ids >= 0) & (ids < vocab)]


def _writable(log_probs: np.ndarray) -> np.ndarray:
    """The backend's float32 log-probs, modified in place when its buffer allows (it is ours until the next step)."""
    if log_probs.dtype == np.float32 and log_probs.flags.writeable and log_probs.flags.c_contiguous:
        return log_probs
    return np.array(log_probs, dtype=np.float32)


def _apply_rules(
    log_probs: np.ndarray, bad: np.ndarray, forced: np.ndarray | None, options: SearchOptions
) -> np.ndarray:
    """transformers' logits processors, in its order: bad words -> -inf; forced EOS rows -> -inf but EOS 0;
    then, with ``renormalize_logits``, log-softmax again."""
    if not (bad.size or forced is not None or options.renormalize_logits):
        return log_probs
    log_probs = _writable(log_probs)
    if bad.size:
        log_probs[:, bad] = _NEG_INF
    if forced is not None:
        log_probs[forced] = _NEG_INF
        log_probs[forced, options.eos_id] = 0.0
    if options.renormalize_logits:
        log_probs -= log_probs.max(axis=1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
    return log_probs


class _GreedySearch:
    """Arg-max after the logits processors, as transformers does for ``num_beams=1``; one row per sentence."""

    def __init__(self, caps: np.ndarray, options: SearchOptions, on_step: StepCallback | None,
                 ids: np.ndarray) -> None:
        self.options = options
        self.on_step = on_step
        self.ids = ids  # of the rows still decoding
        self.caps = caps
        self.steps = np.zeros(caps.size, dtype=np.int64)  # tokens each row has generated
        self.out = np.full((caps.size, int(caps.max())), options.eos_id, dtype=np.int64)
        self.log_prob_sum = np.zeros(caps.size, dtype=np.float64)
        self.tokens = np.full((caps.size, 1), options.decoder_start_id, dtype=np.int64)
        self.results: dict[int, Hypothesis] = {}
        self.bad: np.ndarray | None = None

    def advance(self, log_probs: np.ndarray) -> StepPlan | None:
        options = self.options
        if self.bad is None:
            self.bad = _bad_word_index(options, log_probs.shape[1])
        forced = None
        if options.forced_eos:
            last = self.caps == self.steps + 1
            forced = last if last.any() else None
        log_probs = _apply_rules(log_probs, self.bad, forced, options)
        next_ids = log_probs.argmax(axis=1)
        rows = np.arange(next_ids.size)
        self.log_prob_sum += log_probs[rows, next_ids]
        self.out[rows, self.steps] = next_ids
        lengths = self.steps = self.steps + 1
        if self.on_step is not None:
            self.on_step(self.ids, self.out[:, : int(lengths.max())], lengths)
        done = (next_ids == options.eos_id) | (self.caps <= lengths)
        if not done.any():
            return StepPlan(tokens=next_ids[:, None], rows=rows, encoder_rows=None)
        finished = np.flatnonzero(done)
        scores = normalize_score(self.log_prob_sum[finished], lengths[finished], options)
        for j, i in enumerate(finished.tolist()):
            self.results[int(self.ids[i])] = Hypothesis(self.out[i, : lengths[i]].tolist(), float(scores[j]))
        keep = np.flatnonzero(~done)
        if keep.size == 0:
            return None
        self._keep(keep)
        return StepPlan(tokens=next_ids[keep][:, None], rows=keep, encoder_rows=keep)

    def join(self, other: Search) -> None:
        assert isinstance(other, _GreedySearch) and other.options == self.options
        width = max(self.out.shape[1], other.out.shape[1])
        eos = self.options.eos_id
        self.out = np.concatenate([_pad_width(self.out, width, eos), _pad_width(other.out, width, eos)])
        self.ids = np.concatenate([self.ids, other.ids])
        self.caps = np.concatenate([self.caps, other.caps])
        self.steps = np.concatenate([self.steps, other.steps])
        self.log_prob_sum = np.concatenate([self.log_prob_sum, other.log_prob_sum])

    def remove(self, ids: np.ndarray) -> np.ndarray | None:
        """Drop the sentences ``ids``; return the rows kept (None: nothing is left)."""
        keep = np.flatnonzero(~np.isin(self.ids, ids))
        if keep.size == 0:
            return None
        self._keep(keep)
        return keep

    def _keep(self, keep: np.ndarray) -> None:
        self.ids, self.caps, self.steps = self.ids[keep], self.caps[keep], self.steps[keep]
        self.out, self.log_prob_sum = self.out[keep], self.log_prob_sum[keep]


def _pad_width(seqs: np.ndarray, width: int, fill: int) -> np.ndarray:
    """``seqs [n, ..., w]`` padded with ``fill`` to ``width`` on the last axis."""
    pad = width - seqs.shape[-1]
    if pad == 0:
        return seqs
    return np.pad(seqs, [(0, 0)] * (seqs.ndim - 1) + [(0, pad)], constant_values=fill)


_CHUNK = 64  # top-k over wide rows: chunk maxima first (see _top_k_sorted)


def _top_k_sorted(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, best first; equal scores in ascending index order.

    Narrow rows are sorted. Wide rows (beam candidates are ``K x V``: 232k for opus-mt and 4 beams) are first
    reduced to the maxima of chunks of 64 entries: the k best entries lie in the k chunks with the best maxima, so only
    those ``k x 64`` entries are ranked (about 8x faster than a selection over the whole row). A row where another
    entry ties with the k-th best is re-ranked by a full stable sort, so the result is exact in every case.
    """
    n, width = scores.shape
    if width <= 256:
        return np.asarray(np.argsort(-scores, axis=1, kind="stable")[:, :k])
    if width > 16 * k * _CHUNK:
        maxima = np.maximum.reduceat(scores, np.arange(0, width, _CHUNK), axis=1)
        chunks = np.argpartition(maxima, maxima.shape[1] - k, axis=1)[:, maxima.shape[1] - k :]
        part = (chunks[:, :, None] * _CHUNK + np.arange(_CHUNK)).reshape(n, k * _CHUNK)
        inside = part < width
        values = np.where(inside, np.take_along_axis(scores, np.minimum(part, width - 1), axis=1), _NEG_INF)
        part = np.where(inside, part, width)  # past the end: ranked after every real entry
        order = np.lexsort((part, -values), axis=1)[:, :k]
        kth = np.take_along_axis(values, order[:, -1:], axis=1)
        # Every entry >= the k-th best lies in a chunk whose maximum is >= it: more such chunks than k, or more such
        # entries in the k ranked chunks, is a tie (found without another pass over the whole row).
        tied = np.flatnonzero(((values >= kth).sum(axis=1) > k) | ((maxima >= kth).sum(axis=1) > k))
    else:
        part = np.argpartition(scores, width - k, axis=1)[:, width - k :]
        values = np.take_along_axis(scores, part, axis=1)
        order = np.lexsort((part, -values), axis=1)[:, :k]
        kth = np.take_along_axis(values, order[:, -1:], axis=1)
        tied = np.flatnonzero((scores >= kth).sum(axis=1) > k)
    top = np.take_along_axis(part, order, axis=1)
    for row in tied:  # rare: exact ties at the k-th place
        top[row] = np.argsort(-scores[row], kind="stable")[:k]
    return np.asarray(top)


class _BeamSearchBase:
    """State and cache handling shared by both beam rules; rows are ``sentence * K + beam``. Each sentence counts
    its own steps (``steps``), so that sentences that joined later share the search."""

    def __init__(self, caps: np.ndarray, options: SearchOptions, on_step: StepCallback | None, ids: np.ndarray,
                 joinable: bool) -> None:
        self.options = options
        self.on_step = on_step
        self.k = options.beam_size
        n, k, w = caps.shape[0], self.k, int(caps.max())
        # Not joinable: at the first step every beam of a sentence has the same prefix, so one row per sentence is
        # decoded; its log-probs are shared by the K beams, and the first plan repeats each row K times.
        self.expanded = joinable
        self.tokens = np.full((n * k if joinable else n, 1), options.decoder_start_id, dtype=np.int64)
        self.ids = ids  # of the sentences still decoding
        self.caps = caps
        self.steps = np.zeros(n, dtype=np.int64)  # tokens each sentence has generated
        self.alive_seq = np.full((n, k, w), options.eos_id, dtype=np.int64)
        self.finished_seq = np.full((n, k, w), options.eos_id, dtype=np.int64)
        self.finished_len = np.zeros((n, k), dtype=np.int64)
        self.finished_flag = np.zeros((n, k), dtype=bool)
        self.results: dict[int, Hypothesis] = {}
        self.bad: np.ndarray | None = None
        self._init_state(n)

    def advance(self, log_probs: np.ndarray) -> StepPlan | None:
        k = self.k
        if self.bad is None:
            self.vocab = log_probs.shape[1]
            self.bad = _bad_word_index(self.options, self.vocab)
        first = not self.expanded
        if first:
            log_probs = np.repeat(log_probs, k, axis=0)
            self.expanded = True
        candidates = self._candidates(log_probs)
        select = self._advance(candidates)  # rows (sentence * K + beam) to continue, in their new order
        if select is None:
            return None
        tokens = self.alive_seq[np.arange(self.ids.size), :, self.steps].reshape(-1, 1)
        self.steps = self.steps + 1
        if first:  # this step had one row per sentence
            rows = select // k
            return StepPlan(tokens=tokens, rows=rows, encoder_rows=rows)
        return StepPlan(tokens=tokens, rows=select, encoder_rows=self.encoder_rows)

    def join(self, other: Search) -> None:
        assert isinstance(other, type(self)) and other.options == self.options
        assert self.expanded and other.expanded, "only joinable searches join"
        width = max(self.alive_seq.shape[2], other.alive_seq.shape[2])
        eos = self.options.eos_id
        for name in ("alive_seq", "finished_seq"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, np.concatenate([_pad_width(mine, width, eos), _pad_width(theirs, width, eos)]))
        for name in self._per_sentence():
            setattr(self, name, np.concatenate([getattr(self, name), getattr(other, name)]))

    def remove(self, ids: np.ndarray) -> np.ndarray | None:
        """Drop the sentences ``ids``; return the rows kept (None: nothing is left)."""
        keep = np.flatnonzero(~np.isin(self.ids, ids))
        if keep.size == 0:
            return None
        self._keep(keep)
        rows_per_sentence = self.k if self.expanded else 1
        return np.asarray((keep[:, None] * rows_per_sentence + np.arange(rows_per_sentence)).reshape(-1))

    def _candidates(self, log_probs: np.ndarray) -> np.ndarray:
        """``[n, K * V]`` float32 candidate log-probs: alive log-prob + next-token log-prob after the rules."""
        n, k, v = self.ids.size, self.k, self.vocab
        forced = None
        if self.options.forced_eos:
            last = self.caps == self.steps + 1
            forced = np.repeat(last, k) if last.any() else None
        assert self.bad is not None
        log_probs = _writable(_apply_rules(log_probs, self.bad, forced, self.options))
        scores = log_probs.reshape(n, k, v)
        scores += self.alive_scores[:, :, None]
        return scores.reshape(n, k * v)

    def _gather(self, array: np.ndarray, index: np.ndarray) -> np.ndarray:
        """array [n, M, ...] gathered along axis 1 with index [n, J]."""
        return np.asarray(np.take_along_axis(array, index.reshape(index.shape + (1,) * (array.ndim - 2)), axis=1))

    def _extend(self, beam: np.ndarray, token: np.ndarray) -> np.ndarray:
        """The 2K candidates' sequences ``[n, 2K, w]``: the parent's prefix plus the token at each sentence's step."""
        cand_seq = self._gather(self.alive_seq, beam)
        cand_seq[np.arange(self.ids.size)[:, None], np.arange(beam.shape[1])[None, :], self.steps[:, None]] = token
        return cand_seq

    def _retire(self, done: np.ndarray) -> np.ndarray | None:
        """Record the results of the sentences marked done, drop them; return the cache rows to keep."""
        k = self.k
        if done.any():
            idx = np.flatnonzero(done)
            seqs, lens, scores = self._final(idx)
            for j, i in enumerate(idx.tolist()):
                self.results[int(self.ids[i])] = Hypothesis(seqs[j, : lens[j]].tolist(), float(scores[j]))
            if self.on_step is not None:
                self.on_step(self.ids[idx], seqs, lens)
            keep = np.flatnonzero(~done)
            if keep.size == 0:
                return None
            self._keep(keep)
            self.encoder_rows = (keep[:, None] * k + np.arange(k)).reshape(-1)
            parents = self.parents[keep]
        else:
            keep = np.arange(self.ids.size)
            parents = self.parents
            self.encoder_rows = None
        return np.asarray((keep[:, None] * k + parents).reshape(-1))

    def _per_sentence(self) -> tuple[str, ...]:
        """The state arrays indexed by sentence (first axis), besides the sequences."""
        return ("ids", "caps", "steps", "alive_scores", "finished_len", "finished_flag", "finished_scores")

    def _keep(self, keep: np.ndarray) -> None:
        for name in ("alive_seq", "finished_seq", *self._per_sentence()):
            setattr(self, name, getattr(self, name)[keep])

    # Implemented by each rule set.
    encoder_rows: np.ndarray | None
    alive_scores: np.ndarray
    finished_scores: np.ndarray
    parents: np.ndarray
    vocab: int

    def _init_state(self, n: int) -> None:
        raise NotImplementedError

    def _advance(self, candidates: np.ndarray) -> np.ndarray | None:
        raise NotImplementedError

    def _final(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError


class _HFBeamSearch(_BeamSearchBase):
    """transformers 4.57 ``_beam_search`` rules (module docstring)."""

    def _init_state(self, n: int) -> None:
        k = self.k
        self.alive_scores = np.zeros((n, k), dtype=np.float32)
        self.alive_scores[:, 1:] = _HF_MASK
        self.finished_scores = np.full((n, k), _HF_MASK, dtype=np.float32)
        self.improvable = np.ones(n, dtype=bool)
        self.top_k_mask = np.arange(2 * k) < k

    def _per_sentence(self) -> tuple[str, ...]:
        return (*super()._per_sentence(), "improvable")

    def _advance(self, candidates: np.ndarray) -> np.ndarray | None:
        k, v, opts = self.k, self.vocab, self.options
        n = self.ids.size
        lengths = self.steps + 1  # of the candidates, EOS included
        # transformers divides by float(length) ** lp, rounded to float32.
        penalty = (lengths.astype(np.float64) ** opts.length_penalty).astype(np.float32)[:, None]
        top = _top_k_sorted(candidates, 2 * k)  # [n, 2K] flat indices
        top_scores = np.take_along_axis(candidates, top, axis=1)
        beam, token = top // v, top % v
        at_cap = (self.caps <= lengths)[:, None]
        hits = (token == opts.eos_id) | at_cap  # [n, 2K]
        cand_seq = self._extend(beam, token)

        # Alive beams for the next step: the best K candidates that did not finish.
        alive_candidates = top_scores + hits.astype(np.float32) * _HF_MASK
        pick = _top_k_sorted(alive_candidates, k)
        self.alive_seq = self._gather(cand_seq, pick)
        self.alive_scores = np.take_along_axis(alive_candidates, pick, axis=1)
        self.parents = np.take_along_axis(beam, pick, axis=1)

        # Finished hypotheses: only candidates among the first K of the 2K count.
        just_finished = hits & self.top_k_mask[None, :]
        finished_candidates = top_scores / penalty
        if opts.early_stopping:
            full = self.finished_flag.all(axis=1, keepdims=True)
            finished_candidates = finished_candidates + full.astype(np.float32) * _HF_MASK
        finished_candidates = finished_candidates + (~self.improvable[:, None]).astype(np.float32) * _HF_MASK
        finished_candidates = finished_candidates + (~just_finished).astype(np.float32) * _HF_MASK
        merged_scores = np.concatenate([self.finished_scores, finished_candidates], axis=1)
        best = _top_k_sorted(merged_scores, k)
        self.finished_scores = np.take_along_axis(merged_scores, best, axis=1)
        self.finished_seq = self._gather(np.concatenate([self.finished_seq, cand_seq], axis=1), best)
        cand_len = np.broadcast_to(lengths[:, None], (n, 2 * k))
        self.finished_len = np.take_along_axis(np.concatenate([self.finished_len, cand_len], axis=1), best, axis=1)
        self.finished_flag = np.take_along_axis(
            np.concatenate([self.finished_flag, just_finished], axis=1), best, axis=1
        )

        # Can the best alive beam still beat the worst finished one? (early_stopping=False heuristic; it also keeps
        # the sentence going while any of its K finished slots is empty.)
        best_alive = self.alive_scores[:, :1] / penalty
        worst_finished = np.where(
            self.finished_flag, self.finished_scores.min(axis=1, keepdims=True), _HF_MASK
        )
        self.improvable &= (best_alive > worst_finished).any(axis=1)
        done = ~self.improvable | at_cap[:, 0]
        if opts.early_stopping:
            done |= self.finished_flag.all(axis=1)
        return self._retire(done)

    def _final(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        seqs = self.finished_seq[idx, 0]
        lens = self.finished_len[idx, 0]
        scores = self.finished_scores[idx, 0].astype(np.float64)
        missing = ~self.finished_flag[idx, 0]
        if missing.any():  # cannot happen with transformers' rules; kept as a guard
            seqs = seqs.copy()
            seqs[missing] = self.alive_seq[idx[missing], 0]
            lens = np.where(missing, self.steps[idx] + 1, lens)
            scores = np.where(missing, self.alive_scores[idx, 0], scores)
        return seqs, lens, scores


class _T2TBeamSearch(_BeamSearchBase):
    """tensor2tensor ``beam_search`` rules (module docstring)."""

    def _init_state(self, n: int) -> None:
        k = self.k
        self.alive_scores = np.zeros((n, k), dtype=np.float32)  # raw log-probs
        self.alive_scores[:, 1:] = -_T2T_INF
        self.finished_scores = np.full((n, k), -_T2T_INF, dtype=np.float32)  # penalized

    def _penalty(self, length: np.ndarray | int) -> np.ndarray:
        alpha = np.float32(self.options.length_penalty)
        return np.asarray(np.power((np.float32(5.0) + np.asarray(length, dtype=np.float32)) / np.float32(6.0), alpha))

    def _advance(self, candidates: np.ndarray) -> np.ndarray | None:
        k, v, opts = self.k, self.vocab, self.options
        n = self.ids.size
        lengths = self.steps + 1
        penalty = self._penalty(lengths)[:, None]
        penalized = candidates / penalty
        top = _top_k_sorted(penalized, 2 * k)
        top_scores = np.take_along_axis(penalized, top, axis=1)
        top_log_probs = top_scores * penalty  # T2T recovers the log-probs this way
        beam, token = top // v, top % v
        finished_now = token == opts.eos_id
        cand_seq = self._extend(beam, token)

        alive_candidates = top_scores + finished_now.astype(np.float32) * -_T2T_INF
        pick = _top_k_sorted(alive_candidates, k)
        self.alive_seq = self._gather(cand_seq, pick)
        self.alive_scores = np.take_along_axis(top_log_probs, pick, axis=1)
        self.parents = np.take_along_axis(beam, pick, axis=1)

        finished_candidates = top_scores + (~finished_now).astype(np.float32) * -_T2T_INF
        merged_scores = np.concatenate([self.finished_scores, finished_candidates], axis=1)
        best = _top_k_sorted(merged_scores, k)
        self.finished_scores = np.take_along_axis(merged_scores, best, axis=1)
        self.finished_seq = self._gather(np.concatenate([self.finished_seq, cand_seq], axis=1), best)
        cand_len = np.broadcast_to(lengths[:, None], (n, 2 * k))
        self.finished_len = np.take_along_axis(np.concatenate([self.finished_len, cand_len], axis=1), best, axis=1)
        self.finished_flag = np.take_along_axis(
            np.concatenate([self.finished_flag, finished_now], axis=1), best, axis=1
        )

        # Stop once no alive beam, even at the longest allowed length, can beat the best finished one.
        bound = self.alive_scores[:, 0] / self._penalty(self.caps)
        done = (self.finished_scores.max(axis=1) > bound) | (self.caps <= lengths)
        return self._retire(done)

    def _final(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        has_finished = self.finished_flag[idx].any(axis=1)
        seqs = np.where(has_finished[:, None], self.finished_seq[idx, 0], self.alive_seq[idx, 0])
        lens = np.where(has_finished, self.finished_len[idx, 0], self.steps[idx] + 1)
        scores = np.where(has_finished, self.finished_scores[idx, 0], self.alive_scores[idx, 0]).astype(np.float64)
        return seqs, lens, scores
