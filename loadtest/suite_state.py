"""What a load test's Locust users share (``SuiteState``, kept on the Locust environment, never in module globals) and
how long a user waits before its next request (``--arrival-rate`` pacing, else ``--think-time``)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import gevent
from locust.env import Environment

from loadtest.corpus import paragraph
from loadtest.pacing import Pacer, arrival_interval


@dataclass
class SuiteState:
    """Everything the users share, kept on the Locust environment (never in module globals)."""

    sentences: list[str]
    rng: random.Random
    bulk_size: int
    max_length: int | None
    beam_size: int | None
    model_name: str | None
    think_time_s: float
    arrival_rate: float
    tokens_file: Path | None
    headers: dict[str, str]
    input_tokens: int = 0
    output_tokens: int = 0
    translated: int = 0
    started: float | None = None
    stopped: float | None = None
    history: list[tuple[float, int]] = field(default_factory=list)
    sampler: gevent.Greenlet | None = None
    long_fraction: float = 0.25  # MixedStreamUser: paragraphs among its requests
    paragraph: tuple[int, int] = (4, 8)  # sentences per paragraph, inclusive

    def decoding(self) -> dict[str, int]:
        """The decoding parameters to send (none: the server's defaults)."""
        return {k: v for k, v in (("beam_size", self.beam_size), ("max_length", self.max_length)) if v is not None}

    def target(self) -> dict[str, str]:
        """The ``model`` field of a /v1 request (none: the server's default model)."""
        return {"model": self.model_name} if self.model_name else {}

    def sample(self, n: int) -> list[str]:
        return [self.rng.choice(self.sentences) for _ in range(n)]

    def sample_paragraph(self) -> str:
        """A paragraph of ``paragraph`` sentences, one text (``loadtest.corpus.paragraph``)."""
        return paragraph(self.sentences, self.rng, self.paragraph)[1]

    def count(self, translations: list[dict[str, Any]]) -> None:
        self.translated += len(translations)
        for t in translations:
            self.input_tokens += int(t.get("input_tokens") or 0)
            self.output_tokens += int(t.get("output_tokens") or 0)


def state_of(environment: Environment) -> SuiteState:
    return cast(SuiteState, environment.mtgate_state)  # type: ignore[attr-defined]


def next_wait(environment: Environment, pacer: Pacer) -> float:
    """A user's wait before its next request: ``--arrival-rate`` pacing when set, else ``--think-time``."""
    state = state_of(environment)
    if state.arrival_rate <= 0:
        return state.think_time_s
    # The target user count (--users, or the web UI's), not the count spawned so far: during the ramp-up the rate is
    # lower, rather than the first users sending the whole rate between them.
    options = environment.parsed_options
    users = options.num_users if options is not None and options.num_users else 1
    return pacer.wait(arrival_interval(state.arrival_rate, users), time.perf_counter())
