"""batch-score's output files: what an output item is (:class:`OutputEncoder`), how a file is written
(:func:`write_file`, :func:`concatenate`: atomic, through ``serving.package.files``, one-line :class:`IOFailure` on error),
checking the paths before any work (:func:`check_outputs`), and their default names.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batch.errors import JobError, io_failure
from batch.example import example_class
from batch.framing import Format
from batch.inputs import InputFile
from batch.job import Job
from batch.records import Record, Translated
from serving.engine.request import perplexity
from serving.package.files import atomic_write_bytes, atomic_writer

OUTPUT_KEY = "outputs"
SCORE_KEY = "score"
REFERENCE_KEYS = ("ref_log_prob", "ref_tokens", "ref_perplexity")  # --score-references
_OUTPUT_SUFFIX: dict[str, str] = {"tfrecord": ".tfrecord", "jsonl": ".jsonl", "text": ".txt"}


def _float_or_nan(score: float | None) -> float:
    return float("nan") if score is None else float(score)


class OutputEncoder:
    """Encodes a record and its translation as one output item (serialized Example, JSON line or text line).

    TFRecord output copies the input Example and adds ``outputs`` (bytes) and ``score`` (float); inputs that are not
    Examples get ``inputs`` (and ``targets`` when there is a reference). JSONL output copies the input object (or
    builds ``{"index", "source", "reference"}``) and adds ``outputs`` and ``score``. A record whose reference was
    scored (``--score-references``) also gets ``ref_log_prob`` (float), ``ref_tokens`` (int) and ``ref_perplexity``
    (float; null in JSON where it overflows); text output has no room for them (the summary has the corpus figures).
    """

    def __init__(self, output_format: Format) -> None:
        self.format = output_format
        self._example_cls: Any = example_class() if output_format == "tfrecord" else None

    def encode(self, record: Record, result: Translated) -> bytes:
        if self.format == "tfrecord":
            return self._example(record, result)
        if self.format == "jsonl":
            if isinstance(record.original, dict):
                obj = dict(record.original)
            else:
                obj = {"index": record.index, "source": record.source}
                if record.reference is not None:
                    obj["reference"] = record.reference
            obj[OUTPUT_KEY] = result.text
            score = _float_or_nan(result.score)
            obj[SCORE_KEY] = score if math.isfinite(score) else None
            if result.ref_log_prob is not None:
                log_prob, tokens, ppl = _reference_values(result)
                obj |= dict(zip(REFERENCE_KEYS, (log_prob, tokens, ppl if math.isfinite(ppl) else None), strict=True))
            return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        return (result.text.replace("\r", " ").replace("\n", " ") + "\n").encode("utf-8")

    def _example(self, record: Record, result: Translated) -> bytes:
        example = record.original
        if example is None or not hasattr(example, "features"):
            example = self._example_cls()
            example.features.feature["inputs"].bytes_list.value.append(record.source.encode("utf-8"))
            if record.reference is not None:
                example.features.feature["targets"].bytes_list.value.append(record.reference.encode("utf-8"))
        features = example.features.feature
        features[OUTPUT_KEY].Clear()
        features[OUTPUT_KEY].bytes_list.value.append(result.text.encode("utf-8"))
        features[SCORE_KEY].Clear()
        features[SCORE_KEY].float_list.value.append(_float_or_nan(result.score))
        if result.ref_log_prob is not None:
            log_prob, tokens, ppl = _reference_values(result)
            for key in REFERENCE_KEYS:
                features[key].Clear()
            features["ref_log_prob"].float_list.value.append(log_prob)
            features["ref_tokens"].int64_list.value.append(tokens)
            features["ref_perplexity"].float_list.value.append(ppl)
        # deterministic: map entries in key order, so reruns and resumed runs write identical bytes.
        data: bytes = example.SerializeToString(deterministic=True)
        return data



def _reference_values(result: Translated) -> tuple[float, int, float]:
    """(log-likelihood, tokens, perplexity) of a record's scored reference."""
    log_prob, tokens = float(result.ref_log_prob or 0.0), int(result.ref_tokens or 0)
    return log_prob, tokens, perplexity(log_prob / max(1, tokens))


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: nothing half-written, no temporary file left on any error.

    Raises:
        IOFailure: the file could not be written (full disk, read-only...).
    """
    with io_failure(path, "write"):
        atomic_write_bytes(path, data)


def concatenate(target: Path, parts: Sequence[Path]) -> None:
    """Write the parts one after the other into ``target``, atomically.

    Raises:
        IOFailure: a part could not be read or ``target`` written.
    """
    with io_failure(target, "write"), atomic_writer(target, "wb") as out:
        for part in parts:
            with io_failure(part, "read"):
                f = part.open("rb")
            with f:
                while True:
                    with io_failure(part, "read"):
                        block = f.read(1 << 20)
                    if not block:
                        break
                    out.write(block)


def check_outputs(job: Job) -> None:
    """Refuse outputs that cannot be written, before any work (nothing is written here but a probe, removed).

    Raises:
        JobError: an output path is a directory, or its directory is missing, not a directory or not writable.
    """
    for path, what, flag in ((job.output, "the output", "-o"), (job.rejects, "the rejects file", "--rejects"),
                             (job.summary, "the summary", "--summary")):
        problem = _unwritable(path)
        if problem:
            raise JobError(f"cannot write {what} {path}: {problem}; give another {flag}")
    if job.state_dir.exists() and not job.state_dir.is_dir():
        raise JobError(f"{job.state_dir} is not a directory, but batch-score keeps its resume state there; remove it "
                       "or give another -o")


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or None."""
    if path.is_dir():
        return "it is a directory"
    parent = path.parent
    if not parent.exists():
        return f"no directory {parent} (create it first)"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:  # the one test that holds for read-only mounts, ACLs and root alike: create a file there
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".probe")
    except OSError as e:
        return f"cannot create files in {parent} ({e.strerror})"
    os.close(fd)
    os.unlink(probe)
    return None


def default_output(inputs: list[InputFile], output_format: str) -> Path:
    """``INPUT.scored.EXT`` beside the (first) input; several inputs share their common prefix."""
    paths = [i.path for i in inputs]
    if len(paths) == 1:
        stem = paths[0].name
        for suffix in (".tfrecords", ".tfrecord", ".tfr", ".jsonl", ".ndjson", ".json", ".txt"):
            if stem.lower().endswith(suffix):
                stem = stem[: -len(suffix)]
                break
    else:
        stem = re.sub(r"[-_.0-9]+$", "", os.path.commonprefix([p.name for p in paths])) or "batch-score"
    return paths[0].parent / f"{stem}.scored{_OUTPUT_SUFFIX[output_format]}"


def shard_name(path: Path, num: int, index: int) -> Path:
    """``OUT.EXT`` -> ``OUT-00003-of-00010.EXT`` for shard 3 of 10 (unchanged for one shard)."""
    if num == 1:
        return path
    suffix = path.suffix if path.suffix in _OUTPUT_SUFFIX.values() else ""
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    return path.with_name(f"{stem}-{index:05d}-of-{num:05d}{suffix}")


def side_file(output: Path, ending: str) -> Path:
    """``OUT.EXT`` -> ``OUT<ending>`` (``.rejects.jsonl``, ``.summary.json``) whatever EXT is (``test.hyp.de`` ->
    ``test.hyp.rejects.jsonl``, as ``test.hyp.txt`` and ``test.hyp.tfrecords``); ``OUT`` without one -> ``OUT<ending>``.
    """
    return output.with_name(output.stem + ending)


