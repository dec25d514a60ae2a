"""What ``mtgate validate`` found: its checks (each a reason for the verdict) and everything its report shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.capacity import Plan
from loadtest.quality import Analysis, Comparison, SystemScore
from loadtest.report import ScenarioResult


@dataclass
class Check:
    """One reason for the verdict."""

    name: str
    passed: bool
    detail: str


@dataclass
class Outcome:
    """Everything the report shows."""

    candidate: dict[str, Any]
    baseline: dict[str, Any] | None
    testset: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    parity: list[Any] = field(default_factory=list)
    quality: dict[str, SystemScore] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    load: list[ScenarioResult] = field(default_factory=list)
    host: str | None = None
    cost: dict[str, Any] | None = None
    plan: Plan | None = None
    analysis: Analysis | None = None
    alpha: float = 0.05
    speed_left_to: str | None = None  # the load scenario that measures throughput instead of timed passes in process
    shadow: dict[str, Any] | None = None  # --shadow-log: loadtest.validate.shadow.summarize

    @property
    def verdict(self) -> str:
        return "PROMOTE" if self.checks and all(c.passed for c in self.checks) else "REJECT"
