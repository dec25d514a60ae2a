"""The logits rules greedy search, sampling and both beam searches apply to a step's log-probs, in transformers'
order (``GenerationMixin._get_logits_processor``): repetition penalty, no-repeat n-grams, bad words (``disable_unk``
adds the unknown id to them), minimum length, forced EOS; then renormalization; last, a target prefix forces its
tokens.

Each rule reads the rows' history the way transformers' ``input_ids`` hold it: the decoder start token, then the
tokens generated so far (a row's own count: rows of one batch may be at different steps). ``min_length`` counts the
tokens generated after the target prefix, as ``min_new_tokens`` counts those after the prompt.

Sampling draws from the log-probs after the rules, warped (:func:`warp`).

The rules act on log-probs, not logits (the decoder graphs return log-softmax). Every rule but the repetition
penalty gives the same result either way; transformers applies that one to log-probs in beam search, as here, and to
logits in greedy search and sampling, where the two can differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.engine.decoding.base import NEG_INF, SearchOptions, column_index, writable


@dataclass
class RowHistory:
    """What the rules need to know of each row.

    Attributes:
        tokens: ``[R, W]`` each row's generated tokens (start token excluded); only the first ``steps[r]`` count.
        steps: ``[R]`` tokens each row has generated.
        prefix: ``[R, P]`` each row's forced target prefix, padded with -1 (``P`` may be 0).
        prefix_len: ``[R]`` prefix tokens of each row.
    """

    tokens: np.ndarray
    steps: np.ndarray
    prefix: np.ndarray
    prefix_len: np.ndarray


def needs_history(options: SearchOptions) -> bool:
    """Whether the rules of ``options`` read the rows' history (the searches build it only then)."""
    return options.repetition_penalty != 1.0 or options.no_repeat_ngram_size > 0 or options.min_length > 0


def process(
    log_probs: np.ndarray,
    options: SearchOptions,
    bad: np.ndarray,
    forced: np.ndarray | None,
    history: RowHistory | None,
    columns: np.ndarray | None = None,
) -> np.ndarray:
    """The step's log-probs ``[R, V]`` after every rule of ``options`` (module docstring); modified in place when the
    backend's buffer allows. ``bad``: the columns of the bad words; ``forced``: the rows at their last allowed step
    (EOS only), or None; ``columns``: the ids of a shortlisted step's columns (``serving.engine.decoding.base.Search``),
    which hold EOS and every target prefix token (None: column ``i`` is id ``i``)."""
    prefixed = history is not None and bool((history.steps < history.prefix_len).any())
    if not (bad.size or forced is not None or options.renormalize_logits or prefixed
            or (history is not None and needs_history(options))):
        return log_probs
    log_probs = writable(log_probs)
    eos = int(column_index(columns, np.array([options.eos_id]))[0])
    if history is not None and options.repetition_penalty != 1.0:
        _penalize_repetitions(log_probs, history, options, columns)
    if history is not None and options.no_repeat_ngram_size > 0:
        _ban_repeated_ngrams(log_probs, history, options, columns)
    if bad.size:
        log_probs[:, bad] = NEG_INF
    if history is not None and options.min_length > 0:
        assert eos >= 0, "a shortlisted step always has EOS among its columns"
        short = history.steps - history.prefix_len < options.min_length
        log_probs[short, eos] = NEG_INF
    if forced is not None:
        assert eos >= 0, "a shortlisted step always has EOS among its columns"
        log_probs[forced] = NEG_INF
        log_probs[forced, eos] = 0.0
    if options.renormalize_logits:
        _log_softmax(log_probs)
    if prefixed:
        assert history is not None
        rows = np.flatnonzero(history.steps < history.prefix_len)
        tokens = column_index(columns, history.prefix[rows, history.steps[rows]])
        assert (tokens >= 0).all(), "a shortlisted step always has the target prefix tokens among its columns"
        log_probs[rows] = NEG_INF
        log_probs[rows, tokens] = 0.0
    return log_probs


def _log_softmax(scores: np.ndarray) -> None:
    top = scores.max(axis=1, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    scores -= top
    with np.errstate(divide="ignore"):
        scores -= np.log(np.exp(scores).sum(axis=1, keepdims=True))


def _seen(history: RowHistory, start_id: int, vocab: int, columns: np.ndarray | None) -> np.ndarray:
    """``[R, V]`` True where a token is in the row's history (the start token included, as in ``input_ids``); ``V``
    columns, those of ``columns``' ids when a shortlist narrowed the step."""
    rows, width = history.tokens.shape
    seen = np.zeros((rows, vocab), dtype=bool)
    valid = np.arange(width)[None, :] < history.steps[:, None]
    row_index = np.broadcast_to(np.arange(rows)[:, None], (rows, width))
    column = column_index(columns, history.tokens[valid])
    present = column >= 0
    seen[row_index[valid][present], column[present]] = True
    start = int(column_index(columns, np.array([start_id]))[0])
    if 0 <= start < vocab:
        seen[:, start] = True
    return seen


def _penalize_repetitions(log_probs: np.ndarray, history: RowHistory, options: SearchOptions,
                          columns: np.ndarray | None) -> None:
    """transformers' ``RepetitionPenaltyLogitsProcessor``: a seen token's score times the penalty when negative,
    divided by it otherwise."""
    seen = _seen(history, options.decoder_start_id, log_probs.shape[1], columns)
    penalty = np.float32(options.repetition_penalty)
    scores = log_probs[seen]
    log_probs[seen] = np.where(scores < 0, scores * penalty, scores / penalty)


def _ban_repeated_ngrams(log_probs: np.ndarray, history: RowHistory, options: SearchOptions,
                         columns: np.ndarray | None) -> None:
    """transformers' ``NoRepeatNGramLogitsProcessor``: a token that would repeat an n-gram of the row's history
    (start token included) is banned."""
    n = options.no_repeat_ngram_size
    for row in range(log_probs.shape[0]):
        steps = int(history.steps[row])
        sequence = [options.decoder_start_id, *history.tokens[row, :steps].tolist()]
        if len(sequence) + 1 < n:
            continue
        tail = tuple(sequence[len(sequence) - n + 1 :]) if n > 1 else ()
        banned = [sequence[i + n - 1] for i in range(len(sequence) - n + 1) if tuple(sequence[i : i + n - 1]) == tail]
        if banned:
            index = column_index(columns, np.asarray(banned))
            log_probs[row, index[index >= 0]] = NEG_INF


def warp(log_probs: np.ndarray, options: SearchOptions) -> np.ndarray:
    """What sampling draws from (a new array; the log-probs after the rules stay as they are, for the score):
    transformers' warpers in its order, temperature, top-k (ties with the k-th kept), top-p (the smallest set whose
    probability reaches ``top_p``, at least one token). Warping after renormalization, as here, draws from the same
    distribution as transformers' warping before it."""
    top = log_probs.max(axis=1, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    # Shifted so that each row's best is 0: a tiny temperature leaves it 0 and sends the others to -inf (greedy).
    with np.errstate(over="ignore"):  # beyond float32: -inf, as meant
        scores = ((log_probs - top).astype(np.float64) / options.temperature).astype(np.float32)
    vocab = scores.shape[1]
    if 0 < options.top_k < vocab:
        kth = -np.partition(-scores, options.top_k - 1, axis=1)[:, options.top_k - 1 : options.top_k]
        scores[scores < kth] = NEG_INF
    if options.top_p < 1.0:
        order = np.argsort(scores, axis=1, kind="stable")  # ascending, as transformers sorts
        ranked = np.take_along_axis(scores, order, axis=1)
        shifted = ranked - ranked[:, -1:]
        probs = np.exp(shifted)
        cumulative = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
        remove = cumulative <= 1.0 - options.top_p
        remove[:, -1] = False
        rows = np.broadcast_to(np.arange(scores.shape[0])[:, None], order.shape)
        scores[rows[remove], order[remove]] = NEG_INF
    return np.asarray(scores)


def sample(scores: np.ndarray, seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """One token per row drawn from ``softmax(scores)`` with a uniform number that depends only on the row's seed and
    step (:func:`uniform`), so a sentence samples the same tokens however it is batched."""
    shifted = scores - scores.max(axis=1, keepdims=True)
    probs = np.exp(shifted.astype(np.float64))
    cumulative = np.cumsum(probs, axis=1)
    threshold = uniform(seeds, steps) * cumulative[:, -1]
    chosen = (cumulative <= threshold[:, None]).sum(axis=1)
    # Never a token of probability 0 (a rounding edge at the top end): the last allowed token instead.
    last_allowed = scores.shape[1] - 1 - np.argmax((probs > 0)[:, ::-1], axis=1)
    return np.asarray(np.minimum(chosen, last_allowed), dtype=np.int64)


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.asarray((z ^ (z >> np.uint64(31))) & _MASK64)


def sentence_seeds(seed: int, count: int) -> np.ndarray:
    """The seeds of a request's ``count`` sentences, from the request's seed (each sentence its own stream)."""
    with np.errstate(over="ignore"):
        return _splitmix64(np.uint64(seed % 2**64) + np.arange(count, dtype=np.uint64) * np.uint64(0x632BE59BD9B4E019))


def uniform(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``[R]`` numbers in [0, 1), a function of each row's (seed, step) only (splitmix64)."""
    with np.errstate(over="ignore"):
        mixed = _splitmix64(seeds.astype(np.uint64) ^ _splitmix64(steps.astype(np.uint64)))
    return (mixed >> np.uint64(11)).astype(np.float64) / float(2**53)


def prefix_arrays(prefixes: list[list[int]] | None, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prefix [count, P] padded with -1, prefix_len [count])`` of per-sentence target prefixes (None: none)."""
    if not prefixes:
        return np.full((count, 0), -1, dtype=np.int64), np.zeros(count, dtype=np.int64)
    lengths = np.array([len(p) for p in prefixes], dtype=np.int64)
    array = np.full((count, int(lengths.max(initial=0))), -1, dtype=np.int64)
    for row, prefix in enumerate(prefixes):
        array[row, : len(prefix)] = prefix
    return array, lengths
