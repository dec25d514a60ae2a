"""tensorboard.py: what a run writes (tensorboardX's event file) is read back with TensorBoard's own event loader,
and TensorFlow's summary iterator reads the same summaries ``tf.summary`` wrote before."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch.tensorboard import markdown_table, open_run, read_events


def test_scalars_and_text_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard")
    with open_run(tmp_path, "loadtest") as run:
        run.scalars({"p95_ms": 120.5, "rps": 33.0, "missing": None, "nan": float("nan")}, prefix="load/single/")
        for second, value in enumerate([10.0, 12.0, 11.0]):
            run.scalar("load/single/over_time/p95_ms", value, step=second)
        run.text("verdict", "**PASS**\n\n" + markdown_table([["target", "measured"], ["p95 | ms", "120"]]))
    with open_run(tmp_path, "loadtest") as second:
        second.scalar("load/single/p95_ms", 99.0)
    [first_dir, second_dir] = sorted(p for p in tmp_path.iterdir())
    assert first_dir.name.startswith("loadtest-") and first_dir != second_dir  # one run directory per run
    events = read_events(first_dir)
    assert events["load/single/p95_ms"] == [(0, pytest.approx(120.5))]
    assert events["load/single/rps"] == [(0, 33.0)]
    assert "load/single/missing" not in events and "load/single/nan" not in events
    assert events["load/single/over_time/p95_ms"] == [(0, 10.0), (1, 12.0), (2, 11.0)]
    [(step, text)] = events["verdict"]
    assert step == 0 and text.startswith("**PASS**") and "| p95 \\| ms | 120 |" in text
    assert read_events(second_dir) == {"load/single/p95_ms": [(0, 99.0)]}


def test_the_summaries_are_those_tf_summary_writes(tmp_path: Path) -> None:
    """Each value is a rank-0 tensor with its plugin's name (not tensorboardX's legacy simple_value, nor its
    ``/text_summary`` tag suffix): TensorBoard's scalars and text plugins and TensorFlow's reader see what they saw."""
    pytest.importorskip("tensorboardX")
    tf = pytest.importorskip("tensorflow")
    with open_run(tmp_path, "batch-score") as run:
        run.scalar("quality/bleu", 23.5, step=2)
        run.text("summary", "a | b")
    [events_file] = run.directory.glob("events.out.tfevents.*")
    seen = []
    for event in tf.compat.v1.train.summary_iterator(str(events_file)):
        for value in event.summary.value:
            seen.append((value.tag, event.step, value.metadata.plugin_data.plugin_name,
                         list(value.tensor.tensor_shape.dim), tf.make_ndarray(value.tensor).item()))
    assert seen == [("quality/bleu", 2, "scalars", [], 23.5), ("summary", 0, "text", [], b"a | b")]
