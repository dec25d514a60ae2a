"""deploy/monitoring: every query of the Grafana dashboard and the alert rules parses as PromQL (promql-parser) and
names only metrics, and labels, that the real server exposes on /metrics after real traffic (the real app with a
real model package behind TestClient; the shadow's and canary's series from a second app with a shadow candidate and a
canary). The scrape config points at that route and at the Kubernetes annotations.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from serving.server.http import create_app
from serving.server.settings import ServingSettings
from serving.server.shadow import Shadow
from tests.fakes import EchoTranslator

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
K8S = MONITORING.parent / "k8s"
DASHBOARD = MONITORING / "grafana-dashboard.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def exposition(model_package: Path) -> Iterator[dict[str, set[str] | None]]:
    """Series name -> label names seen on /metrics after translating over /v1 and /v2 (and one expired deadline);
    None for a series the server declares (HELP/TYPE) but has no sample of yet."""
    settings = ServingSettings(model_dirs=[model_package], threads=1, max_queue_delay_us=20_000)
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/health").json()
            time.sleep(0.05)
        name = client.get("/v1/models").json()["models"][0]["name"]
        r = client.post("/v1/translate", json={"text": ["A dog runs.", "Hello!"], "max_length": 6})
        assert r.status_code == 200, r.text
        r = client.post(f"/v2/models/{name}/infer", json={
            "inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["A cat."]}],
            "parameters": {"max_length": 6},
        })
        assert r.status_code == 200, r.text
        r = client.post("/v1/translate", json={"text": "Too late.", "timeout_ms": 1})  # waits 20 ms: expires
        assert r.status_code == 504, r.text
        text = client.get("/metrics").text
    # The shadow's and the canary's series (mtgate_shadow_*, mtgate_canary_*): an app with a candidate and a canary.
    shadowed = ServingSettings(model_dirs=[model_package], shadow=model_package, canary_fraction=0.5)
    app = create_app(shadowed.model_copy(update={"shadow": None, "canary_fraction": 0.0}), EchoTranslator())
    service = app.state.service
    service.shadow = Shadow(shadowed, service.metrics.registry, service.default_model, load=EchoTranslator)
    with TestClient(app) as client:
        text += client.get("/metrics").text
    series: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            series.setdefault(family.name + suffix, None)
        for sample in family.samples:
            series[sample.name] = (series.get(sample.name) or set()) | set(sample.labels)
    yield series


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    return queries


def alert_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text(encoding="utf-8"))
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def grafana_variables() -> dict[str, str]:
    """What Grafana substitutes for each variable (the "All" value), plus its built-in interval."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    values = {"__rate_interval": "1m", "__interval": "30s"}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            values[variable["name"]] = variable.get("allValue", ".*")
    return values


def substitute(expr: str) -> str:
    values = grafana_variables()
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def selectors(node: Any) -> list[Any]:
    found: list[Any] = []

    def visit(n: Any) -> None:
        if isinstance(n, promql_parser.VectorSelector):
            found.append(n)

    promql_parser.walk(node, visit)
    return found


def labels_of(exposition: dict[str, set[str] | None], names: list[str]) -> set[str] | None:
    """Union of the label names of these series; None when one of them has no sample to tell."""
    found: set[str] = set()
    for name in names:
        labels = exposition.get(name)
        if labels is None:
            return None
        found |= labels
    return found


def check_query(expr: str, exposition: dict[str, set[str] | None]) -> list[str]:
    """Problems of one query against the exposition (empty when every metric and label exists)."""
    problems = []
    tree = promql_parser.parse(substitute(expr))
    metrics = [s.name for s in selectors(tree)]
    if not metrics:
        problems.append("queries no metric")
    for selector in selectors(tree):
        if not selector.name.startswith("mtgate_"):
            problems.append(f"{selector.name}: not an mtgate metric")
        elif selector.name not in exposition:
            problems.append(f"{selector.name}: not on /metrics")
        else:
            labels = exposition[selector.name]
            for matcher in selector.matchers.matchers:
                if labels is not None and matcher.name not in labels:
                    problems.append(f"{selector.name}: no label {matcher.name!r} (has {sorted(labels)})")

    def visit(n: Any) -> None:
        if isinstance(n, promql_parser.AggregateExpr) and n.modifier is not None:
            inner = labels_of(exposition, [s.name for s in selectors(n.expr)])
            for label in n.modifier.labels:
                if inner is not None and label not in inner:
                    problems.append(f"aggregation by {label!r}: no such label on {[s.name for s in selectors(n.expr)]}")

    promql_parser.walk(tree, visit)
    return problems


def test_dashboard_covers_latency_throughput_queue_and_batch_size() -> None:
    exprs = " ".join(e for _, e in dashboard_queries())
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(mtgate_request_duration_seconds_bucket" in exprs
    for metric in ("mtgate_sentences_total", "mtgate_output_tokens_total", "mtgate_requests_total",
                   "mtgate_queue_depth", "mtgate_batch_size_bucket", "mtgate_queue_wait_seconds_bucket"):
        assert metric in exprs, metric
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:  # every panel reads the dashboard's datasource variable
        assert panel["type"] == "row" or panel["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize(("title", "expr"), dashboard_queries() + alert_queries())
def test_query_metrics_exist_on_metrics(title: str, expr: str, exposition: dict[str, set[str] | None]) -> None:
    assert check_query(expr, exposition) == []
    # and the traffic produced samples of each, so that the label checks above really ran
    unobserved = [s.name for s in selectors(promql_parser.parse(substitute(expr))) if exposition[s.name] is None]
    assert unobserved == []


def test_alerts_cover_canary_rollbacks_and_shed_shadow_work() -> None:
    alerts = dict(alert_queries())
    assert "mtgate_canary_rolled_back" in alerts["MtgateCanaryRolledBack"]  # as long as the rollback stands
    assert 'mtgate_shadow_requests_total{outcome="shed"}' in alerts["MtgateShadowShedding"]
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text(encoding="utf-8"))
    [shedding] = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == "MtgateShadowShedding"]
    assert shedding["for"] == "15m"  # sustained, not a burst


def test_the_check_catches_a_wrong_name_or_label(exposition: dict[str, set[str] | None]) -> None:
    assert check_query("rate(mtgate_request_seconds_bucket[1m])", exposition) == [
        "mtgate_request_seconds_bucket: not on /metrics"]
    assert check_query('sum by (route) (rate(mtgate_sentences_total{model=~".*"}[1m]))', exposition)
    assert check_query('mtgate_queue_depth{modell="x"}', exposition)


def test_template_variables_use_exposed_labels(exposition: dict[str, set[str] | None]) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"]).groups()
        assert label in (exposition[metric] or set()), (metric, label)
    [route] = [v for v in dashboard["templating"]["list"] if v["name"] == "route"]
    pattern = re.compile(route["regex"].strip("/"))
    for value in route["current"]["value"]:
        assert pattern.fullmatch(value) and re.fullmatch(route["allValue"], value)


def test_legend_placeholders_are_labels(exposition: dict[str, set[str] | None]) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            wanted = set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
            tree = promql_parser.parse(substitute(target["expr"]))
            have = labels_of(exposition, [s.name for s in selectors(tree)])
            assert have is not None and wanted <= have, (panel["title"], wanted, have)


def test_scrape_config_targets_the_metrics_route_and_the_pod_annotations() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        assert (MONITORING / rule_file).is_file()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    local = jobs["mtgate"]
    assert local["metrics_path"] == "/metrics"
    [target] = local["static_configs"][0]["targets"]
    assert target.endswith(f":{ServingSettings().port}")
    pod_job = jobs["mtgate-kubernetes-pods"]
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text(encoding="utf-8"))
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def meta(prefix: str, key: str) -> str:
        return prefix + re.sub(r"[^A-Za-z0-9_]", "_", key)

    for rule in pod_job["relabel_configs"]:
        assert rule.get("action", "replace") in {"keep", "drop", "replace"}
        re.compile(rule.get("regex", "(.*)"))
        for source in rule["source_labels"]:
            if source.startswith("__meta_kubernetes_pod_annotation_"):
                assert source in {meta("__meta_kubernetes_pod_annotation_", k) for k in annotations}, source
            if source.startswith("__meta_kubernetes_pod_label_"):
                assert source in {meta("__meta_kubernetes_pod_label_", k) for k in labels}, source
    # the address rewrite yields the annotated port
    [rewrite] = [r for r in pod_job["relabel_configs"] if r.get("target_label") == "__address__"]
    joined = f"10.0.0.7:9999;{annotations['prometheus.io/port']}"
    assert re.sub(rewrite["regex"], rewrite["replacement"].replace("$", "\\"), joined) == "10.0.0.7:8000"
