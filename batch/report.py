"""What batch-score says on the console: the one summary line of a run (with the sacreBLEU signatures), the
dry run's report of the inputs, and the warning for an empty input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batch.inputs import scan
from batch.job import Job
from batch.records import Record, RecordParser, load_vocab
from batch.schema import Schema
from batch.scoring import describe


def summary_line(summary: dict[str, Any], job: Job) -> str:
    """``batch-score: 40 of 40 records translated in 3.1 s (...); BLEU 23.41 [signature] ... -> OUT``."""
    parts = [f"batch-score: {summary['translated']} of {summary['records']} records translated"]
    if summary["rejects"]:
        parts.append(f", {summary['rejects']} rejected ({job.rejects})")
    parts.append(f" in {summary['wall_seconds']:.1f} s")
    if summary["this_run"]["translated"]:
        parts.append(f" ({summary['records_per_second']:.1f} records/s, {summary['tokens_per_second']:.0f} tokens/s)")
    if summary["resumed"]["chunks"]:
        parts.append(f", resumed {summary['resumed']['records']} records")
    scores = describe(summary.get("scores"))
    if scores:
        parts.append(f"; {scores}")
    parts.append(f" -> {job.output}")
    return "".join(parts)


def dry_run_report(job: Job) -> tuple[list[str], int]:
    """(lines describing the inputs, the schema, what the records hold and the output; the records of the shard).

    Raises:
        InputError: the schema cannot be parsed (ids without a vocabulary).
        IOFailure: an input could not be read.
    """
    parser = RecordParser(job.schema, load_vocab(job.vocab) if job.vocab else None)
    total = readable = with_reference = 0
    problems: list[str] = []
    for entry in scan(job.inputs, want=job.owns):
        if not job.owns(entry.index):
            continue
        total += 1
        parsed = parser.parse(entry)
        if isinstance(parsed, Record):
            readable += 1
            with_reference += parsed.reference is not None
        elif len(problems) < 5:
            problems.append(f"  record {parsed.index} ({parsed.file}:{parsed.position}): {parsed.reason}")
    names = ", ".join(i.path.name for i in job.inputs[:3]) + (", ..." if len(job.inputs) > 3 else "")
    lines = [
        f"inputs: {len(job.inputs)} file(s) ({names})",
        f"schema: {_schema_line(job.schema, job.vocab)}",
        f"records: {total} ({readable} readable, {total - readable} malformed, {with_reference} with a reference)"
        + (f" in shard {job.shard_index} of {job.num_shards}" if job.num_shards > 1 else ""),
        *problems,
        f"output: {job.output} ({job.output_format})",
    ]
    return lines, total


def empty_warning(job: Job) -> str:
    """One line naming the inputs (and the shard) that hold no records: legitimate, but worth a word."""
    names = ", ".join(str(i.path) for i in job.inputs[:3]) + (", ..." if len(job.inputs) > 3 else "")
    where = f"shard {job.shard_index} of {job.num_shards} of " if job.num_shards > 1 else ""
    return f"batch-score: warning: {where}{names}: no records (an empty input); nothing to translate"


def _schema_line(schema: Schema, vocab: Path | None) -> str:
    line = schema.describe()
    if vocab is not None:
        line += f"; ids decoded with {vocab}"
    return line
