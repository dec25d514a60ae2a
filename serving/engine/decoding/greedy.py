"""Greedy search and sampling: the arg-max after the logits rules, as transformers does for ``num_beams=1``, or, with
``SearchOptions.sampling``, a draw from the distribution after them (``serving.engine.decoding.rules.sample``)."""

from __future__ import annotations

import numpy as np

from serving.engine.decoding.base import (
    Hypothesis,
    OnTokens,
    SearchOptions,
    SentenceArrays,
    StepPlan,
    bad_word_index,
    normalize_score,
    token_ids,
)
from serving.engine.decoding.rules import RowHistory, needs_history, prefix_arrays, process, sample, warp


class GreedySearch(SentenceArrays):
    """Arg-max (or a sample) after the logits rules; one row per sentence. A sentence's score is its summed log-prob
    after the rules (when sampling, before the warpers), length-normalized; forced prefix tokens count neither in it
    nor in its length."""

    def __init__(self, caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None, ids: np.ndarray,
                 prefixes: list[list[int]] | None = None, seeds: np.ndarray | None = None) -> None:
        self.options = options
        self.on_tokens = on_tokens
        self.ids = ids  # of the rows still decoding
        self.caps = caps
        self.steps = np.zeros(caps.size, dtype=np.int64)  # tokens each row has generated
        self.out = np.full((caps.size, int(caps.max())), options.eos_id, dtype=np.int64)
        self.log_prob_sum = np.zeros(caps.size, dtype=np.float64)
        self.prefix, self.prefix_len = prefix_arrays(prefixes, caps.size)
        self.seeds = np.zeros(caps.size, dtype=np.uint64) if seeds is None else np.asarray(seeds, dtype=np.uint64)
        self.tokens = np.full((caps.size, 1), options.decoder_start_id, dtype=np.int64)
        self.results: dict[int, Hypothesis] = {}

    def advance(self, log_probs: np.ndarray, columns: np.ndarray | None = None) -> StepPlan | None:
        options = self.options
        bad = bad_word_index(options, log_probs.shape[1], columns)
        forced = None
        if options.forced_eos:
            last = self.caps == self.steps + 1
            forced = last if last.any() else None
        log_probs = process(log_probs, options, bad, forced, self._history(), columns)
        if options.sampling:
            chosen = sample(warp(log_probs, options), self.seeds, self.steps)
        else:
            chosen = log_probs.argmax(axis=1)
        rows = np.arange(chosen.size)
        next_ids = token_ids(columns, chosen)
        generated = self.steps >= self.prefix_len
        self.log_prob_sum += np.where(generated, log_probs[rows, chosen], 0.0)
        self.out[rows, self.steps] = next_ids
        lengths = self.steps = self.steps + 1
        if self.on_tokens is not None:
            self.on_tokens(self.ids, self.out[:, : int(lengths.max())], lengths)
        done = (next_ids == options.eos_id) & generated | (self.caps <= lengths)
        if not done.any():
            return StepPlan(tokens=next_ids[:, None], rows=rows, encoder_rows=None)
        finished = np.flatnonzero(done)
        scores = normalize_score(self.log_prob_sum[finished], lengths[finished] - self.prefix_len[finished], options)
        for j, i in enumerate(finished.tolist()):
            self.results[int(self.ids[i])] = Hypothesis(self.out[i, : lengths[i]].tolist(), float(scores[j]))
        keep = np.flatnonzero(~done)
        if keep.size == 0:
            return None
        self._keep(keep)
        return StepPlan(tokens=next_ids[keep][:, None], rows=keep, encoder_rows=keep)

    def _history(self) -> RowHistory | None:
        if not (needs_history(self.options) or self.prefix.shape[1]):
            return None
        return RowHistory(self.out, self.steps, self.prefix, self.prefix_len)

    def _padded(self) -> dict[str, int]:
        return {"out": self.options.eos_id, "prefix": -1}

    def _per_sentence(self) -> tuple[str, ...]:
        return ("ids", "caps", "steps", "log_prob_sum", "prefix_len", "seeds")
