"""``mtgate validate``'s cost: price per core-hour x cores / output tokens per second, per million output tokens,
and the capacity plan for the expected load.

The throughput comes from the load scenario that decodes as the quality run did (the same beam size); without one,
from the test set's timed passes in process (``loadtest.validate.speed``: their median). The speed is left to that
scenario when one is selected: no timed passes then (:func:`load_scenario_for_cost`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.capacity import CapacityConfig, Plan, cost_per_million_at_full_use, plan
from loadtest.quality import SystemScore
from loadtest.targets import TargetsFile

if TYPE_CHECKING:
    from loadtest.validate.command import Outcome

estimate_cost = cost_per_million_at_full_use  # the name validate's callers know


def load_scenario_for_cost(targets: TargetsFile | None, names: list[str], beam: int, default_beam: int) -> str | None:
    """The first selected load scenario that decodes with the quality run's beam: its throughput prices the model,
    so the speed is left to it (None: no such scenario; the test set's timed passes in process price it)."""
    if targets is None:
        return None
    return next((s.name for s in targets.select(names) if (s.beam_size or default_beam) == beam), None)


def quality_beam(package: Path, beam_size: int | None) -> int:
    """The beam the test set was translated with: ``--beam-size``, else the package's default."""
    from serving.package import read_manifest

    return beam_size or int(read_manifest(package).get("decoding", {}).get("beam_size") or 1)


def throughput_cost(outcome: Outcome, candidate: SystemScore, cores: int, price: float, beam: int,
                    default_beam: int) -> dict[str, Any]:
    """Cost from the load scenario that decodes as the quality run did (same beam size), else from the test set's
    timed passes in process (their median)."""
    matching = [(r.run.tokens.output_tokens_per_s, f"load scenario {r.scenario.name}")
                for r in outcome.load if r.run.tokens is not None and r.run.tokens.output_tokens
                and (r.scenario.beam_size or default_beam) == beam]
    if matching:
        tokens_per_s, source = max(matching)
        note = f"Throughput from {source}, which decodes with beam {beam} as the quality run did."
    elif candidate.speed is None and outcome.speed_left_to is not None:
        tokens_per_s, source = 0.0, f"load scenario {outcome.speed_left_to}"
        note = (f"Load scenario {outcome.speed_left_to} decodes with beam {beam} as the quality run did, but measured "
                "no output tokens: no throughput, no cost.")
    else:
        tokens_per_s, source = candidate.tokens_per_s, "test set, in process"
        note = (f"No load scenario decodes with beam {beam} as the quality run did: throughput from the test-set "
                "run in process" if outcome.load else "Throughput from the test-set run in process (no load run)")
        note += f", {candidate.speed.text()} output tokens/s." if candidate.speed is not None else "."
    return {"price_per_core_hour": price, "cores": cores, "tokens_per_s": tokens_per_s, "throughput_source": source,
            "throughput_note": note, "beam_size": beam,
            "per_million_tokens": estimate_cost(tokens_per_s, cores, price)}


def capacity_plan(outcome: Outcome, capacity: CapacityConfig | None, cores: int) -> Plan | None:
    """The plan for the expected load at the throughput the cost used (None: no ``capacity:`` or no cost)."""
    if capacity is None or outcome.cost is None:
        return None
    source = outcome.cost["throughput_source"]
    scenario = next((r for r in outcome.load if f"load scenario {r.scenario.name}" == source), None)
    per_request = None
    if scenario is not None and scenario.run.tokens is not None:
        total = sum(e.requests for e in scenario.run.request_entries)
        per_request = scenario.run.tokens.output_tokens / total if total else None
    elif outcome.quality.get("candidate"):
        q = outcome.quality["candidate"]
        per_request = q.output_tokens / q.sentences if q.sentences else None
    return plan(capacity, outcome.cost["tokens_per_s"], cores, per_request)
