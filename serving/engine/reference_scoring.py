"""Reference scoring: the model's log-likelihood of given translations, teacher-forced (``Translator.score``).

The decoder graph runs one step per call, so a batch is scored step by step: the sources are encoded once
(``serving.engine.encoding``, as for translation), then every row is fed the decoder start id and its target's tokens one at
a time, and each step gathers the log-probability of each row's next target token (its ids, then EOS). A row whose
target is done leaves the batch (its cache, cross-attention and source-bias rows are dropped, as
``serving.engine.decoding.search`` drops finished sentences), so a batch costs as many decoder calls as its longest target
has tokens. The log-probabilities are the graph's own (log-softmax of the logits), with none of the decoding rules
(bad words, forced EOS): what transformers' loss over ``labels`` averages, negated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from serving.engine.backends import Backend, EncoderOutput, empty_past
from serving.engine.decoding import take_rows
from serving.engine.errors import InferenceFailed, InvalidInput, ServingError
from serving.engine.planner import BatchBudget, plan
from serving.engine.request import ReferenceScore, check_lengths, fit_sources
from serving.engine.tokenizers import InvalidText

logger = logging.getLogger(__name__)

EncodeRows = Callable[[list[list[int]], np.ndarray], EncoderOutput]
"""``encode_rows(sources, rows)``: the encoder output of the sources ``rows`` (sorted by decreasing length):
``serving.engine.translator.Translator.encode_batch``."""


def check_pairs(sources: int, targets: int) -> None:
    """Refuse a scoring request without one target per source.

    Raises:
        InvalidInput: ``"2 sources and 1 targets; scoring needs one target per source"``.
    """
    if sources != targets:
        raise InvalidInput(f"{sources} sources and {targets} targets; scoring needs one target per source")


def encode_texts(encode: Callable[[str], list[int]], texts: Sequence[str], eos: int, limit: int | None,
                 side: str) -> list[list[int]]:
    """Tokenize one side of the pairs (EOS appended) and check it against the model's positions.

    Arguments:
        encode: the tokenizer's ``encode`` (sources) or ``encode_target`` (targets).
        texts: the side's texts.
        eos: the EOS id.
        limit: the model's positions (the longest text, EOS included); None: not checked (the caller cuts).
        side: ``source`` or ``target``: how errors name a text (``target[3]``).

    Raises:
        InvalidText: a text that is not valid Unicode, named ``<side>[i]``.
        InputTooLong: a text longer than ``limit``, named ``<side>[i]`` (``index`` set).
    """
    ids: list[list[int]] = []
    for index, text in enumerate(texts):
        try:
            ids.append([*encode(text), eos])
        except InvalidText as e:
            raise e.about(f"{side}[{index}]") from None
    if limit is not None:
        check_lengths([len(i) for i in ids], limit, subject=f"{side}[{{index}}]")
    return ids


def fit_scored_sources(sources: list[list[int]], limit: int, truncate: bool) -> list[list[int]]:
    """The sources of pairs to score (EOS last) within the model's ``limit`` of positions: with ``truncate`` cut as
    a translation's are (:func:`serving.engine.request.fit_sources`: the reference is scored against what was translated),
    else checked (an over-long one named ``source[i]``).

    Raises:
        InputTooLong: without ``truncate``, a source longer than ``limit``.
    """
    if truncate:
        return fit_sources(sources, limit, True)[0]
    check_lengths([len(source) for source in sources], limit, "source[{index}]")
    return sources


def score_references(
    backend: Backend,
    encode_rows: EncodeRows,
    sources: list[list[int]],
    targets: list[list[int]],
    *,
    decoder_start: int,
    budget: BatchBudget,
    runtime: str = "",
) -> list[ReferenceScore]:
    """Teacher-forced scores of ``targets`` given ``sources`` (ids, EOS appended to both), in order.

    Arguments:
        backend: runs the decoder-step graph.
        encode_rows: encodes sub-batches of ``sources`` (:data:`EncodeRows`).
        sources, targets: the pairs' ids; a target must hold at least EOS.
        decoder_start: the id fed at the first step.
        budget: the engine's budget (``serving.engine.planner``), as for translation: a pair decodes one row.
        runtime: named in the error message.

    Raises:
        InferenceFailed: the runtime failed.
    """
    lengths = np.array([len(source) for source in sources], dtype=np.int64)
    results: list[ReferenceScore | None] = [None] * len(sources)
    for rows in plan(lengths, budget):
        started = time.perf_counter()
        try:
            encoded = encode_rows(sources, rows)
            log_probs = score_batch(backend, encoded, [targets[i] for i in rows], decoder_start)
        except ServingError:
            raise
        except Exception as e:
            raise InferenceFailed(f"{runtime or 'the runtime'} failed scoring a batch of {rows.size}: {e}") from e
        for row, index in enumerate(rows):
            results[index] = ReferenceScore.of(targets[index], log_probs[row].tolist())
        logger.debug("scored a batch of %d (source length %d) in %.1f ms", rows.size, encoded.src_bias.shape[3],
                     (time.perf_counter() - started) * 1000)
    return [r for r in results if r is not None]


def score_batch(
    backend: Backend, encoded: EncoderOutput, targets: Sequence[Sequence[int]], decoder_start: int
) -> list[np.ndarray]:
    """The log-probability of each target token (row ``i`` of ``encoded`` is the source of ``targets[i]``), one
    decoder call per step for the rows whose target is not done.

    Returns:
        Per row, ``[len(targets[i])]`` float64 log-probabilities.
    """
    lengths = np.array([len(target) for target in targets], dtype=np.int64)
    if lengths.size == 0:
        return []
    if lengths.min() < 1:
        raise ValueError("every target needs at least one token (EOS)")
    padded = np.zeros((lengths.size, int(lengths.max())), dtype=np.int64)
    for row, target in enumerate(targets):
        padded[row, : len(target)] = target
    scores = np.zeros(padded.shape, dtype=np.float64)
    cross_kv, src_bias = encoded.cross_kv, encoded.src_bias
    active = np.arange(lengths.size)  # the batch row of each row still scored
    tokens = np.full((lengths.size, 1), decoder_start, dtype=np.int64)
    past = empty_past(cross_kv)
    for step in range(padded.shape[1]):
        log_probs, past = backend.decode_step(tokens, step, past, cross_kv, src_bias)
        # Read now: a backend that reuses its buffers overwrites log_probs at the next call.
        scores[active, step] = log_probs[np.arange(active.size), padded[active, step]]
        going = lengths[active] > step + 1
        if not going.any():
            break
        if not going.all():
            kept = np.flatnonzero(going)
            past = take_rows(backend, past, kept)
            cross_kv, src_bias = np.take(cross_kv, kept, axis=2), np.take(src_bias, kept, axis=0)
            active = active[kept]
        tokens = padded[active, step : step + 1]
    return [scores[row, :length] for row, length in enumerate(lengths.tolist())]
