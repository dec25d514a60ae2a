"""The sweep file: model(s), the search space, the scenarios whose targets every point must meet, load and prices.

Example (``loadtest/sweeps/demo.yaml``)::

    name: demo
    models: [../../models/demo-en-de]      # model packages, relative to this file
    space:                                  # every combination is a point
      runtime: [onnxruntime]                # (the old key `backend` is still read)
      precision: [fp32, int8]               # default [auto]: what mtgate serve would choose
      threads: [1, 2]                       # runtime threads per replica = its cores
      replicas_per_node: [1]
      batching: [request]
      max_batch_size: [8, 32]
      max_queue_delay_us: [2000]            # request batching only
    node_cores: 2                           # default: the CPUs this process may use
    targets: ../targets/smoke.yaml          # a targets file (or `scenarios:` inline), optionally
    scenarios_from_targets: [single]        #   only these of its scenarios
    capacity: {load: {peak_rps: 50}, prices: {cloud_per_core_hour: 0.04}}
    budget: {max_points: 16, max_minutes: 60}

Every problem is reported at once, one per line, with its location, as for targets files.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from loadtest.capacity import CapacityConfig
from loadtest.targets import Scenario, TargetsError, _location, load_targets
from serving.package import DEFAULT_RUNTIME, Runtime
from serving.server.settings import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE_DELAY_US


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Space(_Strict):
    """The values to try for each serving setting (each list non-empty, no duplicates)."""

    runtime: list[Runtime] = Field(
        default=[DEFAULT_RUNTIME], min_length=1, validation_alias=AliasChoices("runtime", "backend"))
    precision: list[Literal["auto", "fp32", "int8"]] = Field(default=["auto"], min_length=1)
    threads: list[int] = Field(default=[1], min_length=1)
    replicas_per_node: list[int] = Field(default=[1], min_length=1)
    batching: list[Literal["request", "step"]] = Field(default=["request"], min_length=1)
    max_batch_size: list[int] = Field(default=[DEFAULT_MAX_BATCH_SIZE], min_length=1)
    max_queue_delay_us: list[int] = Field(default=[DEFAULT_MAX_QUEUE_DELAY_US], min_length=1)

    @model_validator(mode="after")
    def _values(self) -> Space:
        for name in ("threads", "replicas_per_node", "max_batch_size"):
            if any(v < 1 for v in getattr(self, name)):
                raise ValueError(f"{name}: every value must be at least 1")
        if any(v < 0 for v in self.max_queue_delay_us):
            raise ValueError("max_queue_delay_us: every value must be at least 0")
        for name in type(self).model_fields:
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: duplicate values")
        return self


class Budget(_Strict):
    """Bounds of one sweep run: points measured and wall time (a point running when time is up finishes)."""

    max_points: int = Field(default=32, ge=1, le=1000)
    max_minutes: float = Field(default=60.0, gt=0, le=24 * 60)


class SweepFile(_Strict):
    name: str = Field(default="sweep", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    models: list[Path] = Field(min_length=1)
    space: Space = Space()
    node_cores: int | None = Field(default=None, ge=1)
    targets: Path | None = None
    scenarios_from_targets: list[str] = Field(default_factory=list)
    scenarios: list[Scenario] = Field(default_factory=list)
    pareto_scenario: str | None = None
    capacity: CapacityConfig | None = None
    budget: Budget = Budget()

    @model_validator(mode="after")
    def _one_source_of_scenarios(self) -> SweepFile:
        if (self.targets is None) == (not self.scenarios):
            raise ValueError("give either targets: FILE or scenarios: [...]")
        if self.scenarios_from_targets and self.targets is None:
            raise ValueError("scenarios_from_targets needs targets: FILE")
        return self


@dataclass(frozen=True)
class Point:
    """One configuration to measure."""

    model: Path
    runtime: str
    precision: str
    threads: int
    replicas: int
    batching: str
    max_batch_size: int
    max_queue_delay_us: int | None  # None: step batching, where it does not apply

    @property
    def cores(self) -> int:
        return self.threads * self.replicas

    @property
    def group(self) -> tuple[object, ...]:
        """Everything but the batch size and delay: the points pruning compares with each other."""
        return (str(self.model), self.runtime, self.precision, self.threads, self.replicas, self.batching)

    @property
    def label(self) -> str:
        delay = "" if self.max_queue_delay_us is None else f" delay {self.max_queue_delay_us} us"
        return (f"{self.model.name} {self.runtime} {self.precision} {self.threads}t x{self.replicas} "
                f"{self.batching} batch {self.max_batch_size}{delay}")

    def serve_args(self) -> list[str]:
        args = ["--runtime", self.runtime, "--precision", self.precision, "--threads", str(self.threads),
                "--batching", self.batching, "--max-batch-size", str(self.max_batch_size)]
        if self.max_queue_delay_us is not None:
            args += ["--max-queue-delay-us", str(self.max_queue_delay_us)]
        return args

    def to_json(self) -> dict[str, Any]:
        return {"model": str(self.model), "runtime": self.runtime, "precision": self.precision,
                "threads": self.threads, "replicas": self.replicas, "batching": self.batching,
                "max_batch_size": self.max_batch_size, "max_queue_delay_us": self.max_queue_delay_us}


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file: its points in search order, its scenarios, and where it came from."""

    file: SweepFile
    path: Path
    scenarios: list[Scenario]
    node_cores: int

    @property
    def pareto_scenario(self) -> Scenario:
        name = self.file.pareto_scenario
        return next(s for s in self.scenarios if s.name == name) if name else self.scenarios[0]

    def points(self) -> tuple[list[Point], list[tuple[Point, str]]]:
        """The points to measure, grouped (batch size, then delay ascending within a group), and the points left out
        before any run with the reason (more cores than the node has)."""
        s = self.file.space
        out: list[Point] = []
        skipped: list[tuple[Point, str]] = []
        for model, runtime, precision, threads, replicas, batching in itertools.product(
                self.file.models, s.runtime, s.precision, s.threads, s.replicas_per_node, s.batching):
            delays: list[int | None] = [*sorted(s.max_queue_delay_us)] if batching == "request" else [None]
            for size in sorted(s.max_batch_size):
                for delay in delays:
                    point = Point(model, runtime, precision, threads, replicas, batching, size, delay)
                    if point.cores > self.node_cores:
                        skipped.append((point, f"needs {point.cores} cores, the node has {self.node_cores}"))
                    else:
                        out.append(point)
        return out, skipped


def _has_manifest(model: Path) -> bool:
    try:
        return (model / "manifest.json").is_file()
    except PermissionError:  # there, but not ours to look into: check_packages says so
        return True


def check_packages(sweep: Sweep) -> None:
    """Every model is a readable package with every artifact the space asks for (a point without one could only
    fail to start, after the points before it had run).

    Raises:
        TargetsError: one line per problem.
    """
    from serving.package import PackageError, choose_precision, open_package

    path, space, problems = sweep.path, sweep.file.space, []
    for model in sweep.file.models:
        try:
            manifest = open_package(model, verify=False).manifest
        except PackageError as e:
            problems.append(f"{path}: models: {e}")
            continue
        have = {(a.runtime, a.precision) for a in manifest.artifacts}
        asked = [(r, choose_precision(manifest, r, p).precision) for r in space.runtime for p in space.precision]
        lacking = [f"{r}/{p}" for r, p in asked if (r, p) not in have]
        if lacking:
            problems.append(f"{path}: space: {model} has no {', '.join(lacking)} artifact (it has: "
                            f"{', '.join(sorted(f'{r}/{p}' for r, p in have))}); narrow runtime/precision")
    if problems:
        raise TargetsError("\n".join(problems))


def load_sweep(path: Path) -> Sweep:
    """Read and check a sweep file (and its targets file).

    Raises:
        TargetsError: unreadable, not YAML, or against the schema (every problem listed, with its location).
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise TargetsError(f"{path}: no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise TargetsError(f"{path}: unreadable ({e})") from e
    except yaml.YAMLError as e:
        raise TargetsError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise TargetsError(f"{path}: expected a mapping with 'models' and 'space'")
    try:
        sweep = SweepFile.model_validate(data)
    except ValidationError as e:
        lines = [f"{path}: {_location(tuple(err['loc']))}: {str(err['msg']).removeprefix('Value error, ')}"
                 for err in e.errors()]
        raise TargetsError("\n".join(lines)) from e
    base = path.parent
    models = [m if m.is_absolute() else base / m for m in sweep.models]
    missing = [str(m) for m in models if not _has_manifest(m)]
    if missing:
        raise TargetsError(f"{path}: models: not a model package (no manifest.json): {', '.join(missing)}")
    if sweep.targets is not None:
        targets_path = sweep.targets if sweep.targets.is_absolute() else base / sweep.targets
        scenarios = load_targets(targets_path).select(sweep.scenarios_from_targets)
    else:
        scenarios = list(sweep.scenarios)
    names = [s.name for s in scenarios]
    if sweep.pareto_scenario is not None and sweep.pareto_scenario not in names:
        raise TargetsError(f"{path}: pareto_scenario {sweep.pareto_scenario}: no such scenario ({', '.join(names)})")
    cores = sweep.node_cores or len(os.sched_getaffinity(0))
    return Sweep(sweep.model_copy(update={"models": models}), path, scenarios, cores)
