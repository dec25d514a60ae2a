"""Acceptance of the server: `mtgate serve` as a real process on a free loopback port, serving a tiny Marian model
converted by the real converter, driven by httpx, tritonclient and headless Chromium.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from loadtest.metrics_text import read_metrics
from serving.engine.translator import DecodeOptions, Translator
from tests.serving.server.browser import browser_page
from tests.utils.marian_factory import corpus
from tests.utils.server import ServerProcess, start_server

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", params=["request", "step"])
def server(request: pytest.FixtureRequest, tiny_package: Path) -> Iterator[ServerProcess]:
    """The server with each batching mode: every test below holds for both."""
    proc = start_server(tiny_package, "--max-queue-delay-us", "20000", "--batching", request.param)
    proc.batching = request.param
    yield proc
    assert proc.stop() == 0, "".join(proc.log)


@pytest.fixture(scope="module")
def translator(tiny_package: Path) -> Translator:
    return Translator.load(tiny_package, threads=1)


SENTENCES = corpus("en")


def metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in read_metrics(url, 10) for s in family.samples}


def test_translate_equals_the_in_process_translator(server: ServerProcess, translator: Translator) -> None:
    texts = SENTENCES[:6]
    expected = translator.translate(texts, DecodeOptions())
    r = httpx.post(server.url + "/v1/translate", json={"text": texts}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == translator.info.name and body["version"] == translator.info.version
    for got, want in zip(body["translations"], expected, strict=True):
        assert got["text"] == want.text
        assert (got["input_tokens"], got["output_tokens"]) == (want.input_tokens, want.output_tokens)
        assert got["score"] == pytest.approx(want.score, abs=1e-4)
    greedy = translator.translate(texts[:2], DecodeOptions(beam_size=1, max_length=12))
    r = httpx.post(server.url + "/v1/translate", json={"text": texts[:2], "beam_size": 1, "max_length": 12})
    assert [t["text"] for t in r.json()["translations"]] == [t.text for t in greedy]


def test_32_concurrent_clients_get_their_own_answers_in_batches(server: ServerProcess, translator: Translator) -> None:
    texts = SENTENCES[10:42]
    expected = [t.text for t in translator.translate(texts, DecodeOptions(beam_size=1))]
    before = metric_samples(server.url)
    barrier = threading.Barrier(len(texts))
    results: dict[int, Any] = {}

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            barrier.wait()
            results[i] = c.post("/v1/translate", json={"text": texts[i], "beam_size": 1})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    assert all(results[i].status_code == 200 for i in range(len(texts)))
    assert [results[i].json()["translations"][0]["text"] for i in range(len(texts))] == expected
    after = metric_samples(server.url)
    model = (("model", translator.info.name),)
    if server.batching == "step":
        # Requests join the running decode batch: many decoder steps had more than one sentence in flight.
        steps = after[("mtgate_step_sentences_count", model)] - before.get(("mtgate_step_sentences_count", model), 0)
        single_key = ("mtgate_step_sentences_bucket", (("le", "1.0"), *model))
        singles = after[single_key] - before.get(single_key, 0)
        assert steps - singles > 0, "no decoder step with more than one sentence"
        sys.stderr.write(f"\n32 clients, step batching: {len(texts) / elapsed:.1f} requests/s, {steps:.0f} steps\n")
        return
    batches = after[("mtgate_batch_size_count", model)] - before.get(("mtgate_batch_size_count", model), 0)
    sentences = after[("mtgate_batch_size_sum", model)] - before.get(("mtgate_batch_size_sum", model), 0)
    single_key = ("mtgate_batch_size_bucket", (("le", "1.0"), *model))
    singles = after[single_key] - before.get(single_key, 0)
    assert sentences == len(texts)
    assert batches - singles > 0, "no batch larger than 1"
    sys.stderr.write(
        f"\n32 clients: {len(texts) / elapsed:.1f} requests/s, {batches:.0f} batches, "
        f"mean batch {sentences / batches:.1f}\n"
    )


def test_stream_first_event_well_before_the_last(server: ServerProcess, translator: Translator) -> None:
    texts = SENTENCES[50:58]
    expected = [t.text for t in translator.translate(texts, DecodeOptions(beam_size=1, max_length=100))]
    arrivals: list[tuple[float, str, dict[str, Any]]] = []
    started = time.monotonic()
    body = {"text": texts, "beam_size": 1, "max_length": 100}
    with httpx.stream("POST", server.url + "/v1/translate/stream", json=body, timeout=60) as r:
        assert r.status_code == 200
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                arrivals.append((time.monotonic() - started, event, json.loads(line[6:])))
    assert arrivals[-1][1] == "final" and len(arrivals) > 10
    first, last = arrivals[0][0], arrivals[-1][0]
    assert first < 0.6 * last, f"first event at {first:.3f}s, last at {last:.3f}s"
    final = arrivals[-1][2]["translations"]
    assert [t["text"] for t in final] == expected
    for index in range(len(texts)):
        assert "".join(d["delta"] for _, e, d in arrivals if e == "partial" and d["index"] == index) == expected[index]


def _stream(url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A /v1/translate/stream request's partial events and its final response."""
    partials: list[dict[str, Any]] = []
    with httpx.stream("POST", url + "/v1/translate/stream", json=body, timeout=60) as r:
        assert r.status_code == 200
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "final":
                    return partials, data
                assert event == "partial", data
                partials.append(data)
    raise AssertionError("no final event")


def test_beam_streams_concatenate_to_the_translation_in_mixed_batches(server: ServerProcess,
                                                                      translator: Translator) -> None:
    """Concurrent beam-4 streams (the prefix all live beams share, as it grows), beside plain and greedy requests
    in the same batches: each stream's deltas concatenate to its final text, which is the non-streamed
    translation."""
    groups = [SENTENCES[70 + 4 * i : 74 + 4 * i] for i in range(6)]
    expected = [[t.text for t in translator.translate(texts, DecodeOptions(beam_size=4))] for texts in groups]
    outcomes: dict[int, Any] = {}

    def call(i: int) -> None:
        if i < len(groups):
            outcomes[i] = _stream(server.url, {"text": groups[i], "beam_size": 4})
        elif i % 2:
            httpx.post(server.url + "/v1/translate", json={"text": groups[i % len(groups)], "beam_size": 4}, timeout=60)
        else:
            _stream(server.url, {"text": groups[i % len(groups)], "beam_size": 1})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(groups) + 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    early = 0
    for i, texts in enumerate(groups):
        partials, final = outcomes[i]
        assert [t["text"] for t in final["translations"]] == expected[i]
        for index in range(len(texts)):
            deltas = [p["delta"] for p in partials if p["index"] == index]
            assert "".join(deltas) == expected[i][index]
            early += len(deltas) > 1
    assert early > 0, "no beam sentence streamed before it was done"


def test_tritonclient_matches_v1(server: ServerProcess) -> None:
    import tritonclient.http as triton

    texts = SENTENCES[60:63] + ["Grüße aus Köln, 日本"]
    v1 = httpx.post(server.url + "/v1/translate", json={"text": texts}).json()
    expected = [t["text"] for t in v1["translations"]]
    name = v1["model"]
    client = triton.InferenceServerClient(server.address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(name)
    assert not client.is_model_ready("no-such-model")
    meta = client.get_model_metadata(name)
    assert meta["name"] == name and meta["inputs"][0] == {"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [-1, 1]}
    assert client.get_server_metadata()["name"] == "mtgate"
    config = client.get_model_config(name)  # what perf_analyzer reads first
    assert config == client.get_model_config(name, model_version=v1["version"])
    assert config["name"] == name and config["max_batch_size"] == 32
    assert config["input"] == [{"name": "INPUT_TEXT", "data_type": "TYPE_STRING", "dims": [1]}]
    assert [(o["name"], o["data_type"]) for o in config["output"]] == [
        ("OUTPUT_TEXT", "TYPE_STRING"), ("INPUT_TOKENS", "TYPE_INT32"), ("OUTPUT_TOKENS", "TYPE_INT32"),
        ("SCORE", "TYPE_FP32")]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20000  # the server's --max-queue-delay-us
    with pytest.raises(triton.InferenceServerException, match="unknown model"):
        client.get_model_config("no-such-model")
    for binary in (True, False):
        tensor = triton.InferInput("INPUT_TEXT", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t] for t in texts], dtype=object), binary_data=binary)
        output = triton.InferRequestedOutput("OUTPUT_TEXT", binary_data=binary)
        result = client.infer(name, [tensor], outputs=[output], request_id="r1")
        got = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("OUTPUT_TEXT").ravel()]
        assert got == expected, binary
        assert result.get_response()["id"] == "r1"
    tensor = triton.InferInput("INPUT_TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t] for t in texts], dtype=object))
    result = client.infer(name, [tensor], model_version=v1["version"])  # outputs=None: every output, binary
    assert [v.decode() for v in result.as_numpy("OUTPUT_TEXT").ravel()] == expected
    assert result.as_numpy("OUTPUT_TOKENS").ravel().tolist() == [t["output_tokens"] for t in v1["translations"]]
    with pytest.raises(triton.InferenceServerException, match="unknown model"):
        client.infer("no-such-model", [tensor])
    # Triton's statistics extension: the three infers above are in it, with their queue and engine time
    before = client.get_inference_statistics(name)["model_stats"][0]
    client.infer(name, [tensor])
    after = client.get_inference_statistics(name, model_version=v1["version"])["model_stats"][0]
    assert after["name"] == name and after["version"] == v1["version"]
    assert [m["name"] for m in client.get_inference_statistics()["model_stats"]] == [name]
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] == old["success"]["count"] + 1 >= 5  # the /v1 request and the 4 infers
    assert after["inference_count"] == before["inference_count"] + len(texts)
    assert after["execution_count"] > before["execution_count"] and after["last_inference"] > 0
    for key in ("success", "queue", "compute_input", "compute_infer"):
        assert stats[key]["ns"] > old[key]["ns"], key
    assert stats["success"]["ns"] >= stats["queue"]["ns"] + stats["compute_infer"]["ns"] > 0
    assert sum(b["compute_infer"]["count"] for b in after["batch_stats"]) == after["execution_count"]
    with pytest.raises(triton.InferenceServerException, match="unknown model"):
        client.get_inference_statistics("no-such-model")
    # the repository extension: the index; load and unload refused with the reason (mtgate has no repository)
    assert client.get_model_repository_index() == [{"name": name, "version": v1["version"], "state": "READY"}]
    assert client.get_model_repository_index(query_params=None) == httpx.post(
        server.url + "/v2/repository/index", json={"ready": True}).json()
    for call in (client.load_model, client.unload_model):
        with pytest.raises(triton.InferenceServerException, match="no model repository"):
            call(name)
    client.close()


def test_tiny_timeout_is_504(server: ServerProcess) -> None:
    r = httpx.post(server.url + "/v1/translate", json={"text": SENTENCES[0], "timeout_ms": 1})
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"


@pytest.mark.parametrize(
    ("kind", "request_kwargs", "status"),
    [
        # an empty string gets an empty translation (200): tests/serving/server/test_api_messages.py
        ("10k-character sentence", {"json": {"text": "a" * 10_000}}, 413),
        ("10k sentences", {"json": {"text": ["Hello."] * 10_000}}, 413),
        ("too many tokens", {"json": {"text": " ".join(["x"] * 400)}}, 413),
        (
            "invalid UTF-8",
            {"content": b'{"text": "\xff\xfe\xfd"}', "headers": {"Content-Type": "application/json"}},
            400,
        ),
        ("wrong JSON types", {"json": {"text": 12, "beam_size": "four"}}, 422),
        ("not JSON", {"content": b"{{{", "headers": {"Content-Type": "application/json"}}, 400),
        ("unknown model", {"json": {"text": "Hi", "model": "no-such-model"}}, 404),
        ("beam over the limit", {"json": {"text": "Hi", "beam_size": 1000}}, 400),
    ],
)
def test_bad_v1_input_is_a_clear_4xx(
    server: ServerProcess, kind: str, request_kwargs: dict[str, Any], status: int
) -> None:
    r = httpx.post(server.url + "/v1/translate", timeout=30, **request_kwargs)
    assert r.status_code == status, (kind, r.text)
    assert r.json()["error"]["message"], kind
    assert httpx.post(server.url + "/v1/translate", json={"text": "Still here."}).status_code == 200
    assert server.process.poll() is None


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"", {}),
        (b"[]", {}),
        (b'{"inputs": [{"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES"}]}', {}),
        (b'{"inputs": [{"name": "INPUT_TEXT", "shape": [3], "datatype": "BYTES", "data": ["a"]}]}', {}),
        (b'{"inputs": [{"name": "X", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}', {}),
        (
            b'{"inputs": [{"name": "INPUT_TEXT", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 9}}]}'
            b"\x05\x00\x00\x00\xff\xfe\xfd\xfc\xfb",
            {"Inference-Header-Content-Length": "104"},
        ),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "-3"}),
    ],
)
def test_malformed_v2_payloads_are_4xx(server: ServerProcess, body: bytes, headers: dict[str, str]) -> None:
    name = httpx.get(server.url + "/v1/models").json()["models"][0]["name"]
    r = httpx.post(f"{server.url}/v2/models/{name}/infer", content=body, headers=headers)
    assert 400 <= r.status_code < 500, r.text
    assert isinstance(r.json()["error"], str)
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200


def test_metrics_parse_and_counters_move(server: ServerProcess) -> None:
    before = metric_samples(server.url)
    httpx.post(server.url + "/v1/translate", json={"text": ["One.", "Two."]})
    httpx.post(server.url + "/v1/translate", json={"text": []})  # 400: no text (an empty one is translated)
    after = metric_samples(server.url)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    model = httpx.get(server.url + "/v1/models").json()["models"][0]["name"]
    assert moved("mtgate_requests_total", route="/v1/translate", method="POST", status="200") == 1
    assert moved("mtgate_requests_total", route="/v1/translate", method="POST", status="400") == 1
    assert moved("mtgate_sentences_total", model=model) == 2
    assert moved("mtgate_input_tokens_total", model=model) > 0
    assert moved("mtgate_output_tokens_total", model=model) > 0
    assert moved("mtgate_batch_compute_seconds_count", model=model) >= 1
    assert after[("mtgate_ready", ())] == 1


def test_browser_translates_on_the_page(server: ServerProcess) -> None:
    sentence = SENTENCES[3]
    expected = httpx.post(server.url + "/v1/translate", json={"text": sentence}).json()["translations"][0]["text"]
    with browser_page() as (page, _):
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        page.fill("#source", sentence)
        page.click("#translate")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=30_000)
        assert page.inner_text("#output").strip() == expected
        assert "tiny-marian" in page.inner_text("#details")


def test_overload_sheds_excess_with_retry_after(tiny_package: Path, translator: Translator) -> None:
    proc = start_server(
        tiny_package,
        "--max-queue-size",
        "4",
        "--max-batch-size",
        "2",
        env={"MTGATE_MAX_SENTENCES_PER_REQUEST": "2", "MTGATE_RETRY_AFTER_S": "3"},
    )
    try:
        texts = [SENTENCES[100 + i % 16] for i in range(40)]
        unique = sorted(set(texts))
        greedy = DecodeOptions(beam_size=1, max_length=16)
        expected = {t: tr.text for t, tr in zip(unique, translator.translate(unique, greedy), strict=True)}
        barrier = threading.Barrier(len(texts))
        results: dict[int, httpx.Response] = {}

        def client(i: int) -> None:
            with httpx.Client(base_url=proc.url, timeout=60) as c:
                barrier.wait()
                results[i] = c.post("/v1/translate", json={"text": texts[i], "beam_size": 1, "max_length": 16})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        refused = [r for r in results.values() if r.status_code == 503]
        accepted = {i: r for i, r in results.items() if r.status_code == 200}
        assert len(refused) + len(accepted) == len(texts), {r.status_code for r in results.values()}
        assert refused and accepted
        assert all(r.headers["retry-after"] == "3" and r.json()["error"]["code"] == "overloaded" for r in refused)
        assert all(r.json()["translations"][0]["text"] == expected[texts[i]] for i, r in accepted.items())
        assert httpx.get(proc.url + "/v2/health/live").status_code == 200
        assert httpx.post(proc.url + "/v1/translate", json={"text": "After the storm."}).status_code == 200
        sys.stderr.write(f"\noverload: {len(accepted)} accepted, {len(refused)} refused with 503\n")
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("batching", ["request", "step"])
def test_sigterm_drains_in_flight_requests_then_exits_0(tiny_package: Path, translator: Translator,
                                                        batching: str) -> None:
    proc = start_server(tiny_package, "--max-batch-size", "1", "--drain-delay", "1.5", "--grace-period", "30",
                        "--batching", batching)
    texts = SENTENCES[120:136]  # 64 sentences one at a time: the 4 requests are still in flight when polled
    expected = [t.text for t in translator.translate(texts, DecodeOptions())]
    results: dict[int, httpx.Response] = {}

    def client(i: int) -> None:
        results[i] = httpx.post(proc.url + "/v1/translate", json={"text": texts}, timeout=60)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    try:
        _drain_scenario(proc, threads, results, expected)
    finally:
        proc.stop()


def _drain_scenario(
    proc: ServerProcess, threads: list[threading.Thread], results: dict[int, httpx.Response], expected: list[str]
) -> None:
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while metric_samples(proc.url).get(("mtgate_inflight_requests", ()), 0) < 4:
        assert time.monotonic() < deadline, "requests never got in flight"
        time.sleep(0.01)
    proc.process.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    late = httpx.post(proc.url + "/v1/translate", json={"text": "Too late."}, timeout=10)
    assert late.status_code == 503 and late.json()["error"]["message"] == "server is shutting down"
    assert httpx.get(proc.url + "/v2/health/ready").status_code == 503
    for t in threads:
        t.join()
    assert [results[i].status_code for i in range(4)] == [200] * 4
    assert all([t["text"] for t in results[i].json()["translations"]] == expected for i in range(4))
    assert proc.process.wait(30) == 0, "".join(proc.log)
    assert any("draining" in line for line in proc.log)


LONE_SURROGATES = ["A \ud800 man is riding.", "\udfff"]


def _escaped(value: Any) -> bytes:
    """JSON with \\uXXXX escapes, as a client sends a lone surrogate (it has no UTF-8 form)."""
    return json.dumps(value, ensure_ascii=True).encode()


@pytest.mark.parametrize("bad", LONE_SURROGATES)
def test_lone_surrogates_are_400_naming_the_sentence_on_every_route(server: ServerProcess, bad: str) -> None:
    name = httpx.get(server.url + "/v1/models").json()["models"][0]["name"]
    json_headers = {"Content-Type": "application/json"}
    for texts in ([bad], ["Hello.", bad, "A good one."]):
        index = texts.index(bad)
        for path in ("/v1/translate", "/v1/translate/stream"):
            r = httpx.post(server.url + path, content=_escaped({"text": texts}), headers=json_headers, timeout=30)
            assert r.status_code == 400, (path, r.text)
            error = r.json()["error"]
            assert error["code"] == "invalid_text" and error["message"].startswith(f"text[{index}] holds a lone"), r.text
        infer = {"inputs": [{"name": "INPUT_TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}]}
        r = httpx.post(f"{server.url}/v2/models/{name}/infer", content=_escaped(infer), timeout=30)
        assert r.status_code == 400 and r.json()["error"].startswith(f"text[{index}] holds a lone"), r.text
    # The binary tensor extension carries bytes: a surrogate's would-be UTF-8 (CESU) bytes are not UTF-8.
    import struct

    element = "A \ud800 man".encode("utf-8", "surrogatepass")
    raw = struct.pack("<I", len(element)) + element
    header = _escaped({"inputs": [{"name": "INPUT_TEXT", "shape": [1, 1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(raw)}}]})
    r = httpx.post(f"{server.url}/v2/models/{name}/infer", content=header + raw,
                   headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["error"], r.text
    # Bulk: the bad line gets its error, the others their translations.
    lines = [_escaped({"text": "Hello.", "id": "a"}), _escaped({"text": bad, "id": "b"}), _escaped("Good day.")]
    r = httpx.post(server.url + "/v1/translate/bulk", content=b"\n".join(lines) + b"\n", timeout=60)
    out = {o["index"]: o for o in map(json.loads, r.text.splitlines())}
    assert r.status_code == 200 and sorted(out) == [0, 1, 2]
    assert out[1]["id"] == "b" and out[1]["error"]["status"] == 400 and out[1]["error"]["code"] == "invalid_text"
    assert out[0]["text"] and out[2]["text"]
    assert httpx.post(server.url + "/v1/translate", json={"text": "Still here."}).status_code == 200
    assert not any("Traceback" in line for line in server.log), "".join(server.log)
