"""Score the demo package with mtgate's own ``batch-score`` and write the quality record its manifest carries.

For each runtime x precision of the package, ``batch-score`` translates a bundled Multi30k test set (beam 4, the
package's default) and computes sacreBLEU and chrF against the reference. The summaries are joined into one JSON
(``--out``), which ``mtgate convert --quality`` records in the manifest (``make demo`` does this):

    python models/recipe/score_demo.py -m models/demo-en-de --out models/demo-en-de-src/quality.json

Runs with the runtime install only (no torch).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TESTSETS = ROOT / "models" / "data" / "multi30k"
COMBOS = [("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "fp32"), ("openvino", "int8")]


def gunzip(src: Path, dst: Path) -> Path:
    dst.write_bytes(gzip.decompress(src.read_bytes()))
    return dst


def score(package: Path, testset: str, runtime: str, precision: str, work: Path, workers: int) -> dict[str, Any]:
    source = gunzip(TESTSETS / f"{testset}.en.gz", work / f"{testset}.en")
    reference = gunzip(TESTSETS / f"{testset}.de.gz", work / f"{testset}.de")
    summary = work / f"{testset}.{runtime}.{precision}.summary.json"
    batch_score = Path(sys.executable).with_name("batch-score")
    subprocess.run(
        [str(batch_score), str(source), "--references", str(reference), "-m", str(package), "--runtime", runtime,
         "--precision", precision, "-o", str(work / f"{testset}.{runtime}.{precision}.de"), "--summary", str(summary),
         "--workers", str(workers), "--no-progress", "--restart"],
        check=True,
    )
    result = json.loads(summary.read_text(encoding="utf-8"))
    scores = result["scores"]
    return {
        "testset": f"multi30k {testset} (models/data/multi30k)",
        "runtime": runtime,
        "precision": precision,
        "beam_size": result["engine"].get("beam_size"),
        "sentences": result["translated"],
        "bleu": scores["bleu"]["score"],
        "chrf": scores["chrf"]["score"],
        "bleu_signature": scores["bleu"]["signature"],
        "chrf_signature": scores["chrf"]["signature"],
        "command": "batch-score",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, default=ROOT / "models" / "demo-en-de")
    parser.add_argument("--out", type=Path, required=True, help="quality JSON to write")
    parser.add_argument("--testsets", default="test_2016_flickr,test_2017_flickr")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for testset in args.testsets.split(","):
            for runtime, precision in COMBOS:
                row = score(args.model, testset, runtime, precision, Path(tmp), args.workers)
                print(f"{testset} {runtime}/{precision}: BLEU {row['bleu']:.2f} chrF {row['chrf']:.2f}")
                rows.append(row)
    tmp_out = args.out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps({"scores": rows}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp_out, args.out)


if __name__ == "__main__":
    main()
