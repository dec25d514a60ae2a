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
