"""What batch-score says about a resumed run (issue 35): a rerun with other options names them, the progress bar
counts what a rerun keeps, the summary line tells this run's work from the earlier run's, and the side files are
named the same way whatever the output's extension. A fake translator (tests/batch/test_batch_run_loop.py's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow")

import batch.run_loop  # noqa: E402
from batch.errors import JobError  # noqa: E402
from batch.job import EngineConfig  # noqa: E402
from batch.outputs import side_file  # noqa: E402
from batch.report import summary_line  # noqa: E402
from batch.run_loop import run_job  # noqa: E402
from batch.workers import LocalChunkWorker, ThreadExecutor  # noqa: E402
from tests.batch.test_batch_run_loop import FakeTranslator, make_job, write_input  # noqa: E402


def _run(job: Any, translator: FakeTranslator, engine: EngineConfig | None = None, **kw: Any) -> Any:
    worker = LocalChunkWorker(translator, None, max_tokens=16, max_batch_size=4)
    return run_job(job, engine or EngineConfig(model_dir=job.output.parent),
                   make_executor=lambda: ThreadExecutor(lambda: worker, 1, first=worker), **kw)


class Recording:
    """A progress bar that keeps its count and what it showed beside it."""

    def __init__(self, total: int | None, initial: int, enabled: bool) -> None:
        self.n = initial
        self.postfixes: list[str] = []

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfixes.append(s)

    def close(self) -> None:
        pass


def test_a_rerun_with_other_options_names_each_one(tmp_path: Path) -> None:
    write_input(tmp_path / "in.tfrecord", 12)
    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=4)
    engine = EngineConfig(model_dir=tmp_path, beam_size=4, decoding=(("temperature", 0.8),))
    with pytest.raises(RuntimeError):
        _run(job, FakeTranslator(fail_after_batches=1), engine, progress=False)
    other = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=5)
    with pytest.raises(JobError) as refused:
        _run(other, FakeTranslator(), EngineConfig(model_dir=tmp_path, beam_size=1), progress=False)
    message = str(refused.value)
    assert "holds an unfinished run of a different command, with --beam-size 4 (now 1); --chunk-size 4 (now 5); " \
           "--temperature 0.8 (now unset); rerun it with those to resume it, or add --restart" in message, message
    assert "\n" not in message


def test_the_bar_counts_what_a_rerun_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bars: list[Recording] = []

    def recording(total: int | None, initial: int, enabled: bool) -> Recording:
        bars.append(Recording(total, initial, enabled))
        return bars[-1]

    monkeypatch.setattr(batch.run_loop, "_progress_bar", recording)
    write_input(tmp_path / "in.tfrecord", 40)
    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=6)
    with pytest.raises(RuntimeError, match="worker crashed"):  # interrupted after 5 batches of up to 4 records
        _run(job, FakeTranslator(fail_after_batches=5))
    committed = sum(1 for p in job.state_dir.glob("*.json") if p.name != "job.json")
    assert committed and bars[0].n == 6 * committed  # not the records translated in the chunk that was cut short
    assert any("more translated, not committed" in p for p in bars[0].postfixes)
    result = _run(job, FakeTranslator())
    assert bars[1].n == 40 and result.summary["resumed"]["records"] == 6 * committed  # the rerun starts there


def test_the_summary_line_tells_this_run_from_the_earlier_one(tmp_path: Path) -> None:
    write_input(tmp_path / "in.tfrecord", 40)
    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=6)
    with pytest.raises(RuntimeError):
        _run(job, FakeTranslator(fail_after_batches=5), progress=False)
    summary = _run(job, FakeTranslator(), progress=False).summary
    kept, done = summary["resumed"]["records"], summary["this_run"]["translated"]
    line = summary_line(summary, job)
    assert line.startswith(f"batch-score: 40 of 40 records translated: {kept} committed by an earlier run, {done} "
                           f"translated by this one in "), line
    fresh = make_job(tmp_path, tmp_path / "in.tfrecord", "fresh.tfrecord", chunk_size=6)
    assert "earlier run" not in summary_line(_run(fresh, FakeTranslator(), progress=False).summary, fresh)


@pytest.mark.parametrize("output", ["out.tfrecord", "out.tfrecords", "out.jsonl", "out.ndjson", "out.txt", "out.de",
                                    "out"])
def test_side_files_are_named_alike_whatever_the_extension(output: str, tmp_path: Path) -> None:
    path = tmp_path / "test" / output
    assert side_file(path, ".rejects.jsonl") == tmp_path / "test" / "out.rejects.jsonl"
    assert side_file(path, ".summary.json") == tmp_path / "test" / "out.summary.json"


def test_an_over_long_record_s_reason_names_truncate(tmp_path: Path) -> None:
    from tests.fakes import echo_info

    class Short(FakeTranslator):
        info = echo_info("upper", max_input_tokens=4)

    write_input(tmp_path / "in.tfrecord", 7)  # record i: 1 + i % 7 words, its index and EOS (records 2-6 > 4)
    job = make_job(tmp_path, tmp_path / "in.tfrecord", chunk_size=7)
    result = _run(job, Short(), progress=False)
    reasons = job.rejects.read_text().splitlines()
    assert result.rejects == 5 and all("the model accepts at most 4 (--truncate cuts it to them)" in r
                                       for r in reasons), reasons
