"""A/B of the engine's request path: two checkouts' ``Translator.translate`` on the same package and sentences (or on
the same source converted by each checkout, ``--old-package``, when the package format changed).

    .venv/bin/python benchmarks/request_path.py --old ../mtgate-main --new . --rounds 5

Each measurement is its own process (``PYTHONPATH`` = that checkout, so it imports that checkout's ``serving``),
and the two checkouts alternate within every round, so that a change in the machine's load hits both alike. A
process loads the package on ONNX Runtime (``--threads``), translates a few sentences to warm up, then times
``--passes`` passes over the first ``--sentences`` lines of Multi30k test_2016 (real tokenizer, real text: the
whole path from text to text), in calls of ``batch`` sentences, and reports its fastest pass. Configurations:
greedy at batch 1 and beam 4 at batch 16, fp32 and int8. The report gives, per configuration, the median seconds
and the fastest of each checkout over the rounds, new / old, and the generated tokens (equal: same translations).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
CONFIGS = {  # name -> (precision, beam, batch)
    "greedy b1 fp32": ("fp32", 1, 1),
    "greedy b1 int8": ("int8", 1, 1),
    "beam4 b16 fp32": ("fp32", 4, 16),
    "beam4 b16 int8": ("int8", 4, 16),
}

CHILD = """
import json, sys, time
# An editable install's import hook (scikit-build-core) would import its own checkout whatever PYTHONPATH says.
sys.meta_path[:] = [finder for finder in sys.meta_path if "ScikitBuild" not in type(finder).__name__]
try:
    from serving.engine.translator import DecodeOptions, Translator
except ImportError:  # a checkout from before serving/ was cut into rooms
    from serving.engine import DecodeOptions, Translator
import serving
package, precision, beam, batch, threads, passes = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
texts = json.loads(sys.stdin.read())
translator = Translator.load(package, runtime="onnxruntime", precision=precision, threads=threads)
options = DecodeOptions(beam_size=beam)
translator.translate(texts[:batch], options)
best, tokens = float("inf"), 0
for _ in range(passes):
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), batch):
        tokens += sum(t.output_tokens for t in translator.translate(texts[i : i + batch], options))
    best = min(best, time.perf_counter() - start)
print(json.dumps({"seconds": best, "tokens": tokens, "serving": serving.__file__}))
"""


def read_sentences(count: int) -> list[str]:
    with gzip.open(SENTENCES, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:count]


def measure(tree: Path, package: Path, config: tuple[str, int, int], texts: list[str], threads: int,
            passes: int) -> dict[str, object]:
    precision, beam, batch = config
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(package), precision, str(beam), str(batch), str(threads), str(passes)],
        input=json.dumps(texts), capture_output=True, text=True, cwd=tree, env=env, check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{tree}: {result.stderr.strip().splitlines()[-1:]}")
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    if not Path(str(report["serving"])).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: imported serving from {report['serving']}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout to compare against")
    parser.add_argument("--new", type=Path, default=ROOT, help="the checkout under test (default: this one)")
    parser.add_argument("--package", type=Path, default=ROOT / "models" / "demo-en-de", help="model package")
    parser.add_argument("--old-package", type=Path, default=None,
                        help="the old checkout's package, when the package format changed between them (default: "
                        "--package; convert the same source with each checkout)")
    parser.add_argument("--sentences", type=int, default=64, help="test_2016 sentences per pass (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="processes per checkout and configuration")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per process (its fastest counts)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.configs.split(",")]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}")
    texts = read_sentences(args.sentences)
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    packages = {"old": (args.old_package or args.package).resolve(), "new": args.package.resolve()}
    seconds: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], set[int]] = {}
    for round_ in range(args.rounds):
        for name in names:
            order = ["old", "new"] if round_ % 2 == 0 else ["new", "old"]
            for which in order:
                report = measure(trees[which], packages[which], CONFIGS[name], texts, args.threads, args.passes)
                seconds.setdefault((name, which), []).append(float(str(report["seconds"])))
                tokens.setdefault((name, which), set()).add(int(str(report["tokens"])))
        sys.stderr.write(f"round {round_ + 1} of {args.rounds} done\n")
    sys.stdout.write(f"{len(texts)} sentences a pass; per process its best of {args.passes} passes; over {args.rounds} "
                     "processes per checkout: the median and the fastest (least disturbed by other load)\n")
    sys.stdout.write(f"{'configuration':<16} {'old med':>8} {'new med':>8} {'ratio':>6} {'old min':>8} {'new min':>8} "
                     f"{'ratio':>6}  tokens\n")
    for name in names:
        old, new = seconds[(name, "old")], seconds[(name, "new")]
        med_old, med_new, min_old, min_new = statistics.median(old), statistics.median(new), min(old), min(new)
        same = tokens[(name, "old")] == tokens[(name, "new")] and len(tokens[(name, "old")]) == 1
        counted = ",".join(map(str, sorted(tokens[(name, "old")] | tokens[(name, "new")])))
        sys.stdout.write(f"{name:<16} {med_old:8.3f} {med_new:8.3f} {med_new / med_old:6.3f} {min_old:8.3f} "
                         f"{min_new:8.3f} {min_new / min_old:6.3f}  {counted}{'' if same else ' DIFFER'}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
