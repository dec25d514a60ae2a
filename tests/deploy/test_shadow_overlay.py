"""deploy/shadow: deploy/k8s with a candidate model mounted beside production (``--shadow``, the canary's settings):
what it builds (the base's objects, the Deployment patched), every object against the Kubernetes schemas (strict),
the candidate's volume, init container and settings against the real server's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from serving.server.settings import ServingSettings
from tests.deploy.kustomize import build, kustomization
from tests.deploy.test_k8s_manifests import K8S, LATEST, MIN_VERSION, mounts, set_container_env

SHADOW = K8S.parent / "shadow"


def _deployment(folder: Path) -> dict[str, Any]:
    [doc] = [d for d in build(folder) if d["kind"] == "Deployment"]
    return doc


def _pod() -> dict[str, Any]:
    spec: dict[str, Any] = _deployment(SHADOW)["spec"]["template"]["spec"]
    return spec


def test_the_overlay_is_the_base_with_the_deployment_patched() -> None:
    assert kustomization(SHADOW)["resources"] == ["../k8s"]  # the base, not a copy of it
    base = {(d["kind"], d["metadata"]["name"]): d for d in build(K8S)}
    overlay = {(d["kind"], d["metadata"]["name"]): d for d in build(SHADOW)}
    assert overlay.keys() == base.keys()
    assert [key for key in base if base[key] != overlay[key]] == [("Deployment", "mtgate")]
    for doc in overlay.values():
        for version in (LATEST, MIN_VERSION):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_candidate_is_mounted_beside_production_and_the_settings_are_the_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = _pod()
    [c] = pod["containers"]
    fields = {f"MTGATE_{name.upper()}" for name in ServingSettings.model_fields}
    assert [v["name"] for v in c["env"] if v["name"].startswith("MTGATE_") and v["name"] not in fields] == []
    set_container_env(monkeypatch, {**c, "env": [v for v in c["env"] if "secretKeyRef" not in v.get("valueFrom", {})]})
    settings = ServingSettings()
    assert settings.shadow is not None and settings.shadow_log is not None and settings.shadow_redact
    candidate, log = mounts(c)["candidate"], mounts(c)["shadow-log"]
    assert settings.shadow.parent == Path(candidate["mountPath"]) and candidate["readOnly"] is True
    assert settings.shadow_log.parent == Path(log["mountPath"]) and not log.get("readOnly")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {"candidate", "shadow-log", "model-repository"} <= volumes.keys()
    # the pair log's bound (files of at most max_bytes, plus the current one) fits its volume
    files = settings.shadow_log_max_files + 1
    assert files * settings.shadow_log_max_bytes < 512 << 20 and volumes["shadow-log"]["emptyDir"]["sizeLimit"] == "512Mi"
    salt = {v["name"]: v for v in c["env"]}["MTGATE_SHADOW_REDACT_SALT"]["valueFrom"]["secretKeyRef"]
    assert salt["optional"] is True  # without the Secret, a random salt per pod
    # one more model in the pod: more memory than the base's
    assert c["resources"]["limits"]["memory"] == "4Gi" and c["resources"]["requests"]["memory"] == "3Gi"
    base_images = {x["image"] for x in _deployment(K8S)["spec"]["template"]["spec"]["initContainers"]}
    assert {i["image"] for i in pod["initContainers"]} == base_images == {c["image"]}  # the images: the base's


def test_the_seed_container_lays_out_a_candidate_the_server_accepts(tmp_path: Path, model_package: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.commands.main import build_parser
    from serving.commands.serve import build_settings

    pod = _pod()
    [seed] = [i for i in pod["initContainers"] if i["name"] == "seed-candidate"]
    env = {e["name"]: e["value"] for e in seed["env"]}
    assert mounts(seed)["candidate"]["mountPath"] == env["CANDIDATE"] and not mounts(seed)["candidate"].get("readOnly")
    volume = tmp_path / "candidate"
    volume.mkdir()
    assert seed["command"] == ["sh", "-c"]
    for _ in range(2):  # a restarted pod: the volume is left alone
        subprocess.run(["sh", "-c", seed["args"][0]], env={"PATH": "/usr/bin:/bin", "CANDIDATE": str(volume),
                                                  "DEMO": str(model_package)}, check=True, timeout=60)
    assert sorted(p.name for p in volume.iterdir()) == ["package"]
    [c] = pod["containers"]
    set_container_env(monkeypatch, {**c, "env": [v for v in c["env"] if "value" in v
                                                 and v["name"] != "MTGATE_MODEL_REPOSITORY"]})
    monkeypatch.setenv("MTGATE_SHADOW", str(volume / "package"))
    monkeypatch.setenv("MTGATE_SHADOW_LOG", str(tmp_path / "log" / "shadow.jsonl"))
    settings = build_settings(build_parser(only="serve").parse_args(["serve", "-m", str(model_package)]))
    assert settings.shadow == volume / "package" and settings.canary_max_p95_ms == 1000


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_same() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(SHADOW)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted((d for d in yaml.safe_load_all(out.stdout) if d), key=key) == sorted(build(SHADOW), key=key)
