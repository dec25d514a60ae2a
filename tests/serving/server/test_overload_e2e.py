"""Deadline-aware admission and scheduling (issue 34) in a real ``mtgate serve`` process on the tiny Marian package:
behind a backlog, a request that would miss its deadline is refused at once with 503 and a Retry-After, and never
computed; every request's sentences run in one batch; no sentence is computed after its request's deadline; a
request that the learned rate says cannot finish in time fails before it is computed."""

from __future__ import annotations

import gzip
import threading
import time
from pathlib import Path

import httpx

from serving.engine.translator import DecodeOptions, Translator
from serving.server.settings import DEFAULT_MODEL_DIR
from tests.serving.server.test_server_e2e import metric_samples
from tests.utils.marian_factory import corpus
from tests.utils.server import ServerProcess, start_server

SENTENCES = corpus("en")
MULTI30K = Path(__file__).resolve().parents[3] / "tests" / "data" / "multi30k" / "test_2016_flickr.en.gz"


def batch_log(proc: ServerProcess) -> list[dict[str, str]]:
    """The fields of every batch the server logged (``request_ids``, ``infer_ms``, ``padded_tokens``, ...)."""
    return [dict(part.split("=", 1) for part in line[line.index("batch model=") :].split() if "=" in part)
            for line in list(proc.log) if "batch model=" in line]


def wait_for_batches(proc: ServerProcess, count: int) -> None:
    """Until the log lines of ``count`` batches were read (the server may log a batch after it answered)."""
    deadline = time.monotonic() + 10
    while len(batch_log(proc)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} batches logged: {batch_log(proc)}"
        time.sleep(0.01)


def batch_requests(proc: ServerProcess) -> list[list[str]]:
    """The request ids of every batch the server logged."""
    return [[rid for rid in fields.get("request_ids", "").split(",") if rid] for fields in batch_log(proc)]


def translations(response: httpx.Response) -> list[tuple[str, int]]:
    return [(t["text"], t["output_tokens"]) for t in response.json()["translations"]]


def metric(proc: ServerProcess, name: str) -> float:
    return sum(value for (sample, _), value in metric_samples(proc.url).items() if sample == name)


def test_behind_a_backlog_late_requests_are_refused_and_the_rest_run_whole(tiny_onnx_package: Path) -> None:
    proc = start_server(tiny_onnx_package, "--max-batch-size", "4")
    try:
        with httpx.Client(base_url=proc.url, timeout=120) as http:
            for i in range(3):  # the server times its own batches (of 3: requests of 3 never fill 4)
                r = http.post("/v1/translate", json={"text": SENTENCES[3 * i : 3 * i + 3], "max_length": 32},
                              headers={"X-Request-ID": f"warm{i}"})
                assert r.status_code == 200, r.text
        results: dict[str, httpx.Response] = {}

        def client(rid: str, texts: list[str]) -> None:
            results[rid] = httpx.post(proc.url + "/v1/translate", json={"text": texts, "max_length": 32},
                                      headers={"X-Request-ID": rid}, timeout=120)

        backlog = [threading.Thread(target=client, args=(f"bg{i}", SENTENCES[10 + 3 * i : 13 + 3 * i]))
                   for i in range(8)]
        for thread in backlog:
            thread.start()
        deadline = time.monotonic() + 30
        while metric(proc, "mtgate_queue_depth") < 9:  # at least 3 batches queued
            assert time.monotonic() < deadline and any(t.is_alive() for t in backlog), "no backlog formed"
            time.sleep(0.005)
        asked = time.monotonic()
        refused = httpx.post(proc.url + "/v1/translate", json={"text": SENTENCES[:3], "timeout_ms": 1},
                             headers={"X-Request-ID": "late"}, timeout=30)
        answered_s = time.monotonic() - asked
        for thread in backlog:
            thread.join(120)

        # Refused at once by the estimate (not a 504 once its deadline passed in the queue), told when to come back.
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded", refused.text
        assert "deadline" in refused.json()["error"]["message"] and int(refused.headers["retry-after"]) >= 1
        assert answered_s < 5
        # The backlog ran (on a machine slow enough, its last requests may be refused by the same estimate: never
        # computed), each request's 3 sentences together: batches of 4 formed by cost would pull requests apart.
        statuses = {rid: r.status_code for rid, r in results.items()}
        assert set(statuses.values()) <= {200, 503} and list(statuses.values()).count(200) >= 4, statuses
        wait_for_batches(proc, 3 + list(statuses.values()).count(200))  # one batch per request
        batches = batch_requests(proc)
        for rid, status in statuses.items():
            assert sum(rid in ids for ids in batches) == (status == 200), (rid, status, batches)
        assert not any("late" in ids for ids in batches)  # never computed
        assert metric(proc, "mtgate_late_sentences_total") == 0
        assert metric(proc, "mtgate_dropped_sentences_total") >= 3
    finally:
        assert proc.stop() == 0, "".join(proc.log)


def test_a_request_the_learned_rate_says_cannot_finish_in_time_is_not_computed(tiny_onnx_package: Path) -> None:
    """On an idle server (nothing queued: admission lets it in) a request whose own compute, at the rate the server
    learned from its batches, would end after its deadline fails with 504 before it runs (it used to be computed)."""
    proc = start_server(tiny_onnx_package, "--max-batch-size", "4")
    long_text = " ".join(SENTENCES[:3])  # about 100 tokens of the 128 the tiny model takes
    try:
        with httpx.Client(base_url=proc.url, timeout=120) as http:
            for i, text in enumerate(SENTENCES[:5]):  # one at a time: batches of 1
                r = http.post("/v1/translate", json={"text": text, "max_length": 32}, headers={"X-Request-ID": f"w{i}"})
                assert r.status_code == 200, r.text
            wait_for_batches(proc, 5)
            warm = batch_log(proc)
            assert len(warm) == 5 and all(fields["batch_size"] == "1" for fields in warm), warm
            # The learned rate is a decayed mean of these batches' seconds per source token: at least their least.
            # The long text costs its 3 sentences' tokens (one EOS instead of three).
            least = min(float(fields["infer_ms"]) / int(fields["padded_tokens"]) for fields in warm)
            cost = sum(int(fields["padded_tokens"]) for fields in warm[:3]) - 2
            timeout_ms = max(20, int(0.5 * least * cost))
            doomed = http.post("/v1/translate", json={"text": long_text, "max_length": 32, "timeout_ms": timeout_ms},
                               headers={"X-Request-ID": "doomed"})
            assert doomed.status_code == 504 and "not computed" in doomed.json()["error"]["message"], doomed.text
            assert http.post("/v1/translate", json={"text": SENTENCES[7]}).status_code == 200
        wait_for_batches(proc, 6)  # the last request's, logged after the doomed one's would have been
        assert not any("doomed" in ids for ids in batch_requests(proc))
        assert metric(proc, "mtgate_late_sentences_total") == 0
    finally:
        assert proc.stop() == 0, "".join(proc.log)


def test_a_request_whose_deadline_passes_while_its_batch_decodes_stops_there() -> None:
    """A batch started in time can still outlast a request's deadline (a machine slowed under it): the engine stops
    that request's sentences between decoder steps (504, counted ``abandoned``, never late) and the batch's other
    sentences get the translation they get alone. (No batch ran before: the server has no learned rate, so nothing
    refuses or drops the request before its batch starts.)"""
    with gzip.open(MULTI30K, "rt", encoding="utf-8") as f:  # paragraphs of 5 sentences: the demo's long batches
        lines = f.read().splitlines()[:40]
    paragraphs = [" ".join(lines[i : i + 5]) for i in range(0, 40, 5)]
    options = DecodeOptions(beam_size=4)
    expected = [(t.text, t.output_tokens) for t in
                Translator.load(DEFAULT_MODEL_DIR, precision="fp32", threads=1).translate(paragraphs[:6], options)]
    proc = start_server(DEFAULT_MODEL_DIR, "--max-queue-delay-us", "100000", "--precision", "fp32")
    try:
        results: dict[str, httpx.Response] = {}

        def client(rid: str, texts: list[str], timeout_ms: int | None = None) -> None:
            results[rid] = httpx.post(proc.url + "/v1/translate", headers={"X-Request-ID": rid}, timeout=120,
                                      json={"text": texts, "beam_size": 4, "timeout_ms": timeout_ms})

        # Queued 100 ms for a fuller batch, then in one batch with the long request (about a second of beam search
        # on 8 paragraphs): its deadline passes inside the batch.
        short = threading.Thread(target=client, args=("short", paragraphs[6:8], 300))
        short.start()
        time.sleep(0.02)
        client("long", paragraphs[:6])
        short.join(120)
        wait_for_batches(proc, 1)
        assert batch_requests(proc) == [["long", "short"]]  # computing started in time
        assert results["short"].status_code == 504, results["short"].text
        assert results["long"].status_code == 200, results["long"].text
        assert translations(results["long"]) == expected
        assert metric(proc, "mtgate_late_sentences_total") == 0
        stopped = sum(value for (name, labels), value in metric_samples(proc.url).items()
                      if name == "mtgate_dropped_sentences_total" and ("reason", "abandoned") in labels)
        assert stopped == 2, metric_samples(proc.url)
    finally:
        assert proc.stop() == 0, "".join(proc.log)
