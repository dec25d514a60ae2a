"""/v1 routes through the real app (batcher, middleware, error table) with the EchoTranslator fake."""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.fakes import EchoTranslator, echo


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return dict(body["error"])


def test_translate_a_string_and_a_list(client: TestClient) -> None:
    r = client.post("/v1/translate", json={"text": "a man rides"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "echo" and body["version"] == "1"
    assert body["translations"] == [{"text": "RIDES MAN A", "input_tokens": 4, "output_tokens": 3, "score": -1.5}]
    assert r.headers["x-request-id"]

    r = client.post("/v1/translate", json={"text": ["one two", "three"], "beam_size": 2, "max_length": 5})
    assert [t["text"] for t in r.json()["translations"]] == ["TWO ONE", "THREE"]


def test_decode_options_reach_the_engine_and_split_batches(serve: Any) -> None:
    translator = EchoTranslator(step_delay=0.01)
    with serve(translator, max_queue_delay_us=50_000) as client:
        translator.batches.clear()
        translator.options.clear()
        results: dict[int, Any] = {}

        def call(i: int) -> None:
            results[i] = client.post("/v1/translate", json={"text": f"w{i} x", "beam_size": 1 + i % 2}).json()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(results[i]["translations"][0]["text"] == f"X W{i}" for i in range(6))
    for batch, options in zip(translator.batches, translator.options, strict=True):
        beams = {1 + int(text.split()[0][1:]) % 2 for text in batch}
        assert beams == {options.beam_size}  # never two decode settings in one batch


def test_concurrent_clients_get_their_own_answers_in_shared_batches(serve: Any) -> None:
    translator = EchoTranslator(step_delay=0.005)
    with serve(translator, max_queue_delay_us=20_000) as client:
        results: dict[int, str] = {}

        def call(i: int) -> None:
            r = client.post("/v1/translate", json={"text": f"sentence number {i}"})
            results[i] = r.json()["translations"][0]["text"]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = client.get("/metrics").text
    assert results == {i: echo(f"sentence number {i}") for i in range(16)}
    assert max(translator.batch_sizes) > 1
    assert len(translator.threads) == 1
    assert 'mtgate_batch_size_count{model="echo"}' in metrics


def test_stream_sends_partials_then_final(serve: Any) -> None:
    translator = EchoTranslator(step_delay=0.002)
    with serve(translator) as client:
        with client.stream("POST", "/v1/translate/stream", json={"text": ["a b c d", "e f"]}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = "".join(r.iter_text())
    events = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    assert events[-1][0] == "final" and all(e == "partial" for e, _ in events[:-1])
    final = events[-1][1]["translations"]
    for index in (0, 1):
        deltas = "".join(d["delta"] for e, d in events[:-1] if d["index"] == index)
        assert deltas == final[index]["text"]
    assert len([1 for _, d in events[:-1] if d["index"] == 0]) == 4  # one event per decoded word


def test_stream_refusals_keep_their_status(client: TestClient) -> None:
    r = client.post("/v1/translate/stream", json={"text": "x", "model": "nope"})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    r = client.post("/v1/translate/stream", json={"text": ""})
    assert r.status_code == 400


def test_bulk_ndjson_in_and_out(client: TestClient) -> None:
    lines = [json.dumps({"text": f"line {i}", "id": f"id{i}"}) for i in range(5)]
    lines.insert(2, json.dumps("bare string"))
    lines.insert(4, "{not json")
    lines.insert(5, json.dumps({"text": ""}))
    lines.append("[" * 50_000)
    body = "\n".join(lines) + "\n\n"
    with client.stream(
        "POST", "/v1/translate/bulk", content=body, headers={"Content-Type": "application/x-ndjson"}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        out = [json.loads(line) for line in r.iter_lines() if line]
    by_index = {o["index"]: o for o in out}
    assert sorted(by_index) == list(range(9))
    assert "nested too deeply" in by_index[8]["error"]["message"]
    assert by_index[0] == {
        "index": 0,
        "id": "id0",
        "text": "0 LINE",
        "input_tokens": 3,
        "output_tokens": 2,
        "score": -1.0,
    }
    assert by_index[2]["text"] == "STRING BARE" and "id" not in by_index[2]
    assert by_index[4]["error"]["code"] == "invalid_input" and "not JSON" in by_index[4]["error"]["message"]
    assert by_index[5] == {"index": 5, "text": "", "input_tokens": 0, "output_tokens": 0, "score": None}  # empty text
    assert by_index[7]["id"] == "id4"


def test_bulk_larger_than_the_queue_completes(serve: Any) -> None:
    with serve(max_queue_size=8, bulk_window=4, max_sentences_per_request=8) as client:
        body = "\n".join(json.dumps(f"w{i}") for i in range(100))
        r = client.post("/v1/translate/bulk", content=body)
        out = [json.loads(line) for line in r.text.splitlines()]
    assert sorted(o["index"] for o in out) == list(range(100))
    assert all(o["text"] == f"W{o['index']}" for o in out)


def test_models(client: TestClient) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    (model,) = r.json()["models"]
    assert model["name"] == "echo" and model["ready"] and model["default"]
    assert model["details"]["source_language"] == "en" and model["details"]["decoding"]["beam_size"] == 1
    assert client.get("/v1/models/echo").json()["name"] == "echo"
    assert client.get("/v1/models/other").status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        # an empty or blank text is answered with an empty translation: tests/serving/server/test_api_messages.py
        ({"text": []}, 400, "invalid_input", "no text"),
        ({"text": "x" * 10_000}, 413, "limit_exceeded", "max_chars_per_sentence"),
        ({"text": ["w"] * 10_000}, 413, "limit_exceeded", "max_sentences_per_request"),
        ({"text": " ".join(["w"] * 100)}, 413, "input_too_long", "max_input_tokens"),
        ({"text": 5}, 422, "validation_error", "text"),
        ({"text": ["a", 5]}, 422, "validation_error", "text"),
        ({"text": {"a": 1}}, 422, "validation_error", "text"),
        ({}, 422, "validation_error", "text"),
        ({"text": "a", "beam_size": 0}, 400, "invalid_input", "beam_size must be an integer from 1 to 8"),
        ({"text": "a", "beam_size": "x"}, 422, "validation_error", "beam_size"),
        ({"text": "a", "beam_size": 100}, 400, "invalid_input", "from 1 to 8 (max_beam_size), got 100"),
        ({"text": "a", "max_length": 100_000}, 400, "invalid_input", "from 1 to 512 (max_output_tokens)"),
        ({"text": "a", "max_length": 0}, 400, "invalid_input", "max_length"),
        ({"text": "a", "timeout_ms": 0}, 400, "invalid_input", "timeout"),
        ({"text": "a", "bogus": 1}, 422, "validation_error", "bogus"),
        ({"text": "a", "model": "nope"}, 404, "model_not_found", "echo"),
        ([1, 2], 422, "validation_error", "body"),
        ("just a string", 422, "validation_error", "body"),
        (None, 422, "validation_error", "body"),
    ],
)
def test_bad_input_is_a_clear_4xx(shared_client: TestClient, body: Any, status: int, code: str, words: str) -> None:
    r = shared_client.post("/v1/translate", json=body)
    assert r.status_code == status, r.text
    error = error_of(r)
    assert error["code"] == code and words in error["message"], error
    assert shared_client.post("/v1/translate", json={"text": "still serving"}).status_code == 200


def test_malformed_bodies(client: TestClient) -> None:
    for broken in (b'{"text": "a"', b"{{{", b'{"text": "a",}'):
        r = client.post("/v1/translate", content=broken, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_json", r.text
        assert error_of(r)["message"].startswith("the request body is not valid JSON ("), r.text
    r = client.post("/v1/translate", content=b'{"text": "\xff\xfe"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "UTF-8" in error_of(r)["message"]
    r = client.post(
        "/v1/translate", content=b"text=hello", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 422 and "JSON" in error_of(r)["message"]
    r = client.post("/v1/translate", content=b'{"text": "no content type"}')
    assert r.status_code == 200
    r = client.get("/v1/translate")
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"


def test_body_size_limit_names_the_limit(serve: Any) -> None:
    with serve(max_body_bytes=2048) as client:
        r = client.post("/v1/translate", json={"text": "x" * 3000})
        assert r.status_code == 413 and "max_body_bytes" in error_of(r)["message"]

        def chunks() -> Any:  # no Content-Length: chunked transfer
            for _ in range(10):
                yield b" " * 1000

        r = client.post("/v1/translate", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "max_body_bytes" in error_of(r)["message"]
        assert client.post("/v1/translate", json={"text": "fine"}).status_code == 200


def test_compressed_bodies_are_decoded_within_the_limit_or_415(serve: Any) -> None:
    plain = json.dumps({"text": ["a man rides", "two dogs"]}).encode()
    json_type = {"Content-Type": "application/json"}
    with serve(max_body_bytes=4096) as client:
        expected = client.post("/v1/translate", content=plain, headers=json_type).json()
        for coding, data in (("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain)),
                             ("GZIP", gzip.compress(plain))):  # as tritonclient's request_compression_algorithm
            r = client.post("/v1/translate", content=data, headers={**json_type, "Content-Encoding": coding})
            assert r.status_code == 200 and r.json() == expected, (coding, r.text)
        for coding, status, words in (("br", 415, "Content-Encoding 'br'"), ("gzip, br", 415, "'gzip, br'"),
                                      ("gzip", 400, "not valid gzip data")):
            r = client.post("/v1/translate", content=plain, headers={**json_type, "Content-Encoding": coding})
            assert r.status_code == status and words in error_of(r)["message"], (coding, r.text)
            if status == 415:
                assert error_of(r)["code"] == "unsupported_media_type"
                assert r.headers["accept-encoding"] == "gzip, deflate"
        truncated = gzip.compress(plain)[:-12]
        r = client.post("/v1/translate", content=truncated, headers={**json_type, "Content-Encoding": "gzip"})
        assert r.status_code == 400 and "ends before the end of its gzip data" in error_of(r)["message"], r.text
        # A small body that decodes past the limit (a zip bomb) is refused as a large one is.
        bomb = gzip.compress(json.dumps({"text": "a " * 100_000}).encode())
        assert len(bomb) < 4096
        r = client.post("/v1/translate", content=bomb, headers={**json_type, "Content-Encoding": "gzip"})
        assert r.status_code == 413 and "max_body_bytes" in error_of(r)["message"], r.text
        # The routes that do not read their body whole decode nothing: 415 naming the coding.
        ndjson = gzip.compress(b'{"text": "a"}\n')
        r = client.post("/v1/translate/bulk", content=ndjson, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 415 and "Content-Encoding 'gzip'" in error_of(r)["message"], r.text
        assert r.headers["accept-encoding"] == "identity"
        r = client.post("/v2/repository/index", content=gzip.compress(b"{}"), headers={"Content-Encoding": "gzip"})
        assert r.status_code == 415 and "Content-Encoding 'gzip'" in r.json()["error"], r.text
        assert client.post("/v1/translate", content=plain, headers=json_type).json() == expected
        assert "415" in client.get("/openapi.json").json()["paths"]["/v1/translate"]["post"]["responses"]


def test_engine_failure_is_500_and_isolated(serve: Any) -> None:
    translator = EchoTranslator(fail_on="explode", step_delay=0.01)
    with serve(translator, max_queue_delay_us=30_000) as client:
        out: dict[str, Any] = {}

        def call(text: str) -> None:
            out[text] = client.post("/v1/translate", json={"text": text})

        threads = [threading.Thread(target=call, args=(t,)) for t in ("good one", "please explode", "good two")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out["please explode"].status_code == 500
        assert error_of(out["please explode"])["code"] == "inference_failed"
        assert out["good one"].json()["translations"][0]["text"] == "ONE GOOD"
        assert out["good two"].status_code == 200


def test_api_key_guards_inference_routes_only(serve: Any) -> None:
    with serve(api_key="s3cret") as client:
        r = client.post("/v1/translate", json={"text": "a"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert error_of(r)["code"] == "unauthorized"
        r = client.post("/v1/translate", json={"text": "a"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and error_of(r)["message"] == "invalid API key"
        r = client.post("/v1/translate", json={"text": "a"}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert client.post("/v2/models/echo/infer", json={}).json() == {
            "error": "this server requires an API key: send 'Authorization: Bearer <key>'"
        }
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/v1/models", "/", "/v2/models/echo"):
            assert client.get(path).status_code == 200, path


def test_page_and_openapi(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "/v1/translate/stream" in page.text
    spec = client.get("/openapi.json").json()
    assert {"/v1/translate", "/v1/translate/stream", "/v1/translate/bulk", "/v1/models"} <= set(spec["paths"])


def test_several_models_each_with_its_own_batcher(serve: Any) -> None:
    first, second = EchoTranslator("first"), EchoTranslator("second")
    with serve([first, second]) as client:
        models = client.get("/v1/models").json()["models"]
        assert [(m["name"], m["default"]) for m in models] == [("first", True), ("second", False)]
        assert client.post("/v1/translate", json={"text": "a b"}).json()["model"] == "first"
        r = client.post("/v1/translate", json={"text": "a b", "model": "second"})
        assert r.json()["model"] == "second" and r.json()["translations"][0]["text"] == "B A"
        assert client.get("/v2/models/second/ready").status_code == 200
    assert ["a b"] in second.batches and ["a b"] in first.batches
    assert first.threads.isdisjoint(second.threads)


def test_api_key_is_checked_before_the_body_is_read(serve: Any) -> None:
    with serve(api_key="s3cret", max_body_bytes=2048) as client:
        for path in ("/v1/translate", "/v1/translate/stream", "/v1/translate/bulk", "/v2/models/echo/infer"):
            for body in (b"{{{ not json", b'{"text": 5}', b"x" * 5000):
                r = client.post(path, content=body, headers={"Content-Type": "application/json"})
                assert r.status_code == 401, (path, body[:10], r.text)
        r = client.post("/v1/translate", content=b"{{{", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"


def test_line_splitter_is_linear_and_bounded() -> None:
    from serving.server.http.bulk import LineSplitter, Overlong

    splitter = LineSplitter(max_line_bytes=10)
    assert splitter.feed(b"ab\ncd") == [b"ab"]
    assert splitter.feed(b"e\n\nxyz") == [b"cde", b""]
    assert splitter.end() == b"xyz" and splitter.end() == b""
    (line,) = splitter.feed(b"0123456789abc\n")
    assert isinstance(line, Overlong) and line.limit == 10
    assert splitter.feed(b"ok\n") == [b"ok"]
    # One 64 MB line in 64 KB chunks: each byte is looked at once and none is kept (the old code copied the growing
    # line on every chunk: about 32 GB of copying for this input).
    splitter = LineSplitter(max_line_bytes=100_000)
    chunk = b"a" * (64 << 10)
    started = time.monotonic()
    for _ in range(1024):
        assert splitter.feed(chunk) == []
        assert sum(map(len, splitter._parts)) <= 100_000  # what it keeps of the line
    assert isinstance(splitter.end(), Overlong)
    assert time.monotonic() - started < 1.0


def test_bulk_refuses_a_32_mb_line_at_once(live: Any) -> None:
    with live(EchoTranslator(), max_queue_delay_us=2000) as url:
        body = b'{"text": "fine"}\n"' + b"a" * (32 << 20) + b'"\n{"text": "after"}\n'
        started = time.monotonic()
        r = httpx.post(url + "/v1/translate/bulk", content=body, timeout=60)
        took = time.monotonic() - started
        out = {o["index"]: o for o in map(json.loads, r.text.splitlines())}
    assert r.status_code == 200 and sorted(out) == [0, 1, 2]
    assert out[0]["text"] == "FINE" and out[2]["text"] == "AFTER"
    assert out[1]["error"]["status"] == 413 and "max_chars_per_sentence" in out[1]["error"]["message"]
    assert took < 10, took  # measured 0.3 s (loopback, loaded 2-core machine); the quadratic scan took seconds
