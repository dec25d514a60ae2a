"""tensorboard.py: what a run writes is read back with TensorFlow's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.tensorboard import markdown_table, open_run, read_events


def test_scalars_and_text_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
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
