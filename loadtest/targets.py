"""The targets file: load scenarios and the numbers each must meet (YAML, checked with pydantic).

Example (see ``loadtest/targets/*.yaml``)::

    scenarios:
      - name: single
        users: {TranslateUser: 1}      # Locust user class -> weight
        concurrency: 4                 # simulated users
        spawn_rate: 4                  # users started per second
        duration: 20s
        targets: {p95_ms: 500, max_error_rate: 0.0, min_rps: 5}
    quality: {min_bleu: 20, max_bleu_drop: 0.5}       # used by `mtgate validate`
    cost: {max_per_million_tokens: 2.0}                # used by `mtgate validate`
    shadow: {min_agreement: 0.5, min_chrf_p10: 60}     # used by `mtgate validate --shadow-log`

Every problem in a file is reported at once, one per line, with its location (``scenarios[1].targets.p95_ms: ...``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from loadtest.capacity import CapacityConfig

# The user classes defined in loadtest/locustfile.py (kept here as names so this module never imports Locust).
USER_CLASSES: tuple[str, ...] = ("TranslateUser", "BatchUser", "BulkUser", "StreamUser", "MixedStreamUser",
                                  "TritonUser")
STREAM_USERS = frozenset({"StreamUser", "MixedStreamUser"})  # the users that log time-to-first-event entries
MAX_DURATION_S = 3600.0

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

PositiveMs = Annotated[float, Field(gt=0)]


class TargetsError(Exception):
    """The targets file is unreadable or invalid; the message lists every problem."""


def parse_duration(value: object) -> float:
    """``20``, ``"20s"``, ``"2m"``, ``"1m30s"``, ``"1h"`` -> seconds."""
    if isinstance(value, bool):
        raise ValueError("duration must be a number of seconds or a string like '30s', '2m', '1m30s'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip() and (m := _DURATION.match(value.strip())):
        hours, minutes, secs = m.groups()
        seconds = int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs or 0)
    else:
        raise ValueError(f"duration {value!r} is not a number of seconds or a string like '30s', '2m', '1m30s'")
    if not 0 < seconds <= MAX_DURATION_S:
        raise ValueError(f"duration must be more than 0 s and at most {MAX_DURATION_S:.0f} s (got {seconds:g} s)")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Targets(_Strict):
    """What one scenario must meet. Unset targets are not checked, except ``max_error_rate`` (default 0).

    Latency targets apply to every request entry of the scenario (the slowest one decides); ``ttfe_*`` to the
    streaming entries' time to first event; ``min_rps`` and ``min_tokens_per_s`` to the scenario's total.
    """

    p50_ms: PositiveMs | None = None
    p95_ms: PositiveMs | None = None
    p99_ms: PositiveMs | None = None
    max_error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    min_rps: float | None = Field(default=None, ge=0.0)
    min_tokens_per_s: float | None = Field(default=None, ge=0.0)
    ttfe_p50_ms: PositiveMs | None = None
    ttfe_p95_ms: PositiveMs | None = None
    ttfe_p99_ms: PositiveMs | None = None


class Scenario(_Strict):
    """One Locust run: which users, how many, how long, and its targets."""

    name: str = Field(pattern=_NAME, max_length=64)
    users: dict[str, int] = Field(min_length=1, description="user class -> weight")
    concurrency: int = Field(default=1, ge=1, le=1000)
    spawn_rate: float = Field(default=10.0, gt=0)
    duration: float = Field(default=10.0, description="seconds, or '30s', '2m', '1m30s'")
    think_time_s: float = Field(default=0.0, ge=0.0, le=60.0)
    bulk_size: int = Field(default=16, ge=1, le=1024)
    max_length: int | None = Field(default=None, ge=1, description="max_length sent with every request")
    beam_size: int | None = Field(default=None, ge=1, description="beam_size sent with every request")
    model: str | None = Field(default=None, description="model name for the Open Inference Protocol user")
    corpus: Path | None = None
    targets: Targets = Targets()

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("users")
    @classmethod
    def _users(cls, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(USER_CLASSES))
        if unknown:
            raise ValueError(f"unknown user class {', '.join(unknown)} (known: {', '.join(USER_CLASSES)})")
        bad = sorted(name for name, weight in value.items() if weight < 1)
        if bad:
            raise ValueError(f"weights must be at least 1 ({', '.join(bad)})")
        return value

    @model_validator(mode="after")
    def _streaming_targets_need_a_stream(self) -> Scenario:
        t = self.targets
        if (t.ttfe_p50_ms or t.ttfe_p95_ms or t.ttfe_p99_ms) and not STREAM_USERS & set(self.users):
            raise ValueError("ttfe_* targets need StreamUser among the users")
        return self


class QualityTargets(_Strict):
    """Quality rules for ``mtgate validate``: absolute floors and the allowed drop against the baseline.

    A drop counts only when sacrebleu's paired bootstrap finds it significant (p < ``alpha``).
    """

    min_bleu: float | None = Field(default=None, ge=0.0, le=100.0)
    min_chrf: float | None = Field(default=None, ge=0.0, le=100.0)
    max_bleu_drop: float = Field(default=0.0, ge=0.0)
    max_chrf_drop: float = Field(default=0.0, ge=0.0)
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)


class ShadowTargets(_Strict):
    """Live-traffic rules for ``mtgate validate --shadow-log`` (the pair log of ``mtgate serve --shadow``)."""

    min_pairs: int | None = Field(default=None, ge=1)
    min_agreement: float | None = Field(default=None, ge=0.0, le=1.0)
    min_chrf_mean: float | None = Field(default=None, ge=0.0, le=100.0)
    min_chrf_p10: float | None = Field(default=None, ge=0.0, le=100.0)


class CostTargets(_Strict):
    """Cost rule for ``mtgate validate`` (same currency as ``--price-per-core-hour``)."""

    max_per_million_tokens: float | None = Field(default=None, gt=0.0)


class TargetsFile(_Strict):
    """The whole file."""

    scenarios: list[Scenario] = Field(min_length=1)
    quality: QualityTargets = QualityTargets()
    cost: CostTargets = CostTargets()
    shadow: ShadowTargets = ShadowTargets()
    capacity: CapacityConfig | None = None

    @field_validator("scenarios")
    @classmethod
    def _unique_names(cls, value: list[Scenario]) -> list[Scenario]:
        names = [s.name for s in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate scenario name {', '.join(duplicates)}")
        return value

    def select(self, names: list[str] | None) -> list[Scenario]:
        """The scenarios with these names (all when ``names`` is empty or None), in file order.

        Raises:
            TargetsError: a name is not in the file.
        """
        if not names:
            return list(self.scenarios)
        known = {s.name: s for s in self.scenarios}
        missing = [n for n in names if n not in known]
        if missing:
            raise TargetsError(f"no scenario {', '.join(missing)} (scenarios: {', '.join(known)})")
        return [known[n] for n in names]


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_targets(data: Any, source: str = "targets") -> TargetsFile:
    """Check already-parsed YAML/JSON data against the schema.

    Raises:
        TargetsError: one line per problem, each prefixed with ``source`` and the field's location.
    """
    if not isinstance(data, dict):
        raise TargetsError(f"{source}: expected a mapping with a 'scenarios' list, got {type(data).__name__}")
    try:
        targets = TargetsFile.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            # Errors raised in our own validators come wrapped as "Value error, ..."; keep only our message.
            message = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{source}: {_location(tuple(err['loc']))}: {message}")
        raise TargetsError("\n".join(lines)) from e
    # Relative corpus paths are relative to the targets file, so a file and its corpus can travel together.
    base = Path(source).parent
    scenarios = [
        s.model_copy(update={"corpus": base / s.corpus}) if s.corpus and not s.corpus.is_absolute() else s
        for s in targets.scenarios
    ]
    return targets.model_copy(update={"scenarios": scenarios})


def load_targets(path: Path) -> TargetsFile:
    """Read and check a targets file.

    Raises:
        TargetsError: the file is missing, not YAML, or breaks the schema (every problem listed).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise TargetsError(f"{path}: no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise TargetsError(f"{path}: unreadable ({e})") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise TargetsError(f"{path}: not valid YAML{where} ({getattr(e, 'problem', None) or e})") from e
    return parse_targets(data, str(path))
