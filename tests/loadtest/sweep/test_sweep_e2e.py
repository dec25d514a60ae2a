"""``mtgate sweep`` end to end on the bundled demo package: two points (int8 with batch limits 4 and 16), short and
bounded, on loopback; the chosen configuration is checked against the numbers in its own report, and a rerun
measures nothing again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.capacity import CapacityConfig, plan

pytestmark = pytest.mark.timeout(420)
ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "models" / "demo-en-de"


def _sweep_file(path: Path) -> Path:
    path.write_text(json.dumps({  # JSON is YAML
        "name": "two-points",
        "models": [str(DEMO)],
        "space": {"precision": ["int8"], "threads": [1], "max_batch_size": [4, 16], "max_queue_delay_us": [1000]},
        "node_cores": 2,
        "scenarios": [{"name": "short", "users": {"TranslateUser": 1}, "concurrency": 8, "spawn_rate": 8,
                       "duration": "3s", "beam_size": 1, "max_length": 16,
                       "targets": {"p95_ms": 20000, "max_error_rate": 0.0}}],
        "capacity": {"load": {"peak_rps": 30, "hours_per_day": 10},
                     "prices": {"cloud_per_core_hour": 0.04, "onprem_per_core_hour": 0.01}, "headroom": 0.25},
        "budget": {"max_points": 4, "max_minutes": 10},
    }), encoding="utf-8")
    return path


def _sweep(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serving.commands.main", "sweep", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=400, check=False)


def test_two_point_sweep_on_the_demo_package(tmp_path: Path) -> None:
    if not (DEMO / "manifest.json").exists():
        pytest.skip("the demo package is not built (make demo)")
    sweep_file = _sweep_file(tmp_path / "sweep.yaml")
    report = tmp_path / "report"
    started = time.monotonic()
    done = _sweep(str(sweep_file), "--report", str(report), "--tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 300
    data = json.loads((report / "sweep.json").read_text(encoding="utf-8"))
    points = data["points"]
    assert [p["point"]["max_batch_size"] for p in points] == [4, 16]
    assert all(p["status"] == "measured" and p["passed"] for p in points), points
    # The winner is the cheapest passing point, by its own measured numbers and the capacity arithmetic.
    config = CapacityConfig.model_validate(json.loads(sweep_file.read_text(encoding="utf-8"))["capacity"])
    costs = {}
    for p in points:
        [short] = p["scenarios"]
        expected = plan(config, short["output_tokens_per_s"], 1, short["tokens_per_request"])
        assert expected is not None and p["capacity"]["cost_per_month"] == pytest.approx(expected.cost_per_month)
        assert p["capacity"]["replicas"] == expected.replicas
        assert p["tokens_per_s_per_core"] == pytest.approx(short["output_tokens_per_s"])  # 1 thread x 1 replica
        costs[p["key"]] = (expected.cost_per_month, short["p95_ms"])
    assert data["winner"]["key"] == min(costs, key=lambda k: costs[k])
    assert set(data["pareto_front"]) <= set(costs) and data["pareto_front"]
    assert f"cheapest meeting every target: {data['winner']['label']}" in done.stdout
    patch = (report / "k8s-patch.yaml").read_text(encoding="utf-8")
    assert f"replicas: {data['winner']['capacity']['replicas']}" in patch and "MTGATE_PRECISION" in patch
    html = (report / "sweep.html").read_text(encoding="utf-8")
    assert 'data-chart="pareto"' in html and "<script" not in html
    [tb_run] = list((tmp_path / "tb").iterdir())
    from batch.tensorboard import read_events

    events = read_events(tb_run)
    assert [step for step, _ in events["sweep/p95_ms"]] == [0, 1]
    assert events["sweep/winner_cost_per_month"] == [(0, pytest.approx(data["winner"]["capacity"]["cost_per_month"]))]
    assert "winner" in events and "points" in events

    # Resumable: a rerun keeps both points and measures nothing.
    started = time.monotonic()
    again = _sweep(str(sweep_file), "--report", str(report))
    assert again.returncode == 0 and again.stderr.count("measured before, kept") == 2, again.stderr
    assert time.monotonic() - started < 60
    assert json.loads((report / "sweep.json").read_text(encoding="utf-8"))["winner"] == data["winner"]
