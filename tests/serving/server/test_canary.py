"""The canary (``--canary-fraction``, ``serving.server.shadow.canary``) behind the real app on a real uvicorn, with fake
engines: production is an EchoTranslator, the candidate one that marks its answers, fails, or is slow. A sampled
request is answered by the candidate (the response headers say so); a failed or late answer falls back to production
and counts against the candidate; breaking a target rolls the canary back to 0 (log line, metrics, /v1/shadow).
The same on the real demo model with the candidate in its own process: ``test_shadow.py``."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.server.http import create_app
from serving.server.settings import ServingSettings
from serving.server.shadow import Shadow
from tests.fakes import EchoTranslator
from tests.serving.server.conftest import ROOT, run_app


class _Marked(EchoTranslator):
    """A candidate whose answers can be told from production's."""

    def run(self, prepared: Any, on_partial: Any = None) -> Any:
        return [dataclasses.replace(t, text=t.text + " (candidate)") for t in super().run(prepared, on_partial)]


@contextmanager
def _server(tmp_path: Path, load: Any, **canary: Any) -> Iterator[tuple[str, Shadow]]:
    settings = ServingSettings(model_dirs=[ROOT / "unused"], max_queue_delay_us=1000, shadow=tmp_path, **canary)
    app = create_app(settings.model_copy(update={"shadow": None, "canary_fraction": 0.0}), EchoTranslator())
    service = app.state.service
    service.shadow = Shadow(settings, service.metrics.registry, service.default_model, load=load)
    with run_app(app) as url:
        deadline = time.monotonic() + 10
        while httpx.get(url + "/v1/shadow").json()["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield url, service.shadow


def _translate(url: str, text: str = "a b c", **headers: str) -> httpx.Response:
    r = httpx.post(url + "/v1/translate", json={"text": text}, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _metric(url: str, line_start: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start} in /metrics")


def test_at_fraction_one_the_candidate_answers_and_the_headers_say_so(tmp_path: Path) -> None:
    with _server(tmp_path, _Marked, canary_fraction=1.0) as (url, shadow):
        r = _translate(url)
        assert r.json()["translations"][0]["text"] == "C B A (candidate)"
        assert r.headers["x-mtgate-answered-by"] == "candidate"
        assert r.headers["x-mtgate-answered-model"] == shadow.candidate
        assert r.json()["model"] == "echo"  # the body names the model the client asked for
        split = httpx.post(url + "/v1/translate", json={"text": "a b. c d.", "split_sentences": True}).json()
        assert split["translations"][0]["text"].endswith("(candidate)")
        infer = {"inputs": [{"name": "INPUT_TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["x y"]}]}
        r = httpx.post(url + "/v2/models/echo/infer", json=infer)
        assert r.json()["outputs"][0]["data"] == ["Y X (candidate)"] and r.headers["x-mtgate-answered-by"] == "candidate"
        # streaming is production's (its partial text comes from the batcher), and says so
        with httpx.stream("POST", url + "/v1/translate/stream", json={"text": "a b"}) as stream:
            assert stream.headers["x-mtgate-answered-by"] == "production"
            assert "(candidate)" not in stream.read().decode()
        canary = httpx.get(url + "/v1/shadow").json()["canary"]
        assert canary["state"] == "active" and canary["fraction"] == 1.0 and canary["requests"]["candidate"] == 3
        assert _metric(url, 'mtgate_canary_requests_total{candidate="' + shadow.candidate) == 3
        assert httpx.get(url + "/v1/shadow").json()["pairs"] == 1  # only the streamed request was shadowed


def test_the_fraction_samples_by_request_id(tmp_path: Path) -> None:
    with _server(tmp_path, _Marked, canary_fraction=0.5) as (url, _):
        who = {i: _translate(url, **{"X-Request-ID": f"r{i}"}).headers["x-mtgate-answered-by"] for i in range(40)}
        assert 8 < sum(w == "candidate" for w in who.values()) < 32
        again = {i: _translate(url, **{"X-Request-ID": f"r{i}"}).headers["x-mtgate-answered-by"] for i in range(40)}
        assert again == who  # the same id goes the same way
    with _server(tmp_path, _Marked) as (url, _):  # no canary: no header, production answers
        r = _translate(url)
        assert "x-mtgate-answered-by" not in r.headers and r.json()["translations"][0]["text"] == "C B A"


@pytest.mark.parametrize("candidate, targets, reason", [
    (lambda: EchoTranslator(fail_on="b"), {}, "error rate 1.000 (3 of 3)"),
    (lambda: EchoTranslator(step_delay=0.1), {"canary_max_p95_ms": 150}, "p95 latency"),  # 3 words: 0.3 s each
    (lambda: EchoTranslator(step_delay=0.1), {"canary_timeout_ms": 100}, "error rate 1.000"),  # past the timeout
])
def test_a_failing_or_slow_candidate_is_rolled_back_and_clients_get_production_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, candidate: Any, targets: dict[str, Any], reason: str
) -> None:
    caplog.set_level(logging.WARNING, logger="serving.server.shadow.canary")
    settings = {"canary_fraction": 1.0, "canary_window": 5, "canary_min_requests": 3, **targets}
    with _server(tmp_path, candidate, **settings) as (url, shadow):
        answers = [_translate(url) for _ in range(4)]
        assert [r.json()["translations"][0]["text"] for r in answers] == ["C B A"] * 4  # production's, no error
        assert answers[-1].headers["x-mtgate-answered-by"] == "production"
        canary = httpx.get(url + "/v1/shadow").json()["canary"]
        assert canary["state"] == "rolled_back" and canary["fraction"] == 0 and reason in canary["reason"]
        assert canary["rolled_back_at"] and canary["requests"]["sampled"] == 3  # the 4th was not sampled
        assert canary["window"]["requests"] == 3
        labels = f'{{candidate="{shadow.candidate}",model="echo"}}'
        assert _metric(url, "mtgate_canary_fraction" + labels) == 0
        assert _metric(url, "mtgate_canary_rollbacks_total" + labels) == 1
        assert _metric(url, "mtgate_canary_rolled_back" + labels) == 1
        assert _metric(url, f'mtgate_canary_requests_total{{candidate="{shadow.candidate}",model="echo",'
                            'outcome="fallback"}') == (3 if "error" in reason else 0)
    rollbacks = [r.getMessage() for r in caplog.records if "canary rolled back" in r.getMessage()]
    assert len(rollbacks) == 1 and reason in rollbacks[0] and rollbacks[0].count("\n") == 0


def test_a_request_refused_by_production_too_does_not_count_against_the_candidate(tmp_path: Path) -> None:
    with _server(tmp_path, lambda: EchoTranslator(max_input_tokens=4), canary_fraction=1.0, canary_window=2,
                 canary_min_requests=1) as (url, _):
        r = httpx.post(url + "/v1/translate", json={"text": " ".join("w" * 100)})
        assert r.status_code in (400, 413, 422), r.text  # the client's input, refused as without a canary
        canary = httpx.get(url + "/v1/shadow").json()["canary"]
        assert canary["state"] == "active" and canary["window"]["requests"] == 0


def test_while_the_candidate_loads_production_answers_and_nothing_counts_against_it(tmp_path: Path) -> None:
    loaded = threading.Event()

    def slow() -> Any:
        loaded.wait(10)
        return _Marked()

    settings = ServingSettings(model_dirs=[ROOT / "unused"], shadow=tmp_path, canary_fraction=1.0, canary_window=2,
                               canary_min_requests=1)
    app = create_app(settings.model_copy(update={"shadow": None, "canary_fraction": 0.0}), EchoTranslator())
    service = app.state.service
    service.shadow = Shadow(settings, service.metrics.registry, service.default_model, load=slow)
    with run_app(app) as url:
        r = _translate(url)
        assert r.json()["translations"][0]["text"] == "C B A" and r.headers["x-mtgate-answered-by"] == "production"
        canary = httpx.get(url + "/v1/shadow").json()["canary"]
        assert canary["state"] == "active" and canary["requests"]["sampled"] == 0 and canary["window"]["requests"] == 0
        loaded.set()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/v1/shadow").json()["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert _translate(url).headers["x-mtgate-answered-by"] == "candidate"


def test_a_candidate_that_cannot_keep_up_is_not_waited_for(tmp_path: Path) -> None:
    """At most shadow_queue_size canary requests wait for the candidate; the others are answered by production at
    once (counted against the candidate) instead of queueing behind it."""
    with _server(tmp_path, lambda: _Slow(), canary_fraction=1.0, shadow_queue_size=1, canary_min_requests=100,
                 canary_window=100) as (url, _):
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: _translate(url).headers["x-mtgate-answered-by"], range(6)))
        canary = httpx.get(url + "/v1/shadow").json()["canary"]
        assert answers.count("production") >= 3 and canary["requests"]["fallback"] == answers.count("production")


class _Slow(_Marked):
    def run(self, prepared: Any, on_partial: Any = None) -> Any:
        time.sleep(0.5)
        return super().run(prepared, on_partial)


def test_an_operator_re_arms_a_rolled_back_canary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """POST /v1/shadow/canary behind the API key: a candidate rolled back for failing answers again once re-armed
    (state and window cleared, one INFO line, a metric); bad input is a 4xx through the one error mapping."""
    caplog.set_level(logging.INFO, logger="serving.server.shadow.canary")
    broken = threading.Event()
    broken.set()

    class _Flaky(_Marked):
        def run(self, prepared: Any, on_partial: Any = None) -> Any:
            if broken.is_set():
                raise RuntimeError("candidate broken")
            return super().run(prepared, on_partial)

    key = {"Authorization": "Bearer k3y"}
    with _server(tmp_path, _Flaky, canary_fraction=1.0, canary_window=5, canary_min_requests=3,
                 api_key="k3y") as (url, shadow):
        for _ in range(4):
            assert _translate(url, **key).headers["x-mtgate-answered-by"] == "production"
        assert httpx.get(url + "/v1/shadow").json()["canary"]["state"] == "rolled_back"
        broken.clear()  # the candidate is fixed; the canary stays at 0 until re-armed
        assert _translate(url, **key).headers["x-mtgate-answered-by"] == "production"

        def post(body: Any, headers: dict[str, str] = key, **kw: Any) -> httpx.Response:
            return httpx.post(url + "/v1/shadow/canary", json=body, headers=headers, **kw)

        assert post({"fraction": 0.5}, headers={}).status_code == 401  # the key, as model load/unload
        assert post({"fraction": 0.5}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        for bad in ({"fraction": 1.5}, {"fraction": -0.1}, {"fraction": "1"}, {"fraction": True}, {}, [0.5], 0.5):
            r = post(bad)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input", (bad, r.text)
        r = httpx.post(url + "/v1/shadow/canary", content=b"{fraction", headers={**key, "Content-Type":
                                                                                 "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.text
        assert httpx.get(url + "/v1/shadow").json()["canary"]["state"] == "rolled_back"  # nothing changed

        r = post({"fraction": 1})
        assert r.status_code == 200, r.text
        canary = r.json()["canary"]
        assert canary == httpx.get(url + "/v1/shadow").json()["canary"]  # the state /v1/shadow shows
        assert canary["state"] == "active" and canary["fraction"] == 1.0 and canary["reason"] is None
        assert canary["rolled_back_at"] is None and canary["window"]["requests"] == 0
        r = _translate(url, **key)
        assert r.headers["x-mtgate-answered-by"] == "candidate"
        assert r.json()["translations"][0]["text"] == "C B A (candidate)"
        labels = f'{{candidate="{shadow.candidate}",model="echo"}}'
        assert _metric(url, "mtgate_canary_fraction" + labels) == 1
        assert _metric(url, "mtgate_canary_fraction_sets_total" + labels) == 1
        assert _metric(url, "mtgate_canary_rollbacks_total" + labels) == 1
        assert _metric(url, "mtgate_canary_rolled_back" + labels) == 0  # re-armed

        canary = post({"fraction": 0}).json()["canary"]  # an operator's 0: off, production answers
        assert canary["state"] == "off" and canary["fraction"] == 0
        assert _translate(url, **key).headers["x-mtgate-answered-by"] == "production"
    sets = [r for r in caplog.records if "set to" in r.getMessage() and "by an operator" in r.getMessage()]
    assert [r.levelno for r in sets] == [logging.INFO, logging.INFO] and "was rolled_back, now active" in \
        sets[0].getMessage()


def test_setting_the_fraction_without_a_canary_is_404(tmp_path: Path) -> None:
    with _server(tmp_path, _Marked) as (url, _):  # a shadow, no canary
        r = httpx.post(url + "/v1/shadow/canary", json={"fraction": 0.5})
        assert r.status_code == 404 and r.json()["error"]["code"] == "canary_not_configured"
    app = create_app(ServingSettings(model_dirs=[ROOT / "unused"]), EchoTranslator())
    with run_app(app) as url:  # no shadow at all
        r = httpx.post(url + "/v1/shadow/canary", json={"fraction": 0.5})
        assert r.status_code == 404 and r.json()["error"]["code"] == "shadow_not_configured"
