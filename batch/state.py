"""Job state and commits: ``<output>.partial/`` holds an unfinished job's fingerprint (``job.json``), a lock, and
its committed chunks.

A chunk is committed by writing its output items (``NNNNNN.data``) and then, as the commit point, its record
(``NNNNNN.json``: counts, rejects, hypotheses and references for scoring, and the sha256 of the input records it
was made from), each atomically. Killed at any moment and rerun with the same command, the runner finds the
committed chunks and translates only the others. A different command (inputs, model or options) does not reuse the
state by mistake, and neither does a changed input: each committed chunk's records must hash as they did
(:func:`verify_committed`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from batch.errors import InputChanged, JobError, io_failure
from batch.framing import Entry
from batch.inputs import scan
from batch.job import Job
from batch.outputs import write_file

logger = logging.getLogger(__name__)

STATE_VERSION = 2  # 2: chunk records carry the sha256 of their input records


def chunk_digest(entries: Sequence[Entry]) -> str:
    """sha256 of what a chunk was made from: each entry's index, position, bytes, reference bytes and framing error.

    A resumed run reuses a committed chunk only if its records still hash the same (``verify_committed``). Hashing
    per chunk rather than the whole input up front costs nothing on a first run (the records are hashed as they are
    read for translation), and on resume reads only this shard's committed records, once.
    """
    h = hashlib.sha256()
    for e in entries:
        h.update(struct.pack("<qq", e.index, e.position))
        for part in (e.data, e.reference, None if e.error is None else e.error.encode("utf-8")):
            if part is None:
                h.update(struct.pack("<q", -1))
            else:
                h.update(struct.pack("<q", len(part)))
                h.update(part)
    return h.hexdigest()


@dataclass
class ChunkMeta:
    """The commit record of one chunk."""

    chunk: int
    records: int
    data_bytes: int
    rejects: list[dict[str, Any]]
    hypotheses: list[str]
    references: list[str | None]
    source_tokens: int
    target_tokens: int
    entries: int
    input_sha256: str = ""
    references_scored: int = 0  # with --score-references: records whose reference was scored, their log-likelihood
    reference_log_prob: float = 0.0
    reference_tokens: int = 0


# Fingerprint fields (batch.job's Job.fingerprint and EngineConfig.fingerprint) as the options that set them.
_OPTION_OF = {
    "beam_size": "--beam-size", "max_length": "--max-length", "max_tokens": "--max-batch-tokens",
    "max_batch_size": "--max-batch-size", "runtime": "--runtime", "precision": "--precision", "model_dir": "-m",
    "manifest_sha256": "the model package's manifest (the package changed)", "server": "--server",
    "model_name": "--model-name", "chunk_size": "--chunk-size", "num_shards": "--num-shards",
    "shard_index": "--shard-index", "vocab": "--vocab", "schema": "--input-key/--reference-key",
    "output_format": "the output format (-o's extension or --output-format)", "format": "--input-format",
    "score_references": "--score-references", "files": "the input files", "decoding": "the decoding options",
}


def changed_options(existing: Any, wanted: dict[str, Any]) -> list[str]:
    """What differs between an unfinished run's fingerprint and this command's, as options with the value the
    unfinished run had: ``--beam-size 4 (now 1)``; empty when ``existing`` is unreadable or of another version."""
    try:
        if existing["version"] != wanted["version"]:
            return []
        before = {**existing["job"]["job"], **existing["job"]["engine"]}
        after = {**wanted["job"]["job"], **wanted["job"]["engine"]}
    except (KeyError, TypeError):
        return []

    def shown(value: Any) -> str:
        return "unset" if value is None or value is False else "set" if value is True else str(value)

    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if key == "decoding":  # one entry per decoding option: --temperature 0.8 (now unset)
            old, new = old or {}, new or {}
            changes += [f"--{name.replace('_', '-')} {shown(old.get(name))} (now {shown(new.get(name))})"
                        for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
        elif key in ("files", "schema", "manifest_sha256"):
            changes.append(_OPTION_OF[key])
        else:
            changes.append(f"{_OPTION_OF.get(key, key)} {shown(old)} (now {shown(new)})")
    return changes


class StateDir:
    """``<output>.partial``: committed chunks of an unfinished job, its fingerprint and a lock."""

    def __init__(self, path: Path, fingerprint: dict[str, Any]) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self._lock: IO[bytes] | None = None

    def open(self, restart: bool) -> dict[int, ChunkMeta]:
        """Create or reopen the directory; return the committed chunks.

        Raises:
            JobError: another run holds the lock, or the directory belongs to a different job (without restart).
        """
        with io_failure(self.path, "write"):
            self.path.mkdir(exist_ok=True)
            self._lock = (self.path / "lock").open("ab")
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise JobError(f"{self.path}: another batch-score run is writing this output") from e
        job_file = self.path / "job.json"
        wanted = {"version": STATE_VERSION, "job": self.fingerprint}
        if job_file.is_file():
            try:
                existing = json.loads(job_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                existing = None
            if existing != wanted:
                if not restart:
                    raise self._different(existing, wanted)
                logger.warning("discarding the unfinished run in %s (--restart)", self.path)
            elif restart:
                logger.warning("discarding the unfinished run in %s (--restart)", self.path)
            if existing != wanted or restart:
                for p in self.path.iterdir():
                    if p.name != "lock":
                        p.unlink()
        write_file(job_file, json.dumps(wanted, indent=1, sort_keys=True).encode("utf-8"))
        return self.committed()

    def _different(self, existing: Any, wanted: dict[str, Any]) -> JobError:
        def without_files(state: Any) -> Any:
            job = dict(state["job"]["job"])
            job.pop("files", None)
            return state["version"], job, state["job"]["engine"]

        try:
            same_command = without_files(existing) == without_files(wanted)
        except (KeyError, TypeError):
            same_command = False
        if same_command:
            return InputChanged(f"the input changed since the last run (a file's size differs from the one recorded "
                                f"in {self.path}); rerun with --restart")
        changes = changed_options(existing, wanted)
        if not changes:  # unreadable, or an older batch-score's state
            return JobError(f"{self.path} holds an unfinished run of a different command (or of an older "
                            "batch-score); rerun that command to resume it, or add --restart")
        return JobError(f"{self.path} holds an unfinished run of a different command, with {'; '.join(changes)}; "
                        "rerun it with those to resume it, or add --restart to start over")

    def committed(self) -> dict[int, ChunkMeta]:
        """The chunks whose record and data file are both in place."""
        done: dict[int, ChunkMeta] = {}
        for meta_path in sorted(self.path.glob("[0-9]*.json")):
            try:
                meta = ChunkMeta(**json.loads(meta_path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                logger.warning("ignoring unreadable chunk record %s", meta_path)
                continue
            data = self.data_path(meta.chunk)
            if not data.is_file() or data.stat().st_size != meta.data_bytes:
                logger.warning("chunk %d: data file missing or of the wrong size; it will be redone", meta.chunk)
                continue
            done[meta.chunk] = meta
        return done

    def data_path(self, chunk: int) -> Path:
        return self.path / f"{chunk:06d}.data"

    def commit(self, meta: ChunkMeta, data: bytes) -> None:
        """Write the chunk's data, then its record: the chunk counts as done only once the record exists."""
        write_file(self.data_path(meta.chunk), data)
        meta.data_bytes = len(data)
        write_file(self.path / f"{meta.chunk:06d}.json", json.dumps(asdict(meta), ensure_ascii=False).encode())

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)



def verify_committed(job: Job, done: dict[int, ChunkMeta]) -> None:
    """Refuse to resume unless every committed chunk's records hash as they did when it was committed.

    Raises:
        InputChanged: some committed chunk was made from other records.
    """
    if not done:
        return
    last = max(done)
    entries: dict[int, list[Entry]] = {}
    for entry in scan(job.inputs, want=lambda i: job.owns(i) and job.chunk_of(i) in done):
        if not job.owns(entry.index):
            continue
        chunk = job.chunk_of(entry.index)
        if chunk > last:
            break
        if chunk in done:
            entries.setdefault(chunk, []).append(entry)
    for chunk in sorted(done):
        got = entries.get(chunk, [])
        if chunk_digest(got) != done[chunk].input_sha256:
            where = f"records from {got[0].file}:{got[0].position}" if got else "records that are no longer there"
            raise InputChanged(f"the input changed since the last run (chunk {chunk}, {where}, differs from what "
                               f"{job.state_dir} holds); rerun with --restart")

