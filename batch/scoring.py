"""Corpus quality of a batch-score run: BLEU, chrF and TER from sacrebleu, each with sacrebleu's signature.

Scores are sacrebleu's defaults (BLEU 13a tokenization and exp smoothing, chrF with n=6 characters, TER case
insensitive), so the numbers equal ``sacrebleu.corpus_bleu(hyps, [refs])`` and friends and can be compared with
published results that quote the same signature.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str | None]) -> dict[str, Any] | None:
    """BLEU, chrF and TER over the records that have a reference; None when none has one.

    Args:
        hypotheses: translations, one per record.
        references: the reference of each record, None where the record has none.

    Returns:
        ``{"references": n, "records": m, "bleu": {"score", "signature", "detail"}, "chrf": {...}, "ter": {...}}``;
        ``references`` counts the records scored, ``records`` all records.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    pairs = [(h, r) for h, r in zip(hypotheses, references, strict=True) if r is not None]
    if not pairs:
        return None
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF
    from sacrebleu.metrics.ter import TER

    hyps = [h for h, _ in pairs]
    refs = [[r for _, r in pairs]]
    out: dict[str, Any] = {"references": len(pairs), "records": len(hypotheses)}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF()), ("ter", TER())):
        score = metric.corpus_score(hyps, refs)
        out[name] = {"score": round(float(score.score), 4), "signature": str(metric.get_signature()),
                     "detail": str(score)}
    return out


def describe(scores: dict[str, Any] | None) -> str:
    """``BLEU 23.41 [nrefs:1|...|version:2.4.0] chrF 51.20 [...] TER 60.10 [...]`` (empty without references).

    Each score carries its sacreBLEU signature, so a number copied from the console can be compared with others.
    """
    if not scores:
        return ""
    return " ".join(f"{label} {scores[key]['score']:.2f} [{scores[key]['signature']}]"
                    for label, key in (("BLEU", "bleu"), ("chrF", "chrf"), ("TER", "ter")))
