"""Greedy and beam search in numpy over a decoder-step backend (``serving.engine.backends.Backend``).

The backend contract (``docs/architecture.md``): ``decode_step(input_ids [N, 1], step, past_kv [L, 2, N, H, T, Dh],
cross_kv [L, 2, N, H, S, Dh], src_bias [N, 1, 1, S]) -> (log_probs [N, V], present_kv [L, 2, N, H, T + 1, Dh])``;
``search`` runs every row at the same step (``step`` an int), step-level batching (``serving.engine.continuous``) rows at
their own steps.
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

``"gnmt"`` -- tensor2tensor's ``beam_search`` (``tensor2tensor/utils/beam_search.py``): alive beams start at
``[0, -1e7, ...]``; candidates are ranked by ``log_prob / ((5 + len) / 6) ** alpha``; any EOS candidate of the 2K may
finish; the length cap ends a hypothesis without adding it to the finished set; a sentence is done when
its best finished score beats ``best alive log-prob / ((5 + cap) / 6) ** alpha``; with nothing finished, the best
alive hypothesis is returned with its raw log-prob.

Both: ties between exactly equal scores go to the lower flat index ``beam * V + token`` (``tf.nn.top_k``'s order;
``torch.topk`` leaves it unspecified). Finished sentences leave the batch: their rows are dropped from the cache,
``cross_kv`` and ``src_bias`` with ``np.take`` (axis 2 / axis 0); the beam reorder and the drop share one ``take``
of the self-attention cache per step. Greedy search (``beam_size == 1``) takes the arg-max after the same logits
processors, as transformers does for ``num_beams=1``.

The modules: ``base`` (options, results, the ``Search`` protocol, the logits rules both searches apply), ``greedy``,
``beam`` (both beam rule sets) and ``search`` (``start_search`` picks one; ``search`` drives it over a backend).
"""

from serving.engine.decoding.base import (
    Alive,
    Hypothesis,
    LengthPenaltyKind,
    OnTokens,
    Search,
    SearchOptions,
    StepPlan,
    join_prefixes,
    join_seeds,
    normalize_score,
)
from serving.engine.decoding.search import is_identity, search, start_search, take_rows

__all__ = [
    "Alive",
    "Hypothesis",
    "LengthPenaltyKind",
    "OnTokens",
    "Search",
    "SearchOptions",
    "StepPlan",
    "is_identity",
    "join_prefixes",
    "join_seeds",
    "normalize_score",
    "search",
    "start_search",
    "take_rows",
]
