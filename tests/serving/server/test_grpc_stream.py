"""Token streaming on gRPC ``ModelStreamInfer``, Triton's decoupled way, driven by the stock tritonclient.grpc client
against a real `mtgate serve --grpc-port`: a request with the parameter ``stream: true`` gets partial responses
(``OUTPUT_TEXT`` deltas, ``triton_final_response`` false) that concatenate to the whole response's text, which is
``ModelInfer``'s; the empty final response when asked for; requests interleaved on one stream; a bad request's error
in the stream, which goes on; requests without the parameter answered once, as before."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.utils.marian_factory import corpus
from tests.utils.server import ServerProcess, start_server

grpcclient = pytest.importorskip("tritonclient.grpc")

SENTENCES = corpus("en")


@pytest.fixture(scope="module", params=["request", "step"])
def server(request: pytest.FixtureRequest, tiny_package: Path) -> Iterator[ServerProcess]:
    proc = start_server(tiny_package, "--grpc-port", "0", "--batching", request.param)
    yield proc
    assert proc.stop() == 0, "".join(proc.log)


def _input(texts: list[str]) -> Any:
    tensor = grpcclient.InferInput("INPUT_TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t] for t in texts], dtype=object))
    return tensor


def _texts(result: Any) -> list[str]:
    return [v.decode() for v in result.as_numpy("OUTPUT_TEXT").ravel()]


class _Stream:
    """A tritonclient stream whose responses are collected by request id: (texts or None, final flag, error)."""

    def __init__(self, address: str) -> None:
        self.client = grpcclient.InferenceServerClient(address)
        self.name = self.client.get_model_repository_index(as_json=True)["models"][0]["name"]
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, texts: list[str], request_id: str, **parameters: Any) -> None:
        empty_final = parameters.pop("empty_final", False)
        self.client.async_stream_infer(self.name, [_input(texts)], request_id=request_id, parameters=parameters,
                                       enable_empty_final_response=empty_final)

    def collect(self, finals: int) -> tuple[dict[str, list[tuple[list[str] | None, bool]]], list[str]]:
        """The responses until ``finals`` of them were final (successful or not): by request id, and the errors."""
        got: dict[str, list[tuple[list[str] | None, bool]]] = {}
        errors: list[str] = []
        while finals:
            result, error = self.answers.get(timeout=60)
            if error is not None:
                errors.append(str(error))
                finals -= 1
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            texts = _texts(result) if result.as_numpy("OUTPUT_TEXT") is not None else None
            got.setdefault(response.id, []).append((texts, final))
            finals -= final
        return got, errors

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.mark.parametrize("beam", [4, 1])
def test_partial_texts_concatenate_to_the_final_and_the_unstreamed_translation(server: ServerProcess,
                                                                               beam: int) -> None:
    stream = _Stream(server.grpc_address)
    groups = [SENTENCES[80 + 3 * i : 83 + 3 * i] for i in range(4)]
    expected = [_texts(stream.client.infer(stream.name, [_input(g)], parameters={"beam_size": beam})) for g in groups]
    for i, texts in enumerate(groups):  # several requests interleaved on one stream
        stream.send(texts, f"r{i}", beam_size=beam, stream=True)
    got, errors = stream.collect(len(groups))
    stream.close()
    assert not errors, errors
    early = 0
    for i, texts in enumerate(groups):
        responses = got[f"r{i}"]
        *partials, (whole, final) = responses
        assert final and whole == expected[i]
        assert partials and not any(flag for _, flag in partials)
        for index in range(len(texts)):
            deltas = [p[index] for p, _ in partials if p is not None and p[index]]
            assert "".join(deltas) == expected[i][index]
            early += len(deltas) > 1
    assert early > 0, "no sentence streamed before it was done"


def test_empty_final_response_and_plain_requests_on_the_same_stream(server: ServerProcess) -> None:
    stream = _Stream(server.grpc_address)
    texts = [SENTENCES[100], "", SENTENCES[101]]  # a blank text: an empty translation, not sent to the engine
    expected = _texts(stream.client.infer(stream.name, [_input(texts)], parameters={"beam_size": 4}))
    stream.send(texts, "asks", beam_size=4, stream=True, empty_final=True)
    stream.send(texts, "plain", beam_size=4)  # no stream parameter: one response, as before
    stream.send(texts, "plain-empty", beam_size=4, empty_final=True)  # not streamed: the option changes nothing
    got, errors = stream.collect(3)
    stream.close()
    assert not errors, errors
    *partials, (whole, whole_final), (empty, empty_final) = got["asks"]
    assert whole == expected and not whole_final and empty is None and empty_final
    assert partials and not any(flag for _, flag in partials)
    assert ["".join(p[i] for p, _ in partials if p is not None) for i in range(3)] == expected and expected[1] == ""
    assert got["plain"] == [(expected, True)] and got["plain-empty"] == [(expected, True)]


def test_a_bad_request_mid_stream_gets_its_error_and_the_stream_goes_on(server: ServerProcess) -> None:
    stream = _Stream(server.grpc_address)
    texts = SENTENCES[110:112]
    expected = _texts(stream.client.infer(stream.name, [_input(texts)], parameters={"beam_size": 4}))
    stream.send(texts, "first", beam_size=4, stream=True)
    stream.send(texts, "too-wide", beam_size=99, stream=True)
    stream.send(texts, "not-a-flag", stream="yes")
    stream.send(texts, "after", beam_size=4, stream=True)
    got, errors = stream.collect(4)
    assert len(errors) == 2 and any("beam_size" in e for e in errors), errors
    assert any("'stream' must be a boolean" in e for e in errors), errors
    for request_id in ("first", "after"):
        *partials, (whole, final) = got[request_id]
        assert final and whole == expected
        assert ["".join(p[i] for p, _ in partials if p is not None) for i in range(2)] == expected
    stream.send(texts, "later", beam_size=4, stream=True)  # and the stream is still open
    later, errors = stream.collect(1)
    assert not errors and later["later"][-1] == (expected, True)
    # ModelInfer answers once: it refuses the parameter instead of dropping the partial responses
    with pytest.raises(grpcclient.InferenceServerException) as caught:
        stream.client.infer(stream.name, [_input(texts)], parameters={"stream": True})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT" and "ModelStreamInfer" in str(caught.value)
    config = stream.client.get_model_config(stream.name, as_json=True)["config"]
    assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    assert "stream=true" in config["parameters"]["streaming"]["string_value"]
    stream.close()
