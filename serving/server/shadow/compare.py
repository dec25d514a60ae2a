"""What is compared of one pair (production's translation and the candidate's of the same source): identical or
not, sentence chrF and BLEU of the candidate's text against production's, and the length ratio.

chrF and BLEU are sacrebleu's sentence scorers (``CHRF()``, ``BLEU(effective_order=True)``, their defaults) when
sacrebleu is installed (the ``shadow`` extra); without it (the Docker image) the same formulas in plain Python
(:mod:`serving.server.shadow.sentence_scores`). :data:`SCORER` names which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serving.server.shadow.sentence_scores import sentence_bleu, sentence_chrf

try:
    import sacrebleu
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF

    _CHRF: Any = CHRF()
    _BLEU: Any = BLEU(effective_order=True)
    SCORER = f"sacrebleu {sacrebleu.__version__}"
except ImportError:  # the Docker image: the same formulas without sacrebleu
    _CHRF = _BLEU = None
    SCORER = "mtgate sentence_scores (sacrebleu is not installed; its CHRF() and BLEU(effective_order=True) formulas)"


@dataclass(frozen=True)
class PairScores:
    """How a candidate's translation compares with production's.

    Attributes:
        identical: the two texts are equal.
        chrf: sentence chrF of the candidate's text, production's as the reference (0-100).
        bleu: sentence BLEU (effective order), likewise.
        length_ratio: candidate characters / production characters (1.0 when both are empty).
    """

    identical: bool
    chrf: float
    bleu: float
    length_ratio: float


def compare(production: str, candidate: str) -> PairScores:
    """Score ``candidate`` against ``production`` (identical texts score 100 without running the scorers)."""
    identical = production == candidate
    if identical:
        chrf = bleu = 100.0
    elif _CHRF is None:
        chrf, bleu = sentence_chrf(candidate, production), sentence_bleu(candidate, production)
    else:
        chrf = float(_CHRF.sentence_score(candidate, [production]).score)
        bleu = float(_BLEU.sentence_score(candidate, [production]).score)
    ratio = len(candidate) / len(production) if production else (1.0 if not candidate else float(len(candidate)))
    return PairScores(identical, chrf, bleu, ratio)
