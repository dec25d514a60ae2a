"""Sampling (issue 18): tokens are distributed as the softmax after temperature, top-k and top-p says (a chi-square
test over a small vocabulary), and a seed makes the output reproducible, whatever else shares the batch (step-level
batching: tests/serving/engine/test_continuous.py's "sampled" group)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.engine.decoding import SearchOptions, search
from serving.engine.decoding.rules import sentence_seeds, uniform
from serving.engine.errors import InvalidInput
from serving.engine.translator import DecodeOptions, Translator
from tests.utils.marian_factory import corpus

scipy_stats = pytest.importorskip("scipy.stats")

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float64)
EOS = 7  # the least likely token: most draws go on to a second step


class FixedBackend:
    """Every row's next-token distribution is ``log_softmax(LOGITS)``."""

    def decode_step(self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray,
                    src_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        log_probs = LOGITS - np.log(np.exp(LOGITS).sum())
        rows = input_ids.shape[0]
        present = np.zeros((1, 2, rows, 1, past_kv.shape[4] + 1, 1), dtype=np.float32)
        return np.tile(log_probs.astype(np.float32), (rows, 1)), present


def _expected(temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """transformers' warpers written out: temperature, then the top k, then the smallest set reaching top_p."""
    probs = np.exp(LOGITS / temperature)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(probs.size, dtype=bool)
    keep[order[: top_k or probs.size]] = True
    kept = np.where(keep, probs, 0.0) / probs[keep].sum()
    cumulative = 0.0
    nucleus = np.zeros(probs.size, dtype=bool)
    for token in order:
        if not keep[token]:
            break
        nucleus[token] = True
        cumulative += kept[token]
        if cumulative >= top_p - 1e-12:
            break
    final = np.where(nucleus, kept, 0.0)
    return np.asarray(final / final.sum())


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 4, 1.0),
                                                             (1.0, 0, 0.8), (2.0, 5, 0.9)])
def test_samples_follow_the_distribution(temperature: float, top_k: int, top_p: float) -> None:
    draws = 20_000
    options = SearchOptions(eos_id=EOS, decoder_start_id=EOS, sampling=True, temperature=temperature, top_k=top_k,
                            top_p=top_p)
    cross_kv = np.zeros((1, 2, draws, 1, 1, 1), dtype=np.float32)
    src_bias = np.zeros((draws, 1, 1, 1), dtype=np.float32)
    hypotheses = search(FixedBackend(), cross_kv, src_bias, np.full(draws, 2), options,  # type: ignore[arg-type]
                        seeds=sentence_seeds(1234, draws))
    expected = _expected(temperature, top_k, top_p)
    for step in (0, 1):  # each step draws afresh (its own uniform numbers)
        tokens = np.array([h.token_ids[step] for h in hypotheses if len(h.token_ids) > step])
        counts = np.bincount(tokens, minlength=LOGITS.size)
        assert (counts[expected == 0] == 0).all(), f"step {step}: a filtered token was drawn: {counts}"
        allowed = expected > 0
        statistic, p_value = scipy_stats.chisquare(counts[allowed], expected[allowed] * counts.sum())
        assert p_value > 1e-3, f"step {step}: chi-square {statistic:.1f} (p={p_value:.2g}), counts {counts}"


def test_uniform_numbers_depend_only_on_seed_and_step() -> None:
    seeds = sentence_seeds(99, 5)
    assert len(set(seeds.tolist())) == 5
    steps = np.array([0, 1, 2, 3, 4])
    first = uniform(seeds, steps)
    assert ((first >= 0) & (first < 1)).all()
    np.testing.assert_array_equal(uniform(seeds[::-1], steps[::-1]), first[::-1])
    assert not np.array_equal(uniform(seeds, steps + 1), first)
    values = uniform(np.full(50_000, seeds[0]), np.arange(50_000))
    assert scipy_stats.kstest(values, "uniform").pvalue > 1e-3


@pytest.fixture(scope="module")
def translator(tiny_package: Path) -> Translator:
    return Translator.load(tiny_package)


def test_a_seed_makes_sampling_reproducible(translator: Translator) -> None:
    texts = corpus("en")[20:26]
    options = DecodeOptions(do_sample=True, seed=11, temperature=1.5)
    first = [t.token_ids for t in translator.translate(texts, options)]
    assert [t.token_ids for t in translator.translate(texts, options)] == first
    # A sentence's stream depends on its seed and place in the request, not on the other sentences of the batch.
    assert translator.translate(texts[:1], options)[0].token_ids == first[0]
    other_seed = [t.token_ids for t in translator.translate(texts, DecodeOptions(do_sample=True, seed=12,
                                                                                   temperature=1.5))]
    greedy = [t.token_ids for t in translator.translate(texts, DecodeOptions(beam_size=1))]
    assert other_seed != first and greedy != first
    unseeded = [[t.token_ids for t in translator.translate(texts, DecodeOptions(do_sample=True, temperature=1.5))]
                for _ in range(2)]
    assert unseeded[0] != unseeded[1]


@pytest.mark.parametrize(("options", "message"), [
    ({"do_sample": True, "beam_size": 4}, "sampling draws one token at a time: beam_size must be 1, got 4"),
    ({"top_k": 5, "beam_size": 2}, "sampling draws one token at a time: beam_size must be 1, got 2"),
    ({"temperature": 0.5, "do_sample": False}, "temperature applies to sampling, and do_sample is false"),
    ({"do_sample": True, "temperature": 0.0}, "temperature must be a number above 0, got 0.0"),
    ({"do_sample": True, "top_p": 1.5}, "top_p must be a number above 0 and at most 1, got 1.5"),
    ({"do_sample": True, "seed": -1}, "seed must be an integer from 0 to 2**64 - 1, got -1"),
    ({"seed": 3, "num_hypotheses": 2}, "num_hypotheses above 1 needs beam search, not sampling"),
    ({"do_sample": "yes"}, "do_sample must be true or false, got 'yes'"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number above 0, got 0"),
])
def test_options_outside_their_range_are_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as error:
        DecodeOptions(**options)  # type: ignore[arg-type]
    assert str(error.value) == message


def test_num_hypotheses_widens_the_beam(translator: Translator) -> None:
    beam = translator.info.decoding.beam_size
    wide = translator.search_options(DecodeOptions(num_hypotheses=beam + 2))
    assert (wide.beam_size, wide.num_hypotheses) == (beam + 2, beam + 2)
    result = translator.translate(corpus("en")[:2], DecodeOptions(num_hypotheses=3))
    assert all(len(t.alternatives) == 2 for t in result)
    assert all(t.score >= a.score for t in result for a in t.alternatives)  # type: ignore[operator]
    assert translator.search_options(DecodeOptions(beam_size=2, num_hypotheses=3)).beam_size == 3
    assert translator.search_options(DecodeOptions(do_sample=True)).beam_size == 1
    assert translator.search_options(DecodeOptions(temperature=0.5)).sampling  # a sampling option turns it on
    assert not translator.search_options(DecodeOptions(beam_size=1)).sampling
    # max_length wins over a longer min_length: EOS is forced at the cap
    long_min = translator.translate(corpus("en")[:2], DecodeOptions(max_length=3, min_length=6))
    assert all(t.output_tokens <= 3 for t in long_min)
