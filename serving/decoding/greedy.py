"""Greedy search: the arg-max after the logits rules, as transformers does for ``num_beams=1``."""

from __future__ import annotations

import numpy as np

from serving.decoding.base import (
    Hypothesis,
    OnTokens,
    Search,
    SearchOptions,
    StepPlan,
    apply_rules,
    bad_word_index,
    normalize_score,
    pad_width,
)


class GreedySearch:
    """Arg-max after the logits processors, as transformers does for ``num_beams=1``; one row per sentence."""

    def __init__(self, caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None,
                 ids: np.ndarray) -> None:
        self.options = options
        self.on_tokens = on_tokens
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
            self.bad = bad_word_index(options, log_probs.shape[1])
        forced = None
        if options.forced_eos:
            last = self.caps == self.steps + 1
            forced = last if last.any() else None
        log_probs = apply_rules(log_probs, self.bad, forced, options)
        next_ids = log_probs.argmax(axis=1)
        rows = np.arange(next_ids.size)
        self.log_prob_sum += log_probs[rows, next_ids]
        self.out[rows, self.steps] = next_ids
        lengths = self.steps = self.steps + 1
        if self.on_tokens is not None:
            self.on_tokens(self.ids, self.out[:, : int(lengths.max())], lengths)
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
        assert isinstance(other, GreedySearch) and other.options == self.options
        width = max(self.out.shape[1], other.out.shape[1])
        eos = self.options.eos_id
        self.out = np.concatenate([pad_width(self.out, width, eos), pad_width(other.out, width, eos)])
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
