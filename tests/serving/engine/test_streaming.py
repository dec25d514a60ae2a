"""Streaming in the engine (``serving.engine.streaming``) on the demo model (fp32, onnxruntime: int8's dynamic
quantization scales activations over the whole batch, so its translations depend on the batch): the deltas
``on_partial`` carries concatenate to each sentence's final text, which is the non-streamed translation, greedy and
with a beam (the prefix the live beams share, as it grows), in request-level batches (``Translator.run``, several
requests' sentences joined) and at step level (``ContinuousDecoder``: streamed groups joining a running batch beside
non-streamed ones of the same options and greedy ones); each step detokenizes only the new tokens. On the native
core and on numpy, each against the translations numpy makes without streaming.

Multi30k test sentences (tests/data): 32 at beam 4 (the package's rules: transformers', length penalty 1), 24 at
beam 5 with a length penalty of 0.6. ``benchmarks/stream_latency.py --check`` runs 1,000 through a served model.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.continuous import ContinuousDecoder
from serving.engine.request import Prepared
from serving.engine.tokenizers import TextStream, Tokenizer, open_stream
from serving.engine.translator import DecodeOptions, Translation, Translator
from serving.server.settings import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[3]


def _sources(count: int, start: int = 0) -> list[str]:
    with gzip.open(ROOT / "tests" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()[start : start + count]




_EXPECTED: dict[tuple[str, int, int, DecodeOptions], list[str]] = {}


def expected(engine: str, translator: Translator, count: int, options: DecodeOptions, start: int = 0) -> list[str]:
    """The non-streamed translations of ``count`` sentences from ``start``, alone in their batch, on numpy (once)."""
    key = (engine, start, count, options)
    if key not in _EXPECTED:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MTGATE_NATIVE", "0")
            _EXPECTED[key] = _texts(translator.translate(_sources(count, start), options))
    return _EXPECTED[key]


@pytest.fixture(scope="module")
def demo() -> Translator:
    return Translator.load(DEFAULT_MODEL_DIR, precision="fp32", threads=1)


@pytest.fixture(scope="module")
def demo_lp(demo: Translator) -> Translator:
    """The demo model with a length penalty of 0.6 (transformers' rules)."""
    info = replace(demo.info, decoding=replace(demo.info.decoding, length_penalty=0.6))
    return Translator(demo.backend, demo.tokenizer, info, demo.ids)


class Deltas:
    """Collects ``on_partial`` deltas (from any thread), by sentence."""

    def __init__(self) -> None:
        self.by_index: dict[int, list[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, index: int, delta: str) -> None:
        assert delta, "an empty delta"
        with self._lock:
            self.by_index.setdefault(index, []).append(delta)

    def text(self, index: int) -> str:
        return "".join(self.by_index.get(index, []))


def _texts(translations: Sequence[Translation]) -> list[str]:
    return [t.text for t in translations]


CASES = [("beam 4", "demo", 32, DecodeOptions(beam_size=4)), ("beam 5, length penalty 0.6", "demo_lp", 24,
                                                               DecodeOptions(beam_size=5))]


@pytest.mark.parametrize(("name", "engine", "count", "options"), CASES, ids=[case[0] for case in CASES])
def test_request_level_streams_the_translation(request: pytest.FixtureRequest, search_core: str, name: str, engine: str,
                                               count: int, options: DecodeOptions) -> None:
    translator: Translator = request.getfixturevalue(engine)
    sources = _sources(count)
    want = expected(engine, translator, count, options)
    # Several requests' sentences in one batch, as the request-level batcher joins them.
    parts = [translator.prepare(sources[i : i + 7], options) for i in range(0, count, 7)]
    deltas = Deltas()
    got = translator.run(Prepared.join(parts), deltas)
    assert _texts(got) == want
    assert [deltas.text(i) for i in range(count)] == want
    streamed_early = sum(len(deltas.by_index.get(i, [])) > 1 for i in range(count))
    assert streamed_early > count // 2, "most sentences stream more than their last piece"


@pytest.mark.parametrize(("name", "engine", "count", "options"), CASES, ids=[case[0] for case in CASES])
def test_step_level_streams_the_translation_in_mixed_batches(request: pytest.FixtureRequest, search_core: str, name: str,
                                                             engine: str, count: int, options: DecodeOptions) -> None:
    translator: Translator = request.getfixturevalue(engine)
    sources = _sources(count)
    want = expected(engine, translator, count, options)
    others = _sources(12, start=count)
    greedy = DecodeOptions(beam_size=1)
    decoder = ContinuousDecoder(translator)
    results: dict[str, Any] = {}
    streams: dict[str, Deltas] = {}

    def add(name: str, texts: list[str], opts: DecodeOptions, stream: bool) -> None:
        def on_result(value: Any) -> None:
            results[name] = value

        streams[name] = Deltas()
        decoder.add(translator.prepare(texts, opts), on_result, on_partial=streams[name] if stream else None)

    chunks = [sources[i : i + 5] for i in range(0, count, 5)]
    for step, chunk in enumerate(chunks):  # a streamed group joins every other step, among others
        add(f"streamed {step}", chunk, options, True)
        if step % 2 == 0:
            add(f"plain {step}", others[step % 6 : step % 6 + 3], options, False)
        if step % 3 == 0:
            add(f"greedy {step}", others[6 + step % 6 : 8 + step % 6], greedy, step % 2 == 0)
        decoder.step()
        decoder.step()
    while not decoder.idle:
        decoder.step()
    got = [t for step in range(len(chunks)) for t in results[f"streamed {step}"]]
    assert _texts(got) == want
    texts = [streams[f"streamed {step}"].text(i) for step, chunk in enumerate(chunks) for i in range(len(chunk))]
    assert texts == want
    for name, value in results.items():
        if name.startswith("greedy") and streams[name].by_index:
            assert [streams[name].text(i) for i in range(len(value))] == _texts(value)
        else:
            assert not streams[name].by_index or name.startswith("streamed")
    assert _texts(results["plain 0"]) == expected(engine, translator, 3, options, start=count)


class CountingTokenizer:
    """The demo's tokenizer, counting the ids ``decode`` and the streams detokenize."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.decoded = 0
        self.streamed = 0

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def encode_target(self, text: str) -> list[int]:
        return self.inner.encode_target(text)

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded += len(ids)
        return self.inner.decode(ids)

    def stream(self) -> TextStream:
        inner, counter = open_stream(self.inner), self

        class Counted:
            def add(self, ids: Sequence[int]) -> str:
                counter.streamed += len(ids)
                return inner.add(ids)

            def finish(self) -> str:
                return inner.finish()

        return Counted()


@pytest.mark.parametrize("beam", [1, 4])
def test_each_token_is_detokenized_once(demo: Translator, search_core: str, beam: int) -> None:
    """The detokenizer work of a streamed request: every output token goes through a sentence's stream once, and
    ``decode`` runs once per sentence (its translation), never on the prefix at each step."""
    counting = CountingTokenizer(demo.tokenizer)
    translator = Translator(demo.backend, counting, demo.info, demo.ids)
    sources = _sources(16, start=200)
    deltas = Deltas()
    got = translator.translate(sources, DecodeOptions(beam_size=beam), on_partial=deltas)
    tokens = sum(t.output_tokens for t in got)
    assert counting.decoded == tokens  # the translations' texts
    assert counting.streamed == tokens  # each token once
    assert [deltas.text(i) for i in range(len(sources))] == _texts(got)
    assert np.mean([len(deltas.by_index[i]) for i in range(len(sources))]) > 2
