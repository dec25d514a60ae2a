"""batch-score's command line through the real console script: unwritable outputs refused before any work, empty
inputs, TensorFlow's log kept off stderr, the shared option vocabulary, and sacreBLEU signatures on the console."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow")

from batch.cli import build_parser  # noqa: E402
from tests.batch.helpers import (  # noqa: E402
    assert_one_line_error,
    clean_env,
    leftovers,
    run_cli,
    write_tfrecord,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "tests" / "data" / "marian" / "corpus.en").read_text(encoding="utf-8").splitlines()[:6]
REFERENCES = (ROOT / "tests" / "data" / "marian" / "corpus.de").read_text(encoding="utf-8").splitlines()[:6]
FAST = ("--workers", "1", "--threads", "1", "--no-progress")
TF_LOG_MARKS = ("oneDNN", "cpu_feature_guard", "absl::InitializeLog", "TensorFlow binary")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """in.tfrecord (sources + references) and in.txt / ref.txt, in a directory no test writes to."""
    directory = tmp_path_factory.mktemp("inputs")
    write_tfrecord(directory / "in.tfrecord", SOURCES, REFERENCES)
    (directory / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    return directory


def _snapshot(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_unwritable_outputs_are_refused_before_any_work(tmp_path: Path, inputs: Path, tiny_onnx_package: Path,
                                                        mount_tmpfs: Callable[..., Path]) -> None:
    existing_dir = tmp_path / "a-directory"
    existing_dir.mkdir()
    before = _snapshot(inputs)
    cases = [
        (["-o", "/proc/nope/out.tfrecord"], "/proc/nope/out.tfrecord", "no directory /proc/nope"),
        (["-o", str(tmp_path / "missing" / "out.txt")], str(tmp_path / "missing"), "create it first"),
        (["-o", str(existing_dir)], str(existing_dir), "it is a directory"),
        (["-o", str(tmp_path / "ok.txt"), "--summary", str(tmp_path / "nodir" / "s.json")], "--summary",
         "no directory"),
        (["-o", str(tmp_path / "ok.txt"), "--rejects", str(existing_dir)], "--rejects", "it is a directory"),
    ]
    for i, (extra, *needles) in enumerate(cases):
        source = inputs / ("in.tfrecord" if i == 0 else "in.txt")  # text inputs start faster (no tensorflow)
        proc = run_cli(source, "-m", tiny_onnx_package, *extra, *FAST)
        assert_one_line_error(proc, 2, "cannot write", *needles)
    # found before anything else: with an unreachable server, the output is what is refused (no connection tried)
    proc = run_cli(inputs / "in.txt", "--server", "http://127.0.0.1:9", "-o", "/proc/nope/out.txt", *FAST)
    assert_one_line_error(proc, 2, "/proc/nope/out.txt", "give another -o")
    # a read-only directory (a read-only tmpfs: root may write anywhere else)
    read_only = mount_tmpfs("ro", 64, read_only=True)
    proc = run_cli(inputs / "in.txt", "-m", tiny_onnx_package, "-o", read_only / "out.txt", *FAST)
    assert_one_line_error(proc, 2, str(read_only / "out.txt"), "Read-only file system")
    assert _snapshot(tmp_path) == ["a-directory", "ro"] and not list(read_only.iterdir())  # nothing written
    assert _snapshot(inputs) == before and not leftovers(inputs)


def test_an_empty_input_warns_in_one_line(tmp_path: Path, tiny_onnx_package: Path) -> None:
    write_tfrecord(tmp_path / "empty.tfrecord", [])
    (tmp_path / "empty.txt").write_bytes(b"")
    for name in ("empty.tfrecord", "empty.txt"):
        proc = run_cli(tmp_path / name, "-m", tiny_onnx_package, *FAST)
        assert proc.returncode == 0, proc.stderr
        line = assert_one_line_error(proc, 0, "warning", str(tmp_path / name), "no records")
        assert line.startswith("batch-score: warning:")
        assert proc.stdout.startswith("batch-score: 0 of 0 records translated")
        stem = name.split(".")[0]
        out = tmp_path / f"{stem}.scored.{'tfrecord' if name.endswith('tfrecord') else 'txt'}"
        assert out.exists() and out.stat().st_size == 0
        assert json.loads((tmp_path / f"{stem}.scored.summary.json").read_text())["records"] == 0
    # an empty shard of a sharded run is legitimate: the same warning names the shard
    (tmp_path / "one.txt").write_text("A man.\n", encoding="utf-8")
    proc = run_cli(tmp_path / "one.txt", "-m", tiny_onnx_package, "--num-shards", "2", "--shard-index", "1", *FAST)
    assert_one_line_error(proc, 0, "warning", "shard 1 of 2", "no records")
    proc = run_cli(tmp_path / "empty.txt", "-m", tiny_onnx_package, "--dry-run")
    assert_one_line_error(proc, 0, "warning", "no records")


def test_no_tensorflow_log_on_stderr(tmp_path: Path, inputs: Path, tiny_onnx_package: Path) -> None:
    source = inputs / "in.tfrecord"
    dry = run_cli(source, "-m", tiny_onnx_package, "--dry-run")
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    full = run_cli(source, "-m", tiny_onnx_package, "-o", tmp_path / "out.tfrecord", *FAST)
    assert full.returncode == 0 and full.stderr == "", full.stderr
    mtgate = Path(sys.executable).with_name("mtgate")
    if mtgate.exists():
        proc = subprocess.run([str(mtgate), "batch-score", str(source), "-m", str(tiny_onnx_package), "--dry-run"],
                              capture_output=True, text=True, env=clean_env(), timeout=240, check=False)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # batch-score reads and writes TFRecords without tensorflow: not even DEBUG shows TensorFlow's start-up log
    debug = run_cli(source, "-m", tiny_onnx_package, "-o", tmp_path / "debug.tfrecord", "--log-level", "DEBUG",
                    *FAST)
    assert debug.returncode == 0
    assert not [mark for mark in TF_LOG_MARKS if mark in debug.stderr], debug.stderr[-2000:]


def test_one_vocabulary_of_options_with_help_everywhere(tmp_path: Path, inputs: Path,
                                                        tiny_onnx_package: Path) -> None:
    parser = build_parser()
    hidden = {s for a in parser._actions if a.help == "==SUPPRESS==" for s in a.option_strings}
    assert hidden == {"--backend", "--max-tokens", "--max-batch-sentences"}
    for action in parser._actions:
        assert action.help, f"{action.option_strings or action.dest} has no help text"
    text = run_cli("--help").stdout
    for name in ("--runtime", "--precision", "--threads", "--max-batch-size", "--max-batch-tokens", "--beam-size",
                 "--max-length", "--log-level"):
        assert name in text
    assert "--backend" not in text and "--max-tokens" not in text
    new = parser.parse_args(["x", "--runtime", "openvino", "--max-batch-tokens", "77", "--max-batch-size", "5"])
    old = parser.parse_args(["x", "--backend", "openvino", "--max-tokens", "77", "--max-batch-sentences", "5"])
    assert (new.runtime, new.max_batch_tokens, new.max_batch_size) == (old.runtime, old.max_batch_tokens,
                                                                       old.max_batch_size) == ("openvino", 77, 5)
    # the new names and the old ones give the same bytes through the real command
    a, b = tmp_path / "new.txt", tmp_path / "old.txt"
    assert run_cli(inputs / "in.txt", "-m", tiny_onnx_package, "-o", a, "--runtime", "onnxruntime",
                   "--max-batch-tokens", "64", *FAST).returncode == 0
    assert run_cli(inputs / "in.txt", "-m", tiny_onnx_package, "-o", b, "--backend", "onnxruntime",
                   "--max-tokens", "64", *FAST).returncode == 0
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 0


def test_console_line_carries_the_sacrebleu_signatures(tmp_path: Path, inputs: Path, tiny_onnx_package: Path) -> None:
    out = tmp_path / "scored.tfrecord"
    proc = run_cli(inputs / "in.tfrecord", "-m", tiny_onnx_package, "-o", out, *FAST)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line
    scores = json.loads((tmp_path / "scored.summary.json").read_text())["scores"]
    for label, key in (("BLEU", "bleu"), ("chrF", "chrf"), ("TER", "ter")):
        assert f"{label} {scores[key]['score']:.2f} [{scores[key]['signature']}]" in line
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in line
    assert os.path.getsize(out) > 0


def _corrupt_graph_copy(package: Path, into: Path) -> Path:
    """A copy of ``package`` whose decoder graph is truncated, with its checksum updated to match (as
    tests/serving/package/test_package.py's truncated-onnx tampering): only loading the graph can tell."""
    from serving.package import sha256_of

    copy = shutil.copytree(package, into)
    graph = copy / "onnx" / "decoder.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"]["onnx/decoder.onnx"] = sha256_of(graph)
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return copy


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_graph_the_workers_cannot_load_is_one_line_and_leaves_nothing(tmp_path: Path, inputs: Path,
                                                                        tiny_onnx_package: Path, workers: str) -> None:
    package = _corrupt_graph_copy(tiny_onnx_package, tmp_path / "pkg")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_cli(inputs / "in.txt", "-m", package, "-o", out_dir / "out.txt", "--workers", workers, "--threads", "1",
                   "--no-progress")
    assert_one_line_error(proc, 2, "onnx/decoder.onnx", "cannot load this graph")
    assert list(out_dir.iterdir()) == []  # no output, no out.txt.partial, no temporary file


def _events(run_dir: Path) -> dict[str, list[Any]]:
    """tag -> values of every summary in a run directory, read back with tensorflow's own iterator."""
    import tensorflow as tf

    out: dict[str, list[Any]] = {}
    [events] = run_dir.glob("events.out.tfevents.*")
    for event in tf.compat.v1.train.summary_iterator(str(events)):
        for value in event.summary.value:
            item = tf.make_ndarray(value.tensor).item()
            out.setdefault(value.tag, []).append(item.decode() if isinstance(item, bytes) else float(item))
    return out


def test_tensorboard_gets_the_scores_counts_and_speed_of_each_run(tmp_path: Path, inputs: Path,
                                                                  tiny_onnx_package: Path) -> None:
    board = tmp_path / "tb"
    out = tmp_path / "scored.tfrecord"
    proc = run_cli(inputs / "in.tfrecord", "-m", tiny_onnx_package, "-o", out, "--tensorboard", board, *FAST)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    summary_line, tb_line = proc.stdout.strip().splitlines()
    [run_dir] = board.iterdir()
    assert tb_line == f"tensorboard: {run_dir}" and run_dir.name.startswith("batch-score-")
    summary = json.loads((tmp_path / "scored.summary.json").read_text())
    events = _events(run_dir)
    for key in ("bleu", "chrf", "ter"):
        assert events[f"quality/{key}"] == [pytest.approx(summary["scores"][key]["score"], abs=1e-3)]
    assert events["records/total"] == [len(SOURCES)] and events["records/translated"] == [len(SOURCES)]
    assert events["records/rejected"] == [0]
    assert events["speed/records_per_second"] == [pytest.approx(summary["records_per_second"], rel=1e-3)]
    assert events["speed/tokens_per_second"] == [pytest.approx(summary["tokens_per_second"], rel=1e-3)]
    [text] = events["summary"]
    assert summary_line in text and summary["scores"]["bleu"]["signature"] in text
    # a second run gets a run directory of its own beside the first
    assert run_cli(inputs / "in.tfrecord", "-m", tiny_onnx_package, "-o", out, "--tensorboard", board,
                   *FAST).returncode == 0
    assert len(list(board.iterdir())) == 2


def test_tensorboard_dir_is_checked_first_and_imported_only_when_asked(tmp_path: Path, inputs: Path,
                                                                       tiny_onnx_package: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    proc = run_cli(inputs / "in.txt", "-m", tiny_onnx_package, "-o", tmp_path / "out.txt", "--tensorboard", a_file,
                   *FAST)
    assert_one_line_error(proc, 2, "--tensorboard", str(a_file), "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written
    script = ("import sys; from batch.cli import main; rc = main(sys.argv[1:]); "
              "print('batch.tensorboard' in sys.modules or 'tensorboardX' in sys.modules); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", script, str(inputs / "in.txt"), "-m", str(tiny_onnx_package), "-o",
                           str(tmp_path / "out.txt"), *FAST], capture_output=True, text=True, cwd=ROOT,
                          env=clean_env(), timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
