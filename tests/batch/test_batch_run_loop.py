"""batch/run_loop.py (with workers, state, resources) and a fake translator: chunking, ordering, commit/resume, shards,
rejects, fingerprints."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from batch.errors import JobError  # noqa: E402
from batch.inputs import resolve_inputs  # noqa: E402
from batch.job import EngineConfig, Job  # noqa: E402
from batch.resources import plan_parallelism  # noqa: E402
from batch.run_loop import run_job  # noqa: E402
from batch.schema import detect_schema  # noqa: E402
from batch.state import StateDir  # noqa: E402
from batch.workers import LocalChunkWorker, ThreadExecutor, make_batches  # noqa: E402
from serving.engine.decoding import SearchOptions  # noqa: E402
from serving.engine.errors import InputTooLong  # noqa: E402
from serving.engine.request import Prepared, Translation, check_lengths  # noqa: E402
from tests.fakes import echo_info  # noqa: E402


class FakeTranslator:
    """Upper-cases; one token per word plus EOS (``prepare`` maps words to ids and checks the length as the engine
    does); ``run`` refuses sentences containing 'refuse' and can fail after N batches."""

    info = echo_info("upper", max_input_tokens=12)

    def __init__(self, fail_after_batches: int | None = None) -> None:
        self.fail_after = fail_after_batches
        self.batches: list[list[str]] = []
        self.words: dict[str, int] = {}

    def prepare(self, texts: Sequence[str], options: Any = None) -> Prepared:
        sources = [[self.words.setdefault(w, len(self.words) + 1) for w in t.split()] + [0] for t in texts]
        check_lengths([len(s) for s in sources], self.info.max_input_tokens)
        return Prepared(sources, np.full(len(sources), 32), SearchOptions(eos_id=0, decoder_start_id=0))

    def run(self, prepared: Prepared, on_partial: Any = None) -> list[Translation]:
        names = {i: w for w, i in self.words.items()}
        texts = [" ".join(names[i] for i in source[:-1]) for source in prepared.sources]
        if self.fail_after is not None and len(self.batches) >= self.fail_after:
            raise RuntimeError("worker crashed")
        if any("refuse" in t for t in texts):
            raise InputTooLong("refused")
        self.batches.append(list(texts))
        return [Translation(t.upper(), len(t.split()) + 1, len(t.split()) + 1, -0.25 * len(t), []) for t in texts]


def write_input(path: Path, n: int, refuse: Sequence[int] = ()) -> list[str]:
    sentences = [("refuse " if i in refuse else "") + " ".join(["w"] * (1 + i % 7)) + f" {i}" for i in range(n)]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for s in sentences:
            ex = tf.train.Example()
            ex.features.feature["inputs"].bytes_list.value.append(s.encode())
            ex.features.feature["targets"].bytes_list.value.append(s.upper().encode())
            writer.write(ex.SerializeToString())
    return sentences


def make_job(tmp_path: Path, source: Path, name: str = "out.tfrecord", **kw: Any) -> Job:
    inputs = resolve_inputs([str(source)])
    out = tmp_path / name
    return Job(inputs, detect_schema(inputs), None, out, "tfrecord", out.with_suffix(".rejects.jsonl"),
               out.with_suffix(".summary.json"), **kw)


def run(job: Job, translator: FakeTranslator, **kw: Any) -> Any:
    worker = LocalChunkWorker(translator, None, max_tokens=16, max_batch_size=4)
    return run_job(job, EngineConfig(model_dir=job.output.parent), progress=False,
                   make_executor=lambda: ThreadExecutor(lambda: worker, 1, first=worker), **kw)


def outputs(path: Path) -> list[tuple[str, str]]:
    out = []
    for raw in tf.compat.v1.io.tf_record_iterator(str(path)):
        ex = tf.train.Example.FromString(raw)
        out.append((ex.features.feature["inputs"].bytes_list.value[0].decode(),
                    ex.features.feature["outputs"].bytes_list.value[0].decode()))
    return out


def test_make_batches_bounds_padded_tokens_and_is_deterministic() -> None:
    lengths = [5, 1, 9, 3, 3, 7, 2, 8, 1, 4]
    batches = make_batches(lengths, max_tokens=12, max_batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3 and len(b) * max(lengths[i] for i in b) <= 12 or len(b) == 1
        assert [lengths[i] for i in b] == sorted(lengths[i] for i in b)
    assert make_batches(lengths, 12, 3) == batches
    assert plan_parallelism(None, None, 8) == (8, 1) and plan_parallelism(2, None, 8) == (2, 4)
    # every worker holds a model: the default is capped by memory (80% of 2500 fits two 1000-byte models)
    assert plan_parallelism(None, None, 8, per_worker_bytes=1000, memory=2500) == (2, 4)
    assert plan_parallelism(6, None, 8, per_worker_bytes=1000, memory=2500) == (6, 1)  # explicit wins


def test_run_preserves_order_rejects_and_summarises(tmp_path: Path) -> None:
    sentences = write_input(tmp_path / "in.tfrecord", 23, refuse=[5, 17])
    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=5)
    result = run(job, FakeTranslator())
    expected = [(s, s.upper()) for i, s in enumerate(sentences) if i not in (5, 17)]
    assert outputs(job.output) == expected
    rejects = [json.loads(line) for line in job.rejects.read_text().splitlines()]
    assert [r["index"] for r in rejects] == [5, 17] and "refused" in rejects[0]["reason"]
    summary = json.loads(job.summary.read_text())
    assert (summary["records"], summary["translated"], summary["rejects"]) == (23, 21, 2)
    assert summary["scores"]["references"] == 21 and summary["scores"]["chrf"]["score"] == 100.0
    assert result.rejects == 2 and not job.state_dir.exists()


def test_interrupted_run_resumes_to_identical_bytes(tmp_path: Path) -> None:
    write_input(tmp_path / "in.tfrecord", 40)
    reference = make_job(tmp_path, tmp_path / "in.tfrecord", "ref.tfrecord", chunk_size=6)
    run(reference, FakeTranslator())

    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=6)
    with pytest.raises(RuntimeError, match="worker crashed"):
        run(job, FakeTranslator(fail_after_batches=5))
    committed = sorted(p.name for p in job.state_dir.glob("*.json") if p.name != "job.json")
    assert committed and not job.output.exists()
    second = FakeTranslator()
    result = run(job, second)
    assert job.output.read_bytes() == reference.output.read_bytes()
    translated_again = sum(len(b) for b in second.batches)
    assert translated_again == 40 - 6 * len(committed)  # committed chunks are not translated again
    assert result.summary["resumed"]["chunks"] == len(committed)


def test_state_of_another_command_is_refused_unless_restart(tmp_path: Path) -> None:
    write_input(tmp_path / "in.tfrecord", 12)
    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=4)
    with pytest.raises(RuntimeError):
        run(job, FakeTranslator(fail_after_batches=1))
    other = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=5)
    with pytest.raises(JobError, match="different command"):
        run(other, FakeTranslator())
    run(other, FakeTranslator(), restart=True)
    assert len(outputs(other.output)) == 12


def test_a_second_run_on_the_same_output_is_locked_out(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "o.partial", {"a": 1})
    state.open(restart=False)
    with pytest.raises(JobError, match="another batch-score run"):
        StateDir(tmp_path / "o.partial", {"a": 1}).open(restart=False)
    state.close()


def test_shards_partition_the_records(tmp_path: Path) -> None:
    sentences = write_input(tmp_path / "in.tfrecord", 17)
    seen: list[str] = []
    for k in range(3):
        job = make_job(tmp_path, tmp_path / "in.tfrecord", f"out-{k}.tfrecord", chunk_size=2, num_shards=3,
                       shard_index=k)
        run(job, FakeTranslator())
        got = [src for src, _ in outputs(job.output)]
        assert got == sentences[k::3]
        seen += got
    assert sorted(seen) == sorted(sentences)


def test_text_output_stays_line_aligned_with_rejects(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(b"a b\n\xff\nc d\nrefuse e\nf\n")
    inputs = resolve_inputs([str(src)])
    out = tmp_path / "out.txt"
    job = Job(inputs, detect_schema(inputs), None, out, "text", tmp_path / "rejects.jsonl", tmp_path / "s.json",
              chunk_size=2)
    result = run(job, FakeTranslator())
    assert out.read_text().split("\n") == ["A B", "", "C D", "", "F", ""]
    assert result.rejects == 2 and result.translated == 3


def test_resume_checks_the_content_of_committed_chunks_only(tmp_path: Path) -> None:
    import os

    from batch.errors import InputChanged

    source = tmp_path / "in.tfrecord"

    def rewrite(sentences: list[str]) -> None:
        """Rewrite the input in place keeping its size and mtime (what cp -p or tar extraction do)."""
        before = source.stat()
        with tf.io.TFRecordWriter(str(tmp_path / "new.tfrecord")) as writer:
            for s in sentences:
                ex = tf.train.Example()
                ex.features.feature["inputs"].bytes_list.value.append(s.encode())
                ex.features.feature["targets"].bytes_list.value.append(s.upper().encode())
                writer.write(ex.SerializeToString())
        data = (tmp_path / "new.tfrecord").read_bytes()
        assert len(data) == before.st_size
        source.write_bytes(data)
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))

    sentences = write_input(source, 20)
    job = make_job(tmp_path, source, chunk_size=4)
    with pytest.raises(RuntimeError, match="worker crashed"):
        run(job, FakeTranslator(fail_after_batches=3))
    committed = sorted(int(p.stem) for p in job.state_dir.glob("[0-9]*.json"))
    assert committed and max(committed) < 4

    # a change in a chunk not committed yet: the resume is consistent with the new input
    tail = list(sentences)
    tail[19] = tail[19][::-1]
    rewrite(tail)
    run(job, FakeTranslator())
    assert outputs(job.output) == [(s, s.upper()) for s in tail]

    # a change in a committed chunk: refused, then restarted on request
    rewrite(sentences)
    with pytest.raises(RuntimeError, match="worker crashed"):
        run(job, FakeTranslator(fail_after_batches=3))
    head = list(sentences)
    head[0] = head[0][::-1]
    rewrite(head)
    with pytest.raises(InputChanged, match="the input changed since the last run"):
        run(job, FakeTranslator())
    run(job, FakeTranslator(), restart=True)
    assert outputs(job.output) == [(s, s.upper()) for s in head]
