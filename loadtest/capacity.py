"""Capacity and cost: from one replica's measured throughput and an expected load, the replicas and cores needed
(with headroom), and what they cost per million tokens, per month and over three years.

The arithmetic, each step a line of :func:`plan`:

- demand (output tokens/s) = peak requests/s x output tokens per request;
- one replica may be planned at ``(1 - headroom)`` of its measured tokens/s; replicas = ceil(demand / that), >= 1;
- cores = replicas x cores per replica; nodes = ceil(replicas / replicas per node), replicas per node =
  floor(node cores / cores per replica);
- a month is 365 / 12 days. Cloud cores are paid for the hours they run (``hours_per_day``); on-prem cores are owned
  around the clock (24 h a day); nodes are paid per month;
- tokens per month = demand x 3600 x hours_per_day x 365 / 12; cost per million tokens = monthly cost / tokens per
  month x 10^6; three years = 36 months.

Throughput must be measured at the decoding that quality was measured with (beam size, max length): a greedy
scenario's tokens/s makes a beam-4 model look several times cheaper than it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DAYS_PER_MONTH = 365 / 12
MONTHS = 36
Basis = Literal["cloud", "onprem", "node"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Load(_Strict):
    """The expected traffic: requests per second at peak, for ``hours_per_day`` hours a day."""

    peak_rps: float = Field(gt=0)
    tokens_per_request: float | None = Field(default=None, gt=0,
                                             description="output tokens per request (default: as measured)")
    hours_per_day: float = Field(default=24.0, gt=0, le=24)


class Prices(_Strict):
    """Prices in one currency: per core-hour on-prem and in a cloud, or per node per month (with its cores)."""

    currency: str = Field(default="USD", pattern=r"^[A-Za-z$€£¥]{1,8}$",
                          description="what the prices are in, shown beside every cost (default USD)")
    onprem_per_core_hour: float | None = Field(default=None, gt=0)
    cloud_per_core_hour: float | None = Field(default=None, gt=0)
    node_per_month: float | None = Field(default=None, gt=0)
    node_cores: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _complete(self) -> Prices:
        if (self.node_per_month is None) != (self.node_cores is None):
            raise ValueError("node_per_month and node_cores go together")
        if not self.bases:
            raise ValueError("give at least one price: cloud_per_core_hour, onprem_per_core_hour or node_per_month")
        return self

    @property
    def bases(self) -> list[Basis]:
        """The prices given, in the order the cheapest configuration is ranked by (the first one)."""
        given: list[tuple[Basis, float | None]] = [("cloud", self.cloud_per_core_hour),
                                                   ("onprem", self.onprem_per_core_hour),
                                                   ("node", self.node_per_month)]
        return [basis for basis, price in given if price is not None]


class CapacityConfig(_Strict):
    """The ``capacity:`` section of a targets or sweep file."""

    load: Load
    prices: Prices
    headroom: float = Field(default=0.3, ge=0.0, lt=1.0,
                            description="share of a replica's measured throughput kept free (0.3: plan at 70 %)")
    rank_by: Basis | None = Field(default=None, description="price the cheapest configuration is chosen by "
                                                            "(default: the first of cloud, onprem, node given)")

    @model_validator(mode="after")
    def _rank_by_is_priced(self) -> CapacityConfig:
        if self.rank_by is not None and self.rank_by not in self.prices.bases:
            raise ValueError(f"rank_by {self.rank_by}: no such price given")
        return self

    @property
    def basis(self) -> Basis:
        return self.rank_by or self.prices.bases[0]


@dataclass(frozen=True)
class Plan:
    """Replicas, cores and costs for one configuration under the expected load."""

    replica_tokens_per_s: float
    cores_per_replica: int
    tokens_per_request: float
    demand_tokens_per_s: float
    replicas: int
    cores: int
    replicas_per_node: int | None
    nodes: int | None
    utilisation: float
    tokens_per_month: float
    per_month: dict[str, float]
    per_million_tokens: dict[str, float]
    three_years: dict[str, float]
    basis: Basis
    currency: str = "USD"

    @property
    def cost_per_month(self) -> float:
        """The monthly cost by the ranking price."""
        return self.per_month[self.basis]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cost_per_month": self.cost_per_month}


def cost_per_million_at_full_use(tokens_per_s: float, cores: int, price_per_core_hour: float) -> float | None:
    """Price per million output tokens of cores kept busy at this throughput, or None without throughput."""
    if tokens_per_s <= 0:
        return None
    return price_per_core_hour * cores / 3600.0 / tokens_per_s * 1e6


def plan(config: CapacityConfig, replica_tokens_per_s: float, cores_per_replica: int,
         measured_tokens_per_request: float | None = None) -> Plan | None:
    """The capacity plan for one replica's measured throughput; None when nothing was measured.

    Arguments:
        config: load, prices, headroom.
        replica_tokens_per_s: output tokens per second one replica sustained while meeting its targets.
        cores_per_replica: cores one replica uses (its runtime threads).
        measured_tokens_per_request: output tokens per request in the run, used unless the load states its own.
    """
    tokens_per_request = config.load.tokens_per_request or measured_tokens_per_request
    if replica_tokens_per_s <= 0 or not tokens_per_request:
        return None
    demand = config.load.peak_rps * tokens_per_request
    usable = replica_tokens_per_s * (1 - config.headroom)
    replicas = max(1, math.ceil(demand / usable - 1e-9))
    cores = replicas * cores_per_replica
    prices = config.prices
    per_node = nodes = None
    if prices.node_cores is not None:
        per_node = max(1, prices.node_cores // cores_per_replica)
        nodes = math.ceil(replicas / per_node)
    hours = config.load.hours_per_day
    tokens_per_month = demand * 3600 * hours * DAYS_PER_MONTH
    per_month: dict[str, float] = {}
    if prices.cloud_per_core_hour is not None:
        per_month["cloud"] = cores * prices.cloud_per_core_hour * hours * DAYS_PER_MONTH
    if prices.onprem_per_core_hour is not None:
        per_month["onprem"] = cores * prices.onprem_per_core_hour * 24 * DAYS_PER_MONTH
    if prices.node_per_month is not None and nodes is not None:
        per_month["node"] = nodes * prices.node_per_month
    return Plan(
        replica_tokens_per_s=replica_tokens_per_s, cores_per_replica=cores_per_replica,
        tokens_per_request=tokens_per_request, demand_tokens_per_s=demand, replicas=replicas, cores=cores,
        replicas_per_node=per_node, nodes=nodes, utilisation=demand / (replicas * replica_tokens_per_s),
        tokens_per_month=tokens_per_month, per_month=per_month,
        per_million_tokens={k: v / tokens_per_month * 1e6 for k, v in per_month.items()},
        three_years={k: v * MONTHS for k, v in per_month.items()}, basis=config.basis, currency=prices.currency)


def describe(p: Plan) -> str:
    """One line: replicas, cores, utilisation and the ranking cost."""
    nodes = f" on {p.nodes} node(s)" if p.nodes is not None else ""
    return (f"{p.replicas} replica(s) x {p.cores_per_replica} core(s) = {p.cores} cores{nodes} for "
            f"{p.demand_tokens_per_s:.0f} output tokens/s at peak ({p.utilisation:.0%} of measured capacity); "
            f"{p.basis}: {p.per_month[p.basis]:.2f} {p.currency} per month, {p.per_million_tokens[p.basis]:.4f} "
            f"{p.currency} per million tokens, {p.three_years[p.basis]:.2f} {p.currency} over three years")


def plan_rows(p: Plan) -> list[list[str]]:
    """A table of the plan: one row per price basis."""
    rows = [["price", f"per month ({p.currency})", f"per million output tokens ({p.currency})",
             f"three years ({p.currency})"]]
    rows += [[basis, f"{p.per_month[basis]:.2f}", f"{p.per_million_tokens[basis]:.4f}",
              f"{p.three_years[basis]:.2f}"] for basis in p.per_month]
    return rows
