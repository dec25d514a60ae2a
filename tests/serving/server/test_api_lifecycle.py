"""Readiness, overload, deadlines, disconnects, drain and metrics, with the fake engine behind the real app."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.request import Translation
from serving.server.http import create_app
from serving.server.settings import ServingSettings
from tests.fakes import EchoTranslator, echo


class GatedTranslator(EchoTranslator):
    """Blocks in translate() until ``gate`` is set (a slow model load or warm-up)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def translate(self, texts: Any, options: Any = None, on_partial: Any = None) -> list[Translation]:
        self.gate.wait(10)
        return super().translate(texts, options, on_partial)


def test_not_ready_until_warm_then_ready() -> None:
    translator = GatedTranslator()
    app = create_app(ServingSettings(model_dirs=[Path("unused")]), translator)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 503
        r = client.get("/v2/models/echo/ready")
        assert r.status_code == 503 and "not ready" in r.json()["error"]
        r = client.post("/v1/translate", json={"text": "too early"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        assert client.get("/v1/models").json()["models"][0]["ready"] is False
        translator.gate.set()
        deadline = time.monotonic() + 5
        while client.get("/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert client.post("/v1/translate", json={"text": "now ready"}).status_code == 200
        assert translator.batches[0] == ["Hello world.", "This is a warm-up sentence for the translation server."]


def test_overload_gives_503_with_retry_after_and_accepted_requests_complete(serve: Any) -> None:
    translator = EchoTranslator(step_delay=0.02)
    with serve(
        translator, max_queue_size=4, max_sentences_per_request=4, max_batch_size=2, retry_after_s=2, warmup=False
    ) as client:
        results: dict[int, Any] = {}

        def call(i: int) -> None:
            results[i] = client.post("/v1/translate", json={"text": f"word{i} two three"})

        threads = [threading.Thread(target=call, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        refused = [r for r in results.values() if r.status_code == 503]
        accepted = {i: r for i, r in results.items() if r.status_code == 200}
        assert refused and accepted and len(refused) + len(accepted) == 24
        assert all(r.headers["retry-after"] == "2" and r.json()["error"]["code"] == "overloaded" for r in refused)
        assert all(r.json()["translations"][0]["text"] == echo(f"word{i} two three") for i, r in accepted.items())
        assert client.get("/v2/health/live").status_code == 200
        assert client.post("/v1/translate", json={"text": "after the storm"}).status_code == 200
        metrics = client.get("/metrics").text
    assert 'mtgate_dropped_sentences_total{model="echo",reason="overloaded"}' in metrics


def test_deadline_gives_504(serve: Any) -> None:
    translator = EchoTranslator(step_delay=0.05)
    with serve(translator, warmup=False) as client:
        started = time.monotonic()
        r = client.post("/v1/translate", json={"text": "a b c d e f", "timeout_ms": 30})
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
        assert time.monotonic() - started < 0.25  # answered at the deadline, not after the batch
        doc = {
            "inputs": [{"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "data": ["a b c d e f"]}],
            "parameters": {"timeout": 30_000},
        }
        r = client.post("/v2/models/echo/infer", content=json.dumps(doc))
        assert r.status_code == 504 and isinstance(r.json()["error"], str)
        assert client.post("/v1/translate", json={"text": "a b"}).status_code == 200


def test_server_timeout_setting_applies(serve: Any) -> None:
    with serve(EchoTranslator(step_delay=0.05), request_timeout_s=0.02, warmup=False) as client:
        assert client.post("/v1/translate", json={"text": "a b c"}).status_code == 504
        # A client may shorten the deadline, never extend it.
        assert client.post("/v1/translate", json={"text": "a b c", "timeout_ms": 60_000}).status_code == 504


def test_drain_refuses_new_work_but_keeps_answering(client: TestClient) -> None:
    service = client.app.state.service  # type: ignore[attr-defined]
    service.begin_drain()
    r = client.post("/v1/translate", json={"text": "late"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["message"] == "server is shutting down"
    r = client.post("/v2/models/echo/infer", content=b"{}")
    assert r.status_code == 503 and r.json() == {"error": "server is shutting down"}
    assert client.get("/v2/health/ready").status_code == 503
    assert client.get("/v2/health/live").status_code == 200


def test_metrics_parse_and_move(client: TestClient) -> None:
    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = client.get("/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    before = samples()
    for _ in range(3):
        assert client.post("/v1/translate", json={"text": ["a b", "c"]}).status_code == 200
    assert client.post("/v1/translate", json={"text": []}).status_code == 400  # an empty text would be translated
    after = samples()

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("mtgate_requests_total", route="/v1/translate", method="POST", status="200") == 3
    assert delta("mtgate_requests_total", route="/v1/translate", method="POST", status="400") == 1
    assert delta("mtgate_sentences_total", model="echo") == 6
    assert delta("mtgate_input_tokens_total", model="echo") == 15
    assert delta("mtgate_output_tokens_total", model="echo") == 9
    assert delta("mtgate_request_duration_seconds_count", route="/v1/translate") == 4
    assert delta("mtgate_batch_size_count", model="echo") >= 1
    assert delta("mtgate_queue_wait_seconds_count", model="echo") == 6
    assert (
        after[("mtgate_model_info", (("model", "echo"), ("precision", "fp32"), ("runtime", "fake"), ("version", "1")))]
        == 1
    )
    assert after[("mtgate_ready", ())] == 1
    assert after[("mtgate_queue_depth", (("model", "echo"),))] == 0
    families = {f.name: f.type for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families["mtgate_requests"] == "counter"
    assert families["mtgate_request_duration_seconds"] == "histogram"
    assert families["mtgate_batch_size"] == "histogram"


# -- a real uvicorn in a thread, for what TestClient cannot show (disconnects) -------------------------------------


def test_client_disconnect_cancels_queued_work(live: Any) -> None:
    translator = EchoTranslator(step_delay=0.1)
    with live(translator, max_batch_size=1, max_queue_delay_us=0, warmup=False) as url:
        host, port = url.removeprefix("http://").split(":")

        async def main() -> None:
            async with httpx.AsyncClient(base_url=url) as client:
                busy = asyncio.ensure_future(client.post("/v1/translate", json={"text": "keeps the worker busy"}))
                await asyncio.sleep(0.05)
                # A raw client that sends its request and hangs up while the request is still queued.
                reader, writer = await asyncio.open_connection(host, int(port))
                body = json.dumps({"text": "abandoned sentence"}).encode()
                writer.write(
                    b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.close()
                await (await busy).aread()
                await asyncio.sleep(0.2)
                metrics = (await client.get("/metrics")).text
                assert 'mtgate_dropped_sentences_total{model="echo",reason="cancelled"} 1.0' in metrics
                assert 'status="499"' in metrics

        asyncio.run(main())
    assert all("abandoned sentence" not in batch for batch in translator.batches)


def test_stream_disconnect_cancels_queued_work(live: Any) -> None:
    translator = EchoTranslator(step_delay=0.1)
    with live(translator, max_batch_size=1, max_queue_delay_us=0, warmup=False) as url:

        async def main() -> None:
            async with httpx.AsyncClient(base_url=url) as client:
                busy = asyncio.ensure_future(client.post("/v1/translate", json={"text": "keeps the worker busy"}))
                await asyncio.sleep(0.05)
                async with client.stream("POST", "/v1/translate/stream", json={"text": "gone stream"}) as r:
                    assert r.status_code == 200
                await (await busy).aread()
                await asyncio.sleep(0.2)

        asyncio.run(main())
    assert all("gone stream" not in batch for batch in translator.batches)
