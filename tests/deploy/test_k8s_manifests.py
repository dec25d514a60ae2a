"""deploy/k8s: every manifest against the Kubernetes OpenAPI schemas (kubernetes-validate's bundled copies, offline,
strict: an unknown field is an error), the ServiceMonitor CRD against a schema written here, and the references
between the objects and to the server's real settings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from serving.settings import ServingSettings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
DOCKERFILE = K8S.parents[1] / "Dockerfile"
# Oldest Kubernetes the manifests target: PodDisruptionBudget.unhealthyPodEvictionPolicy is GA in 1.31.
MIN_VERSION = "1.31"
LATEST = kubernetes_validate.latest_version()
# serving/serve_cli.py gives uvicorn this long to close connections once the drain is over.
UVICORN_SHUTDOWN_S = 5
SERVER = {"app.kubernetes.io/name": "mtgate", "app.kubernetes.io/component": "server"}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs.append((path.name, doc))
    return docs


def one(kind: str) -> dict[str, Any]:
    [doc] = [d for _, d in manifests() if d["kind"] == kind]
    return doc


# The part of the Prometheus Operator's ServiceMonitor CRD (monitoring.coreos.com/v1) that our manifest uses, with
# its types and patterns; anything outside it is rejected, so a misspelt field cannot pass.
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "required": ["key", "operator"], "additionalProperties": False,
            "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                           "namespace": {"type": "string"},
                           "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                           "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def _cases() -> list[Any]:
    cases = []
    for name, doc in manifests():
        for version in (LATEST, MIN_VERSION):
            cases.append(pytest.param(name, doc, version, id=f"{name}:{doc['kind']}@{version}"))
    return cases


@pytest.mark.parametrize(("name", "doc", "version"), _cases())
def test_manifest_is_valid(name: str, doc: dict[str, Any], version: str) -> None:
    if doc["apiVersion"] == "monitoring.coreos.com/v1":  # a CRD: kubernetes-validate has no schema for it
        jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
        return
    if doc["apiVersion"] == "ray.io/v1":  # KubeRay's RayJob: its schema lives beside its other tests
        from tests.batch.test_batch_deploy import validate_rayjob

        validate_rayjob(doc, version)
        return
    kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError with the offending path


def test_every_kind_is_there() -> None:
    kinds = {d["kind"] for _, d in manifests()}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    if (K8S / "batch-score-job.yaml").exists():
        assert "Job" in kinds


def test_kustomization_lists_the_server_manifests() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert all((K8S / r).is_file() for r in resources)
    expected = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in ("kustomization.yaml",
                                                                         "batch-score-job.yaml",
                                                                         "batch-score-rayjob.yaml"))
    assert sorted(resources) == expected
    images = {i["name"] for i in kustomization["images"]}
    deployment_images = {c["image"].split(":")[0] for c in one("Deployment")["spec"]["template"]["spec"]["containers"]}
    assert deployment_images <= images


def container() -> dict[str, Any]:
    [c] = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def settings_from_env(monkeypatch: pytest.MonkeyPatch) -> ServingSettings:
    """The ServingSettings the container's environment produces (resourceFieldRef values resolved)."""
    limits = container()["resources"]["limits"]
    for var in container()["env"]:
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
        elif "resourceFieldRef" in var["valueFrom"]:
            ref = var["valueFrom"]["resourceFieldRef"]
            cpu = limits[ref["resource"].split(".", 1)[1]]
            monkeypatch.setenv(var["name"], str(-(-_cpu_cores(cpu) // 1)))  # Kubernetes rounds up
    return ServingSettings()


def _cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_env_names_are_server_settings_and_values_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {f"MTGATE_{name.upper()}" for name in ServingSettings.model_fields}
    names = [v["name"] for v in container()["env"]]
    assert [n for n in names if n.startswith("MTGATE_") and n not in fields] == []
    settings = settings_from_env(monkeypatch)
    assert settings.host == "0.0.0.0"
    assert settings.threads == 2 and settings.log_format == "json"


def test_probes_ports_and_shutdown_match_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from_env(monkeypatch)
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": settings.port}
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    # the model gets minutes to load before the startup probe gives up; liveness never races the load
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    pod = one("Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(settings.port)
    drain = max(settings.grace_period_s, settings.drain_delay_s) + UVICORN_SHUTDOWN_S
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain
    assert settings.drain_delay_s > 0  # readiness turns 503 before the socket closes
    assert c["resources"]["requests"]["cpu"] == c["resources"]["limits"]["cpu"]  # threads = the CPU limit
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])


def test_selectors_and_references_line_up() -> None:
    deployment, service = one("Deployment"), one("Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels.items() >= SERVER.items()
    container_ports = {p["name"] for p in container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    target = one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert one("HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2  # so the PDB can always let one go
    monitor = one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}


def test_pods_run_as_the_image_user() -> None:
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    [user] = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, flags=re.M)
    [expose] = re.findall(r"^EXPOSE\s+(\d+)\s*$", dockerfile, flags=re.M)
    assert int(expose) == container()["ports"][0]["containerPort"]
    for _, doc in manifests():
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True
        assert str(context["runAsUser"]) == user[0]
        for c in pod["containers"]:
            assert c["image"].split(":")[0] == "mtgate"


def test_the_batch_job_runs_the_image_that_has_batch_score() -> None:
    """The server image (mtgate:latest) has no tensorflow: the Job runs the Dockerfile's batch target."""
    [job] = [doc for _, doc in manifests() if doc["kind"] == "Job"]
    [c] = job["spec"]["template"]["spec"]["containers"]
    name, _, target = c["image"].partition(":")
    assert (name, target, c["command"]) == ("mtgate", "batch", ["batch-score"])
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(rf"^FROM\s+\S+\s+AS\s+{target}\s*$", dockerfile, flags=re.M | re.I), "no such Dockerfile target"
    assert "uv pip install -r pyproject.toml --extra batch" in dockerfile
    build = f"docker build --target {target} -t {c['image']} ."
    assert build in (K8S / "batch-score-job.yaml").read_text(encoding="utf-8")
    assert build in (K8S.parents[1] / "README.md").read_text(encoding="utf-8")


def test_validation_would_catch_a_misspelt_field() -> None:
    deployment = one("Deployment")
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, LATEST, strict=True)
    monitor = one("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    monitor = one("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
