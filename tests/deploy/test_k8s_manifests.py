"""deploy/k8s, deploy/prometheus-operator and deploy/kserve: every manifest against the Kubernetes OpenAPI schemas
(kubernetes-validate's bundled copies, offline, strict: an unknown field is an error) and the custom resources
against their vendored CRD schemas (tests/deploy/crds/, through the same definitions: k8s_schemas.py); what each
kustomization builds; and the references between the objects and to the server's real settings and image.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from serving.server.settings import ServingSettings
from serving.server.versions import VersionPolicy, served_versions
from tests.deploy.k8s_schemas import CRDS, crd_schema, schema_name, validate
from tests.deploy.kustomize import build, kustomization, load

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"  # the server on any cluster: kubectl apply -k deploy/k8s
OPERATOR = DEPLOY / "prometheus-operator"  # the same plus ServiceMonitor and PrometheusRule
KSERVE = DEPLOY / "kserve"
MONITORING = DEPLOY / "monitoring"
DOCKERFILE = DEPLOY.parent / "Dockerfile"
ONE_OFF = ("batch-score-job.yaml", "batch-score-rayjob.yaml")  # applied on their own, not in the kustomization
# Oldest Kubernetes the manifests target: PodDisruptionBudget.unhealthyPodEvictionPolicy is GA in 1.31.
MIN_VERSION = "1.31"
LATEST = kubernetes_validate.latest_version()
# serving/commands/serve.py gives uvicorn this long to close connections once the drain is over.
UVICORN_SHUTDOWN_S = 5
SERVER = {"app.kubernetes.io/name": "mtgate", "app.kubernetes.io/component": "server"}
BASE_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for folder in (K8S, OPERATOR, KSERVE):
        for path in sorted(folder.glob("*.yaml")):
            if path.name != "kustomization.yaml":
                docs.extend((f"{folder.name}/{path.name}", doc) for doc in load(path))
    return docs


def one(kind: str) -> dict[str, Any]:
    [doc] = [d for _, d in manifests() if d["kind"] == kind]
    return doc


def _cases() -> list[Any]:
    return [pytest.param(doc, version, id=f"{name}:{doc['kind']}@{version}")
            for name, doc in manifests() for version in (LATEST, MIN_VERSION)]


@pytest.mark.parametrize(("doc", "version"), _cases())
def test_manifest_is_valid(doc: dict[str, Any], version: str) -> None:
    validate(doc, version)  # raises kubernetes_validate.ValidationError with the offending path


def test_every_kind_has_one_schema() -> None:
    """A built-in kind is kubernetes-validate's; a custom resource has its CRD's schema vendored (never both)."""
    for name, doc in manifests():
        try:
            kubernetes_validate.validate(doc, LATEST, strict=True)
            builtin = True
        except kubernetes_validate.SchemaNotFoundError:
            builtin = False
        except kubernetes_validate.ValidationError:
            builtin = True
        assert builtin != (crd_schema(doc) is not None), (name, doc["kind"])


def test_every_kind_is_there() -> None:
    kinds = {d["kind"] for _, d in manifests()}
    assert BASE_KINDS | {"ServiceMonitor", "PrometheusRule", "ServingRuntime", "InferenceService", "Job",
                         "RayJob"} <= kinds


# ---------------------------------------------------------------- the kustomizations


def test_base_kustomization_applies_on_a_plain_cluster() -> None:
    """deploy/k8s lists every server manifest and builds built-in kinds only: no CRD, no operator needed."""
    resources = kustomization(K8S)["resources"]
    assert sorted(resources) == sorted(p.name for p in K8S.glob("*.yaml")
                                       if p.name not in ("kustomization.yaml", *ONE_OFF))
    docs = build(K8S)
    assert sorted(d["kind"] for d in docs) == sorted(BASE_KINDS)
    for doc in docs:
        assert crd_schema(doc) is None, doc["kind"]
        kubernetes_validate.validate(doc, MIN_VERSION, strict=True)  # a SchemaNotFoundError would be a CRD
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "mtgate"
    images = {i["name"] for i in kustomization(K8S)["images"]}
    pod = one("Deployment")["spec"]["template"]["spec"]
    assert {c["image"].split(":")[0] for c in [*pod["containers"], *pod["initContainers"]]} <= images


def test_operator_overlay_adds_servicemonitor_and_prometheusrule() -> None:
    base = {(d["kind"], d["metadata"]["name"]) for d in build(K8S)}
    overlay = build(OPERATOR)
    assert kustomization(OPERATOR)["resources"][0] == "../k8s"  # the base, not a copy of it
    added = sorted(d["kind"] for d in overlay if (d["kind"], d["metadata"]["name"]) not in base)
    assert added == ["PrometheusRule", "ServiceMonitor"]
    assert len(overlay) == len(base) + 2
    for doc in overlay:
        validate(doc, MIN_VERSION)


def test_kserve_kustomization_builds_the_runtime_and_the_inferenceservice() -> None:
    assert sorted(d["kind"] for d in build(KSERVE)) == ["InferenceService", "ServingRuntime"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("folder", [K8S, OPERATOR, KSERVE], ids=lambda p: p.name)
def test_kubectl_kustomize_builds_the_same(folder: Path) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted((d for d in yaml.safe_load_all(out.stdout) if d), key=key) == sorted(build(folder), key=key)


# ---------------------------------------------------------------- the server's Deployment and its neighbours


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = one("Deployment")["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    [c] = pod_spec()["containers"]
    return c


def _cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def set_container_env(monkeypatch: pytest.MonkeyPatch, c: dict[str, Any]) -> None:
    """The container's environment, resourceFieldRef values resolved (Kubernetes rounds the CPU limit up)."""
    for var in c.get("env", []):
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
        elif "resourceFieldRef" in var["valueFrom"]:
            ref = var["valueFrom"]["resourceFieldRef"]
            cpu = c["resources"]["limits"][ref["resource"].split(".", 1)[1]]
            monkeypatch.setenv(var["name"], str(-(-_cpu_cores(cpu) // 1)))


def settings_from_env(monkeypatch: pytest.MonkeyPatch) -> ServingSettings:
    """The ServingSettings the container's environment produces."""
    set_container_env(monkeypatch, container())
    return ServingSettings()


def test_no_replicas_beside_the_hpa() -> None:
    """The HPA owns the count: a Deployment's replicas would be reset by every apply, fighting the HPA."""
    deployment, hpa = one("Deployment"), one("HorizontalPodAutoscaler")
    assert "replicas" not in deployment["spec"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment",
                                                                      deployment["metadata"]["name"])
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]  # so the PDB can always let one go


def test_env_names_are_server_settings_and_values_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {f"MTGATE_{name.upper()}" for name in ServingSettings.model_fields}
    names = [v["name"] for v in container()["env"]]
    assert [n for n in names if n.startswith("MTGATE_") and n not in fields] == []
    settings = settings_from_env(monkeypatch)
    assert settings.host == "0.0.0.0"
    assert settings.threads == 2 and settings.log_format == "json"
    assert settings.model_repository is not None and settings.repository_poll_secs  # versions, hot reload


def test_probes_ports_and_shutdown_match_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from_env(monkeypatch)
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": settings.port, "grpc": settings.grpc_port}  # HTTP and gRPC, as the server serves them
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "http"  # the HTTP routes: the probes speak HTTP/1.1
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


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def test_model_repository_volume_is_mounted_where_the_server_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from_env(monkeypatch)
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    [init] = pod_spec()["initContainers"]
    repository = mounts(container())["model-repository"]
    assert "model-repository" in volumes
    assert Path(repository["mountPath"]) == settings.model_repository
    assert repository["readOnly"] is True  # the server only reads; versions are written by whoever publishes them
    init_env = {e["name"]: e["value"] for e in init["env"]}
    assert mounts(init)["model-repository"]["mountPath"] == init_env["REPOSITORY"]
    assert not mounts(init)["model-repository"].get("readOnly")
    # the demo the init container copies is where the image holds it (tests/deploy/test_dockerfile.py checks that)
    assert f"COPY models/demo-en-de {init_env['DEMO']}" in DOCKERFILE.read_text(encoding="utf-8")
    assert init["image"] == container()["image"]
    assert init["securityContext"] == container()["securityContext"]  # no more privilege than the server


def run_init(init: dict[str, Any], repository: Path, demo: Path) -> None:
    script = init["args"][0]
    assert init["command"] == ["sh", "-c"]
    env = {"PATH": "/usr/bin:/bin", "REPOSITORY": str(repository), "DEMO": str(demo)}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=60)


def test_init_container_seeds_a_repository_the_server_accepts(tmp_path: Path, model_package: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The init container's script, run on an empty directory, lays out the demo as a repository that
    `mtgate serve` with the container's environment starts on; a repository that holds a model is left alone."""
    from serving.commands.main import build_parser
    from serving.commands.serve import build_settings

    [init] = pod_spec()["initContainers"]
    repository = tmp_path / "models"
    repository.mkdir()
    run_init(init, repository, model_package)
    policy = VersionPolicy.parse(ServingSettings().repository_version_policy)
    found = served_versions(repository, policy)
    assert {name: [v.number for v in versions] for name, versions in found.items()} == {"demo-en-de": [1]}
    assert sorted(p.name for p in (repository / "demo-en-de").iterdir()) == ["1"]  # no .incoming left behind
    run_init(init, repository, model_package)  # a restarted pod: nothing changes
    assert sorted(p.name for p in (repository / "demo-en-de").iterdir()) == ["1"]
    set_container_env(monkeypatch, container())
    monkeypatch.setenv("MTGATE_MODEL_REPOSITORY", str(repository))
    settings = build_settings(build_parser(only="serve").parse_args(["serve"]))  # refuses a repository with no model
    assert settings.model_repository == repository and settings.grpc_port == 8001
    own = tmp_path / "own"
    (own / "en-de" / "3").mkdir(parents=True)
    run_init(init, own, model_package)
    assert sorted(p.name for p in own.iterdir()) == ["en-de"]


def test_service_exposes_http_and_grpc() -> None:
    service = one("Service")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert set(ports) == set(container_ports) == {"http", "grpc"}
    for name, port in ports.items():
        assert port["targetPort"] == name and port["port"] == container_ports[name]
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"  # cleartext HTTP/2, for meshes and Gateways


def test_network_policy_admits_the_served_ports_only() -> None:
    policy = one("NetworkPolicy")["spec"]
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    [rule] = policy["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == sorted(p["name"] for p in container()["ports"])
    assert policy["egress"] == []  # the server opens no connection


def test_selectors_and_references_line_up() -> None:
    deployment, service = one("Deployment"), one("Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels.items() >= SERVER.items()
    container_ports = {p["name"] for p in container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    monitor = one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http"}  # /metrics is on the HTTP port
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}


def test_prometheusrule_carries_the_alerts_of_alerts_yml() -> None:
    """One set of alerts: the PrometheusRule's groups are alerts.yml's (whose expressions test_monitoring.py checks
    against the server's real /metrics)."""
    alerts = yaml.safe_load((MONITORING / "alerts.yml").read_text(encoding="utf-8"))
    assert one("PrometheusRule")["spec"]["groups"] == alerts["groups"]


def test_pods_run_as_the_image_user() -> None:
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    [user] = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, flags=re.M)
    [expose] = re.findall(r"^EXPOSE\s+([\d ]+?)\s*$", dockerfile, flags=re.M)
    assert sorted(int(p) for p in expose.split()) == sorted(p["containerPort"] for p in container()["ports"])
    for _, doc in manifests():
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True
        assert str(context["runAsUser"]) == user[0]
        for c in [*pod["containers"], *pod.get("initContainers", [])]:
            assert c["image"].split(":")[0] == "mtgate"


def test_the_batch_job_runs_the_image_that_has_batch_score() -> None:
    """The server image (mtgate:latest) has no sacrebleu: the Job runs the Dockerfile's batch target."""
    [job] = [doc for _, doc in manifests() if doc["kind"] == "Job"]
    [c] = job["spec"]["template"]["spec"]["containers"]
    name, _, target = c["image"].partition(":")
    assert (name, target, c["command"]) == ("mtgate", "batch", ["batch-score"])
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(rf"^FROM\s+\S+\s+AS\s+{target}\s*$", dockerfile, flags=re.M | re.I), "no such Dockerfile target"
    assert "uv pip install -r pyproject.toml --extra batch" in dockerfile
    build_command = f"docker build --target {target} -t {c['image']} ."
    assert build_command in (K8S / "batch-score-job.yaml").read_text(encoding="utf-8")
    assert build_command in (DEPLOY.parent / "README.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------- the vendored CRD schemas


def test_vendored_schemas_are_documented() -> None:
    readme = (CRDS / "README.md").read_text(encoding="utf-8")
    for path in CRDS.glob("*.json"):
        assert path.name in readme, path.name
    assert "licence" in readme and "Apache-2.0" in readme
    used = {schema_name(doc) for _, doc in manifests() if crd_schema(doc) is not None}
    assert used == {p.name for p in CRDS.glob("*.json")}  # none vendored for nothing


def _misspelt(kind: str, path: tuple[Any, ...], field: str) -> dict[str, Any]:
    doc = one(kind)
    node: Any = doc
    for key in path:
        node = node[key]
    node[field] = "x"
    return doc


@pytest.mark.parametrize(("kind", "path", "field"), [
    ("Deployment", ("spec", "template", "spec", "containers", 0), "readinesProbe"),
    ("ServiceMonitor", ("spec", "endpoints", 0), "intervall"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0), "expresion"),
    ("RayJob", ("spec",), "entryPoint"),
    ("RayJob", ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0), "imag"),
    ("ServingRuntime", ("spec",), "protocolVersion"),
    ("ServingRuntime", ("spec", "containers", 0), "readinesProbe"),
    ("InferenceService", ("spec", "predictor", "model"), "storageURI"),
    ("InferenceService", ("metadata",), "annotation"),
])
def test_validation_would_catch_a_misspelt_field(kind: str, path: tuple[Any, ...], field: str) -> None:
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(_misspelt(kind, path, field), LATEST)


def test_validation_would_catch_a_wrong_value_or_a_missing_field() -> None:
    bad: list[dict[str, Any]] = []
    monitor = one("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    bad.append(monitor)
    rule = one("PrometheusRule")
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    bad.append(rule)
    rayjob = one("RayJob")
    rayjob["spec"]["submissionMode"] = "K8sJob"
    bad.append(rayjob)
    runtime = one("ServingRuntime")
    del runtime["spec"]["containers"]
    bad.append(runtime)
    service = one("InferenceService")
    del service["spec"]["predictor"]["model"]["modelFormat"]
    bad.append(service)
    port = one("ServingRuntime")
    port["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    bad.append(port)
    for doc in bad:
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(doc, LATEST)
