"""Writes the JSON Schemas of KServe's ServingRuntime and InferenceService beside this file, from the KServe Python SDK.

The SDK (``kserve`` on PyPI, Apache-2.0) holds one generated class per type of KServe's API, each with its fields
(``openapi_types``: the Python type, ``attribute_map``: the JSON name) and a setter that refuses ``None`` for the
fields the API requires. This walks them from ``V1alpha1ServingRuntime`` and ``V1beta1InferenceService``: every KServe
type becomes a ``$defs`` entry that refuses unknown fields, and every Kubernetes type (``V1Container``,
``V1Volume``, ...) a ``$ref`` to kubernetes-validate's own definition of it, so the embedded pod specs are checked
as strictly as a Deployment's. ``status`` is left out: a manifest never sets it.

Run it in the SDK's venv (``make kserve-sdk``), from the repository root, when the SDK is upgraded:

    .venv-kserve/bin/python tests/deploy/crds/kserve_from_sdk.py [KUBERNETES_VALIDATE_DEFINITIONS_JSON]
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
K8S_DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
# The Kubernetes API groups the SDK's V1* types are looked up in first, in this order (a name like V1ResourceClaim
# exists in more than one group; in a pod spec it is the core one); any other must match one definition only.
K8S_GROUPS = ("io.k8s.api.core", "io.k8s.apimachinery.pkg.apis.meta", "io.k8s.api.autoscaling", "io.k8s.api.apps")
ROOTS = {  # file name (kubernetes-validate's naming: kind-group-version) -> (SDK class, apiVersion, kind)
    "servingruntime-serving-v1alpha1.json": ("V1alpha1ServingRuntime", "serving.kserve.io/v1alpha1",
                                             "ServingRuntime"),
    "inferenceservice-serving-v1beta1.json": ("V1beta1InferenceService", "serving.kserve.io/v1beta1",
                                              "InferenceService"),
}
# Kubernetes types the SDK names by their full Go path instead of V1*.
_K8S_FULL_NAMES = {
    "K8sIoApiAppsV1DeploymentStrategy": "io.k8s.api.apps.v1.DeploymentStrategy",
    "K8sIoApiAutoscalingV2HorizontalPodAutoscalerBehavior": "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior",
    "ResourceQuantity": "io.k8s.apimachinery.pkg.api.resource.Quantity",
}
_SCALARS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
    "bool": {"type": "boolean"}, "datetime": {"type": "string"}, "date": {"type": "string"},
    "object": {},  # int-or-string, quantities, raw JSON: any value
}


def _k8s_name(cls_name: str, known: set[str]) -> str:
    kind = re.sub(r"^V\d+(?:(?:alpha|beta)\d+)?", "", cls_name)
    version = cls_name[: len(cls_name) - len(kind)].lower()
    for group in K8S_GROUPS:
        if (name := f"{group}.{version}.{kind}") in known:
            return name
    matches = sorted(k for k in known if k.endswith(f".{version}.{kind}"))
    if len(matches) != 1:
        raise SystemExit(f"{cls_name}: no single Kubernetes definition ({matches})")
    return matches[0]


class Walker:
    """Turns SDK classes into JSON Schema ``$defs``, following their fields."""

    def __init__(self, models: Any, k8s_known: set[str]) -> None:
        self.models = models
        self.k8s_known = k8s_known
        self.defs: dict[str, Any] = {}
        self.undefined: set[str] = set()

    def schema_of(self, type_name: str) -> dict[str, Any]:
        if type_name in _SCALARS:
            return dict(_SCALARS[type_name])
        if match := re.fullmatch(r"list\[(.+)\]", type_name):
            return {"type": "array", "items": self.schema_of(match.group(1))}
        if match := re.fullmatch(r"dict\((\w+), (.+)\)", type_name):
            return {"type": "object", "additionalProperties": self.schema_of(match.group(2))}
        if type_name in _K8S_FULL_NAMES:
            return {"$ref": K8S_DEFS + _K8S_FULL_NAMES[type_name]}
        if hasattr(self.models, type_name):
            self.define(type_name)
            return {"$ref": f"#/$defs/{type_name}"}
        if re.fullmatch(r"V\d+(alpha|beta)\d+\w+", type_name):  # a KServe type the SDK names but does not define
            self.undefined.add(type_name)
            return {"type": "object", "$comment": f"{type_name}: not in the SDK"}
        if re.fullmatch(r"V\d+\w+", type_name):
            return {"$ref": K8S_DEFS + _k8s_name(type_name, self.k8s_known)}
        raise SystemExit(f"unknown SDK type {type_name!r}")

    def define(self, cls_name: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        if cls_name in self.defs:
            return dict(self.defs[cls_name])
        self.defs[cls_name] = {}  # recursion guard
        cls = getattr(self.models, cls_name)
        source = inspect.getsource(cls)
        required = sorted(cls.attribute_map[attr] for attr in cls.openapi_types
                          if f"Invalid value for `{attr}`, must not be `None`" in source)
        properties = {cls.attribute_map[attr]: self.schema_of(type_name)
                      for attr, type_name in sorted(cls.openapi_types.items()) if cls.attribute_map[attr] not in skip}
        schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            schema["required"] = required
        self.defs[cls_name] = schema
        return dict(schema)


def k8s_definitions() -> Path:
    """kubernetes-validate's strict definitions of its newest Kubernetes, from the project's venv (the SDK's venv
    does not have it), or the file given as the first argument."""
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    found = HERE.parents[2].glob(".venv/lib/python*/site-packages/kubernetes_validate/kubernetes-json-schema/"
                                 "v*-local-strict/_definitions.json")
    by_version = {tuple(int(n) for n in p.parent.name[1:].split("-")[0].split(".")): p for p in found}
    if not by_version:
        raise SystemExit("kubernetes-validate not found in .venv: give its _definitions.json as the argument")
    return by_version[max(by_version)]


def main() -> int:
    kserve = importlib.import_module("kserve")
    models = importlib.import_module("kserve.models")
    known = set(json.loads(k8s_definitions().read_text(encoding="utf-8"))["$defs"])
    version = importlib.metadata.version("kserve")
    for file_name, (cls_name, api_version, kind) in ROOTS.items():
        walker = Walker(models, known)
        root = walker.define(cls_name, skip=("status",))
        walker.defs.pop(cls_name)
        root["properties"]["apiVersion"] = {"const": api_version}
        root["properties"]["kind"] = {"const": kind}
        root["required"] = sorted({"apiVersion", "kind", "metadata", "spec", *root.get("required", [])})
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://mtgate.invalid/crds/{file_name}",
            "$comment": f"Generated by tests/deploy/crds/kserve_from_sdk.py from the KServe Python SDK {version} "
                        f"({kserve.__name__} on PyPI, Apache-2.0); Kubernetes types refer to kubernetes-validate's.",
            **root,
            "$defs": dict(sorted(walker.defs.items())),
        }
        (HERE / file_name).write_text(json.dumps(schema, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        sys.stdout.write(f"{file_name}: {len(walker.defs)} KServe types; named but not defined by the SDK (any "
                         f"object): {sorted(walker.undefined) or 'none'}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
