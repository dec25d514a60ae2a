"""What batch-score says on the console: the one summary line of a run (with the sacreBLEU signatures), the
dry run's report of the inputs, the warning for an empty input; and, with ``--tensorboard DIR``, the run's scalars
and summary in a TensorBoard run directory of its own (``batch.tensorboard``'s writer, imported only then)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from batch.inputs import scan
from batch.job import Job
from batch.records import Record, RecordParser, load_vocab
from batch.schema import Schema
from batch.scoring import describe


def summary_line(summary: dict[str, Any], job: Job) -> str:
    """``batch-score: 40 of 40 records translated in 3.1 s (...); BLEU 23.41 [signature] ... -> OUT``; after a
    resume, what this run did and in how long apart from what the earlier run had committed."""
    parts = [f"batch-score: {summary['translated']} of {summary['records']} records translated"]
    if summary["rejects"]:
        parts.append(f", {summary['rejects']} rejected ({job.rejects})")
    this_run = summary["this_run"]["translated"]
    speed = (f"{summary['records_per_second']:.1f} records/s, {summary['tokens_per_second']:.0f} tokens/s"
             if this_run else "")
    if summary["resumed"]["chunks"]:
        parts.append(f": {summary['resumed']['records']} committed by an earlier run, {this_run} translated by this one "
                     f"in {summary['wall_seconds']:.1f} s{f' ({speed})' if speed else ''}")
    else:
        parts.append(f" in {summary['wall_seconds']:.1f} s{f' ({speed})' if speed else ''}")
    scores = describe(summary.get("scores"))
    if scores:
        parts.append(f"; {scores}")
    references = summary.get("reference_scores")
    if references and references["tokens"]:
        parts.append(f"; references: perplexity {references['perplexity'] or float('inf'):.2f}, mean log-prob "
                     f"{references['mean_log_prob']:.4f} over {references['tokens']} tokens")
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


TENSORBOARD_COMMAND = "batch-score"


def tensorboard_problem(root: Path) -> str | None:
    """Why ``--tensorboard DIR`` cannot be written (checked before any work), or None.

    DIR may not exist yet (it is created with the run directory): its nearest existing ancestor must then be a
    writable directory.
    """
    if importlib.util.find_spec("tensorboardX") is None:
        return "--tensorboard needs tensorboardX (not installed): pip install 'mtgate[batch]'"
    if root.exists() and not root.is_dir():
        return f"--tensorboard {root}: exists and is not a directory"
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"--tensorboard {root}: cannot write in {existing}"
    return None


def tensorboard_scalars(summary: dict[str, Any]) -> dict[str, float | None]:
    """The run's numbers as TensorBoard tags: quality (BLEU, chrF, TER), records, speed."""
    scores = summary.get("scores") or {}
    values: dict[str, float | None] = {
        f"quality/{key}": scores[key]["score"] if key in scores else None for key in ("bleu", "chrf", "ter")}
    values |= {"records/total": summary["records"], "records/translated": summary["translated"],
               "records/rejected": summary["rejects"],
               "speed/records_per_second": summary["records_per_second"] if summary["this_run"]["translated"]
               else None,
               "speed/tokens_per_second": summary["tokens_per_second"] if summary["this_run"]["translated"] else None}
    return values


def write_tensorboard(root: Path, summary: dict[str, Any], job: Job) -> Path:
    """One TensorBoard run directory under ``root`` with the run's scalars and a text summary; returns it."""
    from batch.tensorboard import markdown_table, open_run

    scores = summary.get("scores") or {}
    rows = [["", ""], ["inputs", ", ".join(summary["inputs"])], ["output", str(job.output)],
            ["engine", ", ".join(f"{k}={v}" for k, v in summary["engine"].items())],
            ["records", f"{summary['translated']} of {summary['records']} translated, {summary['rejects']} rejected"],
            ["speed", f"{summary['records_per_second']} records/s, {summary['tokens_per_second']} tokens/s"]]
    rows += [[label, f"{scores[key]['score']:.2f} ({scores[key]['signature']})"]
             for label, key in (("BLEU", "bleu"), ("chrF", "chrf"), ("TER", "ter")) if key in scores]
    with open_run(root, TENSORBOARD_COMMAND) as run:
        run.scalars(tensorboard_scalars(summary))
        run.text("summary", summary_line(summary, job) + "\n\n" + markdown_table(rows))
    return run.directory
