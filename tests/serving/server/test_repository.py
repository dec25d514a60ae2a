"""`mtgate serve --model-repository DIR`: Triton's layout DIR/<name>/<version>/, the latest version served; a new
version switches in under load without a failed request; explicit load and unload over HTTP and gRPC."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.utils.server import start_server

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")

NAME = "tiny"


def _place(package: Path, repository: Path, version: int) -> None:
    """Copy a package in as ``version``, atomically: the server never sees half a package."""
    staging = repository / NAME / f".incoming-{version}"
    shutil.copytree(package, staging)
    os.rename(staging, repository / NAME / str(version))


def _infer(client: object, text: str) -> str:
    tensor = tritonhttp.InferInput("INPUT_TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text]], dtype=object))
    result = client.infer(NAME, [tensor])  # type: ignore[attr-defined]
    return str(result.get_response()["model_version"])


def test_a_new_version_switches_in_under_load(tiny_package: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / NAME).mkdir(parents=True)
    _place(tiny_package, repository, 1)
    server = start_server(None, "--model-repository", str(repository), "--repository-poll-secs", "0.5",
                          "--grpc-port", "0")
    try:
        assert httpx.post(server.url + "/v2/repository/index").json() == [
            {"name": NAME, "version": "1", "state": "READY"}]
        seen: list[list[str]] = [[], []]
        failures: list[BaseException] = []
        stop = threading.Event()

        def load(k: int) -> None:
            client = tritonhttp.InferenceServerClient(server.address)
            i = 0
            while not stop.is_set():
                try:
                    seen[k].append(_infer(client, f"A dog number {i} runs."))
                except BaseException as e:  # noqa: BLE001 - every failure counts
                    failures.append(e)
                i += 1
            client.close()

        threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()

        def wait_for(done: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 30
            while not done() and not failures and time.monotonic() < deadline:
                time.sleep(0.05)
            assert done() or failures, f"{what} within 30 s: {[v[-3:] for v in seen]}\n" + "".join(server.log)

        # Load on version 1 first: both clients answered several times (a steady stream, not a warm-up).
        wait_for(lambda: all(len(v) >= 10 for v in seen), "10 answers per client from version 1")
        _place(tiny_package, repository, 2)  # the poll finds it, loads and warms it, switches
        # Load across the whole switch: version 2 loads and warms beside version 1, takes the new requests, version 1
        # drains what it admitted and stops (the last step of a switch) ...
        wait_for(lambda: all(v[-1:] == ["2"] for v in seen) and any(
            f"model {NAME} version 1 stopped" in line for line in server.log), "the switch to version 2")
        # ... then on through four more polls (0.5 s each), which must leave the choice as it is.
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(60)
        assert failures == [], failures[:3]
        for versions in seen:  # each client: version 1, then version 2, never back
            assert versions and versions[0] == "1" and versions[-1] == "2", versions[:3]
            switch = versions.index("2")
            assert set(versions[switch:]) == {"2"}, versions
        assert sum(len(v) for v in seen) > 50
        log = "".join(server.log)
        assert "model tiny serving version(s) 2; version(s) 1 retire" in log

        # the retired version is listed as Triton lists it, and leaves /metrics
        assert httpx.post(server.url + "/v2/repository/index").json() == [
            {"name": NAME, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": NAME, "version": "2", "state": "READY"}]
        served = _series(httpx.get(server.url + "/metrics").text, NAME)
        assert served["mtgate_model_info"] == {"2"} and served["nv_inference_request_success"] == {"2"}

        # polled: the directories decide, so explicit load and unload are refused (as Triton refuses them)
        client = tritonhttp.InferenceServerClient(server.address)
        grpc = tritongrpc.InferenceServerClient(server.grpc_address)
        for call in (client.unload_model, client.load_model, grpc.unload_model, grpc.load_model):
            with pytest.raises((tritonhttp.InferenceServerException, tritongrpc.InferenceServerException),
                               match="not allowed if polling is enabled") as refused:
                call(NAME)
            assert refused.value.status() in ("503", "StatusCode.UNAVAILABLE")
        time.sleep(1.5)  # three polls later: still served
        assert _infer(client, "A cat.") == "2"
        grpc.close()
        client.close()
    finally:
        assert server.stop() == 0, "".join(server.log)


def _series(text: str, model: str) -> dict[str, set[str]]:
    """Metric name -> the versions of ``model`` it has series for."""
    found: dict[str, set[str]] = {}
    for name, labels in re.findall(r"^(\w+)\{([^\n]*)\} \S+$", text, re.MULTILINE):
        if f'model="{model}"' in labels and (version := re.search(r'version="([^"]*)"', labels)):
            found.setdefault(name, set()).add(version.group(1))
    return found


def test_an_empty_repository_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.utils.server import ROOT

    proc = subprocess.run([sys.executable, "-m", "serving.commands.main", "serve", "--model-repository", str(tmp_path),
                           "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no model in it" in lines[0], proc.stderr


def test_the_version_policy_serves_several_versions(tiny_package: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / NAME).mkdir(parents=True)
    for version in (1, 2, 3):
        _place(tiny_package, repository, version)
    server = start_server(None, "--model-repository", str(repository), "--repository-version-policy", "latest:2")
    try:
        index = httpx.post(server.url + "/v2/repository/index").json()
        assert [(m["name"], m["version"], m["state"]) for m in index] == [(NAME, "2", "READY"), (NAME, "3", "READY")]
        client = tritonhttp.InferenceServerClient(server.address)
        tensor = tritonhttp.InferInput("INPUT_TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([["A dog."]], dtype=object))
        assert client.infer(NAME, [tensor]).get_response()["model_version"] == "3"  # no version: the newest
        assert client.infer(NAME, [tensor], model_version="2").get_response()["model_version"] == "2"
        with pytest.raises(tritonhttp.InferenceServerException, match="unknown model"):
            client.infer(NAME, [tensor], model_version="1")  # not chosen by latest:2
        assert client.is_model_ready(NAME, model_version="2") and not client.is_model_ready(NAME, model_version="1")
        stats = client.get_inference_statistics(NAME)["model_stats"]  # one entry per served version, as Triton's
        assert [(s["version"], s["inference_stats"]["success"]["count"]) for s in stats] == [("2", 1), ("3", 1)]
        assert client.get_inference_statistics(NAME, model_version="2")["model_stats"] == stats[:1]
        _place(tiny_package, repository, 4)
        client.load_model(NAME)  # an explicit load rescans: 3 and 4 served, 2 retires
        assert [(m["version"], m["state"]) for m in httpx.post(server.url + "/v2/repository/index").json()] == [
            ("2", "UNAVAILABLE"), ("3", "READY"), ("4", "READY")]
        assert client.infer(NAME, [tensor], model_version="3").get_response()["model_version"] == "3"
        assert httpx.post(server.url + "/v1/translate", json={"text": "A dog."}).json()["version"] == "4"
        client.close()
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_a_bad_version_policy_is_one_line(tiny_package: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.utils.server import ROOT

    (tmp_path / NAME).mkdir()
    _place(tiny_package, tmp_path, 1)
    proc = subprocess.run([sys.executable, "-m", "serving.commands.main", "serve", "--model-repository", str(tmp_path),
                           "--repository-version-policy", "newest", "--port", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "latest:N" in lines[0], proc.stderr


def _place_broken(package: Path, repository: Path, name: str, version: int, outside: Path) -> str:
    """A copy of ``package`` as ``name`` ``version`` whose first listed file is a symlink out of the package (what the
    loader refuses); returns that file."""
    staging = repository / name / f".incoming-{version}"
    shutil.copytree(package, staging)
    listed = sorted(json.loads((staging / "manifest.json").read_text(encoding="utf-8"))["files"])[0]
    outside.mkdir(parents=True, exist_ok=True)
    target = outside / f"{name}-{version}"
    shutil.move(staging / listed, target)
    os.symlink(target, staging / listed)
    os.rename(staging, repository / name / str(version))
    return listed


def _index(server: object) -> list[dict[str, str]]:
    return httpx.post(server.url + "/v2/repository/index").json()  # type: ignore[attr-defined]


def _wait(condition: object, what: str, server: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: {_index(server)}\n" + "".join(server.log)  # type: ignore[attr-defined]
        time.sleep(0.1)


def test_a_broken_package_beside_good_ones_in_a_polled_repository(tiny_package: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / NAME).mkdir(parents=True)
    _place(tiny_package, repository, 1)
    server = start_server(None, "--model-repository", str(repository), "--repository-poll-secs", "0.3")
    try:
        # a broken model sorted before the others, a new model and a new version, all in one poll's reach
        (repository / "broken").mkdir()
        (repository / "other").mkdir()
        listed = _place_broken(tiny_package, repository, "broken", 1, tmp_path / "elsewhere")
        shutil.copytree(tiny_package, repository / "other" / ".incoming")
        os.rename(repository / "other" / ".incoming", repository / "other" / "1")
        _place(tiny_package, repository, 2)

        def others_loaded() -> bool:
            ready = {(m["name"], m.get("version")) for m in _index(server) if m.get("state") == "READY"}
            return {("other", "1"), (NAME, "2")} <= ready

        _wait(others_loaded, "the good model and version were not loaded beside the broken one", server)
        time.sleep(1.5)  # five more polls
        index = _index(server)
        [broken] = [m for m in index if m["name"] == "broken"]
        assert broken["version"] == "1" and broken["state"] == "UNAVAILABLE", index
        assert "failed to load 'broken' version 1" in broken["reason"], broken
        assert f"{listed}: resolves outside the package" in broken["reason"], broken
        log = "".join(server.log)
        assert "Traceback" not in log, log
        assert len([line for line in server.log if "failed to load 'broken'" in line]) == 1, log  # once, not per poll

        # repaired: the next poll sees its files change and loads it
        link = repository / "broken" / "1" / listed
        target = link.resolve()
        link.unlink()
        shutil.copyfile(target, link)
        _wait(lambda: {"name": "broken", "version": "1", "state": "READY"} in _index(server),
              "the repaired package was not loaded", server)

        # a model whose directory is gone is unloaded by the poll (the directories decide)
        shutil.rmtree(repository / "other")
        _wait(lambda: "other" not in {m["name"] for m in _index(server)}, "the removed model was not unloaded",
              server)
        response = httpx.post(server.url + "/v2/models/other/infer", json={
            "inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [1], "data": ["A dog."]}]})
        assert response.status_code == 404, response.text
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_explicit_model_control_over_http_and_grpc(tiny_package: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / NAME).mkdir(parents=True)
    for version in (1, 2):
        _place(tiny_package, repository, version)
    server = start_server(None, "--model-repository", str(repository), "--grpc-port", "0")
    client = tritonhttp.InferenceServerClient(server.address)
    grpc = tritongrpc.InferenceServerClient(server.grpc_address)
    try:
        assert "model_repository" in client.get_server_metadata()["extensions"]
        assert "model_repository" in grpc.get_server_metadata().extensions
        assert _series(httpx.get(server.url + "/metrics").text, NAME)["mtgate_model_info"] == {"2"}

        # an unloaded model stays in the index, UNAVAILABLE, and leaves /metrics
        client.unload_model(NAME)
        unloaded = [{"name": NAME, "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}]
        assert _index(server) == unloaded
        assert grpc.get_model_repository_index(as_json=True)["models"] == unloaded
        assert _series(httpx.get(server.url + "/metrics").text, NAME) == {}
        with pytest.raises(tritonhttp.InferenceServerException, match="unknown model"):
            _infer(client, "A cat.")
        client.load_model(NAME)
        assert _infer(client, "A cat.") == "2"

        # a config override of the version policy is applied ...
        client.load_model(NAME, config=json.dumps({"version_policy": {"specific": {"versions": [1, 2]}}}))
        assert [(m["version"], m["state"]) for m in _index(server)] == [("1", "READY"), ("2", "READY")]
        assert grpc.is_model_ready(NAME, model_version="1")
        # ... one mtgate cannot apply is refused with the reason, and nothing changes
        with pytest.raises(tritonhttp.InferenceServerException, match="max_batch_size cannot be overridden") as e:
            client.load_model(NAME, config=json.dumps({"max_batch_size": 8}))
        assert e.value.status() == "400"
        with pytest.raises(tritongrpc.InferenceServerException, match="version_policy") as e:
            grpc.load_model(NAME, config=json.dumps({"version_policy": {"newest": {}}}))
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(tritonhttp.InferenceServerException, match="model files sent with the request") as e:
            client.load_model(NAME, config="{}", files={"file:1/model.onnx": b"\0"})
        assert e.value.status() == "501"
        assert [(m["version"], m["state"]) for m in _index(server)] == [("1", "READY"), ("2", "READY")]
        grpc.load_model(NAME)  # without a config: the server's policy again (latest:1), version 1 retires
        assert [(m["version"], m["state"]) for m in _index(server)] == [("1", "UNAVAILABLE"), ("2", "READY")]

        grpc.unload_model(NAME)
        assert not grpc.is_model_ready(NAME)
        grpc.load_model(NAME)
        assert grpc.is_model_ready(NAME, model_version="2")
        with pytest.raises(tritongrpc.InferenceServerException, match="no model 'nope'"):
            grpc.load_model("nope")

        # a model placed after the start is listed by name until it is loaded
        (repository / "fresh").mkdir()
        shutil.copytree(tiny_package, repository / "fresh" / "1")
        assert {"name": "fresh"} in _index(server)

        # a broken package: 400 with the loader's reason (gRPC INVALID_ARGUMENT), no traceback, listed UNAVAILABLE
        (repository / "broken").mkdir()
        listed = _place_broken(tiny_package, repository, "broken", 1, tmp_path / "elsewhere")
        with pytest.raises(tritonhttp.InferenceServerException, match="failed to load 'broken' version 1") as e:
            client.load_model("broken")
        assert e.value.status() == "400" and "resolves outside the package" in str(e.value)
        with pytest.raises(tritongrpc.InferenceServerException, match="resolves outside the package") as e:
            grpc.load_model("broken")
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        [broken] = [m for m in _index(server) if m["name"] == "broken"]
        assert broken["state"] == "UNAVAILABLE" and f"{listed}: resolves outside the package" in broken["reason"]
        assert _infer(client, "A dog.") == "2"  # the others serve on
        log = "".join(server.log)
        assert "Traceback" not in log and "internal error" not in log, log
        # the log names the versions as the repository's directories do, not as the package's manifest does
        assert "version 2 ready" in log and " test " not in log, log
    finally:
        grpc.close()
        client.close()
        assert server.stop() == 0, "".join(server.log)
