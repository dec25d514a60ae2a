"""capacity.py against hand-computed cases."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from loadtest.capacity import CapacityConfig, cost_per_million_at_full_use, describe, plan

MONTH_DAYS = 365 / 12  # 30.4166...


def _config(**prices: float) -> CapacityConfig:
    return CapacityConfig.model_validate({"load": {"peak_rps": 20, "tokens_per_request": 40, "hours_per_day": 12},
                                          "prices": prices, "headroom": 0.3})


def test_replicas_cores_and_costs_by_hand() -> None:
    # demand 20 req/s x 40 tokens = 800 tok/s; a replica does 500 tok/s, planned at 70 %: 350 -> ceil(800/350) = 3
    p = plan(_config(cloud_per_core_hour=0.05, onprem_per_core_hour=0.02, node_per_month=300, node_cores=16),
             replica_tokens_per_s=500, cores_per_replica=2)
    assert p is not None
    assert (p.demand_tokens_per_s, p.replicas, p.cores) == (800, 3, 6)
    assert p.utilisation == pytest.approx(800 / 1500)
    assert (p.replicas_per_node, p.nodes) == (8, 1)  # 16 cores / 2 per replica; 3 replicas fit on one node
    # cloud: 6 cores x 0.05 x 12 h x 30.4167 d = 109.50; on-prem: 6 x 0.02 x 24 h x 30.4167 d = 87.60; node: 300
    assert p.per_month == pytest.approx({"cloud": 6 * 0.05 * 12 * MONTH_DAYS, "onprem": 6 * 0.02 * 24 * MONTH_DAYS,
                                         "node": 300.0})
    assert p.per_month["cloud"] == pytest.approx(109.5) and p.per_month["onprem"] == pytest.approx(87.6)
    tokens = 800 * 3600 * 12 * MONTH_DAYS  # 1,051,200,000 per month
    assert p.tokens_per_month == pytest.approx(1.0512e9)
    assert p.per_million_tokens["cloud"] == pytest.approx(109.5 / 1051.2)
    assert p.per_million_tokens["node"] == pytest.approx(300 / tokens * 1e6)
    assert p.three_years == pytest.approx({k: v * 36 for k, v in p.per_month.items()})
    assert p.basis == "cloud" and p.cost_per_month == pytest.approx(109.5)
    assert describe(p).startswith("3 replica(s) x 2 core(s) = 6 cores on 1 node(s) for 800 output tokens/s")


def test_edges() -> None:
    config = _config(onprem_per_core_hour=0.02)
    # exactly at the usable capacity: 800 / (1142.857 x 0.7) = 1.0 -> one replica, not two
    p = plan(config, replica_tokens_per_s=800 / 0.7, cores_per_replica=4)
    assert p is not None and p.replicas == 1 and p.basis == "onprem" and p.nodes is None
    # tiny demand still needs one replica
    small = CapacityConfig.model_validate({"load": {"peak_rps": 0.01}, "prices": {"cloud_per_core_hour": 1}})
    p = plan(small, replica_tokens_per_s=100, cores_per_replica=1, measured_tokens_per_request=12)
    assert p is not None and p.replicas == 1 and p.tokens_per_request == 12 and p.demand_tokens_per_s == 0.12
    assert plan(small, 0.0, 1, 12) is None and plan(small, 100, 1, None) is None
    # 1000 tok/s on 2 cores at 0.05 per core-hour: 0.1 per hour for 3.6M tokens
    assert cost_per_million_at_full_use(1000.0, 2, 0.05) == pytest.approx(0.1 / 3.6)
    assert cost_per_million_at_full_use(0.0, 2, 0.05) is None


def test_config_is_checked() -> None:
    with pytest.raises(ValidationError, match="give at least one price"):
        CapacityConfig.model_validate({"load": {"peak_rps": 1}, "prices": {}})
    with pytest.raises(ValidationError, match="node_per_month and node_cores go together"):
        CapacityConfig.model_validate({"load": {"peak_rps": 1}, "prices": {"node_per_month": 100}})
    with pytest.raises(ValidationError, match="rank_by node: no such price given"):
        CapacityConfig.model_validate({"load": {"peak_rps": 1}, "prices": {"cloud_per_core_hour": 1},
                                       "rank_by": "node"})
    with pytest.raises(ValidationError):
        CapacityConfig.model_validate({"load": {"peak_rps": 1, "hours_per_day": 25},
                                       "prices": {"cloud_per_core_hour": 1}})
