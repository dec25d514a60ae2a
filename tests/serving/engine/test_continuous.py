"""Step-level batching in the engine (serving.engine.continuous): groups that join a running batch at different steps, with
different options and source lengths, get the translations they get alone, on both runtimes, and with a vocabulary
shortlist (each row restricted to its own sentence's candidates, whatever else is in the batch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.continuous import ContinuousDecoder
from serving.engine.errors import InferenceFailed, InputTooLong, ServingError
from serving.engine.rows import DenseRows, SlotRows
from serving.engine.translator import DecodeOptions, Translation, Translator
from tests.utils.marian_factory import corpus

SENTENCES = corpus("en")


@pytest.fixture(scope="module", params=["onnxruntime", "openvino", "onnxruntime-shortlist"])
def translator(request: pytest.FixtureRequest, tiny_package: Path) -> Translator:
    if request.param == "onnxruntime-shortlist":  # each row restricted to its own sentence's candidates
        return Translator.load(request.getfixturevalue("tiny_shortlist_package"), shortlist=True)
    return Translator.load(tiny_package, runtime=request.param)


class Results:
    """Collects each group's on_result value."""

    def __init__(self) -> None:
        self.values: dict[str, list[Translation] | ServingError] = {}

    def sink(self, name: str) -> Any:
        def on_result(value: list[Translation] | ServingError) -> None:
            assert name not in self.values, f"{name} got two results"
            self.values[name] = value

        return on_result


GROUPS: list[tuple[str, list[str], DecodeOptions]] = [
    ("greedy", SENTENCES[0:3], DecodeOptions(beam_size=1)),
    ("beam", SENTENCES[3:5], DecodeOptions(beam_size=3)),
    ("short", [SENTENCES[5] + " " + SENTENCES[6]], DecodeOptions(beam_size=1, max_length=4)),
    ("default", SENTENCES[7:10], DecodeOptions()),
    ("sampled", SENTENCES[10:13], DecodeOptions(do_sample=True, seed=3, top_k=8, temperature=1.5)),
    ("n-best", SENTENCES[13:15], DecodeOptions(beam_size=3, num_hypotheses=3)),
    ("rules", SENTENCES[15:17], DecodeOptions(beam_size=2, min_length=3, no_repeat_ngram_size=2,
                                              repetition_penalty=1.3, disable_unk=True)),
]


def _ids(translations: list[Translation] | ServingError) -> list[list[int]]:
    """Each translation's ids, then its alternatives' (n-best)."""
    assert isinstance(translations, list), translations
    return [t.token_ids + [i for a in t.alternatives for i in [-1, *a.token_ids]] for t in translations]


def test_groups_joining_at_different_steps_translate_as_alone(translator: Translator) -> None:
    decoder = ContinuousDecoder(translator)
    results = Results()
    widths = []
    for joins_after, (name, texts, options) in zip([0, 2, 1, 3, 1, 2, 0], GROUPS, strict=True):
        for _ in range(joins_after):
            decoder.step()
        decoder.add(translator.prepare(texts, options), results.sink(name))
    while not decoder.idle:
        decoder.step()
        for lane in decoder._lanes:
            rows = lane.decode_rows
            if isinstance(rows, DenseRows):
                assert rows._past is not None
                widths.append(rows._past.shape[4])
                # The cache is cut from the left: as wide as the row that has decoded longest, no more.
                assert rows._past.shape[4] == int(rows._positions.max())
            else:
                assert isinstance(rows, SlotRows)
                # The live rows fill slots 0..n-1, one row per slot.
                assert sorted(rows.slot.tolist()) == list(range(rows.count)) == list(range(lane.rows))
    assert decoder.rows == 0 and decoder.sentences == 0 and decoder.lanes == 0
    for name, texts, options in GROUPS:
        alone = translator.translate(texts, options)
        assert _ids(results.values[name]) == _ids(alone), name
        assert [t.text for t in results.values[name]] == [t.text for t in alone]  # type: ignore[union-attr]


def test_late_sentences_open_a_new_lane_and_still_translate_as_alone(translator: Translator) -> None:
    decoder = ContinuousDecoder(translator, max_join_width=3)
    results = Results()
    decoder.add(translator.prepare(SENTENCES[40:42], DecodeOptions(beam_size=2)), results.sink("first"))
    for _ in range(2):
        decoder.step()
    decoder.add(translator.prepare(SENTENCES[42:43], DecodeOptions(beam_size=2)), results.sink("joins"))  # width 2 < 3
    decoder.step()
    assert decoder.lanes == 1
    decoder.add(translator.prepare(SENTENCES[43:45], DecodeOptions(beam_size=2)), results.sink("new lane"))  # width 3
    decoder.step()
    # A growing cache opens a lane of its own; a stationary one has no masked slots: its one lane takes everybody.
    assert decoder.lanes == (1 if getattr(translator.backend, "stationary", False) else 2)
    while not decoder.idle:
        decoder.step()
    assert decoder.lanes == 0
    for name, texts in (("first", SENTENCES[40:42]), ("joins", SENTENCES[42:43]), ("new lane", SENTENCES[43:45])):
        alone = translator.translate(texts, DecodeOptions(beam_size=2))
        assert _ids(results.values[name]) == _ids(alone), name


def test_a_group_that_is_no_longer_wanted_leaves_the_batch(translator: Translator) -> None:
    decoder = ContinuousDecoder(translator)
    results = Results()
    wanted = {"gone": True}
    decoder.add(translator.prepare(SENTENCES[10:13], DecodeOptions(beam_size=2)), results.sink("gone"),
                alive=lambda: wanted["gone"])
    decoder.add(translator.prepare(SENTENCES[13:15], DecodeOptions(beam_size=1)), results.sink("kept"))
    decoder.step()
    wanted["gone"] = False
    while not decoder.idle:
        decoder.step()
    assert isinstance(results.values["gone"], ServingError) and "abandoned" in str(results.values["gone"])
    assert _ids(results.values["kept"]) == [t.token_ids for t in translator.translate(SENTENCES[13:15],
                                                                                        DecodeOptions(beam_size=1))]


def test_streaming_reports_partial_texts_of_each_group(translator: Translator) -> None:
    decoder = ContinuousDecoder(translator)
    results = Results()
    partial: list[tuple[int, str]] = []
    decoder.add(translator.prepare(SENTENCES[15:17], DecodeOptions(beam_size=1)), results.sink("a"),
                on_partial=lambda i, text: partial.append((i, text)))
    decoder.step()
    decoder.add(translator.prepare(SENTENCES[17:18], DecodeOptions(beam_size=1)), results.sink("b"))
    while not decoder.idle:
        decoder.step()
    final = results.values["a"]
    assert isinstance(final, list)
    for index in (0, 1):
        deltas = [text for i, text in partial if i == index]
        assert deltas and "".join(deltas) == final[index].text


def test_refused_input_joins_nothing_and_runtime_failure_fails_every_group(translator: Translator) -> None:
    decoder = ContinuousDecoder(translator)
    results = Results()
    with pytest.raises(InputTooLong):
        decoder.add(translator.prepare(["word " * 2000], None), results.sink("long"))
    assert decoder.idle and decoder.rows == 0
    decoder.add(translator.prepare(SENTENCES[20:22], None), results.sink("a"))
    decoder.add(translator.prepare(SENTENCES[22:23], None), results.sink("b"))

    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(translator.backend, name)

        def decode_step(self, *args: Any) -> Any:
            raise RuntimeError("boom")

        def decode_in_place(self, *args: Any) -> Any:
            raise RuntimeError("boom")

    decoder.backend = Broken()  # type: ignore[assignment]
    decoder.step()
    assert decoder.idle
    assert all(isinstance(results.values[name], InferenceFailed) for name in ("a", "b"))
    assert "boom" in str(results.values["a"])


def test_rows_at_different_positions_match_separate_calls(translator: Translator) -> None:
    """The graph contract behind it all: position_ids and self_bias (growing cache), or each row's own slots
    (stationary cache), make a merged call equal to separate ones."""
    backend = translator.backend
    if getattr(backend, "stationary", False):
        _stationary_rows_at_different_positions(translator)
        return
    sources = translator.encode(SENTENCES[30:32])
    encoded = [translator.encode_batch([s], np.array([0])) for s in sources]
    start = translator.ids.decoder_start
    # Row 0 decodes 3 steps alone.
    past = np.zeros(encoded[0].cross_kv.shape[:4] + (0,) + encoded[0].cross_kv.shape[5:], dtype=np.float32)
    token = np.array([[start]])
    for step in range(3):
        log_probs, past = backend.decode_step(token, step, past, encoded[0].cross_kv, encoded[0].src_bias)
        past = np.array(past)
        token = np.array([[int(np.argmax(log_probs[0]))]])
    alone_a, _ = backend.decode_step(token, 3, past, encoded[0].cross_kv, encoded[0].src_bias)
    alone_a = np.array(alone_a)
    empty = past[:, :, :, :, :0]
    alone_b, _ = backend.decode_step(np.array([[start]]), 0, empty, encoded[1].cross_kv, encoded[1].src_bias)
    alone_b = np.array(alone_b)
    # Both rows in one call: row 1 is at position 0 with 3 masked cache slots.
    width = max(e.cross_kv.shape[4] for e in encoded)
    cross = np.zeros(encoded[0].cross_kv.shape[:2] + (2,) + encoded[0].cross_kv.shape[3:4] + (width,)
                     + encoded[0].cross_kv.shape[5:], dtype=np.float32)
    src_bias = np.full((2, 1, 1, width), -1e9, dtype=np.float32)
    for row, e in enumerate(encoded):
        cross[:, :, row, :, : e.cross_kv.shape[4]] = e.cross_kv[:, :, 0]
        src_bias[row, :, :, : e.src_bias.shape[3]] = e.src_bias[0]
    merged_past = np.concatenate([past, np.zeros_like(past)], axis=2)
    self_bias = np.zeros((2, 1, 1, 3), dtype=np.float32)
    self_bias[1] = -1e9
    merged, _ = backend.decode_step(np.array([[int(token[0, 0])], [start]]), np.array([3, 0]), merged_past, cross,
                                    src_bias, self_bias)
    np.testing.assert_allclose(merged[0], alone_a[0], atol=1e-4)
    np.testing.assert_allclose(merged[1], alone_b[0], atol=1e-4)


def _stationary_rows_at_different_positions(translator: Translator) -> None:
    """Row 0 at position 3 and row 1 at position 0 in one in-place call equal each alone; the call writes each row's
    slot at its position and leaves every other slot as it was."""
    backend: Any = translator.backend
    sources = translator.encode(SENTENCES[30:32])
    encoded = [translator.encode_batch([s], np.array([0])) for s in sources]
    start = translator.ids.decoder_start
    layers, _, _, heads, _, head_dim = encoded[0].cross_kv.shape
    alone = np.zeros((layers, 2, 1, heads, 8, head_dim), dtype=np.float32)
    one = np.array([0])
    token = np.array([[start]])
    for step in range(3):
        log_probs = backend.decode_in_place(token, np.array([step]), alone, encoded[0].cross_kv, encoded[0].src_bias,
                                            one)
        token = np.array([[int(np.argmax(log_probs[0]))]])
    before = alone.copy()
    alone_a = np.array(backend.decode_in_place(token, np.array([3]), alone, encoded[0].cross_kv,
                                               encoded[0].src_bias, one))
    assert not np.array_equal(alone[:, :, :, :, 3], before[:, :, :, :, 3])
    np.testing.assert_array_equal(np.delete(alone, 3, axis=4), np.delete(before, 3, axis=4))
    alone_b = np.array(backend.decode_in_place(np.array([[start]]), np.array([0]),
                                               np.zeros_like(alone), encoded[1].cross_kv, encoded[1].src_bias, one))
    width = max(e.cross_kv.shape[4] for e in encoded)
    cross = np.zeros((layers, 2, 2, heads, width, head_dim), dtype=np.float32)
    src_bias = np.full((2, 1, 1, width), -1e9, dtype=np.float32)
    for row, e in enumerate(encoded):
        cross[:, :, row, :, : e.cross_kv.shape[4]] = e.cross_kv[:, :, 0]
        src_bias[row, :, :, : e.src_bias.shape[3]] = e.src_bias[0]
    cache = np.full((layers, 2, 2, heads, 8, head_dim), 7.0, dtype=np.float32)  # junk beyond each row's slots
    cache[:, :, 0, :, :3] = before[:, :, 0, :, :3]
    merged = np.array(backend.decode_in_place(np.array([[int(token[0, 0])], [start]]), np.array([3, 0]), cache,
                                              cross, src_bias, np.array([0, 1])))
    np.testing.assert_allclose(merged[0], alone_a[0], atol=1e-4)
    np.testing.assert_allclose(merged[1], alone_b[0], atol=1e-4)
    # row_order: the log-probs come back in the order asked for; the cache is written by input row all the same.
    swapped = backend.decode_in_place(np.array([[int(token[0, 0])], [start]]), np.array([3, 0]), cache, cross,
                                      src_bias, np.array([1, 0]))
    np.testing.assert_allclose(swapped[0], alone_b[0], atol=1e-4)
    np.testing.assert_allclose(swapped[1], alone_a[0], atol=1e-4)
    np.testing.assert_allclose(cache[:, :, 0, :, :4], alone[:, :, 0, :, :4], atol=1e-5)


def _check_slots(decoder: ContinuousDecoder) -> None:
    """The rows of each lane: for a stationary cache, one live row per slot, slots 0..n-1."""
    for lane in decoder._lanes:
        rows = lane.decode_rows
        if isinstance(rows, SlotRows):
            assert sorted(rows.slot.tolist()) == list(range(lane.rows))


def _median_length(translator: Translator) -> int:
    return int(np.median([len(source) for source in translator.encode(SENTENCES)]))


@pytest.mark.parametrize("seed,lanes", [(1, "one kind"), (2, "one kind"), (1, "short and long")])
def test_random_joins_and_leaves_translate_as_alone(translator: Translator, seed: int, lanes: str) -> None:
    """Groups of 1-3 sentences, greedy or beam, join at random steps; some are abandoned at random steps. Every
    group that stays gets exactly what it gets alone; abandoned ones get an error and free their rows at once. Also
    with the sentences split between short and long lanes (a group's sentences can be in both), the long ones
    stepped every third step."""
    rng = np.random.default_rng(seed)
    decoder = ContinuousDecoder(translator, long_tokens=None)
    if lanes == "short and long":
        decoder = ContinuousDecoder(translator, long_tokens=_median_length(translator), long_every=3)
    results = Results()
    wanted: dict[str, bool] = {}
    groups: dict[str, tuple[list[str], DecodeOptions]] = {}
    quitting: dict[str, int] = {}  # group -> the step at which it is abandoned
    for g in range(14):
        name = f"g{g}"
        start = int(rng.integers(0, len(SENTENCES) - 3))
        texts = SENTENCES[start : start + int(rng.integers(1, 4))]
        options = DecodeOptions(beam_size=int(rng.choice([1, 2, 3])))
        groups[name] = (texts, options)
        wanted[name] = True
        if rng.random() < 0.3:
            quitting[name] = int(rng.integers(1, 6))
        decoder.add(translator.prepare(texts, options), results.sink(name),
                    alive=lambda name=name: wanted[name])
        for _ in range(int(rng.integers(0, 4))):
            decoder.step()
            _check_slots(decoder)
            for other, after in list(quitting.items()):
                quitting[other] = after - 1
                if quitting[other] <= 0 and wanted[other]:
                    wanted[other] = False
                    rows_before = decoder.rows
                    decoder.step()  # the abandoned group leaves at this step's start
                    assert decoder.rows <= rows_before
                    _check_slots(decoder)
    while not decoder.idle:
        decoder.step()
        _check_slots(decoder)
    assert decoder.rows == 0 and decoder.sentences == 0 and decoder.lanes == 0
    for name, (texts, options) in groups.items():
        if not wanted[name]:
            value = results.values[name]
            assert isinstance(value, ServingError) or _ids(value) == _ids(translator.translate(texts, options)), name
            continue
        assert _ids(results.values[name]) == _ids(translator.translate(texts, options)), name


def test_an_abandoned_group_frees_its_slots_at_the_next_step(translator: Translator) -> None:
    decoder = ContinuousDecoder(translator)
    results = Results()
    wanted = {"a": True}
    decoder.add(translator.prepare(SENTENCES[50:52], DecodeOptions(beam_size=3)), results.sink("a"),
                alive=lambda: wanted["a"])
    decoder.add(translator.prepare(SENTENCES[52:53], DecodeOptions(beam_size=3)), results.sink("b"))
    decoder.step()
    assert decoder.rows == 9  # 3 sentences x 3 beams
    wanted["a"] = False
    decoder.step()
    assert decoder.rows == 3 and decoder.sentences == 1
    (lane,) = decoder._lanes
    assert lane.decode_rows.count == 3
    while not decoder.idle:
        decoder.step()
    assert isinstance(results.values["a"], ServingError)
    assert _ids(results.values["b"]) == _ids(translator.translate(SENTENCES[52:53], DecodeOptions(beam_size=3)))


def test_a_stationary_cache_stays_bounded_under_a_stream_of_joins(translator: Translator) -> None:
    """300 sentences through 8 rows in flight: the slots, cache positions and source width the cache holds are
    bounded by what is in flight, not by how many sentences went through."""
    if not getattr(translator.backend, "stationary", False):
        pytest.skip("a growing cache is rebuilt at every step")
    decoder = ContinuousDecoder(translator)
    results = Results()
    options = DecodeOptions(beam_size=2, max_length=12)
    shapes = set()
    for i in range(300):
        while decoder.sentences >= 4:
            decoder.step()
            for lane in decoder._lanes:
                rows = lane.decode_rows
                assert isinstance(rows, SlotRows) and rows.cache is not None and rows.cross is not None
                shapes.add((rows.cache.shape[2], rows.cache.shape[4], rows.cross.shape[4]))
        decoder.add(translator.prepare([SENTENCES[i % len(SENTENCES)]], options), results.sink(f"s{i}"))
    while not decoder.idle:
        decoder.step()
    assert len(results.values) == 300 and all(isinstance(v, list) for v in results.values.values())
    longest_source = max(len(s) for s in translator.encode(SENTENCES[:300]))
    assert max(slots for slots, _, _ in shapes) <= 16  # 4 sentences x 2 beams, doubled at most once
    assert max(positions for _, positions, _ in shapes) <= 32  # the initial capacity covers 12 steps
    assert max(width for _, _, width in shapes) <= max(16, 2 * longest_source)


def test_short_sentences_step_ahead_of_long_ones(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A short sentence that joins beside a long one runs in a lane of its own, stepped every step, while the long
    lane steps every fourth: the short one finishes in the steps it takes alone, each paying for its own rows; both
    get the translation they get alone."""
    from serving.engine.lane import Lane

    lengths = [len(source) for source in translator.encode(SENTENCES)]
    long_text, short_text = SENTENCES[int(np.argmax(lengths))], SENTENCES[int(np.argmin(lengths))]
    limit = (max(lengths) + min(lengths)) // 2
    options = DecodeOptions(beam_size=2)

    def steps_alone(text: str) -> int:
        decoder = ContinuousDecoder(translator, long_tokens=limit)
        decoder.add(translator.prepare([text], options), Results().sink("alone"))
        steps = 0
        while not decoder.idle:
            decoder.step()
            steps += 1
        return steps

    short_steps = steps_alone(short_text)
    stepped = {False: 0, True: 0}
    lane_step = Lane.step

    def counting(lane: Lane, *args: Any, **kwargs: Any) -> None:
        stepped[lane.long] += 1
        lane_step(lane, *args, **kwargs)

    monkeypatch.setattr(Lane, "step", counting)
    decoder = ContinuousDecoder(translator, long_tokens=limit, long_every=4)
    results = Results()
    long_options = DecodeOptions(beam_size=2, min_length=4 * short_steps + 8)  # in flight all along
    decoder.add(translator.prepare([long_text], long_options), results.sink("long"))
    decoder.step()
    stepped[True] = 0
    decoder.add(translator.prepare([short_text], options), results.sink("short"))
    steps = 0
    while "short" not in results.values:
        decoder.step()
        steps += 1
    assert steps == short_steps and stepped[False] == steps
    assert "long" not in results.values and 1 <= stepped[True] <= steps // 4 + 1 < steps  # every fourth step only
    while not decoder.idle:
        decoder.step()
    monkeypatch.setattr(Lane, "step", lane_step)
    for name, text, opts in (("long", long_text, long_options), ("short", short_text, options)):
        assert _ids(results.values[name]) == _ids(translator.translate([text], opts)), name


def test_greedy_sentences_share_one_lane_whatever_their_length(translator: Translator) -> None:
    """Only a beam search makes a sentence long: greedy, a paragraph is one row, and it shares the short sentences'
    lane (one decoder call a step); at beam 2 the same sentence opens a long lane. Each gets what it gets alone."""
    lengths = [len(source) for source in translator.encode(SENTENCES)]
    long_text, short_text = SENTENCES[int(np.argmax(lengths))], SENTENCES[int(np.argmin(lengths))]
    limit = (max(lengths) + min(lengths)) // 2
    for beam, lanes in ((1, 1), (2, 2)):
        options = DecodeOptions(beam_size=beam)
        decoder = ContinuousDecoder(translator, long_tokens=limit)
        results = Results()
        decoder.add(translator.prepare([long_text, short_text], options), results.sink("both"))
        decoder.step()
        assert decoder.lanes == lanes, beam
        while not decoder.idle:
            decoder.step()
        assert _ids(results.values["both"]) == _ids(translator.translate([long_text, short_text], options)), beam
