"""deploy/k8s/batch-score-job.yaml: a valid Indexed Job whose completion index becomes batch-score's --shard-index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from batch.cli import build_parser

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "batch-score-job.yaml"


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if d]


def test_manifest_validates_against_the_kubernetes_schema() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in _docs():
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_completion_index_maps_to_the_shard() -> None:
    job = next(d for d in _docs() if d["kind"] == "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "batch-score")
    env = {e["name"]: e for e in container["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']")
    assert "--shard-index=$(JOB_COMPLETION_INDEX)" in container["args"]
    for index in range(spec["completions"]):
        # Kubernetes substitutes $(VAR) from the container's env before starting it.
        argv = [a.replace("$(JOB_COMPLETION_INDEX)", str(index)) for a in container["args"]]
        args = build_parser().parse_args(argv)
        assert (args.num_shards, args.shard_index) == (spec["completions"], index)
    assert spec["parallelism"] == spec["completions"]
    # deterministic failures are not retried; killed pods are (and resume)
    assert pod["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "FailIndex"}.items() <= rules[0].items() and rules[0]["onExitCodes"]["values"] == [1, 2]


# ---------------------------------------------------------------- the KubeRay RayJob

RAYJOB = MANIFEST.with_name("batch-score-rayjob.yaml")
_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_POD_TEMPLATE = {"type": "object"}  # checked on its own against Kubernetes' PodTemplateSpec (validate_rayjob)
_METADATA = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "namespace": {"type": "string"}, "labels": _STRINGS, "annotations": _STRINGS}}
_WORKER_GROUP = {
    "type": "object", "required": ["groupName", "maxReplicas", "minReplicas", "template"], "additionalProperties": False,
    "properties": {"groupName": {"type": "string"}, "replicas": _INT32, "minReplicas": _INT32, "maxReplicas": _INT32,
                   "numOfHosts": _INT32, "idleTimeoutSeconds": _INT32, "rayStartParams": _STRINGS,
                   "suspend": {"type": "boolean"}, "template": _POD_TEMPLATE, "labels": _STRINGS,
                   "resources": _STRINGS, "scaleStrategy": {"type": "object"}}}
_HEAD_GROUP = {
    "type": "object", "required": ["template"], "additionalProperties": False,
    "properties": {"rayStartParams": _STRINGS, "template": _POD_TEMPLATE, "serviceType": {"type": "string"},
                   "enableIngress": {"type": "boolean"}, "headService": {"type": "object"}, "labels": _STRINGS,
                   "resources": _STRINGS}}
# KubeRay's RayJob CRD (ray.io/v1), written from the fields its published CustomResourceDefinition declares
# (ray-operator/config/crd/bases/ray.io_rayjobs.yaml: names, types, required fields, enums) for what this manifest
# uses and its siblings; no kuberay package on PyPI ships the CRD to vendor. Anything else is refused, so a
# misspelt field cannot pass.
RAYJOB_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayJob"}, "metadata": _METADATA,
        "spec": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "entrypoint": {"type": "string", "minLength": 1},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                "shutdownAfterJobFinishes": {"type": "boolean"}, "ttlSecondsAfterFinished": _INT32,
                "activeDeadlineSeconds": _INT32, "backoffLimit": _INT32, "suspend": {"type": "boolean"},
                "runtimeEnvYAML": {"type": "string"}, "jobId": {"type": "string"}, "metadata": _STRINGS,
                "entrypointNumCpus": {"type": "number"}, "entrypointNumGpus": {"type": "number"},
                "entrypointResources": {"type": "string"}, "clusterSelector": _STRINGS,
                "submitterPodTemplate": _POD_TEMPLATE, "managedBy": {"type": "string"},
                "submitterConfig": {"type": "object", "additionalProperties": False,
                                    "properties": {"backoffLimit": _INT32}},
                "rayClusterSpec": {
                    "type": "object", "required": ["headGroupSpec"], "additionalProperties": False,
                    "properties": {"rayVersion": {"type": "string"}, "enableInTreeAutoscaling": {"type": "boolean"},
                                   "autoscalerOptions": {"type": "object"}, "headServiceAnnotations": _STRINGS,
                                   "headGroupSpec": _HEAD_GROUP, "suspend": {"type": "boolean"},
                                   "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP},
                                   "managedBy": {"type": "string"}},
                },
            },
        },
    },
}


def _rayjob() -> dict[str, Any]:
    [doc] = [d for d in yaml.safe_load_all(RAYJOB.read_text(encoding="utf-8")) if d]
    return dict(doc)


def validate_rayjob(doc: dict[str, Any], version: str | None = None) -> None:
    """The RayJob against RAYJOB_SCHEMA, and each of its pod templates against Kubernetes' own schema (strict).

    Raises:
        jsonschema.ValidationError, kubernetes_validate.ValidationError: with the offending path.
    """
    import jsonschema
    import kubernetes_validate

    jsonschema.validate(doc, RAYJOB_SCHEMA)
    cluster = doc["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster.get("workerGroupSpecs", []))]
    if "submitterPodTemplate" in doc["spec"]:
        templates.append(doc["spec"]["submitterPodTemplate"])
    for i, template in enumerate(templates):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"template-{i}"},
                        "template": template}
        kubernetes_validate.validate(pod_template, version or kubernetes_validate.latest_version(), strict=True)


def test_rayjob_validates_against_the_crd_fields_and_pod_schemas() -> None:
    pytest.importorskip("kubernetes_validate")
    validate_rayjob(_rayjob())


def test_rayjob_validation_would_catch_a_misspelt_field() -> None:
    import jsonschema

    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for path, bad in ((("spec",), "entryPoint"), (("spec", "rayClusterSpec", "workerGroupSpecs", 0), "replica"),
                      (("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0), "imag")):
        doc = _rayjob()
        node: Any = doc
        for key in path:
            node = node[key]
        node[bad] = "x"
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate_rayjob(doc)
    doc = _rayjob()
    doc["spec"]["submissionMode"] = "K8sJob"
    with pytest.raises(jsonschema.ValidationError):
        validate_rayjob(doc)


def test_rayjob_runs_batch_score_on_its_own_cluster() -> None:
    import shlex

    spec = _rayjob()["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[0] == "batch-score"
    args = build_parser().parse_args(argv[1:])
    assert args.ray == ""  # --ray without an address: $RAY_ADDRESS of the Ray job, i.e. this cluster
    assert args.inputs == ["/data/input/data-*.tfrecord"]  # quoted: batch-score expands the glob
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the actors go to the workers
    [group] = cluster["workerGroupSpecs"]
    [worker] = group["template"]["spec"]["containers"]
    cpus = int(worker["resources"]["limits"]["cpu"])
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"]
    assert args.workers * args.threads == group["replicas"] * cpus  # one actor thread per worker CPU
    # the inputs and outputs live on the Indexed Job's volume, mounted on every pod at the same path
    claim = next(d for d in _docs() if d["kind"] == "PersistentVolumeClaim")["metadata"]["name"]
    for template in (head["template"], group["template"]):
        [volume] = template["spec"]["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim
        [mount] = template["spec"]["containers"][0]["volumeMounts"]
        assert mount["mountPath"] == "/data" and args.output.is_relative_to("/data")
        assert template["spec"]["containers"][0]["image"] == "mtgate:ray"
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] >= 1


def test_rayjob_image_is_a_dockerfile_target_with_ray() -> None:
    import re
    import tomllib

    root = MANIFEST.parents[2]
    dockerfile = (root / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM\s+\S+\s+AS\s+ray\s*$", dockerfile, flags=re.M | re.I)
    assert "uv pip install -r pyproject.toml --extra batch --extra ray" in dockerfile
    build = "docker build --target ray -t mtgate:ray ."
    assert build in RAYJOB.read_text(encoding="utf-8") and build in (root / "README.md").read_text(encoding="utf-8")
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    [ray_requirement] = [r for r in pyproject["project"]["optional-dependencies"]["ray"] if r.startswith("ray[")]
    minimum = tuple(int(x) for x in ray_requirement.split(">=")[1].split("."))
    version = _rayjob()["spec"]["rayClusterSpec"]["rayVersion"]
    assert tuple(int(x) for x in version.split(".")[:2]) >= minimum
