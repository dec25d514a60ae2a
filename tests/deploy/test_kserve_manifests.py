"""deploy/kserve: the ServingRuntime runs `mtgate serve` the way KServe expects of a v2 runtime (the Open Inference
Protocol over HTTP on the first port, over gRPC on a port named for it, the model storage at /mnt/models), and the
InferenceService uses it. Schema validation of both is in test_k8s_manifests.py; here, the references between them
and to the real server: the runtime's command line goes through `mtgate serve`'s own parser and settings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.kustomize import load

KSERVE = Path(__file__).resolve().parents[2] / "deploy" / "kserve"
DOCKERFILE = KSERVE.parents[1] / "Dockerfile"
# KServe: the model storage is mounted here (constants.DefaultModelLocalMountPath); the container it merges the
# predictor into is named so (constants.InferenceServiceContainerName); a port whose name holds "grpc" or "h2c" is
# served as gRPC (appProtocol kubernetes.io/h2c); the first port is the HTTP one its Service and ingress route to.
MODEL_MOUNT = "/mnt/models"
CONTAINER = "kserve-container"
UVICORN_SHUTDOWN_S = 5


def runtime() -> dict[str, Any]:
    [doc] = load(KSERVE / "servingruntime.yaml")
    return doc


def inference_service() -> dict[str, Any]:
    [doc] = load(KSERVE / "inferenceservice.yaml")
    return doc


def runtime_container() -> dict[str, Any]:
    [c] = runtime()["spec"]["containers"]
    return c


def is_grpc(port: dict[str, Any]) -> bool:
    return "grpc" in port["name"] or "h2c" in port["name"]


def served_settings(tmp_path: Path, model_package: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ServingSettings `mtgate serve` builds from the runtime container's command, arguments and environment,
    with /mnt/models a repository holding the demo as demo-en-de/1 (as a pvc:// storageUri would)."""
    from serving.commands.main import build_parser
    from serving.commands.serve import build_settings

    repository = tmp_path / "models"
    (repository / "demo-en-de").mkdir(parents=True)
    (repository / "demo-en-de" / "1").symlink_to(model_package, target_is_directory=True)
    c = runtime_container()
    assert c["command"][:2] == ["mtgate", "serve"]
    argv = [a.replace(MODEL_MOUNT, str(repository)) for a in [*c["command"][1:], *c["args"]]]
    for name in [n for n in os.environ if n.startswith("MTGATE_")]:
        monkeypatch.delenv(name)
    for var in c["env"]:
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
        else:  # resourceFieldRef limits.cpu, rounded up as Kubernetes does
            assert var["valueFrom"]["resourceFieldRef"]["containerName"] == CONTAINER
            monkeypatch.setenv(var["name"], str(-(-float(c["resources"]["limits"]["cpu"]) // 1)))
    return build_settings(build_parser(only="serve").parse_args(argv)), repository


def test_runtime_serves_v2_over_http_and_grpc(tmp_path: Path, model_package: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = runtime()["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    c = runtime_container()
    assert c["name"] == CONTAINER
    settings, repository = served_settings(tmp_path, model_package, monkeypatch)
    http, *others = c["ports"]
    [grpc] = [p for p in others if is_grpc(p)]
    assert not is_grpc(http) and http["containerPort"] == settings.port
    assert grpc["containerPort"] == settings.grpc_port
    assert settings.host == "0.0.0.0"
    assert settings.model_repository == repository and settings.repository_poll_secs  # hot reload from a PVC
    assert settings.threads == 2
    for probe, path in (("startupProbe", "/v2/health/ready"), ("readinessProbe", "/v2/health/ready"),
                        ("livenessProbe", "/v2/health/live")):
        assert (c[probe]["httpGet"]["path"], c[probe]["httpGet"]["port"]) == (path, http["name"])
    annotations = spec["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(settings.port)
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    assert c["resources"]["requests"]["cpu"] == c["resources"]["limits"]["cpu"]


def test_runtime_runs_as_the_image_user() -> None:
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    [(uid, gid)] = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, flags=re.M)
    context = runtime_container()["securityContext"]
    assert (context["runAsNonRoot"], str(context["runAsUser"]), str(context["runAsGroup"])) == (True, uid, gid)
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert runtime_container()["image"].split(":")[0] == "mtgate"


def test_inference_service_uses_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    isvc, spec = inference_service(), runtime()["spec"]
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime()["metadata"]["name"]
    formats = {(f["name"], f.get("version")) for f in spec["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["protocolVersion"] in spec["protocolVersions"]
    assert model["storageUri"].split("://")[0] in {"pvc", "s3", "gs", "https", "hf", "oci"}
    # two ports (HTTP and gRPC) need KServe's raw Deployment mode: Knative allows one port per container
    assert len(runtime_container()["ports"]) == 2
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] in {"RawDeployment", "Standard"}
    assert 2 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    # the drain: --drain-delay, then the grace period for admitted requests, then uvicorn's close
    from serving.server.settings import ServingSettings

    args = dict(a.removeprefix("--").split("=", 1) for a in runtime_container()["args"])
    monkeypatch.delenv("MTGATE_GRACE_PERIOD_S", raising=False)
    drain = max(ServingSettings().grace_period_s, float(args["drain-delay"])) + UVICORN_SHUTDOWN_S
    assert predictor["terminationGracePeriodSeconds"] > drain
