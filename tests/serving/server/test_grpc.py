"""`mtgate serve --grpc-port`: the KServe v2 / Triton gRPC protocol, driven by the stock tritonclient.grpc client
against a real server on loopback: the same answers as /v1, the same statistics, and the errors mapped to the gRPC
codes clients retry on or not."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from loadtest.metrics_text import read_metrics
from tests.utils.marian_factory import corpus
from tests.utils.server import ROOT, ServerProcess, start_server

grpcclient = pytest.importorskip("tritonclient.grpc")

SENTENCES = corpus("en")
SERVICE = "/inference.GRPCInferenceService/"


def _raw_call(address: str, method: str, body: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.RpcError:
    """Send ``body`` as the request of ``method`` as it is (no serializer); return the error it must end with."""
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(SERVICE + method)(body, timeout=30, metadata=metadata)
        except grpc.RpcError as error:
            return error
    raise AssertionError(f"{method} answered {body!r}")


def _requests_total(server: ServerProcess, method: str, code: str) -> float:
    labels = {"method": "GRPC", "route": f"{SERVICE}{method}", "status": code}
    for sample in (s for family in read_metrics(server.url, 10) for s in family.samples):
        if sample.name == "mtgate_requests_total" and sample.labels == labels:
            return float(sample.value)
    return 0.0


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


def test_grpc_client_errors_are_invalid_argument_without_a_traceback(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    name = client.get_model_repository_index(as_json=True)["models"][0]["name"]
    client.close()
    logged = len(server.log)
    for garbage in (b"\xff\xff\xff\xff not protobuf", b"\x0a\xff\x01"):
        error = _raw_call(server.grpc_address, "ModelInfer", garbage)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert "not a valid inference.ModelInferRequest message" in str(error.details())
    assert _raw_call(server.grpc_address, "ServerLive", b"\xff").code() == grpc.StatusCode.INVALID_ARGUMENT
    # raw_input_contents and contents both: which one would be meant?
    from tritonclient.grpc import service_pb2

    both = service_pb2.ModelInferRequest(model_name=name, raw_input_contents=[b"\x03\x00\x00\x00Hi."])
    tensor = both.inputs.add(name="INPUT_TEXT", datatype="BYTES", shape=[1, 1])
    tensor.contents.bytes_contents.append(b"Hi.")
    error = _raw_call(server.grpc_address, "ModelInfer", both.SerializeToString())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "both raw_input_contents and contents" in str(
        error.details()), error
    assert _requests_total(server, "ModelInfer", "INVALID_ARGUMENT") >= 3
    assert not [line for line in server.log[logged:] if "Traceback" in line or " ERROR " in line], server.log[logged:]


def test_grpc_unimplemented_methods_answer_at_once_counted_and_logged_once(server: ServerProcess) -> None:
    before = _requests_total(server, "SystemSharedMemoryStatus", "UNIMPLEMENTED")
    for method in ("SystemSharedMemoryStatus", "SystemSharedMemoryStatus", "CudaSharedMemoryRegister",
                   "TraceSetting", "LogSettings", "LogSettings"):
        error = _raw_call(server.grpc_address, method, b"")
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED and method in str(error.details()), error
    assert _requests_total(server, "SystemSharedMemoryStatus", "UNIMPLEMENTED") == before + 2
    assert _requests_total(server, "LogSettings", "UNIMPLEMENTED") >= 2
    time.sleep(0.2)  # the log is read by a thread
    told = [line for line in server.log if "LogSettings is not implemented" in line]
    assert len(told) == 1 and not [line for line in server.log if "Traceback" in line], server.log


def test_grpc_stream_answers_each_request_as_model_infer(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    name = client.get_model_repository_index(as_json=True)["models"][0]["name"]
    expected = {str(i): client.infer(name, [_input([text])]).as_numpy("OUTPUT_TEXT").ravel()[0].decode()
                for i, text in enumerate(SENTENCES[:4])}
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i, text in enumerate(SENTENCES[:4]):
        client.async_stream_infer(name, [_input([text])], request_id=str(i))
    # fails alone (a beam over the server's cap; an empty text is no failure: it gets an empty translation); the
    # stream goes on
    client.async_stream_infer(name, [_input(["Hi."])], parameters={"beam_size": 99}, request_id="too-wide")
    client.async_stream_infer("no-such-model", [_input(["Hi."])], request_id="lost")
    got, errors = {}, []
    for _ in range(6):
        result, error = answers.get(timeout=60)
        if error is not None:
            errors.append(str(error))
        else:
            response = result.get_response()  # type: ignore[attr-defined]
            got[response.id] = result.as_numpy("OUTPUT_TEXT").ravel()[0].decode()  # type: ignore[attr-defined]
    client.stop_stream()
    client.close()
    assert got == expected
    assert len(errors) == 2 and any("no-such-model" in e for e in errors), errors
    assert _requests_total(server, "ModelStreamInfer", "OK") >= 4


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
        # The key is checked before the request is parsed: garbage without it is UNAUTHENTICATED, not logged.
        logged = len(proc.log)
        error = _raw_call(proc.grpc_address, "ModelInfer", b"\xff\xff garbage")
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
        error = _raw_call(proc.grpc_address, "ModelInfer", b"\xff\xff garbage", (("authorization", "Bearer s3cret"),))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        # (the batch line of the good request above may be written after it answered: only the garbage counts)
        assert [line for line in proc.log[logged:] if " batch model=" not in line] == [], proc.log[logged:]
        refused: queue.Queue[object] = queue.Queue()  # a stream without the key ends at once
        client.start_stream(callback=lambda result, error: refused.put(error))
        # The server may end the stream before this request is sent: the client then raises here, and the error is
        # still reported through the callback.
        with contextlib.suppress(grpcclient.InferenceServerException):
            client.async_stream_infer(name, [_input(["Hi."])])
        stream_error = refused.get(timeout=30)
        assert isinstance(stream_error, grpcclient.InferenceServerException), stream_error
        assert stream_error.status() == "StatusCode.UNAUTHENTICATED", stream_error
        client.stop_stream()

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
        proc = subprocess.run([sys.executable, "-m", "serving.commands.main", "serve", "-m", str(tiny_package), "--port", "0",
                               "--grpc-port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0], proc.stderr
