"""Output assembly: once every chunk of the job is committed, the chunks' data files are concatenated into the
output (in chunk order: the records' order), then the rejects file and summary.json are written, each atomically.

A failure here (a full disk) leaves the committed chunks in place: the rerun assembles again, to the same bytes.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from batch import scoring
from batch.errors import JobError
from batch.job import Job
from batch.outputs import concatenate, write_file
from batch.state import ChunkMeta, StateDir
from serving.engine.request import perplexity


@dataclass
class RunStats:
    """What this run did (the summary's ``this_run``, ``resumed`` and speed figures)."""

    started: float
    reused_chunks: int
    reused_entries: int
    startup: float = 0.0
    translated: int = 0
    source_tokens: int = 0
    target_tokens: int = 0


def reference_scores(metas: list[ChunkMeta]) -> dict[str, Any]:
    """The corpus figures of ``--score-references``: the references' log-likelihood under the model, over every
    scored reference token (EOS included), and its perplexity."""
    scored = sum(m.references_scored for m in metas)
    tokens = sum(m.reference_tokens for m in metas)
    log_prob = math.fsum(m.reference_log_prob for m in metas)
    mean = log_prob / tokens if tokens else None
    ppl = None if mean is None else perplexity(mean)
    return {"references_scored": scored, "tokens": tokens, "log_prob": log_prob, "mean_log_prob": mean,
            "perplexity": ppl if ppl is None or math.isfinite(ppl) else None}


def assemble(job: Job, state: StateDir, n_chunks: int, stats: RunStats, engine_info: dict[str, Any]) -> dict[str, Any]:
    """Write the output, the rejects file and the summary from the committed chunks; return the summary.

    Raises:
        JobError: a chunk is not committed.
        IOFailure: a file could not be written.
    """
    metas = state.committed()
    missing = [c for c in range(n_chunks) if c not in metas]
    if missing:  # pragma: no cover - every chunk was committed by the run or before it
        raise JobError(f"chunks {missing[:5]} were not committed; rerun to finish them")
    concatenate(job.output, [state.data_path(chunk) for chunk in range(n_chunks)])

    ordered = [metas[c] for c in range(n_chunks)]
    rejects = [r for m in ordered for r in m.rejects]
    write_file(job.rejects, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects).encode("utf-8"))
    hyps = [h for m in ordered for h in m.hypotheses]
    refs = [r for m in ordered for r in m.references]
    wall = time.monotonic() - stats.started
    busy = max(wall - stats.startup, 1e-9)
    done = stats.translated
    summary: dict[str, Any] = {
        "inputs": [str(i.path) for i in job.inputs],
        "input_format": job.schema.format,
        "schema": job.schema.to_dict(),
        "output": str(job.output),
        "output_format": job.output_format,
        "rejects_file": str(job.rejects),
        "engine": engine_info,
        "shard": {"index": job.shard_index, "count": job.num_shards},
        "records": sum(m.entries for m in ordered),
        "translated": sum(m.records for m in ordered),
        "rejects": len(rejects),
        "tokens": {"source": sum(m.source_tokens for m in ordered), "target": sum(m.target_tokens for m in ordered)},
        "resumed": {"chunks": stats.reused_chunks, "records": stats.reused_entries},
        "this_run": {"translated": done, "source_tokens": stats.source_tokens, "target_tokens": stats.target_tokens},
        "wall_seconds": round(wall, 3),
        "startup_seconds": round(stats.startup, 3),
        "records_per_second": round(done / busy, 2) if done else 0.0,
        "tokens_per_second": round(stats.target_tokens / busy, 1) if done else 0.0,
        "source_tokens_per_second": round(stats.source_tokens / busy, 1) if done else 0.0,
        "scores": scoring.corpus_scores(hyps, refs),
    }
    if job.score_references:
        summary["reference_scores"] = reference_scores(ordered)
    write_file(job.summary, (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return summary
