"""`mtgate serve --model-repository DIR`: Triton's layout DIR/<name>/<version>/, the latest version served; a new
version switches in under load without a failed request; explicit load and unload over HTTP and gRPC."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.serving.api.servers import start_server

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
        time.sleep(6)
        _place(tiny_package, repository, 2)  # the poll finds it, loads and warms it, switches
        deadline = time.monotonic() + 30
        while not (seen[0][-1:] == ["2"] and seen[1][-1:] == ["2"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(max(0.0, 20 - 6 - 0.5))  # 20 s of load in all
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

        # explicit unload and load, over HTTP and gRPC
        client = tritonhttp.InferenceServerClient(server.address)
        client.unload_model(NAME)
        assert httpx.post(server.url + "/v2/repository/index").json() == []
        with pytest.raises(tritonhttp.InferenceServerException, match="unknown model"):
            _infer(client, "A cat.")
        client.load_model(NAME)
        assert _infer(client, "A cat.") == "2"
        grpc = tritongrpc.InferenceServerClient(server.grpc_address)
        grpc.unload_model(NAME)
        assert not grpc.is_model_ready(NAME)
        grpc.load_model(NAME)
        assert grpc.is_model_ready(NAME, model_version="2")
        with pytest.raises(tritongrpc.InferenceServerException, match="no model 'nope'"):
            grpc.load_model("nope")
        grpc.close()
        client.close()
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_an_empty_repository_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.serving.api.servers import ROOT

    proc = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "--model-repository", str(tmp_path),
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
        assert [m["version"] for m in httpx.post(server.url + "/v2/repository/index").json()] == ["3", "4"]
        assert client.infer(NAME, [tensor], model_version="3").get_response()["model_version"] == "3"
        assert httpx.post(server.url + "/v1/translate", json={"text": "A dog."}).json()["version"] == "4"
        client.close()
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_a_bad_version_policy_is_one_line(tiny_package: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.serving.api.servers import ROOT

    (tmp_path / NAME).mkdir()
    _place(tiny_package, tmp_path, 1)
    proc = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "--model-repository", str(tmp_path),
                           "--repository-version-policy", "newest", "--port", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "latest:N" in lines[0], proc.stderr
