"""What a sweep found, and the choice made from it: each point's result (:class:`PointResult`, what it did under
each scenario), the Pareto front of p95 latency against output tokens/s per core, the cheapest point that meets
every target with its capacity plan, and the Kubernetes patch that deploys it. ``loadtest.sweep.command`` measures the
points; ``loadtest.sweep.report`` draws what this module decides.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.capacity import Plan, plan
from loadtest.sweep.config import Point, Sweep


@dataclass(frozen=True)
class ScenarioSummary:
    """What a point did under one scenario (replicas merged)."""

    name: str
    passed: bool
    missed: list[str]
    latency_missed: bool
    p95_ms: float | None
    requests_per_s: float
    output_tokens_per_s: float | None
    tokens_per_request: float | None
    error_rate: float | None
    batch_size_mean: float | None = None
    batch_size_max: float | None = None
    queue_wait_p95_ms: float | None = None


@dataclass
class PointResult:
    """A point and what became of it: measured, failed (could not run), pruned, skipped, or not run (budget)."""

    point: Point
    key: str
    status: str
    reason: str = ""
    scenarios: list[ScenarioSummary] = field(default_factory=list)
    rss_mb: float | None = None
    seconds: float = 0.0
    reused: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "measured" and bool(self.scenarios) and all(s.passed for s in self.scenarios)

    def scenario(self, name: str) -> ScenarioSummary | None:
        return next((s for s in self.scenarios if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"point": self.point.to_json(), "label": self.point.label, "key": self.key, "status": self.status,
                "reason": self.reason, "passed": self.passed, "scenarios": [asdict(s) for s in self.scenarios],
                "rss_mb": self.rss_mb, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PointResult:
        p = data["point"]
        point = Point(Path(p["model"]), p.get("runtime", p.get("backend")), p["precision"], p["threads"], p["replicas"], p["batching"],
                      p["max_batch_size"], p["max_queue_delay_us"])
        return cls(point, data["key"], data["status"], data["reason"],
                   [ScenarioSummary(**s) for s in data["scenarios"]], data["rss_mb"], data["seconds"], reused=True)

def tokens_per_core(result: PointResult, scenario: str) -> float | None:
    s = result.scenario(scenario)
    if s is None or s.output_tokens_per_s is None:
        return None
    return s.output_tokens_per_s / result.point.cores


def pareto_front(results: list[PointResult], scenario: str) -> list[PointResult]:
    """Measured points that no other point beats on both p95 latency (lower) and tokens/s per core (higher)."""
    candidates = [(r, s.p95_ms, t) for r in results if r.status == "measured" and (s := r.scenario(scenario))
                  and s.p95_ms is not None and (t := tokens_per_core(r, scenario)) is not None]
    front = [r for r, lat, thr in candidates
             if not any(l2 <= lat and t2 >= thr and (l2 < lat or t2 > thr) for _, l2, t2 in candidates)]
    return sorted(front, key=lambda r: r.scenario(scenario).p95_ms or 0.0)  # type: ignore[union-attr]


def capacity_plan(sweep: Sweep, result: PointResult) -> Plan | None:
    """The capacity plan of a measured point, from the Pareto scenario's throughput (per replica)."""
    s = result.scenario(sweep.pareto_scenario.name)
    if sweep.file.capacity is None or s is None or s.output_tokens_per_s is None:
        return None
    return plan(sweep.file.capacity, s.output_tokens_per_s / result.point.replicas, result.point.threads,
                s.tokens_per_request)


def cheapest(sweep: Sweep, results: list[PointResult]) -> tuple[PointResult, Plan | None] | None:
    """The point meeting every target that costs least (with prices), else the most tokens/s per core."""
    passing = [r for r in results if r.passed]
    if not passing:
        return None
    name = sweep.pareto_scenario.name
    if sweep.file.capacity is not None:
        planned = [(r, p) for r in passing if (p := capacity_plan(sweep, r)) is not None]
        if planned:
            return min(planned, key=lambda rp: (rp[1].cost_per_month, rp[0].scenario(name).p95_ms or 0.0))  # type: ignore[union-attr]
    return max(passing, key=lambda r: tokens_per_core(r, name) or 0.0), None


def kubernetes_patch(result: PointResult, capacity: Plan | None) -> str:
    """A strategic-merge patch for deploy/k8s/deployment.yaml: replicas, CPU and memory, the serving settings.

    The memory request is the point's peak RSS + 25 % (in 64 MiB steps); the limit is twice that, not the same: a
    sweep point runs seconds, and a server's memory grows past what it shows there (glibc's per-thread arenas, a
    version switch: the README measured 159 MB growing to 301 MB), so a limit at the request would kill the pod.
    """
    import yaml

    p = result.point
    memory = max(256, math.ceil((result.rss_mb or 0) * 1.25 / 64) * 64)  # peak RSS + 25 %, in 64 MiB steps
    env = [{"name": "MTGATE_RUNTIME", "value": p.runtime}, {"name": "MTGATE_PRECISION", "value": p.precision},
           {"name": "MTGATE_THREADS", "value": str(p.threads)}, {"name": "MTGATE_BATCHING", "value": p.batching},
           {"name": "MTGATE_MAX_BATCH_SIZE", "value": str(p.max_batch_size)}]
    if p.max_queue_delay_us is not None:
        env.append({"name": "MTGATE_MAX_QUEUE_DELAY_US", "value": str(p.max_queue_delay_us)})
    requests = {"cpu": str(p.threads), "memory": f"{memory}Mi"}
    limits = {"cpu": str(p.threads), "memory": f"{2 * memory}Mi"}
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "mtgate"},
             "spec": {"replicas": capacity.replicas if capacity is not None else p.replicas,
                      "template": {"spec": {"containers": [{"name": "mtgate", "env": env,
                                                            "resources": {"requests": requests,
                                                                          "limits": limits}}]}}}}
    rss = "not measured" if result.rss_mb is None else f"{result.rss_mb:.0f} MiB"
    note = (f"# From mtgate sweep, point {p.label}: memory request = the peak RSS of a {result.seconds:.0f} s run "
            f"({rss}) + 25 %;\n# the limit is twice that for the growth a short run does not show. Check both under "
            "your own traffic.\n")
    return note + str(yaml.safe_dump(patch, sort_keys=False))
