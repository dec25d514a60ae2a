"""Sweep without servers: the file, the points, pruning, the Pareto front, the cheapest point, its Kubernetes patch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from loadtest.sweep.command import prune_reason
from loadtest.sweep.config import Point, load_sweep
from loadtest.sweep.results import PointResult, ScenarioSummary, cheapest, kubernetes_patch, pareto_front
from loadtest.targets import TargetsError


def _package(tmp_path: Path) -> Path:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "manifest.json").write_text('{"name": "m"}', encoding="utf-8")
    return package


def _write(tmp_path: Path, **data: object) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps({"models": ["pkg"], "scenarios": [
        {"name": "s", "users": {"TranslateUser": 1}, "targets": {"p95_ms": 500}}], **data}), encoding="utf-8")
    return path


def test_points_in_search_order_and_what_does_not_fit(tmp_path: Path) -> None:
    _package(tmp_path)
    sweep = load_sweep(_write(tmp_path, node_cores=2, space={
        "threads": [2, 1], "replicas_per_node": [1, 2], "batching": ["request", "step"],
        "max_batch_size": [16, 4], "max_queue_delay_us": [0, 1000]}))
    points, skipped = sweep.points()
    assert sweep.scenarios[0].name == "s" and sweep.pareto_scenario.name == "s"
    first = [(p.threads, p.replicas, p.batching, p.max_batch_size, p.max_queue_delay_us) for p in points[:6]]
    assert first == [(2, 1, "request", 4, 0), (2, 1, "request", 4, 1000), (2, 1, "request", 16, 0),
                     (2, 1, "request", 16, 1000), (2, 1, "step", 4, None), (2, 1, "step", 16, None)]
    assert len(points) == 3 * 6 and len(skipped) == 6  # 2 threads x 2 replicas > 2 cores
    assert all(reason == "needs 4 cores, the node has 2" for _, reason in skipped)
    assert points[0].serve_args() == ["--runtime", "onnxruntime", "--precision", "auto", "--threads", "2",
                                      "--batching", "request", "--max-batch-size", "4", "--max-queue-delay-us", "0"]


def test_the_space_reads_the_old_backend_key(tmp_path: Path) -> None:
    _package(tmp_path)
    for key in ("runtime", "backend"):
        sweep = load_sweep(_write(tmp_path, space={key: ["openvino"], "precision": ["int8"]}))
        assert [(p.runtime, p.precision) for p in sweep.points()[0]] == [("openvino", "int8")]


def test_bad_sweep_files_list_every_problem(tmp_path: Path) -> None:
    path = _write(tmp_path, space={"threads": [0], "max_batch_size": [4, 4]}, budget={"max_points": 0})
    with pytest.raises(TargetsError) as e:
        load_sweep(path)
    assert str(e.value).splitlines() == [
        f"{path}: space: threads: every value must be at least 1",
        f"{path}: budget.max_points: Input should be greater than or equal to 1"]
    path.write_text(yaml.safe_dump({"models": ["nope"], "scenarios": [
        {"name": "s", "users": {"TranslateUser": 1}}]}), encoding="utf-8")
    with pytest.raises(TargetsError, match="not a model package"):
        load_sweep(path)
    path.write_text(yaml.safe_dump({"models": ["pkg"]}), encoding="utf-8")
    with pytest.raises(TargetsError, match="give either targets: FILE or scenarios"):
        load_sweep(path)


def _point(size: int, delay: int | None = 1000, threads: int = 1) -> Point:
    return Point(Path("pkg"), "onnxruntime", "fp32", threads, 1, "request", size, delay)


def _measured(point: Point, p95: float, tokens: float, passed: bool = True, largest: float | None = None,
              latency_missed: bool = False) -> PointResult:
    summary = ScenarioSummary("s", passed, [] if passed else ["p95"], latency_missed, p95, 10.0, tokens, 20.0, 0.0,
                              batch_size_max=largest)
    return PointResult(point, f"{point.max_batch_size}-{point.max_queue_delay_us}-{point.threads}", "measured",
                       scenarios=[summary], rss_mb=300.0)


def test_pruning_rules() -> None:
    slow = _measured(_point(8, 1000), 900, 100, passed=False, latency_missed=True)
    assert prune_reason(_point(8, 5000), [slow]) == "a shorter delay (1000 us) already missed a latency target"
    assert prune_reason(_point(16, 5000), [slow]) is None  # another batch size
    assert prune_reason(_point(8, 5000, threads=2), [slow]) is None  # another group
    small = _measured(_point(8, 1000), 100, 100, largest=4.0)  # no batch above 4 at limit 8
    assert prune_reason(_point(32, 1000), [small]) == ("at limit 8 no batch reached it (all at most 4); a larger "
                                                       "limit changes nothing")
    full = _measured(_point(8, 1000), 100, 100, largest=8.0)
    assert prune_reason(_point(32, 1000), [full]) is None


def test_front_cheapest_and_kubernetes(tmp_path: Path) -> None:
    _package(tmp_path)
    sweep = load_sweep(_write(tmp_path, capacity={"load": {"peak_rps": 10}, "prices": {"cloud_per_core_hour": 0.1}}))
    fast = _measured(_point(4), 50, 100)            # fastest, least throughput
    balanced = _measured(_point(8), 80, 300)        # on the front
    dominated = _measured(_point(16), 90, 250)      # slower and less throughput than balanced
    heavy = _measured(_point(32, threads=2), 200, 500, passed=False)  # 250 per core: dominated by balanced
    results = [fast, balanced, dominated, heavy]
    assert pareto_front(results, "s") == [fast, balanced]
    # 10 req/s x 20 tokens = 200 tok/s; at 70 %: fast needs ceil(200/70) = 3 replicas, balanced ceil(200/210) = 1
    winner, capacity = cheapest(sweep, results)  # type: ignore[misc]
    assert winner is balanced and capacity is not None and capacity.replicas == 1
    patch = yaml.safe_load(kubernetes_patch(winner, capacity))
    container = patch["spec"]["template"]["spec"]["containers"][0]
    assert patch["spec"]["replicas"] == 1 and container["name"] == "mtgate"
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "384Mi"}  # 300 MiB + 25 %, 64 MiB steps
    assert {"name": "MTGATE_MAX_BATCH_SIZE", "value": "8"} in container["env"]
    assert cheapest(sweep, [heavy]) is None
