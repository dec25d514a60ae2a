"""What ``kubectl apply -k DIR`` would send, for the kustomize features deploy/ uses, without kubectl.

``resources`` (files and other kustomization directories), ``labels`` (metadata labels only) and ``images``; any other
field of a kustomization is refused rather than ignored, so that the tests never look at objects kustomize would
build differently. tests/deploy/test_k8s_manifests.py compares this with ``kubectl kustomize`` where kubectl is
installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

_KNOWN = {"apiVersion", "kind", "labels", "resources", "images"}


def load(path: Path) -> list[dict[str, Any]]:
    """The objects of one YAML file, in order (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def kustomization(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(data) - _KNOWN
    if unknown:
        raise NotImplementedError(f"{directory}/kustomization.yaml: {sorted(unknown)} (not modelled here)")
    return data


def _set_images(node: Any, images: list[dict[str, str]]) -> None:
    if isinstance(node, dict):
        for key in ("containers", "initContainers"):
            for container in node.get(key, []) if isinstance(node.get(key), list) else []:
                name, _, tag = container["image"].partition(":")
                for image in images:
                    if image["name"] == name:
                        container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
        for value in node.values():
            _set_images(value, images)
    elif isinstance(node, list):
        for value in node:
            _set_images(value, images)


def build(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` prints (as a list; kustomize's own order aside)."""
    spec = kustomization(directory)
    docs: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        docs.extend(build(path) if path.is_dir() else copy.deepcopy(load(path)))
    for entry in spec.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise NotImplementedError(f"{directory}: labels into selectors or templates (not modelled here)")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    _set_images(docs, spec.get("images", []))
    return docs
