"""The k best entries of each row of a score array, exactly as a stable sort ranks them, without sorting whole rows
(beam search's candidates are ``K x V`` wide: 232404 for opus-mt and 4 beams)."""

from __future__ import annotations

import numpy as np

from serving.decoding.base import NEG_INF

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
    columns = width // _STRIPES
    if columns >= 16 * k:
        body = scores[:, : _STRIPES * columns].reshape(n, _STRIPES, columns)
        maxima = body.max(axis=1)
        if width > _STRIPES * columns:
            rest = scores[:, _STRIPES * columns :].max(axis=1, keepdims=True)
            maxima = np.concatenate([maxima, rest], axis=1)
        chunks = np.argpartition(maxima, maxima.shape[1] - k, axis=1)[:, maxima.shape[1] - k :]
        stripes = np.arange(_STRIPES)
        part = np.where((chunks == columns)[:, :, None], _STRIPES * columns + stripes,
                        chunks[:, :, None] + columns * stripes).reshape(n, k * _STRIPES)
        inside = part < width  # the last chunk may hold fewer than 64 entries
        values = np.where(inside, np.take_along_axis(scores, np.minimum(part, width - 1), axis=1), NEG_INF)
        part = np.where(inside, part, width)  # past the end: ranked after every real entry
    else:
        maxima = None
        part, values = np.broadcast_to(np.arange(width), scores.shape), scores
    best = np.argpartition(values, values.shape[1] - k, axis=1)[:, values.shape[1] - k :]
    best_values = np.take_along_axis(values, best, axis=1)
    best_index = np.take_along_axis(part, best, axis=1)
    order = np.lexsort((best_index, -best_values), axis=1)
    top = np.take_along_axis(best_index, order, axis=1)
    kth = best_values.min(axis=1, keepdims=True)
    # Every entry >= the k-th best lies in a chunk whose maximum is >= it: more such chunks than k, or more such
    # entries among the candidates, is a tie at the k-th place (found without another pass over the whole row).
    tied = (values >= kth).sum(axis=1) > k
    if maxima is not None:
        tied |= (maxima >= kth).sum(axis=1) > k
    if tied.any():  # exact ties at the k-th place (e.g. every entry but EOS masked at a sentence's last step)
        above = np.take_along_axis(best_values, order, axis=1) > kth
        for row in np.flatnonzero(tied):
            # The entries above the k-th value are all among the candidates (a chunk holding one has a maximum above
            # it, so it was picked); the places left go to the entries equal to it, in ascending index order.
            better = top[row][above[row]]
            top[row] = np.concatenate([better, _first_equal(scores[row], kth[row, 0], k - better.size)])
    return np.asarray(top)


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
