"""/metrics answers the queries written for Triton (its Grafana dashboards, its autoscaling recipes) unchanged: the
``nv_inference_*`` families per model and version, in Triton's names, types, labels and units (the same numbers as
the statistics extension, in microseconds), Triton's host CPU and memory, and the process's own CPU and memory.

The queries below are written for this test in the form Triton's dashboards use (rates of the cumulative counters,
their ratios per model and version); they are checked against the exposition the real app serves after traffic.
"""

from __future__ import annotations

import re
from pathlib import Path

import promql_parser
import pytest

from tests.fakes import EchoTranslator
from tests.serving.server.conftest import serve_app

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:\w+="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

COUNTERS = ["nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us"]

# What Triton users chart and scale on: throughput, failures, latency split per request, batch size, backlog, host.
TRITON_QUERIES = [
    'sum by (model, version) (rate(nv_inference_request_success{model=~".*"}[1m]))',
    'sum by (model) (rate(nv_inference_request_failure[1m]))',
    'rate(nv_inference_request_duration_us[1m]) / clamp_min(rate(nv_inference_request_success[1m]), 1)',
    'avg by (model, version) (rate(nv_inference_queue_duration_us[1m]) / (1 + rate(nv_inference_request_success[1m])))',
    'sum by (model) (rate(nv_inference_compute_input_duration_us[1m]))',
    'sum by (model) (rate(nv_inference_compute_infer_duration_us[1m]))',
    'sum by (model) (rate(nv_inference_compute_output_duration_us[1m]))',
    'sum by (model) (rate(nv_inference_count[1m])) / sum by (model) (rate(nv_inference_exec_count[1m]))',
    'sum by (model, version) (nv_inference_pending_request_count)',
    'avg(nv_cpu_utilization)',
    'nv_cpu_memory_used_bytes / nv_cpu_memory_total_bytes',
    'rate(process_cpu_seconds_total[1m])',
    'process_resident_memory_bytes',
]


def parse_exposition(text: str) -> tuple[dict[str, str], dict[str, list[tuple[dict[str, str], float]]]]:
    """(family -> declared type, series name -> [(labels, value)]) read as Prometheus reads the text format: the
    sample names as written (prometheus_client's parser would rename counters to ``..._total``)."""
    types: dict[str, str] = {}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            name, labels, value = match.groups()
            samples.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), float(value)))
    return types, samples


def vector_selectors(tree: object) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(tree, visit)
    return found


def test_triton_metric_names_labels_and_units() -> None:
    with serve_app(EchoTranslator(step_delay=0.002, fail_on="BOOM"), max_queue_delay_us=20_000) as client:
        assert client.post("/v1/translate", json={"text": ["a b c", "d e"]}).status_code == 200
        r = client.post("/v2/models/echo/infer", json={
            "inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["f g"]}]})
        assert r.status_code == 200, r.text
        assert client.post("/v1/translate", json={"text": "BOOM now"}).status_code == 500  # a failed request
        text = client.get("/metrics").text
        stats = client.get("/v2/models/echo/stats").json()["model_stats"]

    types, samples = parse_exposition(text)
    [entry] = stats
    inference = entry["inference_stats"]
    expected = {
        "nv_inference_request_success": inference["success"]["count"],
        "nv_inference_request_failure": inference["fail"]["count"],
        "nv_inference_count": entry["inference_count"],
        "nv_inference_exec_count": entry["execution_count"],
        "nv_inference_request_duration_us": inference["success"]["ns"] / 1000,
        "nv_inference_queue_duration_us": inference["queue"]["ns"] / 1000,
        "nv_inference_compute_input_duration_us": inference["compute_input"]["ns"] / 1000,
        "nv_inference_compute_infer_duration_us": inference["compute_infer"]["ns"] / 1000,
        "nv_inference_compute_output_duration_us": 0,
    }
    assert (inference["success"]["count"], inference["fail"]["count"], entry["inference_count"]) == (2, 1, 4)
    for name in COUNTERS:
        assert types[name] == "counter", name  # named as Triton names them: no _total suffix
        [(labels, value)] = samples[name]
        assert labels == {"model": "echo", "version": "1"}, name
        assert value == pytest.approx(expected[name], abs=1e-3), name  # microseconds, from the same statistics
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us"):
        assert samples[name][0][1] > 0, name
    # the fake engine sleeps 2 ms a decoding step, so the two requests' engine time is milliseconds: thousands of us
    assert 5_000 <= samples["nv_inference_compute_infer_duration_us"][0][1] < 10_000_000
    assert types["nv_inference_pending_request_count"] == "gauge"
    assert samples["nv_inference_pending_request_count"] == [({"model": "echo", "version": "1"}, 0.0)]

    if Path("/proc/stat").exists():  # Triton's host metrics, and the process's own, where /proc is
        [(_, utilization)] = samples["nv_cpu_utilization"]
        assert 0.0 <= utilization <= 1.0
        [(_, used)] = samples["nv_cpu_memory_used_bytes"]
        [(_, total)] = samples["nv_cpu_memory_total_bytes"]
        assert 0 < used <= total
        assert samples["process_cpu_seconds_total"][0][1] > 0
        assert samples["process_resident_memory_bytes"][0][1] > 10_000_000

    for query in TRITON_QUERIES:
        selectors = vector_selectors(promql_parser.parse(query))
        assert selectors, query
        for selector in selectors:
            assert selector.name in samples, (query, selector.name)
            have = set().union(*(labels for labels, _ in samples[selector.name]))
            wanted = {m.name for m in selector.matchers.matchers}
            assert wanted <= have, (query, selector.name, wanted - have)
        grouped = re.findall(r"by \(([^)]*)\)", query)
        for group in grouped:
            for label in (part.strip() for part in group.split(",")):
                assert any(label in labels for s in selectors for labels, _ in samples[s.name]), (query, label)
