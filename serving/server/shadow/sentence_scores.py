"""Sentence chrF and sentence BLEU in plain Python, for servers without sacrebleu (the Docker image has none).

Both follow the definitions sacrebleu 2.x uses for ``CHRF().sentence_score`` and
``BLEU(effective_order=True).sentence_score`` with their defaults, so a pair scores the same with or without it
(``tests/serving/server/test_sentence_scores.py`` checks that to 1e-6 on a few thousand pairs):

- chrF (Popović 2015): whitespace removed from both texts, character n-grams of orders 1-6 (no word n-grams), per
  order the hypothesis, reference and matched (clipped) counts, the precision and recall averaged over the orders
  where both texts have n-grams (sacrebleu's "effective order"; no epsilon smoothing), then the F-beta score with
  beta 2, times 100.
- BLEU (Papineni et al. 2002): both texts right-stripped and tokenised as mteval-v13a does, word n-grams of orders
  1-4, clipped matches, precisions up to the highest order the hypothesis has n-grams of (effective order), an order
  without a match smoothed as NIST's "exp" method (1 / 2^k for the k-th such order), the brevity penalty, times 100.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

CHAR_ORDER = 6
BETA = 2
BLEU_ORDER = 4

# mteval-v13a's tokenisation (the part that applies to Western languages), as a list of (pattern, replacement).
_SYMBOLS = " !\"#$%&()*+/:;<=>?@[\\]^_`{|}~"
_V13A: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile("([" + re.escape(_SYMBOLS) + "])"), r" \1 "),  # symbols stand alone
    (re.compile(r"([^0-9])([.,])"), r"\1 \2 "),  # a period or comma, unless after a digit
    (re.compile(r"([.,])([^0-9])"), r" \1 \2"),  # ... or unless before one
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # a dash after a digit
)
_ENTITIES = (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"))


def _char_ngrams(text: str) -> list[Counter[str]]:
    squeezed = "".join(text.split())
    return [Counter(squeezed[i : i + n] for i in range(len(squeezed) - n + 1)) for n in range(1, CHAR_ORDER + 1)]


def sentence_chrf(hypothesis: str, reference: str) -> float:
    """chrF (0-100) of ``hypothesis`` against ``reference``."""
    factor = BETA**2
    precision_sum = recall_sum = 0.0
    orders = 0
    for hyp, ref in zip(_char_ngrams(hypothesis), _char_ngrams(reference), strict=True):
        hyp_total, ref_total = hyp.total(), ref.total()
        if not hyp_total or not ref_total:
            continue
        matched = sum(min(count, ref[gram]) for gram, count in hyp.items() if gram in ref)
        precision_sum += matched / hyp_total
        recall_sum += matched / ref_total
        orders += 1
    if not orders:
        return 0.0
    precision, recall = precision_sum / orders, recall_sum / orders
    if not precision + recall:
        return 0.0
    return 100 * (1 + factor) * precision * recall / (factor * precision + recall)


def tokenize_13a(text: str) -> list[str]:
    """The tokens of ``text`` as mteval-v13a cuts them (sacrebleu's default ``13a`` tokenizer)."""
    line = text.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        for entity, char in _ENTITIES:
            line = line.replace(entity, char)
    line = f" {line} "
    for pattern, replacement in _V13A:
        line = pattern.sub(replacement, line)
    return line.split()


def _word_ngrams(tokens: Sequence[str]) -> Counter[tuple[str, ...]]:
    return Counter(
        tuple(tokens[i : i + n]) for n in range(1, BLEU_ORDER + 1) for i in range(len(tokens) - n + 1)
    )


def sentence_bleu(hypothesis: str, reference: str) -> float:
    """BLEU (0-100) of ``hypothesis`` against ``reference``, effective order, "exp" smoothing."""
    hyp_tokens, ref_tokens = tokenize_13a(hypothesis.rstrip()), tokenize_13a(reference.rstrip())
    hyp_grams, ref_grams = _word_ngrams(hyp_tokens), _word_ngrams(ref_tokens)
    matched, total = [0] * BLEU_ORDER, [0] * BLEU_ORDER
    for gram, count in hyp_grams.items():
        total[len(gram) - 1] += count
        if gram in ref_grams:
            matched[len(gram) - 1] += min(count, ref_grams[gram])
    if not any(matched):
        return 0.0
    hyp_len, ref_len = len(hyp_tokens), len(ref_tokens)
    penalty = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)  # hyp_len > 0: something matched
    log_sum, orders, unmatched = 0.0, 0, 1
    for n in range(BLEU_ORDER):
        if not total[n]:
            break
        if matched[n]:
            precision = 100.0 * matched[n] / total[n]
        else:
            unmatched *= 2
            precision = 100.0 / (unmatched * total[n])
        log_sum += math.log(precision)
        orders += 1
    return penalty * math.exp(log_sum / orders)
