"""The native search core (serving.engine.decoding.native, C++ in serving/engine/decoding/_native) against its numpy reference.

1. Searches: random options (greedy, sampling, both beam rule sets with K 1..5, length penalties, bad words, forced
   EOS, min length, target prefixes, repetition penalty, no-repeat n-grams, renormalization, n-best, early
   stopping), vocabularies from 7 to 8000 columns (numpy's narrow, wide and chunked top-k paths), shortlists
   (random sorted column ids), log-probs with exact ties and -inf entries, and sentences that join and leave
   mid-search: at every step both must return the same plan (tokens, rows, encoder rows), call the streaming hook
   with the same tokens (beam search: the stable prefixes, which only grow, then the result), and finish the same
   sentences with the same tokens and scores (within 1e-6). Once with each block-maximum kernel (AVX2 where the
   CPU has it, SSE2).
2. Slot bookkeeping: SlotRows with the core and with numpy through the same random joins, beam reorders, removals
   and growth end every operation with the same slots and the same cache, encoder outputs and counters.
3. The GIL is released while the core works: a Python thread keeps running through a long native step.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from serving.engine.decoding import SearchOptions, StepPlan
from serving.engine.decoding.native import native_search
from serving.engine.decoding.search import numpy_search
from serving.engine.native import native_core
from serving.engine.rows import SlotRows
from tests.utils.stationary import FakeStationary, encoded

pytestmark = pytest.mark.skipif(os.environ.get("MTGATE_NATIVE", "1").strip() == "0",
                                reason="MTGATE_NATIVE=0: the numpy searches are forced")


@pytest.fixture(scope="module")
def core() -> ModuleType:
    module = native_core()
    assert module is not None, "the native core is not built: pip install -e . (needs a C++17 compiler)"
    return module


@pytest.fixture
def kernel(request: pytest.FixtureRequest, core: ModuleType) -> Iterator[str]:
    """The block-maximum kernel the test names (``default``: the one the CPU gets), restored after it."""
    default = core.kernel()
    assert core.use_kernel(default if request.param == "default" else request.param)
    yield core.kernel()
    core.use_kernel(default)


# ---------------------------------------------------------------------------------------------------------------
# Searches


def _options(rng: np.random.Generator, vocab: int) -> SearchOptions:
    beam = int(rng.choice([1, 1, 2, 3, 4, 5]))
    sampling = beam == 1 and rng.random() < 0.4
    return SearchOptions(
        eos_id=int(rng.integers(0, 3)), decoder_start_id=int(rng.integers(0, 5)), beam_size=beam,
        length_penalty=float(rng.choice([1.0, 0.6, 2.0, 0.0])), length_penalty_kind=str(rng.choice(["hf", "gnmt"])),  # type: ignore[arg-type]
        bad_word_ids=tuple(int(i) for i in rng.integers(0, vocab + 3, int(rng.integers(0, 4)))),
        forced_eos=bool(rng.random() < 0.5), early_stopping=bool(rng.random() < 0.3),
        renormalize_logits=bool(rng.random() < 0.3), num_hypotheses=int(rng.integers(1, beam + 1)),
        min_length=int(rng.choice([0, 0, 2, 5])), repetition_penalty=float(rng.choice([1.0, 1.0, 1.3, 0.8])),
        no_repeat_ngram_size=int(rng.choice([0, 0, 1, 2, 3])), sampling=sampling,
        temperature=float(rng.choice([1.0, 0.5, 1.7])) if sampling else 1.0,
        top_k=int(rng.choice([0, 1, 3, vocab // 2])) if sampling else 0,
    )


class Pair:
    """The numpy and the native search of the same sentences, each with a streaming hook that records its calls."""

    def __init__(self, rng: np.random.Generator, options: SearchOptions, vocab: int, first_id: int) -> None:
        n = int(rng.integers(1, 6))
        self.ids = np.arange(first_id, first_id + n)
        caps = rng.integers(1, 14, n)
        self.prefixes = None
        if rng.random() < 0.4:
            ids = [i for i in range(vocab) if i != options.eos_id]
            self.prefixes = [[int(t) for t in rng.choice(ids, int(rng.integers(0, 4)))] for _ in range(n)]
        seeds = rng.integers(0, 2**63, n).astype(np.uint64) if options.sampling else None
        self.calls: tuple[list[Any], list[Any]] = ([], [])
        self.numpy = numpy_search(caps, options, self._hook(0), self.ids, self.prefixes, seeds)
        native = native_search(caps, options, self._hook(1), self.ids, self.prefixes, seeds)
        assert native is not None and type(native).__module__ == "serving.engine.decoding.native"
        self.native = native

    def _hook(self, side: int) -> Any:
        def hook(rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
            self.calls[side].append([(int(r), tokens[i, : lengths[i]].tolist()) for i, r in enumerate(rows)])

        return hook

    def advance(self, log_probs: np.ndarray, columns: np.ndarray | None) -> StepPlan | None:
        expected = self.numpy.advance(log_probs.copy(), columns)
        got = self.native.advance(log_probs.copy(), columns)
        _same_plan(expected, got)
        assert self.calls[0] == self.calls[1]
        assert self.native.results.keys() == self.numpy.results.keys()
        return got


def _same_plan(expected: StepPlan | None, got: StepPlan | None) -> None:
    assert (expected is None) == (got is None)
    if expected is None or got is None:
        return
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    assert got.tokens.shape == expected.tokens.shape and got.tokens.dtype == np.int64
    np.testing.assert_array_equal(got.rows, expected.rows)
    assert (got.encoder_rows is None) == (expected.encoder_rows is None)
    if expected.encoder_rows is not None:
        np.testing.assert_array_equal(got.encoder_rows, expected.encoder_rows)


def _same_results(expected: dict[int, Any], got: dict[int, Any]) -> None:
    assert got.keys() == expected.keys()
    for sentence, hypothesis in expected.items():
        mine = got[sentence]
        for theirs, ours in zip([hypothesis, *hypothesis.alternatives], [mine, *mine.alternatives], strict=True):
            assert ours.token_ids == theirs.token_ids
            assert ours.score == pytest.approx(theirs.score, abs=1e-6, nan_ok=True)


def _log_probs(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """Random log-probs with exact ties (rows on a coarse grid, a tie for the best place) and -inf entries."""
    log_probs = (rng.standard_normal((rows, width)) * 3 - 4).astype(np.float32)
    for row in range(rows):
        kind = rng.random()
        if kind < 0.25:
            log_probs[row] = np.round(log_probs[row])
        elif kind < 0.4:
            log_probs[row, rng.integers(0, width, width // 2)] = -np.inf
        elif kind < 0.5:
            log_probs[row, rng.integers(0, width, 2)] = np.float32(1.0)
    return log_probs


def _columns(rng: np.random.Generator, vocab: int, keep: set[int]) -> np.ndarray | None:
    """A random shortlist holding ``keep`` (EOS, the target prefixes' tokens), or None (every id)."""
    if rng.random() < 0.6:
        return None
    chosen = set(rng.choice(vocab, int(rng.integers(2, vocab + 1)), replace=False).tolist()) | keep
    return np.array(sorted(chosen), dtype=np.int64)


@pytest.mark.parametrize(("seed", "kernel"), [(seed, "default") for seed in range(40)]
                         + [(seed, "sse2") for seed in range(10)], indirect=["kernel"])
def test_native_searches_match_numpy(seed: int, kernel: str) -> None:
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([7, 40, 300, 1000, 3000]))
    options = _options(rng, vocab)
    pairs = [Pair(rng, options, vocab, 0)]
    main = pairs[0]
    keep = {options.eos_id}
    for pair in pairs:
        keep |= {t for p in pair.prefixes or [] for t in p}
    rows = main.numpy.tokens.shape[0]
    next_id = 100
    for step in range(40):
        columns = _columns(rng, vocab, keep)
        width = vocab if columns is None else columns.size
        plan = main.advance(_log_probs(rng, rows, width), columns)
        if plan is None:
            break
        rows = plan.tokens.shape[0]
        if step % 3 == 1:  # new sentences: their first step on their own, then they join (step-level batching)
            joining = Pair(rng, options, vocab, next_id)
            next_id += 10
            keep |= {t for p in joining.prefixes or [] for t in p}
            first = joining.advance(_log_probs(rng, joining.numpy.tokens.shape[0], vocab), None)
            if first is not None:
                main.numpy.join(joining.numpy)
                main.native.join(joining.native)
                rows += first.tokens.shape[0]
            main.calls[0].extend(joining.calls[0])
            main.calls[1].extend(joining.calls[1])
            main.numpy.results.update(joining.numpy.results)
            main.native.results.update(joining.native.results)
        if step % 4 == 2:  # some sentences leave (and an id that is not there)
            alive = main.numpy.ids.tolist()  # type: ignore[attr-defined]
            gone = np.array(rng.choice(alive + [999], int(rng.integers(1, 3))), dtype=np.int64)
            kept = main.numpy.remove(gone)
            mine = main.native.remove(gone)
            assert (kept is None) == (mine is None)
            if kept is None or mine is None:
                break
            np.testing.assert_array_equal(mine, kept)
            rows = kept.size
    _same_results(main.numpy.results, main.native.results)
    assert main.numpy.results, "the scenario finished no sentence"
    _streams_grow_to_results(main.calls[0], main.numpy.results)


def _streams_grow_to_results(calls: list[Any], results: dict[int, Any]) -> None:
    """Each streaming call extends what the sentence streamed before (never rewrites it), and a finished sentence's
    last call is its result (beam search: the stable prefixes, then the result)."""
    streamed: dict[int, list[int]] = {}
    for call in calls:
        assert len({sentence for sentence, _ in call}) == len(call)  # one row per sentence and call
        for sentence, tokens in call:
            before = streamed.get(sentence, [])
            assert tokens[: len(before)] == before and len(tokens) > len(before), (sentence, before, tokens)
            streamed[sentence] = tokens
    for sentence, hypothesis in results.items():
        assert streamed[sentence] == hypothesis.token_ids


@pytest.mark.parametrize("kind", ["hf", "gnmt"])
def test_beam_streams_the_prefix_every_possible_result_shares(kind: str) -> None:
    """Beam search streams each sentence's stable prefix as it grows, the same in numpy and in the core: the prefix
    of the alive beams *and* of the finished hypotheses kept (the result may be one of those, which need not
    extend the alive beams' common prefix; a small vocabulary makes that frequent), never rewritten, ending with the
    result; most sentences stream before they are done."""
    early = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        options = SearchOptions(eos_id=0, decoder_start_id=1, beam_size=int(rng.integers(2, 6)), length_penalty_kind=kind,  # type: ignore[arg-type]
                                length_penalty=float(rng.choice([0.6, 1.0, 2.0])))
        pair = Pair(rng, options, 8, 0)
        rows = pair.numpy.tokens.shape[0]
        while (plan := pair.advance(_log_probs(rng, rows, 8), None)) is not None:
            rows = plan.tokens.shape[0]
        _same_results(pair.numpy.results, pair.native.results)
        _streams_grow_to_results(pair.calls[0], pair.numpy.results)
        early += sum(len(call) for call in pair.calls[0]) - len(pair.numpy.results)
    assert early > 60


@pytest.mark.parametrize("kind", ["hf", "gnmt"])
def test_beam_searches_with_and_without_prefixes_join(kind: str) -> None:
    """A block of sentences with target prefixes and one without share a search (the numpy reference once failed
    here: it joined the prefixes twice)."""
    rng = np.random.default_rng(7)
    options = SearchOptions(eos_id=0, decoder_start_id=1, beam_size=3, length_penalty_kind=kind)  # type: ignore[arg-type]
    searches = []
    for search in (numpy_search, native_search):
        with_prefix = search(np.array([6, 6]), options, None, np.array([0, 1]), [[5, 6], [7]])
        without = search(np.array([6]), options, None, np.array([2]))
        assert with_prefix is not None and without is not None
        searches.append((with_prefix, without))
    for first in (0, 1):
        log_probs = _log_probs(rng, searches[0][first].tokens.shape[0], 20)
        _same_plan(searches[0][first].advance(log_probs.copy()), searches[1][first].advance(log_probs.copy()))
    for with_prefix, without in searches:
        with_prefix.join(without)
    plans: list[StepPlan | None] = [StepPlan(np.zeros((9, 1), np.int64), np.arange(9), None)] * 2
    while plans[0] is not None:
        log_probs = _log_probs(rng, plans[0].tokens.shape[0], 20)
        plans = [pair[0].advance(log_probs.copy()) for pair in searches]
        _same_plan(*plans)
    _same_results(searches[0][0].results, searches[1][0].results)
    assert [searches[0][0].results[i].token_ids[: len(p)] for i, p in enumerate([[5, 6], [7]])] == [[5, 6], [7]]


@pytest.mark.parametrize("beam", [1, 3])
def test_sentences_leave_before_their_first_step(beam: int) -> None:
    """A request abandoned between joining a lane and its first step: its rows (one per sentence before the first
    step, K after) leave the same way."""
    options = SearchOptions(eos_id=0, decoder_start_id=1, beam_size=beam)
    pairs = [make(np.array([4, 5, 6]), options, None, np.array([7, 8, 9])) for make in (numpy_search, native_search)]
    kept = [search.remove(np.array([8])) for search in pairs if search is not None]
    np.testing.assert_array_equal(kept[1], kept[0])
    log_probs = _log_probs(np.random.default_rng(0), 2, 30)
    _same_plan(*(search.advance(log_probs.copy()) for search in pairs if search is not None))
    assert [search.remove(np.array([7, 9])) for search in pairs if search is not None] == [None, None]


def test_top_p_sampling_keeps_the_numpy_search() -> None:
    options = SearchOptions(eos_id=0, decoder_start_id=1, sampling=True, top_p=0.9)
    assert native_search(np.array([3]), options, None, np.array([0])) is None
    assert native_search(np.array([3]), SearchOptions(eos_id=0, decoder_start_id=1, sampling=True), None,
                         np.array([0])) is not None


def test_numpy_is_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch, core: ModuleType) -> None:
    from serving.engine.decoding import start_search
    from serving.engine.decoding.greedy import GreedySearch

    assert type(start_search(np.array([3]), SearchOptions(eos_id=0, decoder_start_id=1))).__name__ == \
        "NativeGreedySearch"
    monkeypatch.setenv("MTGATE_NATIVE", "0")
    assert isinstance(start_search(np.array([3]), SearchOptions(eos_id=0, decoder_start_id=1)), GreedySearch)
    assert not SlotRows(FakeStationary()).native


def test_without_the_extension_numpy_decodes_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    import importlib

    from serving.engine import native
    from serving.engine.decoding import start_search
    from serving.engine.decoding.greedy import GreedySearch

    def missing(name: str) -> ModuleType:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", missing)
    native._import.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="serving.engine.native"):
            searches = [start_search(np.array([3]), SearchOptions(eos_id=0, decoder_start_id=1)) for _ in range(3)]
            rows = SlotRows(FakeStationary())
    finally:
        native._import.cache_clear()
    assert all(isinstance(search, GreedySearch) for search in searches) and not rows.native
    assert [r.getMessage() for r in caplog.records] == [
        "the native decoding core is not built (No module named 'serving.engine._native_core'): decoding with numpy"]


# ---------------------------------------------------------------------------------------------------------------
# Slot bookkeeping


def _same_rows(expected: SlotRows, got: SlotRows) -> None:
    np.testing.assert_array_equal(got.slot, expected.slot)
    for name in ("positions", "owner", "source_len", "cache", "cross", "src_bias"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)


@pytest.mark.parametrize("seed", range(8))
def test_native_slots_match_numpy(seed: int, core: ModuleType) -> None:
    rng = np.random.default_rng(100 + seed)
    pair = (SlotRows(FakeStationary(), slots=2, positions=2, native=False),
            SlotRows(FakeStationary(), slots=2, positions=2))  # small: grown many times
    assert not pair[0].native and pair[1].native
    count, token = 0, 1
    for _ in range(80):
        action = rng.random()
        if action < 0.3 or not count:  # rows join at position 0
            cross, bias, _ = encoded(rng, int(rng.integers(1, 5)), int(rng.integers(1, 12)))
            picks = rng.integers(0, cross.shape[2], int(rng.integers(1, 5)))
            at = int(rng.integers(0, count + 1))
            sources = np.concatenate([np.arange(at), -1 - picks, np.arange(at, count)])
            for rows in pair:
                rows.arrange(sources, cross, bias)
            count += picks.size
        elif action < 0.4:  # some rows leave
            keep = np.sort(rng.choice(count, int(rng.integers(0, count + 1)), replace=False))
            for rows in pair:
                rows.arrange(keep)
            count = keep.size
        else:  # a step, then a plan (beam reorders: repeats and drops)
            tokens = np.arange(token, token + count).reshape(-1, 1)
            token += count
            parents = rng.integers(0, count, int(rng.integers(1, count + 3)))
            for rows in pair:
                rows.decode(tokens)
                rows.advance(parents, None)
            count = parents.size
        if count:
            _same_rows(*pair)


# ---------------------------------------------------------------------------------------------------------------
# The GIL


def test_a_native_step_releases_the_gil(core: ModuleType) -> None:
    """A sampling step over 256 rows of 32,000 columns (~8M exp) runs in a worker thread while the main thread counts:
    the count must go on inside the step (with the GIL held it could not move at all there)."""
    rows, width = 256, 32_000
    options = SearchOptions(eos_id=0, decoder_start_id=1, sampling=True, temperature=0.9)
    log_probs = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    spans: list[float] = []
    search = native_search(np.full(rows, 5), options, None, np.arange(rows), seeds=np.arange(rows, dtype=np.uint64))
    assert search is not None

    def step() -> None:
        spans.append(time.perf_counter())
        search.advance(log_probs)
        spans.append(time.perf_counter())

    worker = threading.Thread(target=step)
    ticks: list[float] = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    start, end = spans
    margin = (end - start) / 4
    inside = [t for t in ticks if start + margin < t < end - margin]
    assert end - start > 0.02, "the step is too short to tell"
    assert len(inside) > 100, f"{len(inside)} ticks inside a step of {1000 * (end - start):.0f} ms"
