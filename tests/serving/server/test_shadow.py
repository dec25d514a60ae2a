"""Shadow traffic on real servers (``mtgate serve --shadow``): the fp32 demo model in production with, as the
candidate, the int8 demo (nearly the same translations) or a deliberately different package (the demo's fp32 graphs
with greedy decoding cut at 4 tokens in its manifest's decoding defaults: a candidate whose translations differ a
lot). The summary, the metrics and the pair log tell the two apart; production's answers are byte-identical to a
server's without a shadow; a full shadow queue sheds and counts; the log holds whole lines after SIGKILL; redaction
writes no text, only salted hashes; a candidate whose process dies is restarted. The canary: the 4-token candidate
answers (the headers say so) until its process is killed, then production answers, the canary rolls back to 0, and the
candidate's process is restarted."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.server.settings import demo_model
from serving.server.shadow.log import text_hash
from tests.utils.server import ServerProcess, start_server

SENTENCES = [
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two young girls are playing in the sand at the beach.",
    "A dog runs through the green grass.",
    "People are sitting at tables in a busy restaurant.",
    "A woman with a red umbrella walks down the street.",
    "Three children are jumping into a swimming pool.",
]
MODEL = "demo-en-de"


@pytest.fixture(scope="module")
def demo() -> Path:
    package = demo_model()
    if package is None:
        pytest.skip("the bundled demo model is not built (make demo)")
    return package


@pytest.fixture(scope="module")
def different(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's fp32 graphs and tokenizer (hard links, or copies) under a manifest whose decoding defaults are greedy
    and at most 4 tokens: a legitimate package whose translations differ from the demo's."""
    out = tmp_path_factory.mktemp("different") / "package"
    manifest = json.loads((demo / "manifest.json").read_text(encoding="utf-8"))
    manifest["artifacts"] = [a for a in manifest["artifacts"] if (a["runtime"], a["precision"]) == ("onnxruntime", "fp32")]
    keep = {"onnx/encoder.onnx", "onnx/decoder.onnx", *manifest["tokenizer"]["files"].values()}
    manifest["files"] = {name: digest for name, digest in manifest["files"].items() if name in keep}
    manifest["decoding"].update(beam_size=1, max_length=4)
    manifest["version"] = "short"
    for section in ("parity", "quality"):
        manifest.pop(section, None)
    for name in keep:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(demo / name, out / name)
        except OSError:
            (out / name).write_bytes((demo / name).read_bytes())
    (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shadow-logs")


def _serve(demo: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    server = start_server(demo, "--precision", "fp32", *flags, env=env, timeout=180)
    try:
        if "--shadow" in flags:  # the candidate loads beside production, not part of readiness: wait for it
            _shadow_ready(server)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain(demo: Path) -> Iterator[ServerProcess]:
    yield from _serve(demo)


@pytest.fixture(scope="module")
def int8(demo: Path, logs: Path) -> Iterator[ServerProcess]:
    yield from _serve(demo, "--shadow", str(demo), "--shadow-precision", "int8", "--shadow-log", str(logs / "int8.jsonl"),
                      "--grpc-port", "0", env={"MTGATE_SHADOW_PRODUCTION_SCORE": "1"})


@pytest.fixture(scope="module")
def short(demo: Path, different: Path, logs: Path) -> Iterator[ServerProcess]:
    yield from _serve(demo, "--shadow", str(different), "--shadow-log", str(logs / "short.jsonl"), "--shadow-redact",
                      env={"MTGATE_SHADOW_REDACT_SALT": SALT})


SALT = "the replicas' salt"


def _shadow_ready(server: ServerProcess) -> None:
    deadline = time.monotonic() + 120
    while (state := httpx.get(server.url + "/v1/shadow").json()["state"]) != "ready":
        assert state == "loading" and time.monotonic() < deadline, state
        time.sleep(0.05)


def _requests() -> list[tuple[str, dict[str, Any]]]:
    """(path, JSON body): every translating route, one request after the other."""
    infer = {"id": "7", "inputs": [{"name": "INPUT_TEXT", "shape": [2, 1], "datatype": "BYTES",
                                    "data": SENTENCES[4:6]}]}
    return [
        ("/v1/translate", {"text": SENTENCES[0]}),
        ("/v1/translate", {"text": SENTENCES[1:3]}),
        ("/v1/translate/stream", {"text": SENTENCES[3]}),
        (f"/v2/models/{MODEL}/infer", infer),
    ]


PAIRS = 6  # the sentences of _requests()


def _answers(server: ServerProcess) -> list[bytes]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        out = []
        for path, body in _requests():
            r = client.post(path, json=body, headers={"X-Request-ID": f"req-{len(out)}"})
            assert r.status_code == 200, r.text
            out.append(r.content)
        return out


def _summary(server: ServerProcess, pairs: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (summary := httpx.get(server.url + "/v1/shadow").json())["pairs"] < pairs:
        assert time.monotonic() < deadline, json.dumps(summary)
        time.sleep(0.05)
    return summary


def _metric(text: str, name: str, **labels: str) -> float:
    pattern = re.compile(rf"^{name}\{{(.*)\}} (\S+)$", re.M)
    for found in pattern.finditer(text):
        have = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(found.group(2))
    raise AssertionError(f"no {name} {labels} in /metrics")


def test_the_summary_metrics_and_log_tell_a_close_candidate_from_a_different_one(
    plain: ServerProcess, int8: ServerProcess, short: ServerProcess, logs: Path
) -> None:
    expected = _answers(plain)
    assert _answers(int8) == expected  # production answers byte for byte as without a shadow
    assert _answers(short) == expected
    close, far = _summary(int8, PAIRS), _summary(short, PAIRS)
    assert close["candidate"].startswith("demo-en-de@") and close["candidate"].endswith("/int8"), close["candidate"]
    assert far["candidate"] == "demo-en-de@short/fp32", far["candidate"]
    for summary in (close, far):
        assert summary["state"] == "ready" and summary["requests"]["compared"] == 4 and summary["pairs"] == PAIRS
        assert summary["scorer"].startswith("sacrebleu")
        assert summary["latency_seconds"]["production"]["count"] == 4
        assert summary["latency_seconds"]["candidate"]["count"] == 4
    # the int8 demo agrees with fp32 on most sentences; the 4-token candidate on none
    assert close["agreement"] >= 0.5 and close["chrf"]["mean"] > 90 and close["bleu"]["mean"] > 80
    assert far["agreement"] == 0 and far["chrf"]["mean"] < 50 and far["length_ratio"]["mean"] < 0.6
    assert len(far["worst"]) == 5 and far["worst"][0]["chrf"] <= far["worst"][-1]["chrf"]
    # cross-likelihood: the int8 candidate finds production's translations about as likely as its own
    def gap(summary: dict[str, Any], scorer: str, own: str, other: str) -> float:
        cross = summary["cross_likelihood"]
        return abs(cross[f"{scorer}_{own}_mean_log_prob"]["mean"] - cross[f"{scorer}_{other}_mean_log_prob"]["mean"])

    assert gap(close, "candidate", "own", "on_production") < 0.2 < gap(far, "candidate", "own", "on_production")
    # and, with MTGATE_SHADOW_PRODUCTION_SCORE, production finds the int8 candidate's about as likely as its own
    assert gap(close, "production", "own", "on_candidate") < 0.2
    assert close["cross_likelihood"]["production_on_candidate_mean_log_prob"]["count"] == PAIRS
    assert "production_own_mean_log_prob" not in far["cross_likelihood"]  # not asked for there

    close_metrics, far_metrics = httpx.get(int8.url + "/metrics").text, httpx.get(short.url + "/metrics").text
    for text, summary in ((close_metrics, close), (far_metrics, far)):
        labels = {"model": MODEL, "candidate": summary["candidate"]}
        assert _metric(text, "mtgate_shadow_pairs_total", **labels) == PAIRS
        assert _metric(text, "mtgate_shadow_identical_pairs_total", **labels) == summary["identical"]
        assert _metric(text, "mtgate_shadow_requests_total", **labels, outcome="compared") == 4
        assert _metric(text, "mtgate_shadow_chrf_count", **labels) == PAIRS
        assert _metric(text, "mtgate_shadow_latency_seconds_count", **labels, side="production") == 4
        assert _metric(text, "mtgate_shadow_up", **labels) == 1
        assert _metric(text, "mtgate_shadow_mean_log_prob_count", **labels, scorer="candidate",
                        translation="production") == PAIRS
    assert _metric(close_metrics, "mtgate_shadow_mean_log_prob_count", scorer="production", translation="candidate") \
        == PAIRS
    assert _metric(close_metrics, "mtgate_shadow_chrf_sum") > 2 * _metric(far_metrics, "mtgate_shadow_chrf_sum")

    # the pair logs: one whole line per pair; texts in the int8 one, hashes only in the redacted one
    close_log = [json.loads(line) for line in (logs / "int8.jsonl").read_text(encoding="utf-8").splitlines()]
    far_text = (logs / "short.jsonl").read_text(encoding="utf-8")
    far_log = [json.loads(line) for line in far_text.splitlines()]
    assert len(close_log) == len(far_log) == PAIRS
    assert [r["source"] for r in close_log] == SENTENCES
    assert close_log[0]["request_id"] == "req-0" and close_log[0]["production_text"] in expected[0].decode()
    assert all(r["source"].startswith("hmac-sha256:") and r["candidate_text"].startswith("hmac-sha256:")
               for r in far_log)
    assert [r["source"] for r in far_log] == [text_hash(t, SALT.encode()) for t in SENTENCES]  # the configured salt
    for sentence in SENTENCES:
        assert sentence not in far_text and sentence.split()[-1].strip(".") not in far_text
    for record in far_log:
        assert not record["identical"] and record["chrf"] < 60
    for worst in far["worst"]:  # the summary of a redacted shadow shows hashes too
        assert worst["source"].startswith("hmac-sha256:") and worst["production_text"].startswith("hmac-sha256:")


def test_grpc_requests_are_shadowed(int8: ServerProcess) -> None:
    """(After the comparison test, which counts the pairs of the HTTP routes.)"""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    import numpy as np

    before = httpx.get(int8.url + "/v1/shadow").json()["pairs"]
    tensor = grpcclient.InferInput("INPUT_TEXT", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t] for t in SENTENCES[:2]], dtype=object))
    result = grpcclient.InferenceServerClient(int8.grpc_address).infer(MODEL, [tensor], request_id="g1")
    assert result.as_numpy("OUTPUT_TEXT") is not None
    summary = _summary(int8, before + 2)
    assert summary["pairs"] == before + 2 and summary["requests"]["failed"] == 0


def test_a_full_shadow_queue_sheds_and_counts_and_the_log_has_whole_lines_after_sigkill(
    plain: ServerProcess, demo: Path, different: Path, tmp_path: Path
) -> None:
    log = tmp_path / "pairs.jsonl"
    server = start_server(demo, "--precision", "fp32", "--shadow", str(different), "--shadow-log", str(log),
                          "--shadow-queue-size", "1", timeout=180)
    try:
        _shadow_ready(server)
        _sheds(plain, server)
        _killed_while_logging(server, log)
    finally:
        server.stop()


def _sheds(plain: ServerProcess, server: ServerProcess) -> None:
    """A burst of requests: the shadow queue (1) sheds most of them, counted; production answers them all as a
    server without a shadow."""
    bodies = [{"text": SENTENCES[i % len(SENTENCES)]} for i in range(24)]

    def post(url: str, body: dict[str, Any]) -> tuple[int, list[str]]:
        r = httpx.post(url + "/v1/translate", json=body, timeout=60)
        return r.status_code, [t["text"] for t in r.json()["translations"]]

    with ThreadPoolExecutor(12) as pool:
        shadowed = list(pool.map(lambda b: post(server.url, b), bodies))
    expected = [post(plain.url, b) for b in bodies]
    # (the texts: a score's last digits depend on which requests were batched together, with or without a shadow)
    assert shadowed == expected and all(status == 200 for status, _ in shadowed)
    deadline = time.monotonic() + 60
    while (after := httpx.get(server.url + "/v1/shadow").json()["requests"])["compared"] + after["shed"] < 24:
        assert time.monotonic() < deadline, after
        time.sleep(0.05)
    assert after["sampled"] == 24 and after["shed"] > 0 and after["failed"] == after["unavailable"] == 0
    metrics = httpx.get(server.url + "/metrics").text
    assert _metric(metrics, "mtgate_shadow_requests_total", model=MODEL, outcome="shed") == after["shed"]
    assert _metric(metrics, "mtgate_shadow_requests_total", model=MODEL, outcome="compared") == after["compared"]


def _killed_while_logging(server: ServerProcess, log: Path) -> None:
    """Requests keep the shadow writing its log when the server is killed (SIGKILL): only whole lines remain."""
    stop = threading.Event()
    start = log.read_bytes().count(b"\n")

    def load() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not stop.is_set():
                try:
                    client.post("/v1/translate", json={"text": SENTENCES})
                except httpx.HTTPError:
                    return

    clients = [threading.Thread(target=load, daemon=True) for _ in range(3)]
    try:
        for thread in clients:
            thread.start()
        deadline = time.monotonic() + 60
        while log.read_bytes().count(b"\n") < start + 30:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
    data = log.read_bytes()
    assert data.endswith(b"\n")
    records = [json.loads(line) for line in data.splitlines()]
    assert len(records) >= start + 30 and {r["source"] for r in records} <= set(SENTENCES)


def test_a_candidate_whose_process_dies_is_counted_restarted_and_production_answers_as_before(
    plain: ServerProcess, short: ServerProcess
) -> None:
    """(After the comparison test: it kills ``short``'s candidate.)"""
    pid = httpx.get(short.url + "/v1/shadow").json()["pid"]
    assert pid and pid != short.process.pid
    os.kill(pid, signal.SIGKILL)
    assert _answers(short) == _answers(plain)
    deadline = time.monotonic() + 120
    while (summary := httpx.get(short.url + "/v1/shadow").json())["state"] != "ready" or summary["pid"] == pid:
        assert summary["state"] in ("ready", "restarting") and time.monotonic() < deadline, json.dumps(summary)
        time.sleep(0.05)
    assert summary["restarts"] == 1 and "died" in summary["load_error"] and summary["pid"] != pid
    assert summary["requests"]["failed"] == 1  # the request it died on (or would have got next)
    assert short.process.poll() is None and httpx.get(short.url + "/v2/health/ready").status_code == 200
    metrics = httpx.get(short.url + "/metrics").text
    assert _metric(metrics, "mtgate_shadow_restarts_total", model=MODEL) == 1
    assert _metric(metrics, "mtgate_shadow_up", model=MODEL) == 1
    assert any("restarting it in 1 s (restart 1" in line for line in short.log)
    before = summary["pairs"]
    assert _answers(short) == _answers(plain)
    assert _summary(short, before + PAIRS)["requests"]["failed"] == 1  # the restarted candidate compares again


def test_canary_answers_from_the_candidate_falls_back_when_it_dies_and_rolls_back(
    plain: ServerProcess, demo: Path, different: Path
) -> None:
    server = start_server(demo, "--precision", "fp32", "--shadow", str(different), "--shadow-fraction", "0",
                          "--canary-fraction", "1.0", "--canary-window", "3", "--canary-min-requests", "3",
                          "--canary-max-error-rate", "0.5", "--grpc-port", "0", timeout=180)
    try:
        _shadow_ready(server)
        body = {"text": SENTENCES[0]}
        expected = httpx.post(plain.url + "/v1/translate", json=body, timeout=60).json()["translations"][0]["text"]
        for _ in range(3):  # the 4-token candidate answers
            r = httpx.post(server.url + "/v1/translate", json=body, timeout=60)
            assert r.status_code == 200 and r.headers["x-mtgate-answered-by"] == "candidate"
            assert r.headers["x-mtgate-answered-model"] == "demo-en-de@short/fp32"
            text = r.json()["translations"][0]["text"]
            assert text != expected and len(text.split()) <= 4
        assert _grpc_answered_by(server) == ("candidate", "demo-en-de@short/fp32")
        pid = httpx.get(server.url + "/v1/shadow").json()["pid"]
        os.kill(pid, signal.SIGKILL)
        for _ in range(3):  # it died: production answers, no error; 2 failures of the last 3 (> 0.5) roll it back
            r = httpx.post(server.url + "/v1/translate", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["translations"][0]["text"] == expected
            assert r.headers["x-mtgate-answered-by"] == "production"
        shadow = httpx.get(server.url + "/v1/shadow").json()
        canary = shadow["canary"]
        assert canary["state"] == "rolled_back" and canary["fraction"] == 0 and "error rate" in canary["reason"]
        assert canary["requests"] == {"sampled": 6, "candidate": 4, "fallback": 2}  # the last: not sampled
        metrics = httpx.get(server.url + "/metrics").text
        assert _metric(metrics, "mtgate_canary_fraction", model=MODEL) == 0
        assert _metric(metrics, "mtgate_canary_rollbacks_total", model=MODEL) == 1
        assert _metric(metrics, "mtgate_canary_requests_total", model=MODEL, outcome="fallback") == 2
        deadline = time.monotonic() + 30  # (stderr is read by a thread of its own: the line may still be on its way)
        while not (rollbacks := [line for line in server.log if "canary rolled back to 0" in line]):
            assert time.monotonic() < deadline, "".join(server.log[-20:])
            time.sleep(0.05)
        assert len(rollbacks) == 1 and "error rate" in rollbacks[0]
        deadline = time.monotonic() + 120  # the candidate comes back, the canary stays rolled back
        while (shadow := httpx.get(server.url + "/v1/shadow").json())["state"] != "ready":
            assert time.monotonic() < deadline, json.dumps(shadow)
            time.sleep(0.05)
        r = httpx.post(server.url + "/v1/translate", json=body, timeout=60)
        assert r.headers["x-mtgate-answered-by"] == "production" and shadow["canary"]["state"] == "rolled_back"
    finally:
        server.stop()


def _grpc_answered_by(server: ServerProcess) -> tuple[str, str]:
    """A gRPC ModelInfer's trailing metadata: who answered, and which model."""
    grpc = pytest.importorskip("grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=MODEL, inputs=[service_pb2.ModelInferRequest.InferInputTensor(
        name="INPUT_TEXT", datatype="BYTES", shape=[1, 1],
        contents=service_pb2.InferTensorContents(bytes_contents=[SENTENCES[1].encode()]))])
    with grpc.insecure_channel(server.grpc_address) as channel:
        _, call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.with_call(request, timeout=60)
    metadata = dict(call.trailing_metadata())
    return metadata["x-mtgate-answered-by"], metadata["x-mtgate-answered-model"]
