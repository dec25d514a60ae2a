"""Validate a Kubernetes object offline and strictly (an unknown field is an error), whatever its kind.

Built-in kinds go through kubernetes-validate (its bundled OpenAPI schemas of each Kubernetes version). Custom
resources go through the schemas vendored in ``crds/`` (ServiceMonitor, PrometheusRule, RayJob, ServingRuntime,
InferenceService: ``crds/README.md`` says where each comes from), named as kubernetes-validate names its files and
validated by the same machinery: the Kubernetes types they embed (pod templates, containers, volumes, object
metadata) are references into kubernetes-validate's own strict definitions of the version asked for, so a
container inside a RayJob or a ServingRuntime is checked exactly as one inside a Deployment.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import ValidationError, all_versions, major_minor
from packaging.version import Version
from referencing import Registry, Resource

CRDS = Path(__file__).resolve().with_name("crds")


def schema_name(doc: dict[str, Any]) -> str:
    """kubernetes-validate's file name for the kind: ``servicemonitor-monitoring-v1.json``."""
    api_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])
    return f"{doc['kind'].lower()}-{api_version}.json"


def crd_schema(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The vendored schema of a custom resource's kind, None for a built-in kind."""
    path = CRDS / schema_name(doc)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _schema_version(version: str) -> str:
    """The newest Kubernetes version kubernetes-validate has schemas for that is not newer than ``version``."""
    wanted = Version(major_minor(version.removeprefix("v")))
    return str([v for v in all_versions() if Version(major_minor(v)) <= wanted][-1])


@cache
def _definitions(version: str) -> Resource[Any]:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"
    return Resource.from_contents(json.loads((folder / "_definitions.json").read_text(encoding="utf-8")))


def validate(doc: dict[str, Any], version: str) -> None:
    """Validate ``doc`` against the schemas of Kubernetes ``version`` (and its CRD's, for a custom resource).

    Raises:
        kubernetes_validate.ValidationError: the first problem, with its path in the object.
    """
    schema = crd_schema(doc)
    if schema is None:
        kubernetes_validate.validate(doc, version, strict=True)
        return
    schema_version = _schema_version(version)
    registry: Registry[Any] = Resource.from_contents(schema) @ (_definitions(schema_version) @ Registry())
    try:
        jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)
    except jsonschema.ValidationError as e:
        raise ValidationError(e, version=major_minor(schema_version)) from None
