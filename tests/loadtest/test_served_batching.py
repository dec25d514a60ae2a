"""benchmarks/served_batching.py: bad arguments are one line and exit 2; one very short run end to end against the
bundled demo package (real ``mtgate serve``, real headless Locust at a fixed arrival rate)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.served_batching import main
from serving.server.settings import demo_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "message"), [
    (["--modes", "request,batch"], "unknown mode batch (modes: request, step)"),
    (["--rates", "4,2"], "the rates must increase"),
    (["--rates", "2,x"], "not a comma-separated list of numbers"),
    (["--duration", "0s"], "duration must be more than 0 s"),
    (["--server-env", "MTGATE_BATCHING=step"], "set by this script"),
    (["--server-env", "THREADS=2"], "expected MTGATE_<SETTING>=VALUE"),
    (["-m", "/nonexistent/package"], "not a directory"),
    (["--name", "bad name"], "--name 'bad name': use letters, digits"),
])
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main([*argv, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert message in err
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
def test_one_short_rate_end_to_end(tmp_path: Path) -> None:
    package = demo_model()
    if package is None:
        pytest.skip("the bundled demo model is not built (make demo)")
    command = [sys.executable, "-m", "benchmarks.served_batching", "--modes", "request", "--rates", "1",
               "--duration", "3s", "--users", "2", "--name", "e2e", "--out-dir", str(tmp_path),
               "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "e2e.json").read_text(encoding="utf-8"))
    assert data["complete"] and data["command"].endswith("--work-dir " + str(tmp_path / "work"))
    assert data["model"]["package"] == str(package) and data["model"]["name"] == "demo-en-de"
    assert data["server"] == {"runtime": "onnxruntime", "precision": "int8", "threads": 2, "env": {}}
    assert data["load"]["duration_s"] == 3.0 and data["load"]["users"] == 2 and data["load"]["beam_size"] is None
    assert data["machine"]["cpu_count"] >= 1 and len(data["machine"]["load_average_end"]) == 3
    [mode] = data["modes"]
    assert mode["mode"] == "request" and mode["error"] is None
    [rate] = mode["rates"]
    # 2 users at 1/s: one request every 2 s each, the first within 2 s of the start, so 2 to 4 in 3 s
    assert rate["rate"] == 1 and rate["users"] == 2 and 2 <= rate["requests"] <= 4 and rate["failures"] == 0
    assert 0 < rate["p50_ms"] <= rate["p95_ms"] <= rate["p99_ms"]
    # the verdict follows the rule (how fast this machine is does not matter here)
    holds = rate["p95_ms"] < 500 and rate["achieved_rps"] >= 0.9
    assert rate["holds"] is holds and (rate["reasons"] == []) is holds
    assert mode["highest_rate_held"] == (1 if holds else None)
    markdown = (tmp_path / "e2e.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Served batching at fixed arrival rates: e2e") and "## request" in markdown
    assert markdown in proc.stdout  # the same table is printed
    assert (tmp_path / "work" / "request" / "rate-1" / "locust_stats.csv").is_file()
