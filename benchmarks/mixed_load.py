"""The load of ``benchmarks.mixed_traffic``: a seeded mix of short and long texts, Poisson arrivals, an open-loop
asyncio client that streams each request over ``POST /v1/translate/stream`` (SSE), and the per-class summary of
what it measured (latency, time to the first streamed text, errors, achieved rate).

Short requests are single sentences of the corpus; long ones are paragraphs of consecutive corpus sentences joined
with spaces and sent as one text (the stream does not split sentences: the model translates the paragraph whole).
Arrivals are open loop: each request is sent at its scheduled time whatever the latency of the others, so a server
that falls behind builds a queue instead of slowing the load down (a closed loop of users hides queueing).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadtest.corpus import paragraph

CLASSES = ("short", "long")
ERROR_KINDS = ("timeout", "connection", "stream")  # besides HTTP statuses other than 200


@dataclass(frozen=True)
class Mix:
    """What the requests are: the fraction that are paragraphs, and a paragraph's sentences (inclusive range)."""

    long_fraction: float = 0.25
    min_sentences: int = 4
    max_sentences: int = 8


@dataclass(frozen=True)
class Planned:
    """One request of a schedule: when to send it (seconds from the start), its class and its text."""

    at_s: float
    kind: str  # "short" or "long"
    text: str
    sentences: int


@dataclass
class Outcome:
    """One request as the client saw it: times from its scheduled send (seconds), status and token counts."""

    kind: str
    status: str  # "200", another HTTP status, or one of ERROR_KINDS
    latency_s: float | None = None  # to the final event (200 only)
    first_text_s: float | None = None  # to the first partial event with text
    lag_s: float = 0.0  # how late the client sent it (its own scheduling)
    input_tokens: int | None = None
    output_tokens: int | None = None
    truncated: bool = False


def schedule(corpus: Sequence[str], rate: float, duration_s: float, mix: Mix, seed: int) -> list[Planned]:
    """Poisson arrivals at ``rate`` per second over ``duration_s`` (exponential gaps), each request a paragraph with
    probability ``mix.long_fraction`` (else one sentence), all drawn from ``corpus`` by a generator seeded with
    ``seed`` and the rate, so that every mode gets the same requests at a given rate."""
    if len(corpus) < mix.max_sentences:
        raise ValueError(f"the corpus has {len(corpus)} sentences, fewer than a paragraph's {mix.max_sentences}")
    rng = random.Random(f"{seed}/{rate!r}")
    planned: list[Planned] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        if rng.random() < mix.long_fraction:
            count, text = paragraph(corpus, rng, (mix.min_sentences, mix.max_sentences))
            planned.append(Planned(at, "long", text, count))
        else:
            planned.append(Planned(at, "short", rng.choice(corpus).strip(), 1))
        at += rng.expovariate(rate)
    return planned


async def _stream_one(http: httpx.AsyncClient, plan: Planned, body: dict[str, Any], started: float,
                      timeout_s: float) -> Outcome:
    due = started + plan.at_s
    outcome = Outcome(plan.kind, "connection", lag_s=max(0.0, time.monotonic() - due))
    event = ""
    try:
        async with asyncio.timeout(timeout_s), http.stream(
                "POST", "/v1/translate/stream", json={"text": plan.text, **body}) as response:
            if response.status_code != 200:
                await response.aread()
                outcome.status = str(response.status_code)
                return outcome
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if event == "partial" and data.get("delta") and outcome.first_text_s is None:
                        outcome.first_text_s = time.monotonic() - due
                    elif event == "final":
                        [translation] = data["translations"]
                        outcome.status, outcome.latency_s = "200", time.monotonic() - due
                        outcome.input_tokens = translation.get("input_tokens")
                        outcome.output_tokens = translation.get("output_tokens")
                        outcome.truncated = bool(translation.get("truncated"))
                        return outcome
                    elif event == "error":
                        outcome.status = str(data.get("error", {}).get("status") or "stream")
                        return outcome
            outcome.status = "stream"  # ended without a final event
    except TimeoutError:
        outcome.status = "timeout"
    except httpx.HTTPError:
        outcome.status = "connection"
    return outcome


async def run_open_loop(url: str, planned: Sequence[Planned], body: dict[str, Any],
                        timeout_s: float) -> tuple[list[Outcome], float]:
    """Send every planned request at its time (never waiting for an answer before sending the next), stream them
    all to their end (or ``timeout_s`` each); return the outcomes in schedule order and the seconds from the start to
    the last answer."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(timeout_s)) as http:
        tasks = []
        for plan in planned:
            delay = started + plan.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_stream_one(http, plan, body, started, timeout_s)))
        outcomes = list(await asyncio.gather(*tasks))
    return outcomes, time.monotonic() - started


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by the nearest rank (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class ClassSummary:
    """One class of requests at one rate: counts, latency and time to first streamed text (ms), errors."""

    kind: str
    requests: int = 0
    ok: int = 0
    achieved_rps: float = 0.0  # answered 200 per second of the run
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # p50, p95, p99
    first_text_ms: dict[str, float | None] = field(default_factory=dict)
    without_text: int = 0  # answered 200 without any partial text (an empty translation)
    errors: dict[str, int] = field(default_factory=dict)  # status or kind -> requests
    truncated: int = 0  # answered with the text cut to the model's positions
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None


def _quantiles(seconds: list[float]) -> dict[str, float | None]:
    return {f"p{q}": None if (v := percentile(seconds, q)) is None else round(v * 1000, 1) for q in (50, 95, 99)}


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def summarize(outcomes: Sequence[Outcome], elapsed_s: float) -> dict[str, ClassSummary]:
    """Per class: how many, how many answered, their latency and first-text percentiles, errors by status or kind
    (``timeout``, ``connection``, ``stream``), and the achieved rate over ``elapsed_s``."""
    summaries = {}
    for kind in CLASSES:
        mine = [o for o in outcomes if o.kind == kind]
        ok = [o for o in mine if o.status == "200"]
        errors: dict[str, int] = {}
        for o in mine:
            if o.status != "200":
                errors[o.status] = errors.get(o.status, 0) + 1
        summaries[kind] = ClassSummary(
            kind=kind, requests=len(mine), ok=len(ok), achieved_rps=round(len(ok) / elapsed_s, 3) if elapsed_s else 0.0,
            latency_ms=_quantiles([o.latency_s for o in ok if o.latency_s is not None]),
            first_text_ms=_quantiles([o.first_text_s for o in ok if o.first_text_s is not None]),
            without_text=sum(1 for o in ok if o.first_text_s is None), errors=dict(sorted(errors.items())),
            truncated=sum(1 for o in ok if o.truncated),
            input_tokens_mean=_mean([o.input_tokens for o in ok if o.input_tokens is not None]),
            output_tokens_mean=_mean([o.output_tokens for o in ok if o.output_tokens is not None]))
    return summaries


def send_lag_ms(outcomes: Sequence[Outcome]) -> dict[str, float | None]:
    """How late the client sent its requests (p50, p99, max; ms): large values mean the load generator, not the
    server, fell behind (it shares the machine)."""
    lags = [o.lag_s for o in outcomes]
    return {"p50": _ms(percentile(lags, 50)), "p99": _ms(percentile(lags, 99)), "max": _ms(max(lags, default=None))}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
