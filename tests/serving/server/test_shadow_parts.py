"""The shadow's parts on their own (``serving.server.shadow``): a pair's scores, the pair log's whole lines and
rotation, and a candidate that fails to load or crashes, behind the real app on a real uvicorn (a fake engine)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path
from typing import Any

import httpx

from serving.engine.errors import InferenceFailed
from serving.server.http import create_app
from serving.server.settings import ServingSettings
from serving.server.shadow import Shadow
from serving.server.shadow.candidate import ChildCandidate
from serving.server.shadow.compare import compare
from serving.server.shadow.log import PairLog, text_hash
from tests.fakes import EchoTranslator
from tests.serving.server.conftest import ROOT, run_app


def test_compare_scores_a_pair_against_production() -> None:
    same = compare("Ein Hund läuft.", "Ein Hund läuft.")
    assert same.identical and same.chrf == 100.0 and same.bleu == 100.0 and same.length_ratio == 1.0
    near = compare("Ein Hund läuft über die Wiese.", "Ein Hund rennt über die Wiese.")
    far = compare("Ein Hund läuft über die Wiese.", "Katze")
    assert not near.identical and 40 < near.chrf < 100 and far.chrf < near.chrf  # type: ignore[operator]
    assert far.bleu is not None and far.bleu < 10
    assert round(far.length_ratio, 3) == round(5 / 30, 3)


def test_pair_log_rotates_within_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "pairs.jsonl"
    log = PairLog(path, max_bytes=4096, max_files=2)
    for i in range(200):
        log.write({"i": i, "text": "x" * 100})
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["pairs.jsonl", "pairs.jsonl.1", "pairs.jsonl.2"]  # the bound: PATH + max_files
    seen = []
    for name in reversed(files):  # oldest first
        data = (path.parent / name).read_bytes()
        assert len(data) <= 4096 and data.endswith(b"\n")
        seen += [json.loads(line)["i"] for line in data.splitlines()]
    assert seen == list(range(seen[0], 200))  # whole lines, in order, the newest kept
    reopened = PairLog(path, max_bytes=4096, max_files=2)  # appends to what is there
    reopened.write({"i": 200})
    reopened.close()
    assert json.loads(path.read_bytes().splitlines()[-1]) == {"i": 200}
    hashed = text_hash("Hund", b"salt")
    assert hashed.startswith("hmac-sha256:") and "Hund" not in hashed and hashed == text_hash("Hund", b"salt")
    assert hashed != text_hash("Hund", b"other") and hashed[len("hmac-sha256:"):] != sha256(b"Hund").hexdigest()


class _Crashing(EchoTranslator):
    def run(self, prepared: Any, on_partial: Any = None) -> Any:
        raise InferenceFailed("the candidate crashed")


@contextmanager
def _server(tmp_path: Path, load: Any, **shadow: Any) -> Iterator[tuple[str, Any]]:
    """The real app with an EchoTranslator as production and a shadow built by ``load``, on a real uvicorn."""
    settings = ServingSettings(model_dirs=[ROOT / "unused"], max_queue_delay_us=1000, shadow=tmp_path,
                               shadow_log=tmp_path / "pairs.jsonl", **shadow)
    app = create_app(settings.model_copy(update={"shadow": None}), EchoTranslator())
    service = app.state.service
    service.shadow = Shadow(settings, service.metrics.registry, service.default_model, load=load)
    with run_app(app) as url:
        yield url, service.shadow


def _wait(url: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while not done(summary := httpx.get(url + "/v1/shadow").json()):
        assert time.monotonic() < deadline, summary
        time.sleep(0.02)
    return summary


def test_a_candidate_that_fails_to_load_or_crashes_leaves_production_alone(tmp_path: Path) -> None:
    def broken() -> Any:
        raise OSError("no candidate here")

    for load, outcome in ((broken, "unavailable"), (_Crashing, "failed")):
        with _server(tmp_path, load) as (url, shadow):
            for _ in range(3):
                r = httpx.post(url + "/v1/translate", json={"text": "a b c"})
                assert r.status_code == 200 and r.json()["translations"][0]["text"] == "C B A"
            summary = _wait(url, lambda s: s["requests"][outcome] == 3)  # noqa: B023
            assert summary["pairs"] == 0 and summary["requests"]["compared"] == 0
            metrics = httpx.get(url + "/metrics").text
            assert f'mtgate_shadow_requests_total{{candidate="{shadow.candidate}",model="echo",outcome="{outcome}"}} 3.0' \
                in metrics
            if outcome == "unavailable":
                assert summary["state"] == "failed" and "no candidate here" in summary["load_error"]
                assert "mtgate_shadow_up{" in metrics and 'model="echo"} 0.0' in metrics
            else:
                assert summary["state"] == "ready"


def test_a_shadow_of_the_fake_engine_compares_and_logs(tmp_path: Path) -> None:
    with _server(tmp_path, EchoTranslator) as (url, _):
        r = httpx.post(url + "/v1/translate", json={"text": ["a b", "c d e"]})
        assert r.status_code == 200
        summary = _wait(url, lambda s: s["pairs"] == 2)
        assert summary["agreement"] == 1.0 and summary["chrf"]["mean"] == 100.0
    lines = (tmp_path / "pairs.jsonl").read_text().splitlines()
    assert [json.loads(line)["candidate_text"] for line in lines] == ["B A", "E D C"]


def test_bulk_lines_are_shadowed_and_the_fraction_samples(tmp_path: Path) -> None:
    with _server(tmp_path, EchoTranslator) as (url, _):
        body = b"".join(json.dumps({"id": i, "text": f"w{i} x"}).encode() + b"\n" for i in range(5))
        r = httpx.post(url + "/v1/translate/bulk", content=body, headers={"Content-Type": "application/x-ndjson"})
        assert r.status_code == 200 and len(r.text.splitlines()) == 5
        assert _wait(url, lambda s: s["pairs"] == 5)["requests"]["sampled"] == 5
    with _server(tmp_path, EchoTranslator, shadow_fraction=0.0) as (url, _):
        for _ in range(5):
            assert httpx.post(url + "/v1/translate", json={"text": "a b"}).status_code == 200
        time.sleep(0.3)
        assert httpx.get(url + "/v1/shadow").json()["requests"]["sampled"] == 0


def test_without_a_shadow_the_summary_is_404(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    app = create_app(ServingSettings(model_dirs=[ROOT / "unused"]), EchoTranslator())
    with TestClient(app) as client:
        r = client.get("/v1/shadow")
    assert r.status_code == 404 and r.json()["error"]["code"] == "shadow_not_configured"


def test_serve_refuses_a_missing_candidate_or_a_bad_fraction_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    for flags, message in ((["--shadow", str(tmp_path / "nothing")], "no such model package directory"),
                           (["--shadow", str(tmp_path), "--shadow-fraction", "2"], "shadow_fraction")):
        done = subprocess.run([sys.executable, "-m", "serving.commands.main", "serve", "-m", str(tmp_path), "--port",
                               "0", *flags], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
            done.stderr


def test_redacted_hashes_are_salted_per_server_unless_a_salt_is_configured(tmp_path: Path) -> None:
    """Two servers without a configured salt hash the same text differently (a guess cannot be checked against a
    log); two given the same MTGATE_SHADOW_REDACT_SALT alike (replicas' logs compare), and as documented."""
    def sources(run: str, **salt: Any) -> list[str]:
        (tmp_path / run).mkdir()
        with _server(tmp_path / run, EchoTranslator, shadow_redact=True, **salt) as (url, _):
            assert httpx.post(url + "/v1/translate", json={"text": "ein Hund"}).status_code == 200
            _wait(url, lambda s: s["pairs"] == 1)
        text = (tmp_path / run / "pairs.jsonl").read_text()
        assert "Hund" not in text and "HUND" not in text
        return [json.loads(line)["source"] for line in text.splitlines()]

    first, second = sources("a"), sources("b")
    assert first[0].startswith("hmac-sha256:") and first != second
    salted = [sources(run, shadow_redact_salt="replicas") for run in ("c", "d")]
    assert salted[0] == salted[1] == [text_hash("ein Hund", b"replicas")]


def test_the_candidates_pid_is_none_until_its_process_runs() -> None:
    """GET /v1/shadow reads the pid at any moment, also while a restart has created the process but not started it
    (that read was a 500)."""
    import multiprocessing

    candidate = ChildCandidate(ROOT / "unused", "onnxruntime", "auto", 1, False)
    assert candidate.pid is None
    candidate._process = multiprocessing.get_context("spawn").Process(target=print)  # created, not started yet
    assert candidate.pid is None


def test_the_candidates_process_runs_at_the_lowest_cpu_priority(tiny_package: Path) -> None:
    """At nice +19 the candidate takes only CPU production leaves: at 3x capacity on one core, +10 still cost
    production 6% of its answers (benchmarks.shadow_overhead --pin), +19 none."""
    import os

    candidate = ChildCandidate(tiny_package, "onnxruntime", "fp32", 1, False)
    candidate.start()
    try:
        assert candidate.pid is not None
        child = os.getpriority(os.PRIO_PROCESS, candidate.pid)
        assert child == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 19)
    finally:
        candidate.close()
