"""serving.engine.decoding: greedy and beam search.

1. HF parity: a tiny random MarianMTModel decoded by our numpy search over ``HFMarianBackend`` (transformers' own
   forward, cache rebuilt from our [L, 2, B, H, T, Dh] arrays) gives exactly the tokens and scores of
   ``MarianMTModel.generate`` on 20 inputs of varied lengths: greedy, beam 4, length penalties, early stopping,
   forced EOS and bad words as opus-mt sets them.
2. tensor2tensor beam rules against a plain per-sentence reimplementation of ``beam_search`` written here from
   tensor2tensor's ``utils/beam_search.py``, over a fake backend whose next-token distribution depends on the whole
   prefix (kept in the fake's KV cache, so any wrong cache reorder or batch shrink changes the result).
3. Unit behaviour: per-sentence caps, forced EOS, bad words, the streaming hook, finished sentences leaving the batch.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from serving.engine.decoding import Hypothesis, SearchOptions, search

os.environ.setdefault("USE_TF", "0")

V = 96
PAD = V - 1
EOS = 0


# ---------------------------------------------------------------------------------------------------------------
# HF parity


@pytest.fixture(scope="module")
def hf_model():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, forced_eos_token_id=None,
        activation_function="swish", init_std=0.2, scale_embedding=True,
    )
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        # A peaked random model whose EOS probability varies with the context: hypotheses of 1 to 23 tokens.
        model.final_logits_bias[0, EOS] = 3.0
    return model


@pytest.fixture(scope="module")
def sources() -> np.ndarray:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 15, 20)
    ids = np.full((lengths.size, lengths.max() + 1), PAD, dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, PAD, n)
        ids[i, n] = EOS
    return ids


def _hf_generate(model, ids: np.ndarray, **kwargs) -> tuple[list[list[int]], list[float] | None]:  # type: ignore[no-untyped-def]
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(ids != PAD).long(), do_sample=False,
            output_scores=True, return_dict_in_generate=True, **kwargs,
        )
    tokens = []
    for row in out.sequences[:, 1:].tolist():
        tokens.append(row[: row.index(EOS) + 1] if EOS in row else [t for t in row if t != PAD])
    scores = out.sequences_scores.tolist() if kwargs.get("num_beams", 1) > 1 else None
    return tokens, scores


HF_CASES = [
    # (beam, length_penalty, early_stopping, opus-mt rules: forced EOS + pad as bad word, renormalize_logits)
    pytest.param(1, 1.0, False, False, False, id="greedy"),
    pytest.param(1, 1.0, False, True, True, id="greedy-forced-eos-bad-words-renormalize"),
    pytest.param(4, 1.0, False, False, False, id="beam4"),
    pytest.param(4, 1.0, False, True, False, id="beam4-forced-eos-bad-words"),
    pytest.param(4, 1.0, False, True, True, id="beam4-forced-eos-bad-words-renormalize"),
    pytest.param(4, 0.6, False, True, False, id="beam4-lp0.6"),
    pytest.param(4, 2.0, True, True, True, id="beam4-lp2-early-stopping-renormalize"),
    pytest.param(3, 1.0, True, False, False, id="beam3-early-stopping"),
]


@pytest.mark.parametrize(("beam", "length_penalty", "early_stopping", "opus_rules", "renormalize"), HF_CASES)
def test_search_matches_transformers_generate(  # type: ignore[no-untyped-def]
    hf_model, sources: np.ndarray, beam: int, length_penalty: float, early_stopping: bool, opus_rules: bool,
    renormalize: bool,
) -> None:
    from tests.utils.hf_backend import HFMarianBackend

    max_length = 24  # HF counts the start token: at most 23 generated tokens, EOS included
    kwargs = {"num_beams": beam, "max_length": max_length, "length_penalty": length_penalty,
              "early_stopping": early_stopping}
    if opus_rules:
        kwargs |= {"forced_eos_token_id": EOS, "bad_words_ids": [[PAD]]}
    if renormalize:
        kwargs["renormalize_logits"] = True
    expected, expected_scores = _hf_generate(hf_model, sources, **kwargs)
    lengths = sorted(len(t) for t in expected)
    assert lengths[0] < 5 and lengths[-1] > 12, f"inputs should give varied output lengths: {lengths}"

    backend = HFMarianBackend(hf_model)
    encoded = backend.encode(sources)
    options = SearchOptions(
        eos_id=EOS, decoder_start_id=PAD, beam_size=beam, length_penalty=length_penalty,
        bad_word_ids=(PAD,) if opus_rules else (), forced_eos=opus_rules, early_stopping=early_stopping,
        renormalize_logits=renormalize,
    )
    hypotheses = search(backend, encoded.cross_kv, encoded.src_bias, np.full(len(sources), max_length - 1), options)

    assert [h.token_ids for h in hypotheses] == expected
    if expected_scores is not None:
        np.testing.assert_allclose([h.score for h in hypotheses], expected_scores, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# A fake backend whose distribution depends on the source and the whole prefix


class PrefixBackend:
    """log_probs = log_softmax(noise(source, prefix)), with EOS more likely as the prefix grows.

    The "cache" is the prefix itself ([1, 2, B, 1, T, 1] floats), and ``cross_kv`` carries the source ids, so the
    search must reorder and shrink both correctly to reproduce a per-sentence reference.
    """

    def __init__(
        self, vocab: int = 12, eos_boost: float = 0.35, eos_bias: float = 0.0, scale: float = 2.0, seed: int = 0
    ) -> None:
        self.vocab, self.eos_boost, self.eos_bias, self.scale, self.seed = vocab, eos_boost, eos_bias, scale, seed
        self.rows_per_step: list[int] = []

    def encode_ids(self, source_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        width = max(len(s) for s in source_ids)
        cross = np.full((1, 2, len(source_ids), 1, width, 1), -1.0, dtype=np.float32)
        bias = np.zeros((len(source_ids), 1, 1, width), dtype=np.float32)
        for i, s in enumerate(source_ids):
            cross[0, :, i, 0, : len(s), 0] = s
            bias[i, 0, 0, len(s):] = -1e9
        return cross, bias

    def distribution(self, source: tuple[int, ...], prefix: tuple[int, ...]) -> np.ndarray:
        digest = hashlib.sha256(repr((self.seed, source, prefix)).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        logits = (rng.standard_normal(self.vocab) * self.scale).astype(np.float32)
        logits[EOS] += np.float32(self.eos_bias + self.eos_boost * len(prefix))
        shifted = logits - logits.max()
        return (shifted - np.log(np.exp(shifted).sum())).astype(np.float32)

    def decode_step(  # noqa: D102
        self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray, src_bias: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        assert past_kv.shape[4] == step and past_kv.shape[2] == input_ids.shape[0] == cross_kv.shape[2]
        self.rows_per_step.append(input_ids.shape[0])
        prefixes = np.concatenate([past_kv[0, 0, :, 0, :, 0], input_ids.astype(np.float32)], axis=1)
        out = np.empty((input_ids.shape[0], self.vocab), dtype=np.float32)
        for row in range(input_ids.shape[0]):
            source = tuple(int(x) for x in cross_kv[0, 0, row, 0, :, 0] if x >= 0)
            out[row] = self.distribution(source, tuple(int(x) for x in prefixes[row, 1:]))
        present = np.broadcast_to(prefixes[None, None, :, None, :, None], (1, 2, *prefixes.shape[:1], 1,
                                                                             prefixes.shape[1], 1))
        return out, np.ascontiguousarray(present)


def _fake_sources(n: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, 12, rng.integers(1, 8)).tolist() + [EOS] for _ in range(n)]


def t2t_beam_reference(
    backend: PrefixBackend, source: list[int], beam: int, alpha: float, cap: int
) -> tuple[list[int], float]:
    """tensor2tensor ``beam_search`` for one sentence, written out from the reference, one beam at a time."""
    inf = np.float32(1e7)
    f32 = np.float32

    def penalty(length: int) -> np.float32:
        return np.power((f32(5.0) + f32(length)) / f32(6.0), f32(alpha))

    alive = [((), f32(0.0) if b == 0 else -inf) for b in range(beam)]
    finished = [((), -inf, False) for _ in range(beam)]
    for i in range(cap):
        lp = penalty(i + 1)
        flat = []
        for b, (prefix, log_prob) in enumerate(alive):
            logp = backend.distribution(tuple(source), prefix)
            for token in range(backend.vocab):
                flat.append(((f32(log_prob) + logp[token]) / lp, b * backend.vocab + token))
        flat.sort(key=lambda x: (-x[0], x[1]))  # tf.nn.top_k: equal values -> lower index first
        top = flat[: 2 * beam]
        candidates = []
        for score, index in top:
            b, token = divmod(index, backend.vocab)
            candidates.append((alive[b][0] + (token,), score, score * lp, token == EOS))
        alive_rank = sorted(range(2 * beam), key=lambda j: (-(candidates[j][1] + (-inf if candidates[j][3] else 0)), j))
        alive = [(candidates[j][0], candidates[j][2]) for j in alive_rank[:beam]]
        merged = [(seq, score, flag) for seq, score, flag in finished]
        merged += [(c[0], c[1] + (0 if c[3] else -inf), c[3]) for c in candidates]
        order = sorted(range(len(merged)), key=lambda j: (-merged[j][1], j))
        finished = [merged[j] for j in order[:beam]]
        bound = alive[0][1] / penalty(cap)
        if max(f[1] for f in finished) > bound:
            break
    if any(f[2] for f in finished):
        return list(finished[0][0]), float(finished[0][1])
    return list(alive[0][0]), float(alive[0][1])


@pytest.mark.parametrize(("beam", "alpha"), [(4, 0.6), (2, 1.0), (5, 0.0)])
def test_gnmt_beam_search_matches_t2t_reference(beam: int, alpha: float) -> None:
    backend = PrefixBackend()
    srcs = _fake_sources(12)
    cross, bias = backend.encode_ids(srcs)
    caps = np.array([len(s) + 3 for s in srcs])  # T2T's source length + extra_length, small extra here
    options = SearchOptions(eos_id=EOS, decoder_start_id=PAD % 12, beam_size=beam, length_penalty=alpha,
                            length_penalty_kind="gnmt")
    got = search(backend, cross, bias, caps, options)
    for hypothesis, source, cap in zip(got, srcs, caps, strict=True):
        tokens, score = t2t_beam_reference(backend, source, beam, alpha, int(cap))
        assert hypothesis.token_ids == tokens
        assert hypothesis.score == pytest.approx(score, abs=1e-5)


def test_gnmt_beam_returns_best_alive_when_nothing_finished() -> None:
    backend = PrefixBackend(eos_boost=0.0, eos_bias=-50.0)  # EOS never wins
    cross, bias = backend.encode_ids([[3, 4, EOS]])
    options = SearchOptions(eos_id=EOS, decoder_start_id=1, beam_size=3, length_penalty=0.6,
                            length_penalty_kind="gnmt")
    (hypothesis,) = search(backend, cross, bias, np.array([5]), options)
    tokens, score = t2t_beam_reference(backend, [3, 4, EOS], 3, 0.6, 5)
    assert hypothesis.token_ids == tokens and len(tokens) == 5 and EOS not in tokens
    assert hypothesis.score == pytest.approx(score, abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Unit behaviour


def greedy_reference(backend: PrefixBackend, source: list[int], cap: int, bad: tuple[int, ...] = (),
                     forced_eos: bool = False) -> list[int]:
    prefix: list[int] = []
    for step in range(cap):
        logp = backend.distribution(tuple(source), tuple(prefix)).copy()
        logp[list(bad)] = -np.inf
        if forced_eos and step == cap - 1:
            logp[:] = -np.inf
            logp[EOS] = 0
        prefix.append(int(np.argmax(logp)))
        if prefix[-1] == EOS:
            break
    return prefix


def test_greedy_per_sentence_caps_bad_words_and_shrinking_batch() -> None:
    backend = PrefixBackend()
    srcs = _fake_sources(16, seed=3)
    cross, bias = backend.encode_ids(srcs)
    caps = np.array([1, 2, 3, 4, 5, 6, 7, 8] * 2)
    options = SearchOptions(eos_id=EOS, decoder_start_id=1, bad_word_ids=(5, 7), forced_eos=True)
    got = search(backend, cross, bias, caps, options)
    for hypothesis, source, cap in zip(got, srcs, caps, strict=True):
        assert hypothesis.token_ids == greedy_reference(backend, source, int(cap), bad=(5, 7), forced_eos=True)
        assert hypothesis.token_ids[-1] == EOS and len(hypothesis.token_ids) <= cap
        assert not {5, 7} & set(hypothesis.token_ids)
    # Finished sentences leave the batch: row counts never grow and end below the batch size.
    assert backend.rows_per_step[0] == 16
    assert all(a >= b for a, b in zip(backend.rows_per_step, backend.rows_per_step[1:], strict=False))
    assert backend.rows_per_step[-1] < 16


def test_greedy_without_forced_eos_may_stop_at_the_cap() -> None:
    backend = PrefixBackend(eos_boost=0.0, eos_bias=-50.0)
    cross, bias = backend.encode_ids([[3, EOS]])
    (hypothesis,) = search(backend, cross, bias, np.array([4]), SearchOptions(eos_id=EOS, decoder_start_id=1))
    assert len(hypothesis.token_ids) == 4 and EOS not in hypothesis.token_ids


def test_beam_caps_are_per_sentence_and_forced_eos_ends_every_sentence() -> None:
    backend = PrefixBackend(eos_boost=0.0, eos_bias=-5.0)
    srcs = _fake_sources(6, seed=5)
    cross, bias = backend.encode_ids(srcs)
    caps = np.array([1, 2, 3, 4, 5, 6])
    options = SearchOptions(eos_id=EOS, decoder_start_id=1, beam_size=3, forced_eos=True)
    got = search(backend, cross, bias, caps, options)
    for hypothesis, cap in zip(got, caps, strict=True):
        assert hypothesis.token_ids[-1] == EOS and len(hypothesis.token_ids) <= cap
    assert got[0].token_ids == [EOS]


def test_streaming_hook_greedy_every_step_beam_its_stable_prefix() -> None:
    backend = PrefixBackend()
    srcs = _fake_sources(5, seed=7)
    cross, bias = backend.encode_ids(srcs)
    caps = np.full(5, 10)
    calls: list[tuple[int, list[int]]] = []

    def hook(rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
        calls.extend((int(r), tokens[i, : lengths[i]].tolist()) for i, r in enumerate(rows))

    greedy = search(backend, cross, bias, caps, SearchOptions(eos_id=EOS, decoder_start_id=1), hook)
    for row, hypothesis in enumerate(greedy):
        prefixes = [tokens for r, tokens in calls if r == row]
        assert prefixes == [hypothesis.token_ids[: n + 1] for n in range(len(hypothesis.token_ids))]

    calls.clear()
    beam = search(backend, cross, bias, caps, SearchOptions(eos_id=EOS, decoder_start_id=1, beam_size=3), hook)
    # Beam search: the prefix every possible result shares, each time it grows, then the result.
    for row, hypothesis in enumerate(beam):
        prefixes = [tokens for r, tokens in calls if r == row]
        assert prefixes[-1] == hypothesis.token_ids
        assert all(a == b[: len(a)] and len(a) < len(b) for a, b in zip(prefixes, prefixes[1:], strict=False))


def test_empty_batch_and_bad_arguments() -> None:
    backend = PrefixBackend()
    cross = np.zeros((1, 2, 0, 1, 3, 1), dtype=np.float32)
    bias = np.zeros((0, 1, 1, 3), dtype=np.float32)
    assert search(backend, cross, bias, np.zeros(0, dtype=np.int64), SearchOptions(eos_id=0, decoder_start_id=1)) == []
    cross, bias = backend.encode_ids([[3, EOS]])
    with pytest.raises(ValueError, match="max_steps"):
        search(backend, cross, bias, np.array([0]), SearchOptions(eos_id=0, decoder_start_id=1))
    with pytest.raises(ValueError, match="entries"):
        search(backend, cross, bias, np.array([3, 3]), SearchOptions(eos_id=0, decoder_start_id=1))
    assert isinstance(search(backend, cross, bias, np.array([2]), SearchOptions(eos_id=0, decoder_start_id=1))[0],
                      Hypothesis)


@pytest.mark.parametrize("width", [7, 500, 9000, 232_404])
def test_top_k_is_exact_with_ties_in_index_order(width: int) -> None:
    from serving.engine.decoding.topk import top_k_sorted as _top_k_sorted

    rng = np.random.default_rng(width)
    scores = (rng.standard_normal((5, width)) * 3).astype(np.float32)
    scores[0, rng.integers(0, width, width // 2)] = -np.inf  # bad words, forced EOS
    scores[4] = -np.inf  # a forced last step: fewer finite entries than k
    scores[4, [width // 3, 5]] = [0.0, -1.0]
    scores[1] = np.round(scores[1])  # many exact ties
    scores[3, [width - 1, width // 2, 0]] = [100.0, 100.0, 50.0]  # a tie for the best place, far apart
    for k in (1, 2, 8, 10):
        k = min(k, width)
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(_top_k_sorted(scores, k), expected)


@pytest.mark.parametrize(("beams", "vocab"), [(4, 7), (4, 500), (4, 8000), (1, 9000), (4, 58_101)])
@pytest.mark.parametrize("divided", [False, True])
def test_top_k_of_beams_equals_top_k_of_the_written_candidates(beams: int, vocab: int, divided: bool) -> None:
    """Beam search's candidates (log-prob + the beam's score, T2T: / the length penalty) ranked without writing them:
    the same indices and the same float32 scores as top_k_sorted over the written candidates."""
    from serving.engine.decoding.topk import top_k_beams, top_k_sorted

    rng = np.random.default_rng(vocab + beams)
    n = 6
    log_probs = (rng.standard_normal((n, beams, vocab)) * 3 - 10).astype(np.float32)
    log_probs[0, :, rng.integers(0, vocab, vocab // 2)] = -np.inf  # bad words
    log_probs[1] = np.round(log_probs[1])  # many exact ties, within and across beams
    log_probs[2] = -np.inf  # a forced last step: only EOS left in every beam
    log_probs[2, :, 0] = -0.5
    log_probs[3, :, [vocab - 1, vocab // 2]] = 5.0  # ties for the best place, far apart
    offsets = (rng.standard_normal((n, beams)) * 4).astype(np.float32)
    offsets[4, 1:] = np.float32(-1.0e9)  # a first step: every beam but the first masked
    offsets[1] = np.round(offsets[1])
    divisor = (1.0 + rng.random((n, 1))).astype(np.float32) if divided else None
    written = log_probs + offsets[:, :, None]
    if divisor is not None:
        written = written / divisor[:, :, None]
    written = written.reshape(n, beams * vocab)
    for k in (1, 2, 8):
        k = min(k, beams * vocab)
        top, values = top_k_beams(log_probs, offsets, k, divisor)
        np.testing.assert_array_equal(top, top_k_sorted(written, k))
        np.testing.assert_array_equal(values, np.take_along_axis(written, top, axis=1))
        assert values.dtype == np.float32
