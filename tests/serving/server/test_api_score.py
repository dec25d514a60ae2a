"""``POST /v1/score`` through the real app: the EchoTranslator fake for the contract (limits, errors, API key, the
worker thread), the tiny Marian package for the numbers (equal to ``Translator.score``), with both batchers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from serving.engine.translator import Translator
from serving.server.settings import ServingSettings
from tests.fakes import EchoTranslator
from tests.utils.marian_factory import corpus


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return dict(body["error"])


def test_score_a_pair_and_a_list(serve: Any) -> None:
    translator = EchoTranslator()
    with serve(translator) as client:
        r = client.post("/v1/score", json={"source": "a man rides", "target": "RIDES MAN A"})
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"]
        body = r.json()
        assert (body["model"], body["version"]) == ("echo", "1")
        assert body["scores"] == [{"log_prob": -3.5, "tokens": 4, "mean_log_prob": -0.875,
                                   "perplexity": pytest.approx(2.398875), "token_log_probs": [-1.0, -1.0, -1.0, -0.5]}]
        r = client.post("/v1/score", json={"source": ["one two", "three"], "target": ["TWO ONE", "no"]})
        assert [s["log_prob"] for s in r.json()["scores"]] == [-2.5, -2.5]
    # Scoring ran on the model's worker thread, the one that runs its batches of translations.
    assert translator.threads == {"mtgate-worker-echo_0"}


@pytest.mark.parametrize(("body", "status", "code", "words"), [
    ({"source": ["a", "b"], "target": ["A"]}, 400, "invalid_input", "2 sources and 1 targets"),
    ({"source": "a", "target": " "}, 400, "invalid_input", "target[0] is empty; nothing to score"),
    ({"source": [], "target": []}, 400, "invalid_input", "no source to score"),
    ({"source": "a", "target": "x" * 5000}, 413, "limit_exceeded", "target[0] has 5000 characters"),
    ({"source": ["a"] * 300, "target": ["a"] * 300}, 413, "limit_exceeded", "max_sentences_per_request)"),
    ({"source": "a", "target": " ".join(["w"] * 70)}, 413, "input_too_long", "target[0] has 71 tokens"),
    ({"source": "a", "target": "A", "model": "nope"}, 404, "model_not_found", "unknown model 'nope'"),
    ({"source": "a"}, 422, "invalid_request", "target"),
    ({"source": "a", "target": "A", "beam_size": 2}, 422, "invalid_request", "beam_size"),
])
def test_bad_input_is_a_clear_4xx(shared_client: Any, body: Any, status: int, code: str, words: str) -> None:
    r = shared_client.post("/v1/score", json=body)
    assert r.status_code == status, r.text
    error = error_of(r)
    assert words in error["message"], error
    if status != 422:
        assert error["code"] == code


def test_api_key_guards_score(serve: Any) -> None:
    with serve(api_key="s3cret") as client:
        r = client.post("/v1/score", json={"source": "a", "target": "A"})
        assert r.status_code == 401 and error_of(r)["code"] == "unauthorized"
        r = client.post("/v1/score", json={"source": "a", "target": "A"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = client.post("/v1/score", json={"source": "a", "target": "A"}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200, r.text


def test_deadline_is_504_and_a_runtime_failure_500(serve: Any) -> None:
    with serve(EchoTranslator(step_delay=0.1, fail_on="boom"), warmup=False) as client:
        r = client.post("/v1/score", json={"source": "a", "target": "a b c d e", "timeout_ms": 50})
        assert r.status_code == 504 and error_of(r)["code"] == "deadline_exceeded", r.text
        r = client.post("/v1/score", json={"source": "boom", "target": "x"})
        assert r.status_code == 500 and error_of(r)["code"] == "inference_failed", r.text
        assert client.post("/v1/score", json={"source": "a", "target": "A"}).status_code == 200


def test_a_full_scoring_queue_is_503_with_retry_after_until_there_is_room(serve: Any) -> None:
    """Pairs admitted to scoring and not done are bounded by max_queue_size, as queued sentences are; the bound
    holds for a client that gave up too (its pairs stay counted until the worker is done with them)."""
    with serve(EchoTranslator(step_delay=0.2), warmup=False, max_queue_size=2, max_sentences_per_request=2,
               retry_after_s=3) as client, ThreadPoolExecutor(2) as pool:
        runner = client.app.state.service.ready_model(None)  # type: ignore[attr-defined]
        running = pool.submit(client.post, "/v1/score", json={"source": ["a", "b"], "target": ["A", "B"]})
        deadline = time.monotonic() + 5
        while runner.scoring < 2 and time.monotonic() < deadline:  # until those two pairs are admitted
            time.sleep(0.005)
        r = client.post("/v1/score", json={"source": "c", "target": "C"})  # no room for a third
        assert r.status_code == 503, r.text
        assert error_of(r) == {"code": "overloaded",
                               "message": "scoring queue full (2 of 2 pairs waiting); retry later"}
        assert r.headers["retry-after"] == "3"
        assert running.result().status_code == 200
        assert client.post("/v1/score", json={"source": "c", "target": "C"}).status_code == 200  # room again
        # a client whose deadline passed keeps its pairs counted until the worker has scored them
        r = client.post("/v1/score", json={"source": ["a", "b"], "target": ["A", "B"], "timeout_ms": 50})
        assert r.status_code == 504
        assert client.post("/v1/score", json={"source": "c", "target": "C"}).status_code == 503
        deadline = time.monotonic() + 5
        while runner.scoring and time.monotonic() < deadline:  # the worker finishes the abandoned pairs
            time.sleep(0.005)
        assert client.post("/v1/score", json={"source": "c", "target": "C"}).status_code == 200


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_scoring_between_decoder_steps_leaves_the_running_translations_unchanged(serve: Any, tiny_package: Path,
                                                                                  runtime: str) -> None:
    """With step-level batching, /v1/score runs between two decoder steps of a running batch (it used to wait for
    the batch to drain): its scores are the engine's, and the translations decoding around it are those the engine
    gives alone (OpenVINO's growing cache is detached from the backend's buffers first)."""
    texts = corpus("en")[:48]
    sources, targets = corpus("en")[48:52], corpus("de")[48:52]
    engine = Translator.load(tiny_package, runtime=runtime, threads=1)
    expected = engine.score(sources, targets)
    alone = [t.text for t in engine.translate(texts)]
    with serve(Translator.load(tiny_package, runtime=runtime, threads=1), batching="step", warmup=False,
               max_batch_size=8) as client, \
            ThreadPoolExecutor(1) as pool:
        batcher = client.app.state.service.ready_model(None).batcher  # type: ignore[attr-defined]
        translating = pool.submit(client.post, "/v1/translate", json={"text": texts})
        deadline = time.monotonic() + 10
        while batcher.in_flight == 0 and time.monotonic() < deadline:  # the batch is decoding
            time.sleep(0.001)
        scored = [client.post("/v1/score", json={"source": sources, "target": targets})]
        assert batcher.in_flight > 0, "the scoring waited for the batch to drain"
        scored += [client.post("/v1/score", json={"source": sources, "target": targets}) for _ in range(2)]
        translated = translating.result()
    assert translated.status_code == 200, translated.text
    assert [t["text"] for t in translated.json()["translations"]] == alone
    for r in scored:
        assert r.status_code == 200, r.text
        for got, want in zip(r.json()["scores"], expected, strict=True):
            assert got["tokens"] == want.tokens and got["log_prob"] == pytest.approx(want.log_prob, abs=1e-5)


def test_openapi_states_the_limits(shared_client: Any) -> None:
    settings = ServingSettings(model_dirs=[Path("unused")])
    document = shared_client.get("/openapi.json").json()
    properties = document["components"]["schemas"]["ScoreRequest"]["properties"]
    for name in ("source", "target"):
        sentence, many = properties[name]["anyOf"]
        assert sentence["maxLength"] == settings.max_chars_per_sentence, properties[name]
        assert many["maxItems"] == settings.max_sentences_per_request
    assert properties["model"]["enum"] == ["echo", None]
    assert {"200", "400", "401", "404", "413", "503", "504"} <= set(document["paths"]["/v1/score"]["post"]["responses"])


@pytest.mark.parametrize("batching", ["request", "step"])
def test_scores_of_the_real_engine(serve: Any, tiny_package: Path, batching: str) -> None:
    sources = ["A man rides a bike.", "Two dogs play in the snow."]
    targets = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    expected = Translator.load(tiny_package, threads=1).score(sources, targets)
    with serve(Translator.load(tiny_package, threads=1), batching=batching) as client:
        r = client.post("/v1/score", json={"source": sources, "target": targets})
        assert r.status_code == 200, r.text
        translated = client.post("/v1/translate", json={"text": sources})
        assert translated.status_code == 200
    for got, want in zip(r.json()["scores"], expected, strict=True):
        assert got["tokens"] == want.tokens
        assert got["log_prob"] == pytest.approx(want.log_prob, abs=1e-5)
        assert got["token_log_probs"] == pytest.approx(want.token_log_probs, abs=1e-5)
