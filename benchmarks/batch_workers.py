"""batch-score throughput: 1 worker vs every core (records/s and tokens/s). A benchmark, not a test.

    .venv/bin/python benchmarks/batch_workers.py -m models/demo-en-de
    .venv/bin/python benchmarks/batch_workers.py -m /tmp/pkg --records 2000 --workers 1 2

Writes a TFRecord of ``--records`` records (Multi30k test_2016 EN sentences with their DE references, repeated as
needed) and runs the ``batch-score`` console script on it once per worker count, each in a fresh process and a fresh
output directory. Reports, from each run's summary.json: processing records/s and target tokens/s (wall time minus
model loading in the parent), end-to-end records/s (whole command, including tensorflow import, worker start-up and
model loading), and BLEU, which must not change with the worker count.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "models" / "data" / "multi30k"


def write_input(path: Path, records: int) -> None:
    import tensorflow as tf

    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sources = [line.strip() for line in f]
    with gzip.open(DATA / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        references = [line.strip() for line in f]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(records):
            ex = tf.train.Example()
            ex.features.feature["inputs"].bytes_list.value.append(sources[i % len(sources)].encode())
            ex.features.feature["targets"].bytes_list.value.append(references[i % len(references)].encode())
            writer.write(ex.SerializeToString())


def run(input_path: Path, out_dir: Path, model: str | None, workers: int, extra: list[str]) -> dict[str, object]:
    exe = shutil.which("batch-score", path=str(Path(sys.executable).parent)) or "batch-score"
    cmd = [exe, str(input_path), "-o", str(out_dir / "out.tfrecord"), "--workers", str(workers), "--no-progress",
           "--allow-rejects", *extra]
    if model:
        cmd += ["-m", model]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"batch-score failed ({proc.returncode}): {' '.join(cmd)}")
    summary = json.loads((out_dir / "out.summary.json").read_text(encoding="utf-8"))
    return {"cmd": " ".join(cmd), "command_seconds": wall, **summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=None, help="model package (default: the bundled demo model)")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="worker counts to compare (default: 1 and every core)")
    parser.add_argument("--chunk-size", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args, extra = parser.parse_known_args()
    cores = len(os.sched_getaffinity(0))
    counts = args.workers or sorted({1, cores})
    results = []
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        input_path = Path(tmp) / "bench.tfrecord"
        write_input(input_path, args.records)
        for n in counts:
            out_dir = Path(tmp) / f"w{n}"
            out_dir.mkdir()
            results.append(run(input_path, out_dir, args.model, n, ["--chunk-size", str(args.chunk_size), *extra]))
    print(f"{args.records} records, {cores} cores, model {args.model or 'demo'}")
    print(f"{'workers':>7} {'threads':>7} {'records/s':>10} {'tokens/s':>9} {'e2e rec/s':>10} {'command s':>9} "
          f"{'BLEU':>6}")
    for r in results:
        engine = r["engine"]  # type: ignore[index]
        bleu = (r.get("scores") or {}).get("bleu", {}).get("score")  # type: ignore[union-attr]
        print(f"{engine['workers']:>7} {engine['threads_per_worker']:>7} {r['records_per_second']:>10.1f} "
              f"{r['tokens_per_second']:>9.0f} {args.records / r['command_seconds']:>10.1f} "
              f"{r['command_seconds']:>9.1f} {bleu if bleu is not None else '-':>6}")
    for r in results:
        print("  " + str(r["cmd"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
