"""Do two checkouts translate alike? Every path from text to text, on the same package and sentences.

    .venv/bin/python -m benchmarks.same_translations --old ../mtgate-before --new . -m models/demo-en-de

For each checkout (its own processes, ``PYTHONPATH`` = that checkout) and each configuration (greedy and beam 4,
fp32 and int8): ``mtgate translate`` over the sentences, a real ``mtgate serve`` on loopback with request-level and
with step-level batching (every sentence its own ``/v1/translate`` request, ``--concurrency`` in flight), and
``batch-score`` (its output file). One request in flight by default: ONNX Runtime's int8 graphs quantize each step's
activations with a scale taken over the whole batch, so an int8 translation served under load depends on the
sentences it shared a batch with, from one run to the next of the same checkout (fp32 does not). Prints, per path and configuration, whether the two checkouts' outputs are byte-identical, and
exits 1 when one is not. A restructuring must leave every line ``identical``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
CONFIGS = {"greedy fp32": ("fp32", 1), "greedy int8": ("int8", 1), "beam4 fp32": ("fp32", 4), "beam4 int8": ("int8", 4)}
# The checkout's CLI whatever its layout (serving.commands.main, or serving.cli before serving/ had rooms); an
# editable install's import hook (scikit-build-core) is dropped so that PYTHONPATH decides which checkout runs.
LAUNCH = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
try:
    from serving.commands.main import main
except ImportError:
    from serving.cli import main
sys.argv[0] = "mtgate"
sys.exit(main())
"""
BATCH = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
from batch.cli import main
sys.exit(main())
"""


def _env(tree: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("MTGATE_")}, "PYTHONPATH": str(tree),
            "OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def translate_cli(tree: Path, package: Path, texts: list[str], precision: str, beam: int) -> bytes:
    proc = subprocess.run([sys.executable, "-c", LAUNCH, "translate", "-m", str(package), "--precision", precision,
                           "--beam-size", str(beam), "--threads", "2"], input="\n".join(texts) + "\n",
                          capture_output=True, text=True, env=_env(tree), cwd=tree, check=True)
    return proc.stdout.encode()


def _post(url: str, text: str, beam: int) -> str:
    body = json.dumps({"text": text, "beam_size": beam}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return str(json.loads(resp.read())["translations"][0]["text"])


def serve(tree: Path, package: Path, texts: list[str], precision: str, beam: int, batching: str,
          concurrency: int) -> bytes:
    port = _free_port()
    command = [sys.executable, "-c", LAUNCH, "serve", "-m", str(package), "--precision", precision, "--port",
               str(port), "--batching", batching, "--threads", "2"]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, env=_env(tree), cwd=tree, stdout=log, stderr=log)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    with urllib.request.urlopen(base + "/v2/health/ready", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            else:
                log.seek(0)
                raise SystemExit(f"{tree}: the server did not get ready: {log.read()[-2000:]!r}")
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                outputs = list(pool.map(lambda t: _post(base + "/v1/translate", t, beam), texts))
        finally:
            server.terminate()
            server.wait(timeout=60)
    return ("\n".join(outputs) + "\n").encode()


def batch_score(tree: Path, package: Path, source: Path, precision: str, beam: int, work: Path) -> bytes:
    out = work / f"{hashlib.sha1(str(tree).encode()).hexdigest()[:8]}-{precision}-{beam}.jsonl"
    subprocess.run([sys.executable, "-c", BATCH, str(source), "-m", str(package), "-o", str(out), "--precision",
                    precision, "--beam-size", str(beam), "--workers", "1", "--threads", "2", "--no-progress"],
                   env=_env(tree), cwd=tree, check=True, capture_output=True, text=True)
    return out.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout before")
    parser.add_argument("--new", type=Path, required=True, help="the checkout after")
    parser.add_argument("-m", "--model", type=Path, default=ROOT / "models" / "demo-en-de", help="model package")
    parser.add_argument("--sentences", type=int, default=1000, help="first N of Multi30k test_2016 (default 1000)")
    parser.add_argument("--paths", default="translate,serve-request,serve-step,batch-score",
                        help="comma-separated paths to compare")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight to a server (default 1)")
    args = parser.parse_args(argv)
    with gzip.open(SENTENCES, "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()][: args.sentences]
    paths, configs = args.paths.split(","), args.configs.split(",")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = work / "source.txt"
        source.write_text("\n".join(texts) + "\n", encoding="utf-8")
        for config in configs:
            precision, beam = CONFIGS[config]
            for path in paths:
                outputs = []
                for tree in (args.old.resolve(), args.new.resolve()):
                    if path == "translate":
                        outputs.append(translate_cli(tree, args.model, texts, precision, beam))
                    elif path.startswith("serve-"):
                        outputs.append(serve(tree, args.model, texts, precision, beam, path.removeprefix("serve-"),
                                             args.concurrency))
                    else:
                        outputs.append(batch_score(tree, args.model, source, precision, beam, work))
                same = outputs[0] == outputs[1]
                failed += not same
                digest = hashlib.sha256(outputs[1]).hexdigest()[:12]
                sys.stdout.write(f"{config:12s} {path:14s} {'identical' if same else 'DIFFERENT'} "
                                 f"({len(texts)} sentences, sha256 {digest})\n")
                sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
