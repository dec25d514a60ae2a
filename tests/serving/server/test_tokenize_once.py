"""A sentence is tokenized exactly once on its way from the HTTP request to the runtime: the server prepares it at
admission (``Translator.prepare``) and the batchers carry its ids. The real engine on the tiny package, behind the
real app on a real uvicorn, in both batching modes, through /v1 (plain, stream, bulk) and /v2."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.engine.translator import Translator
from tests.fakes import CountingTokenizer
from tests.utils.marian_factory import corpus

SENTENCES = corpus("en")


@pytest.fixture(scope="module")
def translator(tiny_package: Path) -> Iterator[Translator]:
    translator = Translator.load(tiny_package, threads=1)
    translator.tokenizer = CountingTokenizer(translator.tokenizer)
    yield translator


def _calls(translator: Translator, request: Callable[[], httpx.Response]) -> int:
    counter = translator.tokenizer
    assert isinstance(counter, CountingTokenizer)
    before = counter.calls
    response = request()
    assert response.status_code == 200, response.text
    return counter.calls - before


@pytest.mark.parametrize("batching", ["request", "step"])
def test_each_sentence_is_tokenized_once(live: Callable[..., Any], translator: Translator, batching: str) -> None:
    with live(translator, batching=batching, max_queue_delay_us=2000) as url:
        texts = SENTENCES[:5]
        assert _calls(translator, lambda: httpx.post(url + "/v1/translate", json={"text": texts}, timeout=60)) == 5
        assert _calls(translator, lambda: httpx.post(
            url + "/v1/translate", json={"text": texts[:2], "beam_size": 1, "max_length": 8}, timeout=60)) == 2

        def stream() -> httpx.Response:
            with httpx.stream("POST", url + "/v1/translate/stream", json={"text": texts[:3], "beam_size": 1},
                              timeout=60) as r:
                body = r.read().decode()
            assert "event: final" in body
            return r

        assert _calls(translator, stream) == 3
        lines = "\n".join(f'"{text}"' for text in texts[:4]) + "\n"
        assert _calls(translator, lambda: httpx.post(url + "/v1/translate/bulk", content=lines.encode(),
                                                     timeout=60)) == 4
        infer = {"inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [3, 1], "data": texts[:3]}],
                 "parameters": {"beam_size": 2}}
        name = translator.info.name
        assert _calls(translator, lambda: httpx.post(f"{url}/v2/models/{name}/infer", json=infer, timeout=60)) == 3
