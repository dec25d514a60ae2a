"""batch-score under hostile input and a hostile disk, through the real console script on TFRecords written by
tensorflow: lone surrogates become rejected records (never an abort), an input rewritten in place is refused or
restarted (never mixed into a resume), and a full disk (a small tmpfs) during a chunk write, the assembly or the
summary gives one line, leaves no temporary file, and the rerun after freeing space is byte-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

from tests.batch.helpers import (  # noqa: E402
    ROOT,
    assert_one_line_error,
    batch_score_command,
    clean_env,
    leftovers,
    run_cli,
    write_tfrecord,
)

VOCAB_8K = ROOT / "tests" / "data" / "t2t" / "vocab.translate_ende_wmt8k.8192.subwords"
CORPUS = (ROOT / "tests" / "data" / "marian" / "corpus.en").read_text(encoding="utf-8").splitlines()
FAST = ("--workers", "1", "--threads", "1", "--no-progress", "--max-length", "6")


def rejects_of(out: Path) -> list[dict[str, Any]]:
    name = out.name.rsplit(".", 1)[0] + ".rejects.jsonl"
    return [json.loads(line) for line in (out.parent / name).read_text(encoding="utf-8").splitlines()]


def outputs_of(path: Path) -> list[str]:
    return [tf.train.Example.FromString(r).features.feature["outputs"].bytes_list.value[0].decode()
            for r in tf.compat.v1.io.tf_record_iterator(str(path))]


# ------------------------------------------------------------------------------------------------ lone surrogates


def test_lone_surrogates_are_rejected_records_and_a_rerun_finishes(tmp_path: Path, tiny_onnx_package: Path) -> None:
    from serving.engine.tokenizers.subword import SubwordTextEncoder

    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("\n".join([
        '{"text": "A man rides a bike."}',
        '{"text": "A man \\ud800 rides a bike."}',        # a lone high surrogate
        '{"text": "A \\udfff man."}',                     # a lone low surrogate
        '{"text": "Two dogs \\ud83d\\ude00 play."}',     # a valid pair: one character, translated
        '{"text": "Hello.", "note": "\\udbff"}',          # in another field: its output line could not be written
        '{"text": "Good bye."}',
    ]) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = [jsonl, "-m", tiny_onnx_package, "-o", out, *FAST]
    first = run_cli(*argv)
    assert_one_line_error(first, 1, "3 record(s) rejected")
    rejects = rejects_of(out)
    assert [r["index"] for r in rejects] == [1, 2, 4]
    assert "lone surrogate (U+D800" in rejects[0]["reason"] and "lone surrogate (U+DFFF" in rejects[1]["reason"]
    assert "lone surrogate" in rejects[2]["reason"]
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows] == ["A man rides a bike.", "Two dogs \U0001F600 play.", "Good bye."]
    again = run_cli(*argv)  # the rerun finishes as the first run did (it used to abort the same way forever)
    assert_one_line_error(again, 1, "3 record(s) rejected")
    assert not out.with_name(out.name + ".partial").exists()
    assert run_cli(*argv, "--allow-rejects").returncode == 0

    text = tmp_path / "in.txt"  # encoded surrogates are not UTF-8
    text.write_bytes(b"A man rides.\nA \xed\xa0\x80 man.\nA \xed\xbf\xbf man.\nbad \xff byte\nDogs play.\n")
    proc = run_cli(text, "-m", tiny_onnx_package, "-o", tmp_path / "out.txt", *FAST)
    assert_one_line_error(proc, 1, "3 record(s) rejected")
    reasons = {r["index"]: r["reason"] for r in rejects_of(tmp_path / "out.txt")}
    assert sorted(reasons) == [1, 2, 3] and "encoded UTF-16 surrogate" in reasons[1] + reasons[2]
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert [bool(line) for line in lines] == [True, False, False, False, True, False]  # still line-aligned

    record = write_tfrecord(tmp_path / "in.tfrecord", ["A man rides.", "x", "y", "Dogs play."])
    raw = record.read_bytes()  # same lengths: swap the one-byte sentences for invalid ones, reframed by tensorflow
    examples = [tf.train.Example.FromString(r) for r in tf.compat.v1.io.tf_record_iterator(str(record))]
    examples[1].features.feature["inputs"].bytes_list.value[0] = b"A \xed\xa0\x80 man"
    examples[2].features.feature["inputs"].bytes_list.value[0] = b"\xed\xbf\xbf"
    with tf.io.TFRecordWriter(str(record)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())
    assert record.read_bytes() != raw
    proc = run_cli(record, "-m", tiny_onnx_package, "-o", tmp_path / "out.tfrecord", *FAST)
    assert_one_line_error(proc, 1, "2 record(s) rejected")
    assert [r["index"] for r in rejects_of(tmp_path / "out.tfrecord")] == [1, 2]
    assert len(outputs_of(tmp_path / "out.tfrecord")) == 2

    # T2T ids that decode to a lone surrogate (the subword escape \55296;)
    encoder = SubwordTextEncoder(VOCAB_8K)
    t2t = tmp_path / "translate_ende_wmt8k-dev-00000-of-00001"
    with tf.io.TFRecordWriter(str(t2t)) as writer:
        for sentence in ("A man.", "A \ud800 man.", "Dogs."):
            example = tf.train.Example()
            example.features.feature["inputs"].int64_list.value.extend(encoder.encode(sentence) + [1])
            writer.write(example.SerializeToString())
    proc = run_cli(t2t, "-m", tiny_onnx_package, "--vocab", VOCAB_8K, "-o", tmp_path / "t2t.tfrecord", *FAST)
    assert_one_line_error(proc, 1, "1 record(s) rejected")
    assert [(r["index"], "lone surrogate" in r["reason"]) for r in rejects_of(tmp_path / "t2t.tfrecord")] == [
        (1, True)]


# ------------------------------------------------------------------------------------------------ stale input


def _committed(state: Path) -> int:
    return sum(1 for _ in state.glob("[0-9]*.json")) if state.is_dir() else 0


def _kill_after_commits(argv: list[Any], state: Path, commits: int) -> None:
    """Start the command and SIGKILL it once ``commits`` chunks are committed."""
    proc = subprocess.Popen([*batch_score_command(), *map(str, argv)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env(), cwd=ROOT)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline and _committed(state) < commits:
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert _committed(state) >= commits


def test_an_input_rewritten_with_the_same_size_and_mtime_is_refused_or_restarted(
        tmp_path: Path, tiny_onnx_package: Path) -> None:
    sources = CORPUS[:40]
    source = write_tfrecord(tmp_path / "in.tfrecord", sources)
    out = tmp_path / "out.tfrecord"
    state = out.with_name(out.name + ".partial")
    argv = [source, "-m", tiny_onnx_package, "-o", out, "--chunk-size", "1", *FAST]
    _kill_after_commits(argv, state, commits=2)

    # rewrite record 0 (committed) in place: same size, mtime restored (what cp -p, rsync -t or tar produce)
    changed = list(sources)
    changed[0] = changed[0].replace("a", "e", 1) if "a" in changed[0] else changed[0].upper()
    assert changed[0] != sources[0] and len(changed[0]) == len(sources[0])
    before = source.stat()
    new_bytes = write_tfrecord(tmp_path / "new.tfrecord", changed).read_bytes()
    assert len(new_bytes) == before.st_size
    with source.open("r+b") as f:
        f.write(new_bytes)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (source.stat().st_size, source.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    refused = run_cli(*argv)
    assert_one_line_error(refused, 2, "the input changed since the last run", "rerun with --restart")
    assert not out.exists() and _committed(state) >= 2  # nothing mixed, nothing discarded without being asked

    clean = tmp_path / "clean.tfrecord"
    assert run_cli(tmp_path / "new.tfrecord", "-m", tiny_onnx_package, "-o", clean, "--chunk-size", "1",
                   *FAST).returncode == 0
    restarted = run_cli(*argv, "--restart")
    assert restarted.returncode == 0, restarted.stderr
    assert out.read_bytes() == clean.read_bytes()
    assert not state.exists()


# ------------------------------------------------------------------------------------------------ full disk

PAGE = 4096
PAD = 3000  # bytes of an extra feature copied into every output Example: chunks of a known, page-sized scale
RECORDS, CHUNK = 24, 6


def _pages(n: int) -> int:
    return -(-n // PAGE)


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory, tiny_onnx_package: Path) -> dict[str, Any]:
    """The input (on the ordinary disk) and the bytes of a clean run."""
    directory = tmp_path_factory.mktemp("full-disk")
    source = directory / "in.tfrecord"
    with tf.io.TFRecordWriter(str(source)) as writer:
        for i in range(RECORDS):
            example = tf.train.Example()
            example.features.feature["inputs"].bytes_list.value.append(CORPUS[i].encode())
            example.features.feature["pad"].bytes_list.value.append(bytes([65 + i % 26]) * PAD)
            writer.write(example.SerializeToString())
    clean = directory / "clean.tfrecord"
    argv = [source, "-m", tiny_onnx_package, "--chunk-size", str(CHUNK), "--allow-rejects", *FAST]
    proc = run_cli(*argv, "-o", clean)
    assert proc.returncode == 0, proc.stderr
    return {"argv": argv, "output": clean.read_bytes(), "rejects": (directory / "clean.rejects.jsonl").read_bytes()}


def _fill(directory: Path, leave_pages: int) -> Path:
    """A ballast file leaving about ``leave_pages`` pages free on ``directory``'s filesystem."""
    st = os.statvfs(directory)
    ballast = directory / "ballast"
    size = max(0, st.f_bavail * st.f_frsize - leave_pages * PAGE)
    with ballast.open("wb") as f:
        f.write(b"\0" * size)
    return ballast


def _assert_full_disk_failure(proc: subprocess.CompletedProcess[str], disk: Path, path: Path) -> None:
    assert_one_line_error(proc, 1, str(path), "No space left on device", "free some space", "rerun the same command")
    assert not leftovers(disk), leftovers(disk)


def _assert_resumes_identically(padded: dict[str, Any], out: Path, *extra: Any) -> None:
    proc = run_cli(*padded["argv"], "-o", out, *extra)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == padded["output"]
    assert out.with_name("out.rejects.jsonl").read_bytes() == padded["rejects"]
    assert not out.with_name(out.name + ".partial").exists()


@pytest.mark.parametrize("stage", ["chunk", "assembly"])
def test_a_full_disk_fails_in_one_line_and_resumes_identically(stage: str, padded: dict[str, Any],
                                                               mount_tmpfs: Callable[..., Path]) -> None:
    chunk_pages = _pages(len(padded["output"]) // (RECORDS // CHUNK)) + 1
    chunks = RECORDS // CHUNK
    small = 2  # a chunk record (hypotheses, counts) or job.json: well under a page each
    if stage == "chunk":  # room for the first chunk and half of the second
        leave = chunk_pages + 2 * small + chunk_pages // 2
    else:  # room for every chunk and half of the output
        leave = chunks * (chunk_pages + small) + small + _pages(len(padded["output"])) // 2
    disk = mount_tmpfs("disk", 4 * 1024)
    ballast = _fill(disk, leave)
    out = disk / "out.tfrecord"
    proc = run_cli(*padded["argv"], "-o", out)
    state = out.with_name(out.name + ".partial")
    _assert_full_disk_failure(proc, disk, state if stage == "chunk" else out)
    assert not out.exists()
    committed = _committed(state)
    assert (0 < committed < chunks) if stage == "chunk" else committed == chunks
    ballast.unlink()
    _assert_resumes_identically(padded, out)


def test_a_full_disk_while_writing_the_summary(padded: dict[str, Any], mount_tmpfs: Callable[..., Path]) -> None:
    disk = mount_tmpfs("disk", 4 * 1024)
    tiny = mount_tmpfs("tiny", 64)  # the summary goes to another, full filesystem
    ballast = _fill(tiny, 0)
    out = disk / "out.tfrecord"
    summary = tiny / "summary.json"
    proc = run_cli(*padded["argv"], "-o", out, "--summary", summary)
    _assert_full_disk_failure(proc, tiny, summary)
    assert not leftovers(disk) and not summary.exists()
    ballast.unlink()
    _assert_resumes_identically(padded, out, "--summary", summary)
    assert json.loads(summary.read_text())["records"] == RECORDS
