"""``split_sentences`` and ``truncate`` over HTTP: a 2,000-word paragraph through the real server (real app, real
uvicorn, the tiny Marian engine) in one request, aligned with its sentences; over-long sentences refused (413, the
default) or cut; the limits of a split request; answers without these options unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.engine.translator import DecodeOptions, Translator
from tests.fakes import EchoTranslator, echo

# Written for this test: abbreviations, decimals and questions that must not (or must) end a sentence.
SENTENCES = [
    "Dr. Smith arrived at the station at 7.30 in the morning.",
    "The train to Berlin was late again, and nobody was surprised.",
    "Prices rose by 3.5 percent last year, according to the U.S. statistics office.",
    "She said that the meeting had been moved to Friday.",
    "Mr. Brown and Mrs. Green live on the same street as Prof. Klein.",
    "A man is riding a bicycle along the river.",
    "Two children are playing football in the park near the old church.",
    "The company reported a profit of 1.2 billion euros.",
    "Why would anyone leave such a beautiful city?",
    "The weather was cold, but the sun was shining all day long!",
    "We will discuss the results in the next chapter, e.g. the effect of the new rules.",
    "Her brother works as an engineer at a small firm in Munich.",
    "The museum opens at ten and closes at six on weekdays.",
    "Several hundred people attended the concert on Saturday evening.",
    "He bought bread, cheese, apples and a bottle of water.",
    "It is not clear whether the bridge will be finished before winter.",
    "The report, which was published in March, runs to 250 pages.",
    "A woman in a red coat is waiting for the bus.",
    "Most of the students passed the exam on their first attempt.",
    "The old library has more than forty thousand books.",
    "After dinner, they went for a long walk by the lake.",
    "The new law comes into force on the first of January.",
    "Can you tell me where the nearest pharmacy is?",
    "Our neighbours have two dogs and a very noisy cat.",
    "The river flooded the fields after three days of heavy rain.",
    "A group of tourists is taking photos in front of the castle.",
    "The minister refused to answer questions from journalists.",
    "This recipe needs 0.5 litres of milk and two eggs.",
    "The children laughed when the clown fell off his chair.",
    "Nobody knows exactly how old the tree in the square is.",
    "The factory employs about 800 people from the region.",
    "He has been learning to play the piano since he was six.",
    "The shop on the corner sells fresh fish every Tuesday.",
    "A dog is running across the beach with a stick in its mouth.",
    "The team won the championship for the second year in a row.",
    "It took them almost four hours to climb to the top of the hill.",
]
OPTIONS = {"beam_size": 1, "max_length": 6}
TOO_LONG = " ".join(["word"] * 200)  # more than the tiny model's 128 positions, no sentence end


def paragraph(words: int = 2000) -> tuple[str, list[str]]:
    """A text of at least ``words`` words (the sentences above, cycled; one paragraph break, leading and trailing
    whitespace) and its sentences."""
    sentences: list[str] = []
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(SENTENCES[len(sentences) % len(SENTENCES)])
    half = len(sentences) // 2
    return "  " + " ".join(sentences[:half]) + "\n\n" + "  ".join(sentences[half:]) + "\n", sentences


@pytest.fixture(scope="module")
def translator(tiny_package: Path) -> Translator:
    return Translator.load(tiny_package, threads=1)


def _rebuilt(text: str, sentences: list[dict[str, Any]]) -> str:
    """``text`` with each sentence replaced by its translation, by the answer's offsets."""
    parts, last = [], 0
    for sentence in sentences:
        assert text[sentence["start"] : sentence["end"]] == sentence["source"]
        parts += [text[last : sentence["start"]], sentence["text"]]
        last = sentence["end"]
    return "".join([*parts, text[last:]])


def test_a_2000_word_paragraph_in_one_request(live: Any, translator: Translator) -> None:
    text, sentences = paragraph()
    with live(translator, max_queue_delay_us=1000) as url:
        r = httpx.post(url + "/v1/translate", json={"text": text, "split_sentences": True, **OPTIONS}, timeout=120)
        assert r.status_code == 200, r.text
        (got,) = r.json()["translations"]
        plain = httpx.post(url + "/v1/translate", json={"text": SENTENCES[0], **OPTIONS}).json()["translations"]
    assert len(text.split()) >= 2000 and len(got["sentences"]) == len(sentences) > 100
    assert [s["source"] for s in got["sentences"]] == sentences
    alone = {s: translator.translate([s], DecodeOptions(**OPTIONS))[0] for s in set(sentences)}
    assert [s["text"] for s in got["sentences"]] == [alone[s].text for s in sentences]
    assert got["text"] == _rebuilt(text, got["sentences"])
    assert got["text"].startswith("  ") and got["text"].endswith("\n") and got["text"].count("\n\n") == 1
    assert got["input_tokens"] == sum(alone[s].input_tokens for s in sentences)
    assert "truncated" not in got and not any(s["truncated"] for s in got["sentences"])
    assert set(plain[0]) == {"text", "input_tokens", "output_tokens", "score"}  # without the options: as before


def test_over_long_sentences_are_refused_unless_truncated(live: Any, translator: Translator) -> None:
    with live(translator) as url, httpx.Client(base_url=url, timeout=60) as client:
        refused = client.post("/v1/translate", json={"text": ["fine", TOO_LONG], **OPTIONS})
        cut = client.post("/v1/translate", json={"text": ["fine", TOO_LONG], "truncate": True, **OPTIONS})
        document = {"text": f"Fine. {TOO_LONG}", "split_sentences": True, **OPTIONS}
        refused_document = client.post("/v1/translate", json=document)
        cut_document = client.post("/v1/translate", json={**document, "truncate": True})
        v2 = client.post("/v2/models/tiny-marian/infer", json={
            "inputs": [{"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "data": [TOO_LONG]}],
            "parameters": {"truncate": True, "max_length": 4}})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "input_too_long"
    assert "text[1] is " in refused.json()["error"]["message"]
    assert cut.status_code == 200
    fine, long = cut.json()["translations"]
    assert "truncated" not in fine and long["truncated"] is True and long["input_tokens"] == 128
    expected = translator.translate([TOO_LONG], DecodeOptions(**OPTIONS, truncate=True))[0]
    assert long["text"] == expected.text
    assert refused_document.status_code == 413
    assert refused_document.json()["error"]["message"].startswith("text[0] sentence 1 is ")
    (got,) = cut_document.json()["translations"]
    assert got["truncated"] is True and [s["truncated"] for s in got["sentences"]] == [False, True]
    assert v2.status_code == 200, v2.text


def test_the_sentences_of_a_request_batch_together(serve: Any) -> None:
    engine = EchoTranslator()
    texts = ["One two. Three four.\nFive.", "Six seven."]
    with serve(engine, max_batch_size=8, max_queue_delay_us=50_000, warmup=False) as client:
        r = client.post("/v1/translate", json={"text": texts, "split_sentences": True})
    assert r.status_code == 200
    assert [sorted(batch) for batch in engine.batches] == [["Five.", "One two.", "Six seven.", "Three four."]]
    first, second = r.json()["translations"]
    assert first["text"] == f"{echo('One two.')} {echo('Three four.')}\n{echo('Five.')}"
    assert second["sentences"] == [{"source": "Six seven.", "text": echo("Six seven."), "start": 0, "end": 10,
                                    "input_tokens": 3, "output_tokens": 2, "score": -1.0, "truncated": False}]


def test_limits_of_a_split_request(serve: Any) -> None:
    with serve(max_document_sentences=3, max_chars_per_sentence=12, max_sentences_per_request=2) as client:
        long_document = client.post("/v1/translate", json={"text": "Aaaa. Bbbb. Cccc.", "split_sentences": True})
        too_many = client.post("/v1/translate", json={"text": ["One. Two.", "Three. Four."],
                                                          "split_sentences": True})
        long_sentence = client.post("/v1/translate", json={"text": "Short. A longer one.", "split_sentences": True})
        texts = client.post("/v1/translate", json={"text": ["One.", "Two.", "Three."], "split_sentences": True})
        empty = client.post("/v1/translate", json={"text": ["One.", " \n"], "split_sentences": True})
        stream = client.post("/v1/translate/stream", json={"text": "One. Two.", "split_sentences": True})
        limits = client.get("/v1/models").json()["limits"]
    assert long_document.status_code == 200  # 17 characters: the limit is a sentence's
    assert too_many.status_code == 413 and "(max_document_sentences)" in too_many.json()["error"]["message"]
    assert long_sentence.status_code == 413
    assert long_sentence.json()["error"]["message"].startswith("text[0] sentence 1 has 13 characters")
    assert texts.status_code == 413 and "(max_sentences_per_request" in texts.json()["error"]["message"]
    assert empty.status_code == 200 and empty.json()["translations"][1] == {  # a blank text keeps its whitespace
        "text": " \n", "input_tokens": 0, "output_tokens": 0, "score": None, "sentences": []}
    assert stream.status_code == 422 and "split_sentences" in stream.json()["error"]["message"]
    assert limits["max_document_sentences"] == 3


def test_the_document_states_the_limits_of_split_texts(client: Any) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    request = schemas["TranslateRequest"]
    assert request["if"] == {"properties": {"split_sentences": {"const": True}}, "required": ["split_sentences"]}
    assert request["else"]["properties"]["text"]["anyOf"][0]["maxLength"] == 2000
    assert "maxLength" not in request["properties"]["text"]["anyOf"][0]
    stream = schemas["TranslateStreamRequest"]
    assert stream["properties"]["split_sentences"]["const"] is False
    assert stream["properties"]["text"]["anyOf"][0]["maxLength"] == 2000


def test_bulk_lines_are_truncated_when_asked(serve: Any) -> None:
    import json

    body = b'"a b c d e f"\n"fine"\n'
    with serve(EchoTranslator(max_input_tokens=4), warmup=False) as client:
        refused = client.post("/v1/translate/bulk", content=body, headers={"Content-Type": "application/x-ndjson"})
        cut = client.post("/v1/translate/bulk?truncate=true", content=body,
                          headers={"Content-Type": "application/x-ndjson"})
    refused_lines = {line["index"]: line for line in map(json.loads, refused.text.splitlines())}
    assert refused_lines[0]["error"]["status"] == 413 and "text" in refused_lines[1]
    lines = {line["index"]: line for line in map(json.loads, cut.text.splitlines())}
    assert (lines[0]["text"], lines[0]["truncated"]) == ("C B A", True) and "truncated" not in lines[1]
