"""Triton's real perf_analyzer against `mtgate serve`, unchanged, over HTTP and gRPC: it reads the model config,
drives infer with BYTES inputs and prints the server-side statistics (the "Server:" section, from the statistics
extension).

perf_analyzer is the binary of the tritonclient 2.45.0 wheel, installed by `make perf-analyzer` (`make test` runs
it) into .venv-perf with the libraries it needs; where that could not be done this test skips and says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.utils.server import start_server

ROOT = Path(__file__).resolve().parents[3]
PERF_VENV = ROOT / ".venv-perf"
PERF_ANALYZER = PERF_VENV / "bin" / "perf_analyzer"


def _environment() -> dict[str, str]:
    cudart = sorted(PERF_VENV.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    if not PERF_ANALYZER.exists() or not cudart:
        pytest.skip("perf_analyzer is not installed (`make perf-analyzer` installs it into .venv-perf)")
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join([str(cudart[0]), os.environ.get("LD_LIBRARY_PATH", "")])}
    probe = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True, env=env, timeout=60,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"perf_analyzer does not run here: {(probe.stderr or probe.stdout).strip()[:300]}")
    return env


@pytest.mark.parametrize(("batching", "protocol"), [("request", "http"), ("step", "http"), ("request", "grpc"),
                                                   ("step", "grpc-stream")])
def test_perf_analyzer_runs_and_reports_server_statistics(tiny_package: Path, tmp_path: Path, batching: str,
                                                          protocol: str) -> None:
    env = _environment()
    data = tmp_path / "input.json"
    data.write_text('{"data": [{"INPUT_TEXT": ["A man is riding a bike."]}, {"INPUT_TEXT": ["Two dogs play."]}]}',
                    encoding="utf-8")
    # Triton's versions are integers, and perf_analyzer parses them as such (the tiny package's is "test")
    package = tmp_path / "package"
    shutil.copytree(tiny_package, package)
    manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    (package / "manifest.json").write_text(json.dumps({**manifest, "version": "3"}), encoding="utf-8")
    grpc = protocol.startswith("grpc")
    server = start_server(package, "--batching", batching, *(["--grpc-port", "0"] if grpc else []))
    try:
        name = httpx.get(server.url + "/v1/models").json()["models"][0]["name"]
        address = server.grpc_address if grpc else server.address
        streaming = ["--streaming"] if protocol == "grpc-stream" else []  # ModelStreamInfer (it hung when refused)
        command = [str(PERF_ANALYZER), "-m", name, "-u", address, "-i", "grpc" if grpc else "http", *streaming,
                   "--input-data", str(data),
                   "--shape", "INPUT_TEXT:1", "--concurrency-range", "2", "--measurement-interval", "1000",
                   "--stability-percentage", "100", "--max-trials", "3"]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180, check=False)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        assert "Server:" in output, output
        served = int(re.search(r"Successful request count: (\d+)", output).group(1))  # type: ignore[union-attr]
        assert served > 0 and int(re.search(r"Request count: (\d+)", output).group(1)) > 0, output  # type: ignore[union-attr]
        breakdown = re.search(r"Avg request latency: \d+ usec \(overhead \d+ usec \+ queue (\d+) usec \+ compute input "
                              r"(\d+) usec \+ compute infer (\d+) usec", output)
        assert breakdown is not None and int(breakdown.group(3)) > 0, output
        stats = httpx.get(f"{server.url}/v2/models/{name}/stats").json()["model_stats"][0]["inference_stats"]
        assert stats["success"]["count"] >= served and stats["fail"]["count"] == 0
    finally:
        assert server.stop() == 0, "".join(server.log)
