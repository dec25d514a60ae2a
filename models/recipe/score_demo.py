"""Score the demo package with mtgate's own ``batch-score`` and write the quality record its manifest carries.

For each runtime x precision of the package, ``batch-score`` translates a bundled Multi30k test set (beam 4, the
package's default) and computes sacreBLEU and chrF against the reference; then the same for paragraphs made of the
test set's consecutive sentences (groups of 4-8, ``paragraphs.py``; the references joined alike), as a
``TESTSET-paragraphs`` test set. Each row also has the mean output/input token ratio (SentencePiece pieces of the
package's tokenizer, EOS excluded) and the reference's. The rows are joined into one JSON (``--out``), which
``mtgate convert --quality`` records in the manifest (``make demo`` does this):

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

import sentencepiece as spm
from paragraphs import eval_paragraphs, join

ROOT = Path(__file__).resolve().parents[2]
TESTSETS = ROOT / "models" / "data" / "multi30k"
COMBOS = [("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "fp32"), ("openvino", "int8")]


def lines_of(text: str) -> list[str]:
    return text.removesuffix("\n").split("\n")


def read_lines(path: Path) -> list[str]:
    return lines_of(gzip.decompress(path.read_bytes()).decode("utf-8"))


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class Lengths:
    """Token counts with the package's own SentencePiece models (pieces, EOS excluded)."""

    def __init__(self, package: Path) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(package / "tokenizer" / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(package / "tokenizer" / "target.spm"))

    def ratio(self, sources: list[str], outputs: list[str]) -> float:
        """Mean over segments of output tokens / input tokens."""
        pairs = zip(self.source.encode(sources), self.target.encode(outputs), strict=True)
        return sum(len(out) / max(len(src), 1) for src, out in pairs) / len(sources)


def score(package: Path, name: str, label: str, sources: list[str], references: list[str], runtime: str,
          precision: str, work: Path, workers: int, lengths: Lengths) -> dict[str, Any]:
    source = write_lines(work / f"{name}.en", sources)
    reference = write_lines(work / f"{name}.de", references)
    output = work / f"{name}.{runtime}.{precision}.de"
    summary = work / f"{name}.{runtime}.{precision}.summary.json"
    batch_score = Path(sys.executable).with_name("batch-score")
    subprocess.run(
        [str(batch_score), str(source), "--references", str(reference), "-m", str(package), "--runtime", runtime,
         "--precision", precision, "-o", str(output), "--summary", str(summary),
         "--workers", str(workers), "--no-progress", "--restart"],
        check=True,
    )
    result = json.loads(summary.read_text(encoding="utf-8"))
    scores = result["scores"]
    return {
        "testset": f"multi30k {name} ({label})",
        "runtime": runtime,
        "precision": precision,
        "beam_size": result["engine"].get("beam_size"),
        "sentences": result["translated"],
        "bleu": scores["bleu"]["score"],
        "chrf": scores["chrf"]["score"],
        "bleu_signature": scores["bleu"]["signature"],
        "chrf_signature": scores["chrf"]["signature"],
        "length_ratio": round(lengths.ratio(sources, lines_of(output.read_text(encoding="utf-8"))), 4),
        "reference_length_ratio": round(lengths.ratio(sources, references), 4),
        "command": "batch-score",
    }


def segments(testset: str, paragraphs: bool) -> tuple[str, str, list[str], list[str], dict[str, int]]:
    """(name, label, sources, references, counts) of a bundled test set, as sentences or as its paragraphs; a
    paragraph row counts the sentences it covers and its paragraphs."""
    sources, references = read_lines(TESTSETS / f"{testset}.en.gz"), read_lines(TESTSETS / f"{testset}.de.gz")
    if not paragraphs:
        return testset, "models/data/multi30k", sources, references, {}
    joined, groups = eval_paragraphs(sources)
    label = "models/data/multi30k; 4-8 consecutive sentences joined, models/recipe/paragraphs.py"
    counts = {"sentences": groups[-1][1], "paragraphs": len(groups)}
    return f"{testset}-paragraphs", label, joined, join(references, groups), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, default=ROOT / "models" / "demo-en-de")
    parser.add_argument("--out", type=Path, required=True, help="quality JSON to write")
    parser.add_argument("--testsets", default="test_2016_flickr,test_2017_flickr")
    parser.add_argument("--paragraphs", default="test_2016_flickr", metavar="TESTSETS",
                        help="test sets also scored as paragraphs of 4-8 consecutive sentences ('' for none)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    rows = []
    lengths = Lengths(args.model)
    runs = [(t, False) for t in args.testsets.split(",") if t] + [(t, True) for t in args.paragraphs.split(",") if t]
    with tempfile.TemporaryDirectory() as tmp:
        for testset, paragraphs in runs:
            name, label, sources, references, counts = segments(testset, paragraphs)
            for runtime, precision in COMBOS:
                row = score(args.model, name, label, sources, references, runtime, precision, Path(tmp),
                            args.workers, lengths) | counts
                print(f"{name} {runtime}/{precision}: BLEU {row['bleu']:.2f} chrF {row['chrf']:.2f} "
                      f"length ratio {row['length_ratio']:.3f} (reference {row['reference_length_ratio']:.3f})")
                rows.append(row)
    tmp_out = args.out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps({"scores": rows}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp_out, args.out)


if __name__ == "__main__":
    main()
