"""The k best entries of each row of a score array, exactly as a stable sort ranks them, without sorting whole rows
(beam search's candidates are ``K x V`` wide: 232404 for opus-mt and 4 beams), and of beam search's candidates without
writing them (``top_k_beams``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from serving.engine.decoding.base import NEG_INF

_STRIPES = 64  # top-k over wide rows: entries per chunk (see top_k_sorted)
_TIE_WINDOW = 4096  # entries read at a time when looking for the entries tied at the k-th place


def top_k_sorted(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, best first; equal scores in ascending index order.

    Narrow rows are sorted. Wide rows (beam candidates are ``K x V``: 232k for opus-mt and 4 beams) are first reduced
    to the maxima of chunks of 64 entries: the k best entries lie in the k chunks with the best maxima, so only those
    ``k x 64`` entries are looked at. A chunk is a column of the row read as 64 stripes (entries ``c, c + C, c + 2C,
    ...``, ``C = width // 64``; the last ``width % 64`` entries are one more chunk), so that the maxima are one
    vectorized pass over contiguous memory. The k best of the candidates are selected, and only those k sorted. In a row
    where another entry ties with the k-th best, the places from the tie on go to the tied entries in ascending index
    order (one pass over that row), so the result is exact in every case.
    """
    n, width = scores.shape
    if width <= 256:
        return np.asarray(np.argsort(-scores, axis=1, kind="stable")[:, :k])
    if width // _STRIPES >= 16 * k:
        return _top_k_chunked(scores[:, None, :], k, None, None)[0]
    part = np.broadcast_to(np.arange(width), scores.shape)
    return _select(scores, part, k, lambda kth: np.zeros(n, dtype=bool), lambda row: scores[row])[0]


def top_k_beams(log_probs: np.ndarray, offsets: np.ndarray, k: int,
                divisor: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_k_sorted` of beam search's candidate scores, and those k scores, without writing the candidates.

    The candidates of sentence ``i`` are ``(log_probs[i, b, t] + offsets[i, b]) / divisor[i, 0]`` (float32, in that
    order; no division without ``divisor``) at flat index ``b * V + t``. Adding an offset and dividing by a positive
    number are monotone in float32 (rounding never reverses an order), so the maximum of a chunk of one beam's
    log-probs, offset and divided, is the maximum of that chunk's scores: the chunks are taken within each beam's row
    and only the chosen chunks' entries are scored. Results equal those of :func:`top_k_sorted` on the candidates.

    Arguments:
        log_probs: ``[n, K, V]`` float32.
        offsets: ``[n, K]`` float32, each beam's score so far.
        k: how many.
        divisor: ``[n, 1]`` positive float32 (T2T's length penalty), or None.

    Returns:
        ``[n, k]`` flat indices ``b * V + t``, best first, and their scores.
    """
    n, beams, vocab = log_probs.shape
    if (vocab // _STRIPES) * beams >= 16 * k and vocab >= _STRIPES:
        return _top_k_chunked(log_probs, k, offsets, divisor)
    scores = _scored_rows(log_probs, offsets, divisor).reshape(n, beams * vocab)
    top = top_k_sorted(scores, k)
    return top, np.take_along_axis(scores, top, axis=1)


def _scored_rows(rows: np.ndarray, offsets: np.ndarray | None, divisor: np.ndarray | None,
                 sentences: slice = slice(None)) -> np.ndarray:
    """``rows [n, B, X]`` (per-beam rows, or their chunk maxima) of the sentences ``sentences`` as candidate scores:
    plus each beam's offset, then divided by the sentence's divisor (see top_k_beams)."""
    if offsets is not None:
        rows = rows + offsets[sentences][:, :, None]
    if divisor is not None:
        rows = rows / divisor[sentences][:, :, None]
    return rows


def _scored_entries(values: np.ndarray, beam: np.ndarray, offsets: np.ndarray | None,
                    divisor: np.ndarray | None) -> np.ndarray:
    """Entries ``values [n, M]`` of the beams ``beam [n, M]`` as candidate scores (as ``_scored_rows``)."""
    if offsets is not None:
        values = values + np.take_along_axis(offsets, beam, axis=1)
    if divisor is not None:
        values = values / divisor
    return values


def _top_k_chunked(rows: np.ndarray, k: int, offsets: np.ndarray | None,
                   divisor: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The k best scores of ``rows [n, B, W]`` laid end to end (flat index ``b * W + t``), scored as ``_scored_rows``,
    through the maxima of 64-entry chunks of each of the B rows (top_k_sorted's docstring)."""
    n, beams, width = rows.shape
    columns = width // _STRIPES
    chunks_per_beam = columns + (width > _STRIPES * columns)
    body = rows[:, :, : _STRIPES * columns].reshape(n, beams, _STRIPES, columns)
    maxima = body.max(axis=2)
    if chunks_per_beam > columns:
        rest = rows[:, :, _STRIPES * columns :].max(axis=2, keepdims=True)
        maxima = np.concatenate([maxima, rest], axis=2)
    maxima = _scored_rows(maxima, offsets, divisor).reshape(n, beams * chunks_per_beam)
    total = maxima.shape[1]
    chunks = np.argpartition(maxima, total - k, axis=1)[:, total - k :]
    beam, column = chunks // chunks_per_beam, chunks % chunks_per_beam
    stripes = np.arange(_STRIPES)
    inner = np.where((column == columns)[:, :, None], _STRIPES * columns + stripes, column[:, :, None] + columns * stripes)
    inside = (inner < width).reshape(n, k * _STRIPES)  # a row's last chunk may hold fewer than 64 entries
    part = (beam[:, :, None] * width + np.minimum(inner, width - 1)).reshape(n, k * _STRIPES)
    flat = rows.reshape(n, beams * width)
    values = _scored_entries(np.take_along_axis(flat, part, axis=1), part // width, offsets, divisor)
    values = np.where(inside, values, NEG_INF)
    part = np.where(inside, part, beams * width)  # past the end: ranked after every real entry

    def row_scores(row: int) -> np.ndarray:
        return np.asarray(_scored_rows(rows[row : row + 1], offsets, divisor, slice(row, row + 1))).reshape(-1)

    # Every entry >= the k-th best lies in a chunk whose maximum is >= it: more such chunks than k is a tie at the k-th
    # place (found without another pass over the whole row).
    return _select(values, part, k, lambda kth: (maxima >= kth).sum(axis=1) > k, row_scores)


def _select(values: np.ndarray, part: np.ndarray, k: int, tied_chunks: Callable[[np.ndarray], np.ndarray],
            row_scores: Callable[[int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The k best of the candidate ``values`` (``part``: their indices in the row), best first, ties in ascending
    index order, and their values. ``tied_chunks(kth)`` marks the rows where a chunk not among the candidates ties
    with the k-th value; ``row_scores(i)`` is row ``i`` whole, read only for a row tied at the k-th place."""
    best = np.argpartition(values, values.shape[1] - k, axis=1)[:, values.shape[1] - k :]
    best_values = np.take_along_axis(values, best, axis=1)
    best_index = np.take_along_axis(part, best, axis=1)
    order = np.lexsort((best_index, -best_values), axis=1)
    top = np.take_along_axis(best_index, order, axis=1)
    top_values = np.take_along_axis(best_values, order, axis=1)
    kth = best_values.min(axis=1, keepdims=True)
    # More entries >= the k-th best among the candidates than k is a tie at the k-th place too.
    tied = ((values >= kth).sum(axis=1) > k) | tied_chunks(kth)
    for row in np.flatnonzero(tied):  # exact ties at the k-th place (e.g. every entry but EOS masked at a last step)
        # The entries above the k-th value are all among the candidates (a chunk holding one has a maximum above it,
        # so it was picked); the places left go to the entries equal to it, in ascending index order.
        scores = row_scores(int(row))
        better = top[row][top_values[row] > kth[row, 0]]
        top[row] = np.concatenate([better, _first_equal(scores, kth[row, 0], k - better.size)])
        top_values[row] = scores[top[row]]
    return np.asarray(top), np.asarray(top_values)


def _first_equal(row: np.ndarray, value: np.floating, count: int) -> np.ndarray:
    """The first ``count`` indices of ``row`` whose entry equals ``value``, read in windows: a row that is almost all
    ties (every entry but EOS masked) is not listed whole."""
    found: list[np.ndarray] = []
    for start in range(0, row.size, _TIE_WINDOW):
        if count <= 0:
            break
        hits = np.flatnonzero(row[start : start + _TIE_WINDOW] == value)[:count] + start
        found.append(hits)
        count -= hits.size
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
