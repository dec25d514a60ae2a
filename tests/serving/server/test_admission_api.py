"""Admission by estimate through the real app: a request that the queued work would make miss its deadline gets 503
at once, with a Retry-After from the estimate (before tokenizing when the work ahead alone is too much)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from serving.engine.decoding import Alive
from serving.engine.request import OnPartial, Prepared, Translation
from tests.fakes import EchoTranslator

LONG = " ".join(f"w{i}" for i in range(49))  # 49 words + EOS: cost 50, 5 s at 100 ms per token


class GatedEcho(EchoTranslator):
    """Blocks every batch until ``gate`` is set; counts the texts it prepared."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.running = threading.Event()
        self.prepared = 0

    def prepare(self, texts: Any, options: Any = None, target_prefix: Any = None) -> Prepared:
        self.prepared += len(texts)
        return super().prepare(texts, options, target_prefix)

    def run(self, prepared: Prepared, on_partial: OnPartial | None = None, alive: Alive | None = None
            ) -> list[Translation]:
        self.running.set()
        self.gate.wait(10)
        return super().run(prepared, on_partial, alive)


def test_a_request_the_queue_would_make_late_gets_503_with_retry_after_from_the_estimate(serve: Any) -> None:
    translator = GatedEcho()
    with serve(translator, warmup=False, max_batch_size=1, max_queue_delay_us=0) as client:
        batcher = client.app.state.service.get(None).batcher  # type: ignore[attr-defined]
        batcher.estimator.observe(1, 50, 5.0)  # the engine's speed, as if learned: 100 ms per token in batches of 1
        results: list[Any] = []
        texts = ["a b c", LONG, LONG, LONG, LONG]
        threads = [threading.Thread(target=lambda t=t: results.append(client.post("/v1/translate", json={"text": t})))
                   for t in texts]
        threads[0].start()
        assert translator.running.wait(5)  # the first batch runs, blocked
        for thread in threads[1:]:
            thread.start()
        deadline = time.monotonic() + 5
        while batcher.queued < 4:  # 4 x 5 s queued
            assert time.monotonic() < deadline
            time.sleep(0.01)
        prepared = translator.prepared

        # The work ahead alone (20 s) is past a 3 s deadline: refused before tokenizing; fits 17 s and a bit later.
        r = client.post("/v1/translate", json={"text": LONG, "timeout_ms": 3000})
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
        assert r.headers["retry-after"] in ("18", "19") and "deadline" in r.json()["error"]["message"]
        assert translator.prepared == prepared
        # 20 s ahead + 5 s of its own past a 22 s deadline: refused once its cost is known.
        r = client.post("/v1/translate", json={"text": LONG, "timeout_ms": 22_000})
        assert r.status_code == 503 and r.headers["retry-after"] in ("4", "5"), r.text
        assert not translator.gate.is_set()  # answered at once: nothing ran meanwhile

        translator.gate.set()
        for thread in threads:
            thread.join(10)
        assert [r.status_code for r in results] == [200] * 5
        metrics = client.get("/metrics").text
    assert 'mtgate_dropped_sentences_total{model="echo",reason="overloaded"} 2.0' in metrics


def test_a_model_whose_queue_cannot_take_a_request_refuses_it_before_parsing_it(serve: Any) -> None:
    """No room for one more sentence, or the queued work alone past the server's timeout: 503 before the body is
    parsed or tokenized (a body that is not even JSON gets the 503), on /v1 and /v2, the connection kept open."""
    translator = GatedEcho()
    with serve(translator, warmup=False, max_batch_size=1, max_queue_delay_us=0, max_queue_size=2,
               max_sentences_per_request=2, request_timeout_s=12) as client:
        batcher = client.app.state.service.get(None).batcher  # type: ignore[attr-defined]
        batcher.estimator.observe(1, 50, 5.0)  # 100 ms per token in batches of 1
        results: dict[int, Any] = {}  # by the order sent (the threads finish in any order)

        def send(text: str) -> None:
            index = len(threads)
            thread = threading.Thread(target=lambda: results.update({index: client.post("/v1/translate",
                                                                                          json={"text": text})}))
            thread.start()
            threads.append(thread)

        def queued(count: int) -> None:
            deadline = time.monotonic() + 5
            while batcher.queued < count:
                assert time.monotonic() < deadline
                time.sleep(0.01)

        threads: list[threading.Thread] = []
        send("a b c")
        assert translator.running.wait(5)  # the first batch runs, blocked
        send(LONG)
        queued(1)
        not_json = {"content": b"not json", "headers": {"Content-Type": "application/json"}}
        r = client.post("/v1/translate", **not_json)  # room for one, 5 s queued of a 12 s timeout: parsed
        assert r.status_code == 400 and "not valid JSON" in r.text, r.text
        send(LONG)  # 10 s queued, its own 5 s within 12 s
        queued(2)
        prepared = translator.prepared

        for path in ("/v1/translate", "/v1/translate/stream", "/v2/models/echo/infer"):
            r = client.post(path, **not_json)
            assert r.status_code == 503 and "queue full (2 of 2 sentences waiting)" in r.text, (path, r.text)
            assert int(r.headers["retry-after"]) >= 1 and r.headers.get("connection") != "close"
        batcher.limits = dataclasses.replace(batcher.limits, queue_capacity=10)  # room again, but
        batcher.estimator.observe(1, 50, 50.0)  # the engine slowed: the queued work alone is past 12 s
        r = client.post("/v1/translate", **not_json)
        assert r.status_code == 503 and "after its deadline" in r.text, r.text
        assert translator.prepared == prepared  # none of them was tokenized

        translator.gate.set()
        for thread in threads:
            thread.join(10)
        assert results[0].status_code == 200, results[0].text  # the one that ran
