"""``--tensorboard DIR``: scalars and text of one run, written with ``tf.summary`` into a run directory of its own.

Every run of ``mtgate loadtest``, ``validate``, ``sweep`` (and ``batch-score``) gets ``DIR/<command>-<UTC time>-<pid>``,
so ``tensorboard --logdir DIR`` lists the runs side by side and compares them over time. Tags are
``<group>/<name>`` (``quality/candidate_bleu``, ``load/interactive/p95_ms``); a value without a time axis is written
at step 0, a series over a run at its seconds (or, for a sweep, at each point's index).

This is the one module that writes summaries; tensorflow is imported only when a writer is opened, with its start-up
log kept off stderr (:func:`_tensorflow`), so a command without ``--tensorboard`` never pays for it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class TensorBoardUnavailable(Exception):
    """tensorflow (``tf.summary``) cannot be imported in this install."""


# Set before tensorflow is imported (a value already in the environment wins). Its C++ side logs through absl: the
# instruction-set notice, "All log messages before absl::InitializeLog() ..." and, on CPUs where oneDNN is on by
# default (AVX512_VNNI, AMX), "oneDNN custom operations are on" whatever TF_CPP_MIN_LOG_LEVEL says. Summaries run no
# TensorFlow math, so turning oneDNN off changes nothing else.
QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def _tensorflow() -> Any:
    for name, value in QUIET_TENSORFLOW.items():
        os.environ.setdefault(name, value)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # its Python side (absl.logging's warnings)
    try:
        import tensorflow as tf
    except ImportError as e:
        raise TensorBoardUnavailable(f"--tensorboard needs tensorflow ({e}); pip install 'mtgate[loadtest]'") from e
    return tf


def check_available() -> None:
    """Raise :class:`TensorBoardUnavailable` now rather than after a run."""
    _tensorflow()


def run_directory(root: Path, command: str) -> Path:
    """A new, unique run directory name under ``root`` for one run of ``command``."""
    base = f"{command}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    candidates = (root / (base if i == 0 else f"{base}-{i}") for i in range(1000))
    return next(c for c in candidates if not c.exists())


class RunWriter:
    """Scalars and Markdown text of one run (a ``tf.summary`` file writer)."""

    def __init__(self, writer: Any, tf: Any, directory: Path) -> None:
        self._writer = writer
        self._tf = tf
        self.directory = directory

    def scalar(self, tag: str, value: float | None, step: int = 0) -> None:
        """One value (None and non-finite values are skipped: TensorBoard cannot draw them)."""
        if value is None or not math.isfinite(float(value)):
            return
        with self._writer.as_default():
            self._tf.summary.scalar(tag, float(value), step=step)

    def scalars(self, values: Mapping[str, float | None], step: int = 0, prefix: str = "") -> None:
        for tag, value in values.items():
            self.scalar(f"{prefix}{tag}", value, step)

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        """Text shown by TensorBoard's text plugin (Markdown, tables included)."""
        with self._writer.as_default():
            self._tf.summary.text(tag, markdown, step=step)


@contextmanager
def open_run(root: Path, command: str) -> Iterator[RunWriter]:
    """A writer into a new run directory under ``root``; flushed and closed when the block ends.

    Raises:
        TensorBoardUnavailable: tensorflow is not installed.
    """
    tf = _tensorflow()
    directory = run_directory(root, command)
    directory.mkdir(parents=True, exist_ok=False)
    writer = tf.summary.create_file_writer(str(directory))
    try:
        yield RunWriter(writer, tf, directory)
    finally:
        writer.flush()
        writer.close()


def markdown_table(rows: list[list[str]]) -> str:
    """A Markdown table for :meth:`RunWriter.text` (first row the header)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines) + "\n"


def read_events(directory: Path) -> dict[str, list[tuple[int, Any]]]:
    """Every summary in a run directory as tag -> [(step, value)]: floats for scalars, str for text.

    For tests and for reading runs back without TensorBoard.
    """
    tf = _tensorflow()
    out: dict[str, list[tuple[int, Any]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                item: Any = array.item() if array.ndim == 0 else array.tolist()
                if isinstance(item, bytes):
                    item = item.decode("utf-8")
                elif not isinstance(item, str):
                    item = float(item)
                out.setdefault(value.tag, []).append((int(event.step), item))
    return out
