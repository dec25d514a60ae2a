"""batch-score --ray on a real local Ray: the same output, rejects, scores and exit codes as the local runner, byte
for byte, on TFRecords written by tensorflow (text schema and T2T int64 schema); an actor killed mid-chunk and a
driver killed at a random point change nothing.

One Ray (``ray.init(num_cpus=2)`` in a subprocess that lives at most RAY_LIFETIME_S and ends when this module's
process closes its stdin) serves the module's tests, with token authentication (a token made here, passed as Ray's
own RAY_AUTH_TOKEN). The kill test starts a Ray of its own through ``batch-score --ray`` to see it die with the
driver. The model is the tiny random Marian package of tests/conftest.py; local runs go through the same console
script, in process.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("ray")

from batch.cli import main  # noqa: E402
from batch.records import EOS_ID  # noqa: E402
from tests.batch.helpers import (  # noqa: E402
    assert_one_line_error,
    batch_score_command,
    clean_env,
    run_cli,
)

ROOT = Path(__file__).resolve().parents[2]
VOCAB_8K = ROOT / "tests" / "data" / "t2t" / "vocab.translate_ende_wmt8k.8192.subwords"
CORPUS_EN = (ROOT / "tests" / "data" / "marian" / "corpus.en").read_text(encoding="utf-8").splitlines()
CORPUS_DE = (ROOT / "tests" / "data" / "marian" / "corpus.de").read_text(encoding="utf-8").splitlines()
N = 160  # records: 32 chunks of 5, so that kills land while chunks are still to do
CHUNKS = ["--chunk-size", "5", "--threads", "1"]
CHUNK = [*CHUNKS, "--no-progress"]
RAY_LIFETIME_S = 900
_CLUSTER = """
import logging, os, select, sys, time
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
import ray
context = ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
print(context.address_info["gcs_address"], flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    ready, _, _ = select.select([sys.stdin], [], [], 1.0)
    if ready and not os.read(0, 1):
        break
ray.shutdown()
"""


@pytest.fixture(scope="module")
def ray_env() -> dict[str, str]:
    """Token authentication for every Ray of this module (Ray's own variables)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.fixture(scope="module")
def cluster(ray_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(GCS address, pid of the process holding the Ray) of a 2-CPU local Ray shared by the module."""
    log = tmp_path_factory.mktemp("ray") / "cluster.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", _CLUSTER, str(RAY_LIFETIME_S)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env={**clean_env(), **ray_env}, cwd=ROOT)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().decode().strip()
        assert address.startswith("127.0.0.1:"), log.read_text()[-3000:]
        yield address, proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the helper shuts Ray down and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def examples(n: int, ids: bool = False) -> list[bytes]:
    """``n`` Examples {inputs, targets, id}: text, or T2T subword ids of the wmt8k vocabulary ending in EOS."""
    from serving.engine.tokenizers.subword import SubwordTextEncoder

    encoder = SubwordTextEncoder(VOCAB_8K) if ids else None
    out = []
    for i in range(n):
        src, ref = CORPUS_EN[i % len(CORPUS_EN)], CORPUS_DE[i % len(CORPUS_DE)]
        ex = tf.train.Example()
        for key, text in (("inputs", src), ("targets", ref)):
            if encoder is None:
                ex.features.feature[key].bytes_list.value.append(text.encode())
            else:
                ex.features.feature[key].int64_list.value.extend(encoder.encode(text) + [EOS_ID])
        ex.features.feature["id"].int64_list.value.append(i)
        out.append(ex.SerializeToString())
    return out


def write_tfrecord(path: Path, records: list[bytes], truncate_last: bool = False) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)
    if truncate_last:
        path.write_bytes(path.read_bytes()[:-9])
    return path


def with_rejects(records: list[bytes]) -> list[bytes]:
    """Records with two that cannot be parsed, so that rejects must come out as locally too."""
    wrong_type = tf.train.Example()
    wrong_type.features.feature["inputs"].float_list.value.append(0.5)
    out = list(records)
    out.insert(7, b"not an example \xff")
    out.insert(23, wrong_type.SerializeToString())
    return out


def local_run(source: Path, out: Path, package: Path, *extra: str) -> int:
    return main([str(source), "-m", str(package), "-o", str(out), "--workers", "1", *CHUNK, *extra])


def side(out: Path, ending: str) -> Path:
    return out.with_name(out.name.removesuffix(".tfrecord") + ending)


def assert_same_as_local(ray_out: Path, local_out: Path) -> dict[str, Any]:
    """Output and rejects byte-identical, summary counts and scores equal; returns the Ray run's summary."""
    assert ray_out.read_bytes() == local_out.read_bytes()
    assert side(ray_out, ".rejects.jsonl").read_bytes() == side(local_out, ".rejects.jsonl").read_bytes()
    ray_summary = json.loads(side(ray_out, ".summary.json").read_text())
    local_summary = json.loads(side(local_out, ".summary.json").read_text())
    for key in ("records", "translated", "rejects", "tokens", "scores", "schema"):
        assert ray_summary[key] == local_summary[key], key
    assert not ray_out.with_name(ray_out.name + ".partial").exists()
    return dict(ray_summary)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc: parent links)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        children = {p for p, parent in parents.items() if parent in frontier} - found
        found |= children
        frontier = children
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ray_core(command: str) -> bool:
    """The GCS, the raylet and the actors (Ray's dashboard and runtime-env agents notice a dead raylet on their own
    schedule, within about a minute, and are not counted)."""
    program = command.split(" ", 1)[0]
    return program.endswith(("/gcs_server", "/raylet")) or command.startswith("ray::MapWorker")


def committed(state: Path) -> int:
    return sum(1 for _ in state.glob("[0-9]*.json")) if state.is_dir() else 0


def start_cli(*args: str | Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen([*batch_score_command(), *map(str, args)], stdout=f, stderr=subprocess.STDOUT,
                                cwd=ROOT, env={**clean_env(), **env})


def test_text_schema_with_an_actor_killed_mid_chunk(tmp_path: Path, tiny_onnx_package: Path,
                                                   cluster: tuple[str, int], ray_env: dict[str, str]) -> None:
    address, cluster_pid = cluster
    source = write_tfrecord(tmp_path / "in.tfrecord", with_rejects(examples(N)), truncate_last=True)
    local = tmp_path / "local.tfrecord"
    assert local_run(source, local, tiny_onnx_package) == 1  # 3 rejects: exit 1 without --allow-rejects

    out = tmp_path / "ray.tfrecord"
    log = tmp_path / "ray.log"
    proc = start_cli(source, "-m", tiny_onnx_package, "-o", out, "--ray", address, "--workers", "2", *CHUNK,
                     env=ray_env, log=log)
    state = out.with_name(out.name + ".partial")
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        if committed(state) >= 2:  # running: kill an actor while it translates a chunk
            busy = [p for p in descendants(cluster_pid) if "MapBatches(ChunkTranslator)).submit" in cmdline(p)]
            if busy:
                victim = busy[0]
                os.kill(victim, signal.SIGKILL)
                at = committed(state)
        time.sleep(0.02)
    assert victim is not None, log.read_text()[-3000:]
    assert proc.wait(timeout=240) == 1, log.read_text()[-3000:]  # the same exit code: records were rejected
    assert at < -(-(N + 2) // 5), "the actor was killed after the last chunk"
    summary = assert_same_as_local(out, local)
    assert summary["rejects"] == 3 and summary["engine"]["ray"]["address"] == address
    text = log.read_text()
    assert f"batch-score: Ray at {address} (2 CPUs), 2 actor(s) x 1 thread(s)" in text
    assert "3 record(s) rejected" in text and "Traceback" not in text and "core_worker.cc" not in text


def test_t2t_int64_schema_gives_the_local_bytes(tmp_path: Path, tiny_onnx_package: Path, cluster: tuple[str, int],
                                               ray_env: dict[str, str]) -> None:
    source = write_tfrecord(tmp_path / "translate_ende_wmt8k-dev-00000-of-00001", examples(40, ids=True))
    vocab = ["--vocab", str(VOCAB_8K)]
    local = tmp_path / "local.tfrecord"
    assert local_run(source, local, tiny_onnx_package, *vocab) == 0
    out = tmp_path / "ray.tfrecord"
    proc = run_cli(source, "-m", tiny_onnx_package, "-o", out, *vocab, "--ray", cluster[0], "--workers", "2",
                   *CHUNKS, env=ray_env)
    assert proc.returncode == 0, proc.stderr
    summary = assert_same_as_local(out, local)
    assert summary["schema"]["input_kind"] == "ids" and summary["scores"]["bleu"]["score"] is not None
    assert proc.stdout.startswith("batch-score: 40 of 40 records translated")
    # progress on stderr: records done of the total, the time taken < the time left, records/s
    assert re.search(r"batch-score: 100%\|.*\| 40/40 \[\d\d:\d\d<00:00, +[\d.]+rec/s\]", proc.stderr), proc.stderr


def test_driver_killed_at_a_random_point_then_rerun_gives_identical_output(
        tmp_path: Path, tiny_onnx_package: Path, cluster: tuple[str, int], ray_env: dict[str, str]) -> None:
    source = write_tfrecord(tmp_path / "in.tfrecord", with_rejects(examples(N)))
    local = tmp_path / "local.tfrecord"
    assert local_run(source, local, tiny_onnx_package, "--allow-rejects") == 0
    n_chunks = -(-(N + 2) // 5)
    kill_after = random.Random().randint(0, n_chunks - 3)

    # a Ray started by batch-score itself (no ADDRESS): it dies with the killed driver
    out = tmp_path / "ray.tfrecord"
    state = out.with_name(out.name + ".partial")
    log = tmp_path / "first.log"
    args = [source, "-m", tiny_onnx_package, "-o", out, "--allow-rejects", "--workers", "2", *CHUNK]
    proc = start_cli(*args, "--ray", env=ray_env, log=log)
    ray_processes: set[int] = set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        ray_processes |= {p for p in descendants(proc.pid) if _ray_core(cmdline(p))}
        if (state / "job.json").exists() and committed(state) >= kill_after:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before the kill (after {kill_after} chunks): " + log.read_text()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = committed(state)
    assert ray_processes, "no Ray processes seen under the driver"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in ray_processes):
        time.sleep(0.2)
    assert not [p for p in ray_processes if Path(f"/proc/{p}/status").exists()
                and "zombie" not in Path(f"/proc/{p}/status").read_text()], "Ray outlived the killed driver"
    assert not out.exists()
    first = log.read_text()
    assert "batch-score: a local Ray (" in first
    if "dashboard" in first:  # ray[default] is installed: the dashboard's address is on the console
        assert "dashboard http://127.0.0.1:" in first

    # the same command on the module's Ray resumes the committed chunks and finishes
    proc2 = run_cli(*args, "--ray", cluster[0], env=ray_env)
    assert proc2.returncode == 0, proc2.stderr
    summary = assert_same_as_local(out, local)
    assert summary["resumed"]["chunks"] == killed_at >= kill_after, (kill_after, killed_at)
    assert summary["resumed"]["records"] == 5 * killed_at  # full chunks: none lost, none translated twice


def test_relative_paths_from_another_directory_give_the_local_bytes(
        tmp_path: Path, tiny_onnx_package: Path, cluster: tuple[str, int], ray_env: dict[str, str]) -> None:
    # Ray's workers do not run in the command's directory: relative inputs are resolved here, and the rejects keep
    # the names as given (the local run's). Joining Ray counts in startup and in wall time.
    work = tmp_path / "work"
    work.mkdir()
    write_tfrecord(work / "in.tfrecord", with_rejects(examples(12)))
    args = ["in.tfrecord", "-m", tiny_onnx_package, "--allow-rejects", *CHUNKS]
    local = run_cli(*args, "-o", "local.tfrecord", "--workers", "1", cwd=work)
    assert local.returncode == 0, local.stderr
    ray = run_cli(*args, "-o", "ray.tfrecord", "--ray", cluster[0], "--workers", "1", cwd=work, env=ray_env)
    assert ray.returncode == 0, ray.stderr
    assert ray.stderr.startswith("batch-score: Ray at ") and "Traceback" not in ray.stderr, ray.stderr
    summary = assert_same_as_local(work / "ray.tfrecord", work / "local.tfrecord")
    assert summary["inputs"] == ["in.tfrecord"] and summary["rejects"] == 2
    assert '"file": "in.tfrecord"' in side(work / "ray.tfrecord", ".rejects.jsonl").read_text()
    assert 0 < summary["startup_seconds"] < summary["wall_seconds"], summary  # joining Ray (was 0.0 and not in wall)


def test_ray_errors_say_whether_a_rerun_resumes(tmp_path: Path) -> None:
    import errno
    import pickle

    from ray import exceptions as ray_errors

    from batch.errors import IOFailure
    from batch.ray_runner import RayFailure, _raise_ray_failure
    from serving.package import PackageError

    failure = IOFailure(tmp_path / "in.txt", FileNotFoundError(errno.ENOENT, "No such file or directory"), "read")
    assert str(pickle.loads(pickle.dumps(failure))) == str(failure)  # it crosses from a read task intact
    for cause in (failure, PackageError("onnx/decoder.onnx: cannot load this graph")):
        with pytest.raises(type(cause)) as raised:  # batch-score's own errors, as locally
            _raise_ray_failure(ray_errors.RayTaskError("read", "traceback", cause).as_instanceof_cause())
        assert raised.value is cause
    cases = [(ray_errors.RayTaskError("read", "traceback", KeyError("x")).as_instanceof_cause(), False),
             (ray_errors.UnserializableException("a traceback"), False),
             (ray_errors.ActorDiedError(), True), (ray_errors.NodeDiedError("node gone"), True)]
    for error, resumable in cases:
        with pytest.raises(RayFailure) as raised:
            _raise_ray_failure(error)
        assert raised.value.resumable is resumable, error


def test_a_package_the_actors_cannot_load_is_one_line(tmp_path: Path, tiny_onnx_package: Path,
                                                     cluster: tuple[str, int], ray_env: dict[str, str]) -> None:
    from tests.batch.test_batch_cli import _corrupt_graph_copy

    package = _corrupt_graph_copy(tiny_onnx_package, tmp_path / "pkg")
    source = tmp_path / "in.txt"
    source.write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_cli(source, "-m", package, "-o", out_dir / "out.txt", "--ray", cluster[0], "--workers", "1", *CHUNK,
                   env=ray_env)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert err[0].startswith("batch-score: Ray at ")  # where it ran, then the one error line
    assert_one_line_error(subprocess.CompletedProcess(proc.args, 2, "", "\n".join(err[1:])), 2,
                          "onnx/decoder.onnx", "cannot load this graph")
    assert list(out_dir.iterdir()) == []


def test_ray_usage_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_text("A dog runs.\n", encoding="utf-8")
    base = [str(source), "-o", str(tmp_path / "out.txt"), "--no-progress"]
    cases = [
        ([*base, "--server", "http://127.0.0.1:9", "--ray"], "either --server or --ray"),
        (["--ray", str(source), str(source)], "not a Ray address"),
        ([*base, "--ray", "127.0.0.1:9"], "cannot connect to Ray at 127.0.0.1:9"),  # nothing listens there
    ]
    for argv, needle in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and needle in err, err
    # without the ray extra: one line naming it
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main([*base, "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install 'mtgate[ray]'" in err
    assert not (tmp_path / "out.txt.partial").exists()
