"""Per-sentence quality for ``mtgate validate``: sentence chrF of each system, the sentences that changed most, and
scores by source length; and their charts.

Sentence chrF (sacrebleu's, the same metric as the corpus score) is what a person compares when reading two
translations of one sentence; sentence BLEU is too noisy at that length to rank sentences by.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.charts import bars, histogram
from loadtest.validate.speed import Speed

BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 5), (6, 10), (11, 15), (16, 20), (21, None))
EXAMPLES = 5
BOOTSTRAP_SAMPLES = 1000


@dataclass
class SystemScore:
    """A system's translations of the test set and their scores; ``output_tokens`` and ``seconds`` are those of the
    pass that translated it for quality, ``speed`` the repeated timed passes (None: not measured in process)."""

    package: str
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int
    output_tokens: int
    seconds: float
    speed: Speed | None = None

    @property
    def tokens_per_s(self) -> float:
        """The median of the timed passes, else the one pass that translated the test set."""
        if self.speed is not None:
            return self.speed.median
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Comparison:
    """Candidate against baseline for one metric (sacrebleu paired bootstrap)."""

    metric: str
    candidate: float
    baseline: float
    delta: float
    p_value: float
    candidate_mean: float
    candidate_ci: float
    baseline_mean: float
    baseline_ci: float
    identical: bool = False

    def significance(self, alpha: float, with_p: bool = True) -> str:
        """In words: identical, no significant difference, or a significant gain or drop (``with_p``: and the p-value,
        which a caller that shows it already leaves out)."""
        if self.identical:
            return "identical translations: no difference"
        p = f" (p = {self.p_value:.4f})" if with_p else ""
        if self.p_value >= alpha:
            return f"no significant difference{p}"
        return f"significant {'gain' if self.delta > 0 else 'drop'}{p}"


def score(package: Path, hypotheses: list[str], references: list[str], tokens: int, seconds: float,
          speed: Speed | None = None) -> SystemScore:
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF

    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return SystemScore(str(package), b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()),
                       len(hypotheses), tokens, seconds, speed)


def compare(candidate: list[str], baseline: list[str], references: list[str]) -> list[Comparison]:
    """sacrebleu's paired bootstrap resampling test (``sacrebleu --paired-bs``), baseline first."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF
    from sacrebleu.significance import PairedTest

    metrics = {"BLEU": BLEU(references=[references]), "chrF": CHRF(references=[references])}
    test = PairedTest([("baseline", baseline), ("candidate", candidate)], metrics, references=None, test_type="bs",
                      n_samples=BOOTSTRAP_SAMPLES)
    _, scores = test()
    identical = list(candidate) == list(baseline)
    out = []
    for metric in ("BLEU", "chrF2" if "chrF2" in scores else "chrF"):
        base, cand = scores[metric]
        assert not isinstance(base, str) and not isinstance(cand, str)
        delta = float(cand.score) - float(base.score)
        # sacrebleu counts resampled differences strictly above the real one, plus one: with no difference at all
        # (every resample's difference is 0 too) that reads p = 1/(n+1), "significant". Nothing differs: p = 1.
        p_value = 1.0 if identical or delta == 0 else float(cand.p_value if cand.p_value is not None else 1.0)
        out.append(Comparison(
            metric="chrF" if metric.startswith("chrF") else metric, candidate=float(cand.score),
            baseline=float(base.score), delta=delta, p_value=p_value,
            candidate_mean=float(cand.mean or 0.0), candidate_ci=float(cand.ci or 0.0),
            baseline_mean=float(base.mean or 0.0), baseline_ci=float(base.ci or 0.0), identical=identical))
    return out


@dataclass(frozen=True)
class Example:
    """One test sentence with both systems' translations and their sentence chrF."""

    index: int
    source: str
    reference: str
    baseline: str
    candidate: str
    baseline_chrf: float
    candidate_chrf: float

    @property
    def delta(self) -> float:
        return self.candidate_chrf - self.baseline_chrf


@dataclass(frozen=True)
class Analysis:
    """Everything the quality section shows."""

    chrf: dict[str, list[float]]                 # system -> sentence chrF, in test-set order
    buckets: list[str]                           # "1-5 words", ...
    bucket_sizes: list[int]
    bucket_chrf: dict[str, list[float | None]]   # system -> corpus chrF of each bucket
    losses: list[Example]                        # largest drops first (candidate vs baseline)
    gains: list[Example]                         # largest gains first

    def to_json(self) -> dict[str, Any]:
        return {"sentence_chrf": self.chrf, "buckets": self.buckets, "bucket_sizes": self.bucket_sizes,
                "bucket_chrf": self.bucket_chrf, "losses": [asdict(e) for e in self.losses],
                "gains": [asdict(e) for e in self.gains]}


def sentence_chrf(hypotheses: list[str], references: list[str]) -> list[float]:
    from sacrebleu.metrics.chrf import CHRF

    metric = CHRF()
    return [float(metric.sentence_score(h, [r]).score) for h, r in zip(hypotheses, references, strict=True)]


def _bucket(words: int) -> int:
    return next(i for i, (lo, hi) in enumerate(BUCKETS) if words >= lo and (hi is None or words <= hi))


def analyse(sources: list[str], references: list[str], systems: dict[str, list[str]]) -> Analysis:
    """Sentence chrF per system; with a baseline, the largest losses and gains of the candidate."""
    from sacrebleu.metrics.chrf import CHRF

    chrf = {role: sentence_chrf(hyps, references) for role, hyps in systems.items()}
    members: list[list[int]] = [[] for _ in BUCKETS]
    for i, source in enumerate(sources):
        members[_bucket(max(1, len(source.split())))].append(i)
    bucket_chrf: dict[str, list[float | None]] = {}
    for role, hyps in systems.items():
        bucket_chrf[role] = [float(CHRF().corpus_score([hyps[i] for i in m], [[references[i] for i in m]]).score)
                             if m else None for m in members]
    names = [f"{lo}-{hi} words" if hi is not None else f"{lo}+ words" for lo, hi in BUCKETS]
    losses: list[Example] = []
    gains: list[Example] = []
    if "baseline" in systems and "candidate" in systems:
        examples = [Example(i, sources[i], references[i], systems["baseline"][i], systems["candidate"][i],
                            chrf["baseline"][i], chrf["candidate"][i]) for i in range(len(sources))]
        changed = [e for e in examples if e.baseline != e.candidate]
        losses = sorted((e for e in changed if e.delta < 0), key=lambda e: e.delta)[:EXAMPLES]
        gains = sorted((e for e in changed if e.delta > 0), key=lambda e: -e.delta)[:EXAMPLES]
    return Analysis(chrf, names, [len(m) for m in members], bucket_chrf, losses, gains)


def _examples_table(title: str, examples: list[Example]) -> str:
    if not examples:
        return f"<h3>{html.escape(title)}</h3><p>none</p>"
    head = "<tr><th>#</th><th>source</th><th>reference</th><th>baseline</th><th>candidate</th><th>chrF</th></tr>"
    rows = [f'<tr><td>{e.index + 1}</td><td class="text">{html.escape(e.source)}</td>'
            f'<td class="text">{html.escape(e.reference)}</td><td class="text">{html.escape(e.baseline)}</td>'
            f'<td class="text">{html.escape(e.candidate)}</td>'
            f"<td>{e.baseline_chrf:.1f} → {e.candidate_chrf:.1f} ({e.delta:+.1f})</td></tr>" for e in examples]
    return f"<h3>{html.escape(title)}</h3><table class=\"examples\">{head}{''.join(rows)}</table>"


def quality_html(analysis: Analysis) -> str:
    """The charts (score distribution, length buckets) and the side-by-side examples."""
    from loadtest.report import figure_html

    parts = [
        figure_html("chrf-distribution", "sentence chrF of each system over the test set",
                    histogram("Sentence chrF, candidate vs baseline", analysis.chrf, "sentence chrF",
                              [float(b) for b in range(0, 105, 5)])),
        figure_html("length-buckets", "corpus chrF by source length (words); n sentences per bucket",
                    bars("chrF by source length", analysis.buckets, analysis.bucket_chrf, "chrF",
                         analysis.bucket_sizes)),
    ]
    if "baseline" in analysis.chrf:
        parts += [_examples_table(f"Largest chrF losses of the candidate (up to {EXAMPLES})", analysis.losses),
                  _examples_table(f"Largest chrF gains of the candidate (up to {EXAMPLES})", analysis.gains)]
    return "\n".join(parts)


def examples_markdown(analysis: Analysis) -> str:
    """The examples as Markdown (for TensorBoard's text plugin)."""
    from batch.tensorboard import markdown_table

    out = []
    for title, examples in (("Largest chrF losses", analysis.losses), ("Largest chrF gains", analysis.gains)):
        rows = [["#", "source", "reference", "baseline", "candidate", "chrF"]]
        rows += [[str(e.index + 1), e.source, e.reference, e.baseline, e.candidate,
                  f"{e.baseline_chrf:.1f} -> {e.candidate_chrf:.1f}"] for e in examples]
        out.append(f"**{title}**\n\n" + (markdown_table(rows) if examples else "none\n"))
    return "\n".join(out)
