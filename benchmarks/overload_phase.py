"""The load of ``benchmarks.overload``: closed-loop clients on loopback, and what a phase of them did, from their
side (statuses, latency, Retry-After) and from the server's (its per-batch log lines and late-sentence counter)."""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

LATE_SLACK_S = 0.05  # the server's deadline starts when it reads the request, a little after the client sent it


@dataclass
class Phase:
    """One run of closed-loop clients against one server."""

    phase: str
    round: int
    clients: int
    duration_s: float
    statuses: dict[str, int] = field(default_factory=dict)  # HTTP status (or "error") -> requests answered
    ok_rps: float = 0.0
    p50_s: float | None = None
    p95_s: float | None = None
    retry_after_median_s: float | None = None
    computed_sentences: int = 0  # in batches done during the phase (the server's log)
    useful_sentences: int = 0  # of the requests answered 200
    engine_s: float = 0.0  # the batches' infer time
    late_sentences_log: int = 0  # at least this many computed sentences were done after their deadline
    late_sentences_metric: float | None = None  # the server's own count, when it has one
    loop_cpu_s: float | None = None  # CPU of the server's event-loop thread (parsing, refusing, answering; Linux)
    client_cpu_s: float = 0.0  # CPU of the load generator (this process) while its clients ran


@dataclass
class Sent:
    """One request a client sent and how it was answered."""

    rid: str
    sent_wall: float
    latency_s: float
    status: str
    retry_after: float | None


def loop_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``'s main thread, where uvicorn's event loop parses, refuses and
    answers every request (the engine decodes on other threads); None where ``/proc`` does not tell."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def late_metric(url: str) -> float | None:
    """``mtgate_late_sentences_total`` summed over models (None: the server has no such metric)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("mtgate_late_sentences_total{")]
    return sum(values) if values or "mtgate_late_sentences_total" in text else None


def batches_logged(log_path: Path, offset: int) -> list[tuple[float, int, list[str], float]]:
    """(when done, batch size, request ids, infer seconds) of every batch the server logged after byte ``offset``."""
    batches = []
    with log_path.open("rb") as f:
        f.seek(offset)
        for raw in f:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            message = entry.get("message", "") if isinstance(entry, dict) else ""
            if not message.startswith("batch model="):
                continue
            fields = dict(part.split("=", 1) for part in message.split() if "=" in part)
            stamp, millis = entry["ts"].rstrip("Z").split(".")
            done = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000
            rids = [r for r in fields.get("request_ids", "").split(",") if r]
            batches.append((done, int(fields["batch_size"]), rids, float(fields.get("infer_ms", 0)) / 1000))
    return batches


async def run_clients(url: str, clients: int, sentences: int, duration_s: float, corpus: list[str], seed: int,
                      honour_retry_after: bool, timeout_ms: int | None, prefix: str) -> list[Sent]:
    """``clients`` closed-loop clients for ``duration_s``; every request answered within it."""
    sent: list[Sent] = []
    started = time.monotonic()
    end = started + duration_s
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)

    async def client(index: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(seed * 100_003 + index)
        for n in range(1_000_000):
            body: dict[str, Any] = {"text": [rng.choice(corpus) for _ in range(sentences)]}
            if timeout_ms is not None:
                body["timeout_ms"] = timeout_ms
            rid = f"{prefix}-{index}-{n}"
            wall, t0 = time.time(), time.monotonic()
            try:
                r = await http.post("/v1/translate", json=body, headers={"X-Request-ID": rid})
                status, retry = str(r.status_code), r.headers.get("retry-after")
            except httpx.HTTPError:
                status, retry = "error", None
            if time.monotonic() > end:
                return
            sent.append(Sent(rid, wall, time.monotonic() - t0, status,
                              float(retry) if retry and retry.isdigit() else None))
            if status == "503" and honour_retry_after and retry and retry.isdigit():
                await asyncio.sleep(min(float(retry), max(0.0, end - time.monotonic())))

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=duration_s + 120) as http:
        tasks = [asyncio.create_task(client(i, http)) for i in range(clients)]
        await asyncio.wait(tasks, timeout=max(0.0, end - time.monotonic()))
        for task in tasks:  # requests still open are abandoned: the connection closes, the server drops them
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return sent


def summarize(phase: str, round_: int, clients: int, duration_s: float, sent: list[Sent], sentences: int,
              deadline_s: float, batches: list[tuple[float, int, list[str], float]],
              late_counter: float | None) -> Phase:
    ok = sorted(s.latency_s for s in sent if s.status == "200")
    retries = [s.retry_after for s in sent if s.retry_after is not None]
    due = {s.rid: s.sent_wall + deadline_s + LATE_SLACK_S for s in sent}
    late = 0
    for done, size, rids, _ in batches:
        late_requests = sum(1 for rid in rids if rid in due and done > due[rid])
        late += size if rids and late_requests == len(rids) else late_requests
    return Phase(
        phase=phase, round=round_, clients=clients, duration_s=duration_s,
        statuses=dict(Counter(s.status for s in sent)),
        ok_rps=len(ok) / duration_s, p50_s=statistics.median(ok) if ok else None,
        p95_s=ok[min(len(ok) - 1, int(0.95 * len(ok)))] if ok else None,
        retry_after_median_s=statistics.median(retries) if retries else None,
        computed_sentences=sum(b[1] for b in batches), useful_sentences=len(ok) * sentences,
        engine_s=sum(b[3] for b in batches), late_sentences_log=late, late_sentences_metric=late_counter,
    )
