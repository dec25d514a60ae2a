"""What ``kubectl apply -k DIR`` would send, for the kustomize features deploy/ uses, without kubectl.

``resources`` (files and other kustomization directories), ``labels`` (metadata labels only), ``images`` and
``patches`` given inline as JSON patches (RFC 6902: add, replace, remove, copy) on a target named by kind and name;
any other field of a kustomization (or kind of patch) is refused rather than ignored, so that the tests never look at objects kustomize would
build differently. tests/deploy/test_k8s_manifests.py compares this with ``kubectl kustomize`` where kubectl is
installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

_KNOWN = {"apiVersion", "kind", "labels", "resources", "images", "patches"}


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
    for entry in spec.get("patches", []):
        _patch(directory, docs, entry)
    for entry in spec.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise NotImplementedError(f"{directory}: labels into selectors or templates (not modelled here)")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    _set_images(docs, spec.get("images", []))
    return docs


def _patch(directory: Path, docs: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    target, ops = entry.get("target", {}), yaml.safe_load(entry.get("patch", "null"))
    if set(entry) != {"target", "patch"} or set(target) - {"kind", "name"} or not isinstance(ops, list):
        raise NotImplementedError(f"{directory}: a patch other than an inline JSON patch on a kind and name")
    matched = [d for d in docs if target.get("kind", d["kind"]) == d["kind"]
               and target.get("name", d["metadata"]["name"]) == d["metadata"]["name"]]
    if not matched:
        raise ValueError(f"{directory}: no object matches the patch's target {target}")
    for doc in matched:
        for op in ops:
            _apply(doc, op)


def _apply(doc: dict[str, Any], op: dict[str, Any]) -> None:
    def walk(path: str) -> tuple[Any, str]:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        return node, last

    kind = op["op"]
    if kind == "copy":
        source, key = walk(op["from"])
        kind, op = "add", {**op, "value": copy.deepcopy(source[int(key)] if isinstance(source, list) else source[key])}
    node, last = walk(op["path"])
    if kind not in ("add", "replace", "remove"):
        raise NotImplementedError(f"JSON patch op {kind!r}")
    if isinstance(node, list):
        if kind == "add":
            node.insert(len(node) if last == "-" else int(last), op["value"])
        elif kind == "replace":
            node[int(last)] = op["value"]
        else:
            del node[int(last)]
    elif kind == "remove" or (kind == "replace" and last not in node):
        del node[last]  # a KeyError for a missing one, as kustomize fails
    else:
        node[last] = op["value"]
