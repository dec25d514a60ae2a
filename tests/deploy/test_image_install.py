"""The Dockerfile's installs, each replayed in a fresh venv (no Docker engine needed).

- The server image (the default target): the plain install plus the grpc extra serves the bundled model (or the tiny
  test package) over HTTP and gRPC, holds none of the distributions serving does not need, imports none of them while
  serving a request, and each command that needs an extra answers with one line naming it.
- The batch image (``--target batch``): the plain install plus the batch extra runs the Kubernetes Job's
  ``batch-score`` command (deploy/k8s/batch-score-job.yaml) on a TFRecord.

The replay takes the stages' own ``COPY`` and ``uv pip install`` lines from the Dockerfile (tests/deploy/dockerfile.py
parses it), so the test and the images cannot drift apart. Two speed-only settings differ from the image: bytecode is
not precompiled (UV_COMPILE_BYTECODE) and uv links from its cache instead of copying (UV_LINK_MODE).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serving.server.settings import DEFAULT_MODEL_DIR
from tests.deploy.dockerfile import BATCH, FINAL, FORBIDDEN, ROOT, ancestry, copies, env_of, of, run_steps
from tests.utils.server import wait_until_ready

K8S_JOB = ROOT / "deploy" / "k8s" / "batch-score-job.yaml"
# Distributions (and their top-level modules) the server never needs: not in the server image, not imported.
# tritonclient is in the server image: the grpc extra's compiled protocol messages (tritonclient.grpc), not its HTTP
# client (geventhttpclient), which the server never needs.
NOT_SERVING = {"tensorflow": "tensorflow", "tensorflow-cpu": "tensorflow", "keras": "keras", "locust": "locust",
               "gevent": "gevent", "geventhttpclient": "geventhttpclient", "sacrebleu": "sacrebleu",
               "torch": "torch", "transformers": "transformers", "onnx": "onnx", "nncf": "nncf",
               "safetensors": "safetensors", "pyyaml": "yaml"}  # tqdm is in the image (the plain install: progress bars)
NOT_SERVING_PACKAGES = ("converters", "batch", "loadtest")  # mtgate's own packages a server never imports


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


# A replay compiles the native decoding core (scikit-build-core, as `docker build` does): minutes on a loaded machine.
pytestmark = pytest.mark.timeout(900)


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


def venv_stage(image: str) -> str:
    """The builder stage whose /opt/venv ``image`` copies."""
    [source] = {c.split()[0].removeprefix("--from=") for c in of("COPY", image)
                if c.startswith("--from=") and c.split()[1] == "/opt/venv"}
    return source


# A .pth file runs at every start of the venv's interpreter: with $PROBE_MODULES_OUT set, the process writes the
# names of every module it imported to that file when it exits (the server does, on SIGTERM).
MODULES_PROBE = ("import atexit, os, sys; _out = os.environ.get('PROBE_MODULES_OUT'); "
                 "_out and atexit.register(lambda out=_out: open(out, 'w').write('\\n'.join(sorted(sys.modules))))\n")


def replay(base: Path, image: str, model_package: Path) -> tuple[Path, Path]:
    """(app dir laid out like the image's /app, venv) after the Dockerfile's own install steps for ``image``."""
    app = base / "app"
    app.mkdir()
    image_root = [dest for source, dest in copies("builder") if source == "serving"][0].parent  # /app
    for stage in [*ancestry(venv_stage(image)), *ancestry(image)]:  # the source tree's stages and the image's
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
    stages = ancestry(venv_stage(image))
    env.update(env_of(stages[-1]))
    env.update(VIRTUAL_ENV=str(venv), UV_COMPILE_BYTECODE="0", UV_LINK_MODE="hardlink",
               PATH=os.pathsep.join([str(venv / "bin"), str(Path(uv()).parent), env.get("PATH", "")]))
    for stage in stages:
        for steps in run_steps(stage):
            if not any(s.startswith("uv pip install") for s in steps):
                continue  # the step that installs uv and creates /opt/venv: done above
            command = " && ".join(steps)
            proc = subprocess.run(["bash", "-c", command], cwd=app, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    sys.stderr.write(f"\n{image} install ({' + '.join(stages)}; uv, fresh venv): {time.monotonic() - started:.1f}s\n")
    [site] = venv.glob("lib/python*/site-packages")
    (site / "_probe_modules.pth").write_text(MODULES_PROBE, encoding="utf-8")
    return app, venv


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory, model_package: Path) -> tuple[Path, Path]:
    """The server image's install, replayed."""
    return replay(tmp_path_factory.mktemp("image"), FINAL, model_package)


@pytest.fixture(scope="module")
def batch_venv(tmp_path_factory: pytest.TempPathFactory, model_package: Path) -> tuple[Path, Path]:
    """The batch image's install, replayed."""
    return replay(tmp_path_factory.mktemp("batch-image"), BATCH, model_package)


def installed(venv: Path) -> set[str]:
    listing = subprocess.run([uv(), "pip", "list", "--python", str(venv / "bin" / "python"), "--format", "json"],
                             check=True, capture_output=True, text=True, timeout=60).stdout
    return {p["name"].lower() for p in json.loads(listing)}


def test_fresh_runtime_venv_has_no_torch_or_transformers(runtime_venv: tuple[Path, Path]) -> None:
    app, venv = runtime_venv
    python = venv / "bin" / "python"
    probe = ("import importlib.util, json, serving; "
             f"print(json.dumps({{'missing': [m for m in {list(FORBIDDEN)!r} if importlib.util.find_spec(m)], "
             "'serving': serving.__file__}))")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}  # the venv's own tree
    out = json.loads(subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True,
                                    cwd="/", env=env, timeout=60).stdout)
    assert out["missing"] == []
    assert Path(out["serving"]).resolve().is_relative_to(app.resolve())  # the image's /app source tree
    names = installed(venv)
    assert not names & set(FORBIDDEN)
    assert sorted(names & set(NOT_SERVING)) == []  # the server image holds what serving needs, nothing more
    assert {"onnxruntime", "openvino", "fastapi", "uvicorn", "sentencepiece", "mtgate", "grpcio", "tritonclient"} <= names
    check = subprocess.run([uv(), "pip", "check", "--python", str(python)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_fresh_runtime_venv_decodes_on_the_native_core(runtime_venv: tuple[Path, Path]) -> None:
    """The image's install compiles the C++ decoding core (serving/engine/_native) and leaves no build files behind."""
    app, venv = runtime_venv
    probe = ("import json; from serving.engine.native import native_core; core = native_core(); "
             "print(json.dumps(None if core is None else core.__file__))")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "MTGATE_NATIVE")}
    built = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True, capture_output=True,
                                      text=True, cwd="/", env=env, timeout=60).stdout)
    assert built is not None and Path(built).resolve().is_relative_to((app / "serving" / "engine").resolve())
    assert not [p.name for p in app.iterdir() if p.name.startswith(("CMake", "build.ninja", "libnanobind"))]


def test_fresh_runtime_venv_serves_the_bundled_model(runtime_venv: tuple[Path, Path], model_package: Path) -> None:
    app, venv = runtime_venv
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTGATE_") and k not in ("VIRTUAL_ENV",
                                                                                           "PYTHONPATH")}
    env.update(env_of(FINAL))
    assert env["MTGATE_GRPC_PORT"]  # the image serves gRPC
    # the image's environment, except: loopback only (tests never listen beyond it), free ports, one thread
    env.update(MTGATE_HOST="127.0.0.1", MTGATE_PORT=str(port), MTGATE_GRPC_PORT=str(grpc_port), MTGATE_THREADS="1",
               VIRTUAL_ENV=str(venv), PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]))
    modules_file = app.parent / "serve.modules"
    server_env = {**env, "PROBE_MODULES_OUT": str(modules_file)}
    [cmd] = of("CMD", FINAL)
    log = (app.parent / "serve.log").open("w")
    proc = subprocess.Popen(json.loads(cmd), cwd=app, env=server_env, stdout=log, stderr=subprocess.STDOUT)
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
        # and over gRPC, with the stock Triton client (this venv's), as a Service's grpc port would be reached
        import numpy as np
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            assert client.is_server_ready(client_timeout=10)
            text = np.array([["A man is riding a bicycle."]], dtype=object)
            inputs = [grpcclient.InferInput("INPUT_TEXT", list(text.shape), "BYTES")]
            inputs[0].set_data_from_numpy(text)
            result = client.infer(manifest["name"], inputs, client_timeout=60)
            assert result.as_numpy("OUTPUT_TEXT")[0][0].decode() == answer["translations"][0]["text"]
        finally:
            client.close()
    finally:
        proc.send_signal(signal.SIGTERM)  # the image's STOPSIGNAL: drains, then exits 0
        try:
            code = proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert code == 0, (app.parent / "serve.log").read_text()[-3000:]
    # what the server imported, from its start to its exit, having served the request
    imported = {name.split(".")[0] for name in modules_file.read_text(encoding="utf-8").split()}
    assert {"serving", "onnxruntime", "uvicorn", "fastapi"} <= imported
    assert sorted(imported & {*NOT_SERVING.values(), *NOT_SERVING_PACKAGES}) == []


COMMANDS_NEEDING_AN_EXTRA = [
    (["mtgate", "batch-score", "input.txt", "-o", "out.txt"], "batch"),
    (["batch-score", "input.txt", "-o", "out.txt"], "batch"),
    (["mtgate", "batch-score", "--help"], "batch"),
    (["mtgate", "loadtest", "--targets", "smoke.yaml"], "loadtest"),
    (["mtgate", "validate", "-m", "pkg", "--baseline", "pkg"], "loadtest"),
    (["mtgate", "convert", "checkpoint", "-o", "pkg"], "convert"),
    (["mtgate", "verify", "pkg"], "convert"),
]


@pytest.mark.parametrize(("argv", "extra"), COMMANDS_NEEDING_AN_EXTRA, ids=lambda v: " ".join(v) if isinstance(
    v, list) else v)
def test_fresh_runtime_venv_names_the_extra_a_command_needs(runtime_venv: tuple[Path, Path], tmp_path: Path,
                                                            argv: list[str], extra: str) -> None:
    _, venv = runtime_venv
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    proc = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    prefix = f"mtgate {argv[1]}: error:" if argv[0] == "mtgate" else f"{argv[0]}: error:"
    assert lines[0].startswith(prefix) and f"pip install 'mtgate[{extra}]'" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_fresh_runtime_venv_lists_every_command(runtime_venv: tuple[Path, Path]) -> None:
    _, venv = runtime_venv
    proc = subprocess.run([str(venv / "bin" / "mtgate"), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("serve", "translate", "export-triton", "batch-score", "loadtest", "validate", "convert"):
        assert command in proc.stdout


# ---------------------------------------------------------------- the batch image, replayed


def write_tfrecord(path: Path, texts: list[str]) -> None:
    """``tf.train.Example``s with an ``inputs`` feature, written by tensorflow (this venv's, which has it)."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for text in texts:
            feature = {"inputs": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_batch_image_runs_the_kubernetes_job(batch_venv: tuple[Path, Path], tmp_path: Path) -> None:
    import yaml

    app, venv = batch_venv
    names = installed(venv)
    # TFRecords without tensorflow: the batch image is the server's plus google-crc32c and sacrebleu
    assert {"google-crc32c", "sacrebleu", "mtgate"} <= names and not names & set(FORBIDDEN)
    assert "tensorflow-cpu" not in names and "tensorflow" not in names
    job = next(d for d in yaml.safe_load_all(K8S_JOB.read_text(encoding="utf-8")) if d and d["kind"] == "Job")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"mtgate:{BATCH}"  # the image `docker build --target batch -t mtgate:batch .` makes
    data = tmp_path / "data"  # the Job's volume, mounted at /data
    (data / "input").mkdir(parents=True)
    (data / "output").mkdir()
    texts = ["A man is riding a bicycle.", "Two dogs play in the snow.", "A girl reads a book.", "Hello!",
             "A woman is walking.", "The sun is shining.", "A boy jumps.", "Three people sit on a bench."]
    write_tfrecord(data / "input" / "data-00000.tfrecord", texts)
    # Kubernetes substitutes $(JOB_COMPLETION_INDEX); pod 1 of 4 takes records 1 and 5
    argv = [a.replace("/data/", f"{data}/").replace("$(JOB_COMPLETION_INDEX)", "1") for a in container["args"]]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and
           not k.startswith("MTGATE_")}
    env.update(env_of(BATCH))
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env.update(VIRTUAL_ENV=str(venv), PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
               JOB_COMPLETION_INDEX="1")
    proc = subprocess.run([str(venv / "bin" / container["command"][0]), *container["command"][1:], *argv],
                          cwd=app, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "2 of 2 records translated" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    output = data / "output" / "scored-00001-of-00004.tfrecord"
    assert output.stat().st_size > 0 and json.loads(output.with_suffix(".summary.json").read_text())
