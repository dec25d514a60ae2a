"""``--tensorboard DIR``: scalars and text of one run, written with ``tensorboardX`` into a run directory of its own.

Every run of ``batch-score``, ``mtgate loadtest``, ``validate`` and ``sweep`` gets ``DIR/<command>-<UTC time>-<pid>``,
so ``tensorboard --logdir DIR`` lists the runs side by side and compares them over time. Tags are
``<group>/<name>`` (``quality/candidate_bleu``, ``load/interactive/p95_ms``); a value without a time axis is written
at step 0, a series over a run at its seconds (or, for a sweep, at each point's index).

This is the one module that writes summaries (``loadtest`` uses it too: batch is below loadtest, never the other way
round). The event file is tensorboardX's (``FileWriter``: TFRecord framing, checksums, its name); each summary is
the one ``tf.summary`` writes (a tensor with the ``scalars`` or ``text`` plugin's metadata, the tag as given), so a
run reads back the same in TensorBoard, in TensorFlow's summary iterator or in :func:`read_events`. tensorboardX
(the ``batch`` and ``loadtest`` extras; no tensorflow) is imported only when a writer is opened.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class TensorBoardUnavailable(Exception):
    """tensorboardX (or, to read events back, tensorboard) cannot be imported in this install."""


def check_available() -> None:
    """Raise :class:`TensorBoardUnavailable` now rather than after a run (nothing is imported)."""
    if importlib.util.find_spec("tensorboardX") is None:
        raise TensorBoardUnavailable("--tensorboard needs tensorboardX (not installed): pip install 'mtgate[batch]' "
                                     "or 'mtgate[loadtest]'")


def run_directory(root: Path, command: str) -> Path:
    """A new, unique run directory name under ``root`` for one run of ``command``."""
    base = f"{command}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    candidates = (root / (base if i == 0 else f"{base}-{i}") for i in range(1000))
    return next(c for c in candidates if not c.exists())


class RunWriter:
    """Scalars and Markdown text of one run (a tensorboardX ``FileWriter``)."""

    def __init__(self, writer: Any, directory: Path) -> None:
        self._writer = writer
        self.directory = directory

    def scalar(self, tag: str, value: float | None, step: int = 0) -> None:
        """One value (None and non-finite values are skipped: TensorBoard cannot draw them)."""
        if value is None or not math.isfinite(float(value)):
            return
        from tensorboardX.proto.tensor_pb2 import TensorProto

        self._add(tag, "scalars", TensorProto(dtype="DT_FLOAT", float_val=[float(value)]), step)

    def scalars(self, values: Mapping[str, float | None], step: int = 0, prefix: str = "") -> None:
        for tag, value in values.items():
            self.scalar(f"{prefix}{tag}", value, step)

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        """Text shown by TensorBoard's text plugin (Markdown, tables included)."""
        from tensorboardX.proto.tensor_pb2 import TensorProto

        self._add(tag, "text", TensorProto(dtype="DT_STRING", string_val=[markdown.encode("utf-8")]), step)

    def _add(self, tag: str, plugin: str, tensor: Any, step: int) -> None:
        # a scalar tensor (no shape: rank 0) tagged for its plugin, as tf.summary.scalar / tf.summary.text write it;
        # tensorboardX's own add_scalar / add_text write a legacy simple_value and suffix text tags instead
        from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=plugin))
        self._writer.add_summary(Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)]), step)


@contextmanager
def open_run(root: Path, command: str) -> Iterator[RunWriter]:
    """A writer into a new run directory under ``root``; flushed and closed when the block ends.

    Raises:
        TensorBoardUnavailable: tensorboardX is not installed.
    """
    check_available()
    from tensorboardX import FileWriter

    directory = run_directory(root, command)
    directory.mkdir(parents=True, exist_ok=False)
    writer = FileWriter(str(directory))
    try:
        yield RunWriter(writer, directory)
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

    Read with TensorBoard's own event loader (the ``tensorboard`` package: it comes with tensorflow, in the ``t2t``
    and test extras); for tests and for reading runs back without TensorBoard's UI.

    Raises:
        TensorBoardUnavailable: tensorboard is not installed.
    """
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util.tensor_util import make_ndarray
    except ImportError as e:
        raise TensorBoardUnavailable(f"reading events needs tensorboard ({e}): pip install tensorboard") from e
    out: dict[str, list[tuple[int, Any]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                array = make_ndarray(value.tensor)
                item: Any = array.item() if array.ndim == 0 else array.tolist()
                if isinstance(item, bytes):
                    item = item.decode("utf-8")
                elif not isinstance(item, str):
                    item = float(item)
                out.setdefault(value.tag, []).append((int(event.step), item))
    return out
