"""Open Inference Protocol routes with the fake engine: the exact bytes tritonclient sends (reference section 6)."""

from __future__ import annotations

import gzip
import json
import struct
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving.server.oip import encode_bytes_tensor


def binary_request(
    texts: list[str], outputs: list[dict[str, Any]] | None = None, **extra: Any
) -> tuple[bytes, dict[str, str]]:
    raw = encode_bytes_tensor(texts)
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": "INPUT_TEXT",
                "shape": [len(texts), 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        **extra,
    }
    if outputs is not None:
        doc["outputs"] = outputs
    header = json.dumps(doc).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def split_binary(response: Any) -> tuple[dict[str, Any], bytes]:
    n = int(response.headers["inference-header-content-length"])
    return json.loads(response.content[:n]), response.content[n:]


def decode_bytes(raw: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(raw):
        (n,) = struct.unpack_from("<I", raw, offset)
        out.append(raw[offset + 4 : offset + 4 + n])
        offset += 4 + n
    return out


def test_health_and_metadata(client: TestClient) -> None:
    r = client.get("/v2/health/live")
    assert r.status_code == 200 and r.json() == {"live": True}
    r = client.get("/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}  # what the KServe SDK reads
    meta = client.get("/v2").json()
    assert meta["name"] == "mtgate" and "binary_tensor_data" in meta["extensions"]
    r = client.get("/v2/models/echo/ready")
    assert r.status_code == 200 and r.json() == {"name": "echo", "ready": True}
    assert client.get("/v2/models/echo/versions/1/ready").status_code == 200
    model = client.get("/v2/models/echo").json()
    assert model["name"] == "echo" and model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert {o["name"] for o in model["outputs"]} == {"OUTPUT_TEXT", "INPUT_TOKENS", "OUTPUT_TOKENS", "SCORE"}
    assert client.get("/v2/models/echo/versions/1").status_code == 200
    r = client.get("/v2/models/nope")
    assert r.status_code == 404 and r.json()["error"].startswith("Request for unknown model")
    assert client.get("/v2/models/echo/versions/7").status_code == 404
    assert client.get("/v2/models/nope/ready").status_code == 404


def test_infer_json_without_content_type(client: TestClient) -> None:
    # Byte-for-byte what tritonclient sends with binary_data=False (no Content-Type header).
    body = (
        b'{"id":"42","inputs":[{"name":"INPUT_TEXT","shape":[2,1],"datatype":"BYTES","data":["Hello world",'
        b'"Good day"]}],"outputs":[{"name":"OUTPUT_TEXT","parameters":{"binary_data":false}}]}'
    )
    r = client.post("/v2/models/echo/infer", content=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in r.headers
    assert r.json() == {
        "id": "42",
        "model_name": "echo",
        "model_version": "1",
        "outputs": [{"name": "OUTPUT_TEXT", "datatype": "BYTES", "shape": [2, 1], "data": ["WORLD HELLO", "DAY GOOD"]}],
    }


def test_infer_binary_both_ways(client: TestClient) -> None:
    body, headers = binary_request(
        ["Hello world", "Grüße 日本"],
        outputs=[
            {"name": "OUTPUT_TEXT", "parameters": {"binary_data": True}},
            {"name": "OUTPUT_TOKENS", "parameters": {"binary_data": True}},
            {"name": "SCORE", "parameters": {"binary_data": False}},
        ],
    )
    r = client.post("/v2/models/echo/versions/1/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    doc, raw = split_binary(r)
    text, tokens, score = doc["outputs"]
    assert text["parameters"]["binary_data_size"] + tokens["parameters"]["binary_data_size"] == len(raw)
    assert decode_bytes(raw[: text["parameters"]["binary_data_size"]]) == [b"WORLD HELLO", "日本 GRÜSSE".encode()]
    assert struct.unpack("<2i", raw[text["parameters"]["binary_data_size"] :]) == (2, 2)
    assert score["data"] == [-1.0, -1.0]


def test_infer_defaults_binary_data_output(client: TestClient) -> None:
    body, headers = binary_request(["a b"], parameters={"binary_data_output": True})
    r = client.post("/v2/models/echo/infer", content=body, headers=headers)
    doc, raw = split_binary(r)
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT_TEXT", "INPUT_TOKENS", "OUTPUT_TOKENS", "SCORE"]
    assert decode_bytes(raw[: doc["outputs"][0]["parameters"]["binary_data_size"]]) == [b"B A"]


def test_infer_parameters_and_gzip(client: TestClient) -> None:
    doc = {
        "inputs": [{"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "data": ["a b c d"]}],
        "parameters": {"max_length": 2, "beam_size": 2},
        "outputs": [{"name": "OUTPUT_TEXT"}],
    }
    r = client.post(
        "/v2/models/echo/infer",
        content=gzip.compress(json.dumps(doc).encode()),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["D C"]


def test_nul_bearing_strings_survive(client: TestClient) -> None:
    body, headers = binary_request(["abc\0def"], outputs=[{"name": "OUTPUT_TEXT", "parameters": {"binary_data": True}}])
    r = client.post("/v2/models/echo/infer", content=body, headers=headers)
    assert r.status_code == 200
    _, raw = split_binary(r)
    assert decode_bytes(raw) == [b"ABC\0DEF"]


def _json(doc: Any) -> bytes:
    return json.dumps(doc).encode()


GOOD_INPUT = {"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "data": ["x"]}


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b"", {}, 400, "empty"),
        (b"{not json", {}, 400, "not valid JSON"),
        (b"[" * 100_000, {}, 400, "nested too deeply"),
        (b"\xff\xfe\x00", {}, 400, "JSON"),
        (_json([1, 2]), {}, 400, "JSON object"),
        (_json({}), {}, 400, "inputs"),
        (_json({"inputs": "x"}), {}, 400, "inputs"),
        (_json({"inputs": [5]}), {}, 400, "object"),
        (_json({"inputs": [{**GOOD_INPUT, "name": "TEXT"}]}), {}, 400, "unexpected input"),
        (_json({"inputs": [{**GOOD_INPUT, "datatype": "FP32"}]}), {}, 400, "BYTES"),
        (_json({"inputs": [{**GOOD_INPUT, "shape": [2]}]}), {}, 400, "needs 2"),
        (_json({"inputs": [{**GOOD_INPUT, "shape": "1"}]}), {}, 400, "shape"),
        (_json({"inputs": [{**GOOD_INPUT, "shape": [-1]}]}), {}, 400, "shape"),
        (_json({"inputs": [{**GOOD_INPUT, "data": [1]}]}), {}, 400, "strings"),
        (_json({"inputs": [{k: v for k, v in GOOD_INPUT.items() if k != "data"}]}), {}, 400, "neither"),
        (_json({"inputs": [GOOD_INPUT, GOOD_INPUT]}), {}, 400, "twice"),
        (_json({"inputs": [GOOD_INPUT], "outputs": [{"name": "NOPE"}]}), {}, 400, "unknown output"),
        (_json({"inputs": [GOOD_INPUT], "id": 5}), {}, 400, "'id'"),
        (_json({"inputs": [GOOD_INPUT], "parameters": {"beam_size": "wide"}}), {}, 400, "beam_size"),
        (_json({"inputs": [GOOD_INPUT], "parameters": {"beam_size": 99}}), {}, 400, "max_beam_size"),
        # an empty string gets an empty translation (200): tests/serving/server/test_api_messages.py
        (_json({"inputs": [{**GOOD_INPUT, "data": ["x" * 10_000]}]}), {}, 413, "max_chars_per_sentence"),
        (
            _json({"inputs": [{**GOOD_INPUT, "shape": [10_000], "data": ["w"] * 10_000}]}),
            {},
            413,
            "max_sentences_per_request",
        ),
        (_json({"inputs": [GOOD_INPUT]}), {"Inference-Header-Content-Length": "abc"}, 400, "not an integer"),
        (_json({"inputs": [GOOD_INPUT]}), {"Inference-Header-Content-Length": "99999"}, 400, "outside"),
        (_json({"inputs": [GOOD_INPUT]}), {"Inference-Header-Content-Length": "0"}, 400, "raw binary"),
        (_json({"inputs": [GOOD_INPUT]}), {"Content-Encoding": "br"}, 415, "Content-Encoding 'br'"),
        (b"not gzip", {"Content-Encoding": "gzip"}, 400, "gzip"),
    ],
)
def test_malformed_payloads_are_clear_4xx(
    shared_client: TestClient, body: bytes, headers: dict[str, str], status: int, words: str
) -> None:
    r = shared_client.post("/v2/models/echo/infer", content=body, headers=headers)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and words in error, error
    assert shared_client.post("/v2/models/echo/infer", content=_json({"inputs": [GOOD_INPUT]})).status_code == 200


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (struct.pack("<I", 2) + b"\xff\xfe", "UTF-8"),
        (struct.pack("<I", 50) + b"abc", "claims 50 bytes"),
        (b"\x01\x00", "ends before"),
        (struct.pack("<I", 1) + b"a" + b"junk", "beyond"),
    ],
)
def test_malformed_binary_tensors(shared_client: TestClient, raw: bytes, words: str) -> None:
    header = _json(
        {
            "inputs": [
                {"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    )
    r = shared_client.post(
        "/v2/models/echo/infer", content=header + raw, headers={"Inference-Header-Content-Length": str(len(header))}
    )
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_binary_sizes_must_add_up(client: TestClient) -> None:
    raw = encode_bytes_tensor(["a"])
    header = _json(
        {
            "inputs": [
                {"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    )
    r = client.post(
        "/v2/models/echo/infer",
        content=header + raw + b"extra",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "do not add up" in r.json()["error"]
    r = client.post(
        "/v2/models/echo/infer",
        content=header + raw[:-1],
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "exceeds" in r.json()["error"]


def test_framework_errors_use_the_v2_shape(client: TestClient) -> None:
    r = client.get("/v2/models/echo/infer")
    assert r.status_code == 405 and isinstance(r.json()["error"], str)
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = client.post("/v2/models/nope/infer", content=_json({"inputs": [GOOD_INPUT]}))
    assert r.status_code == 404 and "unknown model" in r.json()["error"]


@pytest.mark.parametrize(("body", "words"), [(b"{not json", "not valid JSON"), (b"[" * 100_000, "nested too deeply")])
def test_a_bad_repository_request_body_is_a_400(shared_client: TestClient, body: bytes, words: str) -> None:
    """The repository routes read their optional body as every /v2 route does: nested too deeply is a 400 too."""
    r = shared_client.post("/v2/repository/index", content=body)
    assert r.status_code == 400 and words in r.json()["error"], r.text


@pytest.mark.parametrize(("config", "words"), [("{not json", "not valid JSON"), ("[" * 100_000, "nested too deeply")])
def test_a_bad_load_config_is_invalid_input(config: str, words: str) -> None:
    from serving.engine.errors import InvalidInput
    from serving.server.versions import config_policy

    with pytest.raises(InvalidInput, match=words):
        config_policy("echo", {"config": config})
