"""`mtgate serve --grpc-port`: the KServe v2 / Triton gRPC protocol, driven by the stock tritonclient.grpc client
against a real server on loopback: the same answers as /v1, the same statistics, and the errors mapped to the gRPC
codes clients retry on or not."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.serving.api.servers import ROOT, ServerProcess, start_server
from tests.utils.marian_factory import corpus

grpcclient = pytest.importorskip("tritonclient.grpc")

SENTENCES = corpus("en")


def _input(texts: list[str] | list[bytes]) -> object:
    tensor = grpcclient.InferInput("INPUT_TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t] for t in texts], dtype=object))
    return tensor


@pytest.fixture(scope="module", params=["request", "step"])
def server(request: pytest.FixtureRequest, tiny_package: Path) -> Iterator[ServerProcess]:
    proc = start_server(tiny_package, "--grpc-port", "0", "--batching", request.param)
    yield proc
    assert proc.stop() == 0, "".join(proc.log)


def test_grpc_answers_as_v1(server: ServerProcess) -> None:
    texts = SENTENCES[10:13] + ["Grüße aus Köln, 日本"]
    v1 = httpx.post(server.url + "/v1/translate", json={"text": texts, "beam_size": 2}, timeout=60).json()
    name, version = v1["model"], v1["version"]
    client = grpcclient.InferenceServerClient(server.grpc_address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(name)
    assert client.is_model_ready(name, model_version=version) and not client.is_model_ready("no-such-model")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "mtgate" and "statistics" in metadata["extensions"]
    model = client.get_model_metadata(name, as_json=True)
    assert model == {**httpx.get(f"{server.url}/v2/models/{name}").json(),
                     "inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": ["-1", "1"]}],
                     "outputs": model["outputs"]}
    assert [o["name"] for o in model["outputs"]] == ["OUTPUT_TEXT", "INPUT_TOKENS", "OUTPUT_TOKENS", "SCORE"]
    config = client.get_model_config(name, as_json=True)["config"]
    http_config = httpx.get(f"{server.url}/v2/models/{name}/config").json()
    assert config["name"] == name and int(config["max_batch_size"]) == http_config["max_batch_size"]
    assert [t["data_type"] for t in config["input"]] == ["TYPE_STRING"]

    result = client.infer(name, [_input(texts)], parameters={"beam_size": 2}, request_id="g1")
    assert [v.decode() for v in result.as_numpy("OUTPUT_TEXT").ravel()] == [t["text"] for t in v1["translations"]]
    assert result.as_numpy("OUTPUT_TOKENS").ravel().tolist() == [t["output_tokens"] for t in v1["translations"]]
    assert result.as_numpy("INPUT_TOKENS").ravel().tolist() == [t["input_tokens"] for t in v1["translations"]]
    np.testing.assert_allclose(result.as_numpy("SCORE").ravel(), [t["score"] for t in v1["translations"]],
                               rtol=1e-5)
    assert result.get_response().id == "g1" and result.get_response().model_version == version
    only = client.infer(name, [_input(texts[:1])], outputs=[grpcclient.InferRequestedOutput("OUTPUT_TOKENS")])
    assert only.as_numpy("OUTPUT_TEXT") is None and only.as_numpy("OUTPUT_TOKENS").shape == (1, 1)

    stats = client.get_inference_statistics(name, as_json=True)["model_stats"][0]
    http_stats = httpx.get(f"{server.url}/v2/models/{name}/stats").json()["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == http_stats["inference_stats"]["success"]["count"] >= 3
    assert int(stats["inference_count"]) == http_stats["inference_count"]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": name, "version": version, "state": "READY"}]
    with pytest.raises(grpcclient.InferenceServerException, match="no model repository"):
        client.unload_model(name)
    client.close()


def test_grpc_errors_have_their_codes(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    name = client.get_model_repository_index(as_json=True)["models"][0]["name"]
    cases = [
        ({"model_name": "no-such-model", "inputs": [_input(["Hi."])]}, "StatusCode.NOT_FOUND"),
        ({"model_name": name, "inputs": [_input(["Hi."])], "parameters": {"beam_size": 99}},
         "StatusCode.INVALID_ARGUMENT"),
        ({"model_name": name, "inputs": [_input(["a" * 10_000])]}, "StatusCode.RESOURCE_EXHAUSTED"),
        ({"model_name": name, "inputs": [_input([b"\xff\xfe not UTF-8"])]}, "StatusCode.INVALID_ARGUMENT"),
        ({"model_name": name, "inputs": [_input(SENTENCES[:4])], "timeout": 1},
         "StatusCode.DEADLINE_EXCEEDED"),
    ]
    for kwargs, code in cases:
        with pytest.raises(grpcclient.InferenceServerException) as caught:
            client.infer(**kwargs)
        assert caught.value.status() == code, (kwargs, caught.value)
    with pytest.raises(grpcclient.InferenceServerException) as caught:  # the client's gRPC deadline
        client.infer(name, [_input(SENTENCES[:8])], client_timeout=0.001)
    assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert client.is_server_live()  # and the server goes on
    empty = client.infer(name, [_input(["", "Hi."])]).as_numpy("OUTPUT_TEXT")  # an empty text: an empty translation
    assert empty[0][0] == b"" and empty[1][0]
    client.close()


def test_grpc_api_key_and_overload(tiny_package: Path) -> None:
    proc = start_server(tiny_package, "--grpc-port", "0", "--max-queue-size", "2", "--max-batch-size", "1",
                        env={"MTGATE_API_KEY": "s3cret", "MTGATE_MAX_SENTENCES_PER_REQUEST": "2"})
    try:
        client = grpcclient.InferenceServerClient(proc.grpc_address)
        name = client.get_model_repository_index(as_json=True)["models"][0]["name"]
        with pytest.raises(grpcclient.InferenceServerException) as caught:
            client.infer(name, [_input(["Hi."])])
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(grpcclient.InferenceServerException) as caught:
            client.infer(name, [_input(["Hi."])], headers={"authorization": "Bearer wrong"})
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        good = {"authorization": "Bearer s3cret"}
        assert client.infer(name, [_input(["Hi."])], headers=good).as_numpy("OUTPUT_TEXT").shape == (1, 1)

        async def flood() -> list[str]:
            import tritonclient.grpc.aio as aioclient

            async with aioclient.InferenceServerClient(proc.grpc_address) as aio:
                async def one(i: int) -> str:
                    tensor = aioclient.InferInput("INPUT_TEXT", [1, 1], "BYTES")
                    tensor.set_data_from_numpy(np.array([[SENTENCES[i % len(SENTENCES)]]], dtype=object))
                    try:
                        await aio.infer(name, [tensor], headers=good)
                    except aioclient.InferenceServerException as e:
                        return str(e.status())
                    return "OK"

                return list(await asyncio.gather(*(one(i) for i in range(40))))

        codes = asyncio.run(flood())
        assert "OK" in codes and "StatusCode.UNAVAILABLE" in codes, codes  # a full queue: retry later
        assert set(codes) <= {"OK", "StatusCode.UNAVAILABLE"}, codes
        client.close()
    finally:
        assert proc.stop() == 0, "".join(proc.log)


def test_busy_grpc_port_is_one_line(tiny_package: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "-m", str(tiny_package), "--port", "0",
                               "--grpc-port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0], proc.stderr
