"""serving.server.infer_header: one pydantic model validates an infer request's JSON header and is the document's
schema of it; what the document refuses, the parser refuses, and each problem is named in one message."""

from __future__ import annotations

import json
from typing import Any, get_args

import jsonschema
import pytest
from fastapi.testclient import TestClient

from serving.engine.errors import InvalidInput
from serving.server.infer_header import OutputName, infer_request_schema
from serving.server.oip import OUTPUT_DATATYPES, parse_infer_request

GOOD = {"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "data": ["x"]}
WELL_FORMED: list[dict[str, Any]] = [
    {"inputs": [GOOD]}, {"inputs": [GOOD], "id": "r1", "parameters": {"beam_size": 2, "zzz": 1}},
    {"inputs": [GOOD], "id": None, "parameters": None, "outputs": None}, {"inputs": [GOOD], "outputs": []},
    {"inputs": [{**GOOD, "shape": [2, 1], "data": [["a"], ["b"]]}]},
    {"inputs": [GOOD], "outputs": [{"name": "SCORE", "parameters": {"binary_data": True}}]},
    {"inputs": [{**GOOD, "parameters": None, "foo": 1}], "bar": 2},
]
HEADERS: list[dict[str, Any]] = [
    *WELL_FORMED, {}, {"inputs": None}, {"inputs": "x"}, {"inputs": []}, {"inputs": [5]}, {"inputs": [GOOD, GOOD]},
    {"inputs": [{**GOOD, "name": "TEXT"}]}, {"inputs": [{**GOOD, "datatype": "FP32"}]},
    {"inputs": [{**GOOD, "shape": "1"}]}, {"inputs": [{**GOOD, "shape": [-1]}]}, {"inputs": [{**GOOD, "shape": [True]}]},
    {"inputs": [{**GOOD, "shape": [1.0]}]}, {"inputs": [{**GOOD, "shape": [1] * 9}]},
    {"inputs": [{**GOOD, "data": "x"}]}, {"inputs": [{k: v for k, v in GOOD.items() if k != "data"}]},
    {"inputs": [{**GOOD, "parameters": {"binary_data_size": -1}}]}, {"inputs": [{**GOOD, "parameters": [1]}]},
    {"inputs": [GOOD], "id": 5}, {"inputs": [GOOD], "parameters": [1]},
    {"inputs": [GOOD], "parameters": {"binary_data_output": None}}, {"inputs": [GOOD], "outputs": "x"},
    {"inputs": [GOOD], "outputs": [{"name": "NOPE"}]}, {"inputs": [GOOD], "outputs": [{}]},
    {"inputs": [GOOD], "outputs": [{"name": "SCORE", "parameters": {"binary_data": "yes"}}]},
]


def test_the_outputs_the_model_names_are_the_contract_s() -> None:
    assert get_args(OutputName) == tuple(OUTPUT_DATATYPES)


@pytest.mark.parametrize("header", HEADERS, ids=range(len(HEADERS)))
def test_what_the_document_refuses_the_parser_refuses(header: dict[str, Any]) -> None:
    """(The converse is looser: JSON Schema counts 1.0 as an integer, the parser does not; and the count of a shape
    against its data is beyond JSON Schema.)"""
    valid = jsonschema.Draft202012Validator(infer_request_schema()).is_valid(header)
    try:
        parse_infer_request(json.dumps(header).encode(), None)
        parsed = True
    except InvalidInput:
        parsed = False
    assert valid or not parsed
    if any(header is good for good in WELL_FORMED):
        assert parsed and valid


def test_every_problem_is_named_in_one_message() -> None:
    header = {"id": 5, "inputs": [{**GOOD, "datatype": "FP32", "shape": [-1]}], "outputs": [{"name": "NOPE"}]}
    with pytest.raises(InvalidInput) as raised:
        parse_infer_request(json.dumps(header).encode(), None)
    assert str(raised.value).split("; ") == [
        "'id' must be a string", "input 'INPUT_TEXT' must have datatype BYTES, got 'FP32'",
        "input 'INPUT_TEXT' needs a 'shape' list of non-negative integers, got [-1]",
        "unknown output 'NOPE'", "this model has OUTPUT_TEXT, INPUT_TOKENS, OUTPUT_TOKENS, SCORE"]


def test_the_route_documents_the_model(shared_client: TestClient) -> None:
    """The request body the OpenAPI document states is the model's schema, with the server's limits written in."""
    body = shared_client.get("/openapi.json").json()["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    parameters = schema["properties"]["parameters"]
    assert parameters["type"] == ["object", "null"] and parameters["properties"]["beam_size"]["maximum"] >= 1
    data = schema["properties"]["inputs"]["items"]["properties"]["data"]
    assert data["type"] == ["array", "null"] and "maxLength" in data["items"]
    assert "pattern" not in data["items"]  # an empty or blank sentence gets an empty translation (issue 35 item 8)
    generic = infer_request_schema()
    for name, documented in schema["properties"].items():  # what the limits add aside, the same schema
        assert set(documented) - {"default"} == set(generic["properties"][name]) - {"default"}, name
