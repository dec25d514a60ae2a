"""What the server answers where it used to surprise (issue 35): an over-long sentence's 413 says how to have it cut,
and an empty text is translated as an empty text (as ``mtgate translate`` and the page do with a blank line), on
/v1, with split_sentences, and on /v2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from serving.engine.translator import Translator
from tests.serving.server.conftest import serve_app

EMPTY = {"text": "", "input_tokens": 0, "output_tokens": 0, "score": None}


@pytest.fixture(scope="module")
def client(tiny_onnx_package: Path) -> TestClient:
    with serve_app(Translator.load(tiny_onnx_package, threads=1), model_dirs=[tiny_onnx_package]) as client:
        yield client  # type: ignore[misc]


def test_an_over_long_sentence_says_truncate_cuts_it(client: TestClient) -> None:
    answer = client.post("/v1/translate", json={"text": ["Hi.", " ".join(["word"] * 400)], "max_length": 4})
    assert answer.status_code == 413
    message = answer.json()["error"]["message"]
    assert message.startswith("text[1] is ") and "(max_input_tokens; truncate cuts it instead)" in message, message
    assert client.post("/v1/translate", json={"text": " ".join(["word"] * 400), "max_length": 4,
                                              "truncate": True}).status_code == 200


def test_an_empty_text_gets_an_empty_translation(client: TestClient) -> None:
    for text in ("", "   "):
        answer = client.post("/v1/translate", json={"text": text})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translations"] == [EMPTY]
    mixed = client.post("/v1/translate", json={"text": ["A dog runs.", "", "A cat sleeps."], "max_length": 4})
    assert mixed.status_code == 200, mixed.text
    one, blank, two = mixed.json()["translations"]
    assert blank == EMPTY and one["text"] and two["text"] and one["input_tokens"] > 0
    alone = client.post("/v1/translate", json={"text": ["A dog runs.", "A cat sleeps."], "max_length": 4})
    assert [one, two] == alone.json()["translations"]  # the blank one changes nothing around it


def test_the_indexes_of_messages_stay_the_requests(client: TestClient) -> None:
    answer = client.post("/v1/translate", json={"text": ["", "Hi.", " ".join(["word"] * 400)]})
    assert answer.status_code == 413 and answer.json()["error"]["message"].startswith("text[2] is "), answer.text


def test_empty_texts_with_split_sentences_and_on_v2(client: TestClient) -> None:
    documents = client.post("/v1/translate", json={"text": ["", "A dog runs. A cat sleeps."], "max_length": 4,
                                                    "split_sentences": True})
    assert documents.status_code == 200, documents.text
    blank, full = documents.json()["translations"]
    assert blank == {**EMPTY, "sentences": []} and len(full["sentences"]) == 2
    only_blank = client.post("/v1/translate", json={"text": ["", " "], "split_sentences": True})
    assert only_blank.status_code == 200 and [t["text"] for t in only_blank.json()["translations"]] == ["", " "]
    body = {"inputs": [{"name": "INPUT_TEXT", "shape": [2, 1], "datatype": "BYTES", "data": ["", "A dog runs."]}],
            "parameters": {"max_length": 4}}
    infer = client.post("/v2/models/tiny-marian/infer", content=json.dumps(body))
    assert infer.status_code == 200, infer.text
    outputs = {o["name"]: o["data"] for o in infer.json()["outputs"]}
    assert outputs["OUTPUT_TEXT"][0] == "" and outputs["OUTPUT_TEXT"][1] and outputs["INPUT_TOKENS"][0] == 0


def test_an_empty_line_of_bulk_gets_an_empty_translation(client: TestClient) -> None:
    answer = client.post("/v1/translate/bulk?max_length=4", content=b'"A dog runs."\n""\n{"text": " ", "id": 7}\n',
                         headers={"Content-Type": "application/x-ndjson"})
    assert answer.status_code == 200
    lines = sorted((json.loads(line) for line in answer.text.splitlines()), key=lambda line: line["index"])
    assert lines[1] == {"index": 1, **EMPTY} and lines[2] == {"index": 2, "id": 7, **EMPTY}
    assert lines[0]["text"] and lines[0]["input_tokens"] > 0
    assert client.post("/v1/translate/stream", json={"text": ""}).status_code == 400  # as the README says


def test_v2_statistics_are_the_model_s_whatever_the_route(client: TestClient) -> None:
    """Documented (README, serving/server/statistics.py): every translation request of the model counts once in /v2's
    statistics, whichever route sent it, as Triton counts a model's requests from all its frontends."""

    def successes() -> int:
        [model] = client.get("/v2/models/tiny-marian/stats").json()["model_stats"]
        return int(model["inference_stats"]["success"]["count"])

    before = successes()
    assert client.post("/v1/translate", json={"text": ["A dog runs.", "A cat."], "max_length": 4}).status_code == 200
    assert client.post("/v1/translate/stream", json={"text": "A dog runs.", "max_length": 4}).status_code == 200
    bulk = client.post("/v1/translate/bulk?max_length=4", content=b'"A dog runs."\n"A cat."\n',
                       headers={"Content-Type": "application/x-ndjson"})
    assert bulk.status_code == 200 and len(bulk.text.splitlines()) == 2
    body = {"inputs": [{"name": "INPUT_TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["A dog runs."]}],
            "parameters": {"max_length": 4}}
    assert client.post("/v2/models/tiny-marian/infer", content=json.dumps(body)).status_code == 200
    assert successes() - before == 1 + 1 + 2 + 1  # the /v1 request, the stream, each bulk line, the /v2 infer
