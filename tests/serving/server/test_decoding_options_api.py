"""The decoding options through a real ``mtgate serve`` (issue 18), in both batching modes: ``/v1/translate``
fields, ``/v2`` infer parameters and gRPC parameters give what the engine gives offline with the same options
(n-best, seeded sampling, the logits rules, a target prefix), and options that do not go together are refused with
their names (400 / INVALID_ARGUMENT)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.engine.translator import DecodeOptions, Translator
from tests.utils.marian_factory import corpus
from tests.utils.server import ServerProcess, start_server

grpcclient = pytest.importorskip("tritonclient.grpc")

TEXTS = corpus("en")[30:34]
SAMPLED = {"temperature": 1.5, "top_k": 20, "seed": 5}
RULES = {"min_length": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.3, "disable_unk": True, "beam_size": 2}


@pytest.fixture(scope="module", params=["request", "step"])
def server(request: pytest.FixtureRequest, tiny_package: Path) -> Iterator[ServerProcess]:
    proc = start_server(tiny_package, "--grpc-port", "0", "--batching", request.param)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def offline(tiny_package: Path) -> Translator:
    return Translator.load(tiny_package, threads=1)


def _v1(server: ServerProcess, **fields: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/translate", json={"text": TEXTS, **fields}, timeout=60)


def _v2(server: ServerProcess, texts: list[str], parameters: dict[str, Any]) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}],
            "parameters": parameters}
    return httpx.post(server.url + "/v2/models/tiny-marian/infer", json=body, timeout=60)


def _grpc(server: ServerProcess, texts: list[str], parameters: dict[str, Any]) -> list[str]:
    import numpy as np

    client = grpcclient.InferenceServerClient(server.grpc_address)
    tensor = grpcclient.InferInput("INPUT_TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    result = client.infer("tiny-marian", [tensor], parameters=parameters)
    return [v.decode() for v in result.as_numpy("OUTPUT_TEXT").reshape(-1)]


def _texts(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    body = response.json()
    if "translations" in body:
        return [t["text"] for t in body["translations"]]
    return next(o["data"] for o in body["outputs"] if o["name"] == "OUTPUT_TEXT")


def test_n_best_lists(server: ServerProcess, offline: Translator) -> None:
    response = _v1(server, num_hypotheses=3)
    expected = offline.translate(TEXTS, DecodeOptions(num_hypotheses=3))
    for item, translation in zip(response.json()["translations"], expected, strict=True):
        hypotheses = item["hypotheses"]
        assert [h["text"] for h in hypotheses] == [translation.text] + [a.text for a in translation.alternatives]
        assert hypotheses[0]["text"] == item["text"] and hypotheses[0]["score"] == item["score"]
        scores = [h["score"] for h in hypotheses]
        assert scores == sorted(scores, reverse=True) and len({h["text"] for h in hypotheses}) == 3
    assert "hypotheses" not in _v1(server).json()["translations"][0]  # only when asked for


def test_token_scores(server: ServerProcess, offline: Translator) -> None:
    expected = offline.translate(TEXTS, DecodeOptions(num_hypotheses=2, return_scores=True))
    items = _v1(server, num_hypotheses=2, return_scores=True).json()["translations"]
    for item, translation in zip(items, expected, strict=True):
        assert len(item["token_scores"]) == item["output_tokens"] + 1
        assert item["token_scores"] == pytest.approx(list(translation.token_scores or ()), abs=1e-5)
        assert item["hypotheses"][1]["token_scores"] == pytest.approx(
            list(translation.alternatives[0].token_scores or ()), abs=1e-5)
    assert "token_scores" not in _v1(server).json()["translations"][0]


@pytest.mark.parametrize("options", [SAMPLED, RULES], ids=["sampled", "rules"])
def test_every_protocol_decodes_as_the_engine(server: ServerProcess, offline: Translator,
                                              options: dict[str, Any]) -> None:
    expected = [t.text for t in offline.translate(TEXTS, DecodeOptions(**options))]
    assert _texts(_v1(server, **options)) == expected
    assert _texts(_v1(server, **options)) == expected  # the seed reproduces it
    assert _texts(_v2(server, TEXTS, options)) == expected
    assert _grpc(server, TEXTS, options) == expected
    if options is SAMPLED:
        assert _texts(_v1(server, **{**options, "seed": 6})) != expected


def test_target_prefix(server: ServerProcess, offline: Translator) -> None:
    expected = offline.run(offline.prepare(TEXTS, DecodeOptions(beam_size=2), ["Ein Mann"] * len(TEXTS)))
    got = _texts(_v1(server, beam_size=2, target_prefix="Ein Mann"))
    assert got == [t.text for t in expected] and all(text.startswith("Ein Mann") for text in got)
    assert got != _texts(_v1(server, beam_size=2))
    shared = [t.text for t in offline.run(offline.prepare(TEXTS[:2], DecodeOptions(), ["Zwei Hunde"] * 2))]
    assert _texts(_v2(server, TEXTS[:2], {"target_prefix": "Zwei Hunde"})) == shared
    assert _grpc(server, TEXTS[:2], {"target_prefix": "Zwei Hunde"}) == shared
    wrong = _v1(server, target_prefix="Ein Mann", split_sentences=True)
    assert wrong.status_code == 400, wrong.text
    assert wrong.json()["error"]["message"] == ("split_sentences gives each sentence one translation: not with "
                                                "target_prefix or num_hypotheses above 1")


def test_options_that_do_not_go_together_are_named(server: ServerProcess) -> None:
    for fields, message in (
        ({"beam_size": 3, "temperature": 0.7}, "sampling draws one token at a time: beam_size must be 1, got 3"),
        ({"do_sample": False, "seed": 1}, "seed applies to sampling, and do_sample is false"),
        ({"num_hypotheses": 9}, "num_hypotheses must be an integer from 1 to 8 (max_beam_size), got 9"),
    ):
        response = _v1(server, **fields)
        assert response.status_code == 400 and response.json()["error"]["message"] == message, response.text
    response = _v2(server, TEXTS[:1], {"num_hypotheses": 2})
    assert response.status_code == 400 and "parameter 'num_hypotheses' above 1 is not for infer" in response.text
    response = _v2(server, TEXTS[:1], {"top_p": 1.5})
    assert response.status_code == 400
    assert response.json()["error"] == "parameter 'top_p' must be a number above 0 and at most 1, got 1.5"
    with pytest.raises(grpcclient.InferenceServerException) as caught:
        _grpc(server, TEXTS[:1], {"beam_size": 2, "seed": 3})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "sampling draws one token at a time: parameter 'beam_size' must be 1, got 2" in caught.value.message()
