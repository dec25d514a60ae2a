"""batch-score --ray scaling: records/s and tokens/s with 1 and 2 actors vs the local runner with the same cores.
A benchmark, not a test: the numbers mean something only on an otherwise idle machine.

    .venv/bin/python -m benchmarks.batch_ray_scaling                       # the demo model, 1500 records
    .venv/bin/python -m benchmarks.batch_ray_scaling -m /tmp/pkg --records 2000 --actors 1 2 4 --json out.json

Writes a TFRecord of ``--records`` Multi30k test_2016 records (``benchmarks.batch_workers.write_input``) and runs the
``batch-score`` console script once per configuration, each in a fresh process and output directory: the local
runner with N worker processes x 1 thread, and ``--ray`` (a local Ray started by the command, as many CPUs as the
process may use) with N actors x 1 thread, for each N of ``--actors``. Reports, from each summary.json: records/s
and target tokens/s while translating (``run_job``'s wall time: actor or worker start-up and model loading
included, Ray's own start excluded), end-to-end records/s of the whole command, and BLEU; then the efficiency the
numbers imply: Ray's speed-up from the fewest actors to each count as a share of linear, and Ray / local at the
same cores. Every configuration must write the same bytes (the sha256 of the outputs is compared).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.batch_workers import run, write_input


def _one(input_path: Path, root: Path, model: str | None, n: int, ray: bool, chunk_size: int) -> dict[str, Any]:
    out_dir = root / f"{'ray' if ray else 'local'}-{n}"
    out_dir.mkdir()
    extra = ["--threads", "1", "--chunk-size", str(chunk_size), *(["--ray"] if ray else [])]
    result = run(input_path, out_dir, model, n, extra)
    result["sha256"] = hashlib.sha256((out_dir / "out.tfrecord").read_bytes()).hexdigest()
    result["runner"] = "ray" if ray else "local"
    return result


def efficiency(results: list[dict[str, Any]]) -> list[str]:
    """Lines: Ray's scaling from its fewest actors (share of linear), and Ray / local at the same cores."""
    by = {(r["runner"], r["engine"]["workers"]): r for r in results}
    ray = sorted(n for runner, n in by if runner == "ray")
    lines = []
    if ray:
        base = by[("ray", ray[0])]
        for n in ray[1:]:
            for key, label in (("records_per_second", "records/s"), ("tokens_per_second", "tokens/s")):
                speedup = by[("ray", n)][key] / base[key]
                lines.append(f"ray {ray[0]} -> {n} actors: {speedup:.2f}x {label}, {100 * speedup / (n / ray[0]):.0f}% "
                             f"of linear (per-actor efficiency)")
    for n in ray:
        if ("local", n) in by:
            ratio = by[("ray", n)]["records_per_second"] / by[("local", n)]["records_per_second"]
            lines.append(f"ray / local at {n} core(s): {ratio:.2f} (records/s)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=None, help="model package (default: the bundled demo model)")
    parser.add_argument("--records", type=int, default=1500,
                        help="records to translate (enough that start-up, a few seconds, is a small part)")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2],
                        help="actor counts, each against the local runner with as many worker processes")
    parser.add_argument("--chunk-size", type=int, default=25, help="records per chunk (the unit of work)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # writing the input imports tensorflow here too
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    cores = len(os.sched_getaffinity(0))
    results = []
    with tempfile.TemporaryDirectory(prefix="batch-ray-bench-") as tmp:
        root = Path(tmp)
        input_path = root / "bench.tfrecord"
        write_input(input_path, args.records)
        for n in args.actors:
            for ray in (False, True):
                results.append(_one(input_path, root, args.model, n, ray, args.chunk_size))
    print(f"{args.records} records, chunks of {args.chunk_size}, {cores} cores, model {args.model or 'demo'}")
    print(f"{'runner':>6} {'procs':>5} {'records/s':>10} {'tokens/s':>9} {'e2e rec/s':>10} {'command s':>9} "
          f"{'BLEU':>6}")
    for r in results:
        bleu = (r.get("scores") or {}).get("bleu", {}).get("score")
        print(f"{r['runner']:>6} {r['engine']['workers']:>5} {r['records_per_second']:>10.1f} "
              f"{r['tokens_per_second']:>9.0f} {args.records / r['command_seconds']:>10.1f} "
              f"{r['command_seconds']:>9.1f} {bleu if bleu is not None else '-':>6}")
    for line in efficiency(results):
        print(line)
    same = len({r["sha256"] for r in results}) == 1
    print("outputs: identical in every configuration" if same else "outputs DIFFER between configurations")
    for r in results:
        print("  " + str(r["cmd"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
