"""Beam search, both rule sets (``serving.engine.decoding``'s docstring): transformers' (``HFBeamSearch``) and
tensor2tensor's (``T2TBeamSearch``), over shared state and cache handling (``BeamSearchBase``)."""

from __future__ import annotations

import numpy as np

from serving.engine.decoding.base import (
    Hypothesis,
    OnTokens,
    Search,
    SearchOptions,
    SentenceArrays,
    StepPlan,
    bad_word_index,
    pad_width,
    token_ids,
    writable,
)
from serving.engine.decoding.rules import RowHistory, needs_history, prefix_arrays, process
from serving.engine.decoding.topk import top_k_beams, top_k_sorted

# transformers masks with -1e9 (float32); tensor2tensor's INF is 1e7.
_HF_MASK = np.float32(-1.0e9)
_T2T_INF = np.float32(1.0e7)

_SEQ_WIDTH = 16  # initial width of the beams' token sequences


def hf_length_penalty(generated: np.ndarray, length_penalty: float) -> np.ndarray:
    """transformers' divisor of a candidate's log-prob: ``float(length) ** length_penalty`` rounded to float32, for
    ``generated`` tokens after the target prefix (at least 1)."""
    return np.asarray((np.maximum(generated, 1).astype(np.float64) ** length_penalty).astype(np.float32))


def hf_alternative_penalty(generated: int, length_penalty: float) -> np.float32:
    """The divisor of an alive alternative's raw log-prob (``_alternatives``): Python's float power, in float32."""
    return np.float32(float(generated) ** length_penalty)


def t2t_length_penalty(length: np.ndarray | int, alpha: float) -> np.ndarray:
    """tensor2tensor's ``((5 + length) / 6) ** alpha``, in float32."""
    return np.asarray(np.power((np.float32(5.0) + np.asarray(length, dtype=np.float32)) / np.float32(6.0),
                               np.float32(alpha)))


class BeamSearchBase(SentenceArrays):
    """State and cache handling shared by both beam rules; rows are ``sentence * K + beam``. Each sentence counts
    its own steps (``steps``), so that sentences that joined later share the search."""

    def __init__(self, caps: np.ndarray, options: SearchOptions, on_tokens: OnTokens | None, ids: np.ndarray,
                 prefixes: list[list[int]] | None = None) -> None:
        self.options = options
        self.on_tokens = on_tokens
        self.k = options.beam_size
        # The sequences grow with the longest one (``_fit_width``), not to the caps: every step gathers them.
        n, k, w = caps.shape[0], self.k, min(int(caps.max()), _SEQ_WIDTH)
        # At the first step every beam of a sentence has the same prefix, so one row per sentence is decoded; its
        # log-probs are shared by the K beams, and the first plan repeats each row K times.
        self.expanded = False
        self.tokens = np.full((n, 1), options.decoder_start_id, dtype=np.int64)
        self.ids = ids  # of the sentences still decoding
        self.caps = caps
        self.steps = np.zeros(n, dtype=np.int64)  # tokens each sentence has generated
        self.alive_seq = np.full((n, k, w), options.eos_id, dtype=np.int64)
        self.finished_seq = np.full((n, k, w), options.eos_id, dtype=np.int64)
        self.finished_len = np.zeros((n, k), dtype=np.int64)
        self.finished_flag = np.zeros((n, k), dtype=bool)
        self.prefix, self.prefix_len = prefix_arrays(prefixes, n)
        self.results: dict[int, Hypothesis] = {}
        self.columns: np.ndarray | None = None  # the ids of this step's log-prob columns (None: every id)
        if on_tokens is not None:  # streaming: the length of each sentence's stable prefix (``_stream``)
            self.stable = np.zeros(n, dtype=np.int64)
        self._init_state(n)

    def advance(self, log_probs: np.ndarray, columns: np.ndarray | None = None) -> StepPlan | None:
        k = self.k
        self.vocab, self.columns = log_probs.shape[1], columns
        first = not self.expanded
        if first:
            log_probs = np.repeat(log_probs, k, axis=0)
            self.expanded = True
        self._fit_width()
        select = self._advance(self._next_log_probs(log_probs))  # rows (sentence * K + beam) to continue, in order
        if select is None:
            return None
        tokens = self.alive_seq[np.arange(self.ids.size), :, self.steps].reshape(-1, 1)
        self.steps = self.steps + 1
        if first:  # this step had one row per sentence
            rows = select // k
            return StepPlan(tokens=tokens, rows=rows, encoder_rows=rows)
        return StepPlan(tokens=tokens, rows=select, encoder_rows=self.encoder_rows)

    def _fit_width(self) -> None:
        """Widen the sequences (doubling, up to the longest cap) so that this step's tokens fit."""
        width = self.alive_seq.shape[2]
        needed = int(self.steps.max()) + 1
        if needed > width:
            width = min(max(needed, 2 * width), int(self.caps.max()))
            eos = self.options.eos_id
            self.alive_seq = pad_width(self.alive_seq, width, eos)
            self.finished_seq = pad_width(self.finished_seq, width, eos)

    def join(self, other: Search) -> None:
        assert isinstance(other, BeamSearchBase) and self.expanded and other.expanded, (
            "a search joins another once both have taken their first step")
        assert (self.on_tokens is None) == (other.on_tokens is None), "a streamed search joins only a streamed one"
        super().join(other)

    def _next_log_probs(self, log_probs: np.ndarray) -> np.ndarray:
        """``[n, K, V]`` float32 next-token log-probs after the rules; a candidate's log-prob adds its beam's
        (``alive_scores``; ``top_k_beams`` adds it to the candidates it reads)."""
        n, k, v = self.ids.size, self.k, self.vocab
        forced = None
        if self.options.forced_eos:
            last = self.caps == self.steps + 1
            forced = np.repeat(last, k) if last.any() else None
        bad = bad_word_index(self.options, v, self.columns)
        return writable(process(log_probs, self.options, bad, forced, self._history(), self.columns)).reshape(n, k, v)

    def _history(self) -> RowHistory | None:
        """Each row's tokens for the rules that read them (None when no rule does)."""
        if not (needs_history(self.options) or self.prefix.shape[1]):
            return None
        k = self.k
        n, _, width = self.alive_seq.shape
        return RowHistory(self.alive_seq.reshape(n * k, width), np.repeat(self.steps, k),
                          np.repeat(self.prefix, k, axis=0), np.repeat(self.prefix_len, k))

    def _generated(self) -> np.ndarray:
        """``[n]`` the candidates' lengths after the prefix, EOS included: what the length penalty counts."""
        return np.asarray(self.steps + 1 - self.prefix_len)

    def _gather(self, array: np.ndarray, index: np.ndarray) -> np.ndarray:
        """array [n, M, ...] gathered along axis 1 with index [n, J]."""
        return np.asarray(np.take_along_axis(array, index.reshape(index.shape + (1,) * (array.ndim - 2)), axis=1))

    def _extend(self, beam: np.ndarray, token: np.ndarray) -> np.ndarray:
        """The 2K candidates' sequences ``[n, 2K, w]``: the parent's prefix plus the token at each sentence's step."""
        cand_seq = self._gather(self.alive_seq, beam)
        cand_seq[np.arange(self.ids.size)[:, None], np.arange(beam.shape[1])[None, :], self.steps[:, None]] = token
        return cand_seq

    def _merge_finished(self, scores: np.ndarray, cand_seq: np.ndarray, lengths: np.ndarray,
                        finished: np.ndarray) -> None:
        """Keep the K best of the finished hypotheses so far and the 2K candidates (``scores``, ``-inf``-like where a
        candidate did not finish; ``finished`` marks those that did; ``lengths`` [n]: their length, EOS included)."""
        merged_scores = np.concatenate([self.finished_scores, scores], axis=1)
        best = top_k_sorted(merged_scores, self.k)
        self.finished_scores = np.take_along_axis(merged_scores, best, axis=1)
        self.finished_seq = self._gather(np.concatenate([self.finished_seq, cand_seq], axis=1), best)
        cand_len = np.broadcast_to(lengths[:, None], scores.shape)
        self.finished_len = np.take_along_axis(np.concatenate([self.finished_len, cand_len], axis=1), best, axis=1)
        self.finished_flag = np.take_along_axis(np.concatenate([self.finished_flag, finished], axis=1), best, axis=1)

    def _retire(self, done: np.ndarray) -> np.ndarray | None:
        """Record the results of the sentences marked done, drop them; return the cache rows to keep. Streaming: one
        ``on_tokens`` call for the step (``_stream``)."""
        k = self.k
        if done.any():
            idx = np.flatnonzero(done)
            seqs, lens, scores = self._final(idx)
            for j, i in enumerate(idx.tolist()):
                hypothesis = Hypothesis(seqs[j, : lens[j]].tolist(), float(scores[j]))
                if self.options.num_hypotheses > 1:
                    hypothesis.alternatives = self._alternatives(i, hypothesis)
                self.results[int(self.ids[i])] = hypothesis
            finals = None if self.on_tokens is None else (self.ids[idx], seqs, lens)
            keep = np.flatnonzero(~done)
            if keep.size == 0:
                if finals is not None and self.on_tokens is not None:
                    self.on_tokens(*finals)
                return None
            self._keep(keep)
            self.encoder_rows = (keep[:, None] * k + np.arange(k)).reshape(-1)
            parents = self.parents[keep]
        else:
            finals = None
            keep = np.arange(self.ids.size)
            parents = self.parents
            self.encoder_rows = None
        if self.on_tokens is not None:
            self._stream(finals)
        return np.asarray((keep[:, None] * k + parents).reshape(-1))

    def _stream(self, finals: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        """The step's streaming call (``OnTokens``): the sentences it finished with their results (``finals``), then
        those whose stable prefix grew: the prefix their alive beams and kept finished hypotheses share (the result
        is one of these or extends an alive beam, so that prefix starts it whatever comes; it only grows)."""
        n, _, width = self.alive_seq.shape
        best = self.alive_seq[:, :1, :]
        column = np.arange(width)
        # The alive beams just took this step's token: steps + 1 of them count.
        differ = (self.alive_seq != best).any(axis=1) | (column >= (self.steps + 1)[:, None])
        finished_differ = (self.finished_seq != best) | (column >= self.finished_len[:, :, None])
        differ |= (finished_differ & self.finished_flag[:, :, None]).any(axis=1)
        stable = np.where(differ.any(axis=1), differ.argmax(axis=1), width)
        grew = np.flatnonzero(stable > self.stable)
        self.stable = np.maximum(self.stable, stable)
        if grew.size:
            grown = (self.ids[grew], self.alive_seq[grew, 0], stable[grew])
            if finals is None:
                finals = grown
            else:
                fill = max(finals[1].shape[1], width)
                eos = self.options.eos_id
                finals = (np.concatenate([finals[0], grown[0]]),
                          np.concatenate([pad_width(finals[1], fill, eos), pad_width(grown[1], fill, eos)]),
                          np.concatenate([finals[2], grown[2]]))
        if finals is not None and self.on_tokens is not None:
            self.on_tokens(*finals)

    def _alternatives(self, i: int, best: Hypothesis) -> list[Hypothesis]:
        """Sentence ``i``'s next best hypotheses after ``best`` (``num_hypotheses - 1``): its finished ones in their
        order, then, where fewer finished, its alive beams in theirs (their raw log-probs normalized alike)."""
        wanted = self.options.num_hypotheses - 1
        found: list[Hypothesis] = []
        seen = [best.token_ids]
        for slot in range(self.k):
            if self.finished_flag[i, slot]:
                tokens = self.finished_seq[i, slot, : self.finished_len[i, slot]].tolist()
                if tokens not in seen:
                    seen.append(tokens)
                    found.append(Hypothesis(tokens, float(self.finished_scores[i, slot])))
        length = int(self.steps[i]) + 1  # the alive beams were just extended by this step's token
        generated = max(length - int(self.prefix_len[i]), 1)
        for slot in range(self.k):
            tokens = self.alive_seq[i, slot, :length].tolist()
            if len(found) >= wanted:
                break
            if tokens not in seen and self.alive_scores[i, slot] > -1.0e8:
                seen.append(tokens)
                found.append(Hypothesis(tokens, float(self._normalized(self.alive_scores[i, slot], generated))))
        return found[:wanted]

    def _normalized(self, log_prob: float, generated: int) -> float:
        """A raw log-prob normalized as this rule set normalizes finished hypotheses."""
        raise NotImplementedError

    def _per_sentence(self) -> tuple[str, ...]:
        """The state arrays indexed by sentence (first axis), besides the sequences and the prefixes (padded)."""
        stream = () if self.on_tokens is None else ("stable",)
        return ("ids", "caps", "steps", "alive_scores", "finished_len", "finished_flag", "finished_scores",
                "prefix_len", *stream)

    def _padded(self) -> dict[str, int]:
        eos = self.options.eos_id
        return {"alive_seq": eos, "finished_seq": eos, "prefix": -1}

    def _rows_per_sentence(self) -> int:
        return self.k if self.expanded else 1

    stable: np.ndarray  # streaming only

    # Implemented by each rule set.
    encoder_rows: np.ndarray | None
    alive_scores: np.ndarray
    finished_scores: np.ndarray
    parents: np.ndarray
    vocab: int

    def _init_state(self, n: int) -> None:
        raise NotImplementedError

    def _advance(self, log_probs: np.ndarray) -> np.ndarray | None:
        raise NotImplementedError

    def _final(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError


class HFBeamSearch(BeamSearchBase):
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

    def _normalized(self, log_prob: float, generated: int) -> float:
        return float(np.float32(log_prob) / hf_alternative_penalty(generated, self.options.length_penalty))

    def _advance(self, log_probs: np.ndarray) -> np.ndarray | None:
        k, v, opts = self.k, self.vocab, self.options
        lengths = self.steps + 1  # of the candidates, EOS included
        # transformers divides by float(length) ** lp, rounded to float32 (the length after a target prefix).
        penalty = hf_length_penalty(self._generated(), opts.length_penalty)[:, None]
        top, top_scores = top_k_beams(log_probs, self.alive_scores, 2 * k)  # [n, 2K] flat indices, their scores
        beam, token = top // v, token_ids(self.columns, top % v)
        at_cap = (self.caps <= lengths)[:, None]
        hits = (token == opts.eos_id) | at_cap  # [n, 2K]
        cand_seq = self._extend(beam, token)

        # Alive beams for the next step: the best K candidates that did not finish.
        alive_candidates = top_scores + hits.astype(np.float32) * _HF_MASK
        pick = top_k_sorted(alive_candidates, k)
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
        self._merge_finished(finished_candidates, cand_seq, lengths, just_finished)

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


class T2TBeamSearch(BeamSearchBase):
    """tensor2tensor ``beam_search`` rules (module docstring)."""

    def _init_state(self, n: int) -> None:
        k = self.k
        self.alive_scores = np.zeros((n, k), dtype=np.float32)  # raw log-probs
        self.alive_scores[:, 1:] = -_T2T_INF
        self.finished_scores = np.full((n, k), -_T2T_INF, dtype=np.float32)  # penalized

    def _normalized(self, log_prob: float, generated: int) -> float:
        return float(np.float32(log_prob) / self._penalty(generated))

    def _penalty(self, length: np.ndarray | int) -> np.ndarray:
        return t2t_length_penalty(length, self.options.length_penalty)

    def _advance(self, log_probs: np.ndarray) -> np.ndarray | None:
        k, v, opts = self.k, self.vocab, self.options
        lengths = self.steps + 1
        penalty = self._penalty(np.maximum(self._generated(), 1))[:, None]
        top, top_scores = top_k_beams(log_probs, self.alive_scores, 2 * k, divisor=penalty)  # (log-prob sum) / penalty
        top_log_probs = top_scores * penalty  # T2T recovers the log-probs this way
        beam, token = top // v, token_ids(self.columns, top % v)
        finished_now = token == opts.eos_id
        cand_seq = self._extend(beam, token)

        alive_candidates = top_scores + finished_now.astype(np.float32) * -_T2T_INF
        pick = top_k_sorted(alive_candidates, k)
        self.alive_seq = self._gather(cand_seq, pick)
        self.alive_scores = np.take_along_axis(top_log_probs, pick, axis=1)
        self.parents = np.take_along_axis(beam, pick, axis=1)

        finished_candidates = top_scores + (~finished_now).astype(np.float32) * -_T2T_INF
        self._merge_finished(finished_candidates, cand_seq, lengths, finished_now)

        # Stop once no alive beam, even at the longest allowed length, can beat the best finished one.
        bound = self.alive_scores[:, 0] / self._penalty(np.maximum(self.caps - self.prefix_len, 1))
        done = (self.finished_scores.max(axis=1) > bound) | (self.caps <= lengths)
        return self._retire(done)

    def _final(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        has_finished = self.finished_flag[idx].any(axis=1)
        seqs = np.where(has_finished[:, None], self.finished_seq[idx, 0], self.alive_seq[idx, 0])
        lens = np.where(has_finished, self.finished_len[idx, 0], self.steps[idx] + 1)
        scores = np.where(has_finished, self.finished_scores[idx, 0], self.alive_scores[idx, 0]).astype(np.float64)
        return seqs, lens, scores
