"""The serving path never imports torch or transformers.

A fresh interpreter imports ``serving.engine.translator`` and ``serving.commands.translate``, loads a converted package on both
runtimes, translates (greedy, beam, streaming), scores a reference and runs ``mtgate translate``; then no module of torch or transformers
may be in ``sys.modules``. (The package is converted in this test process, which does use torch.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
package = sys.argv[1]
import serving.engine.translator, serving.commands.translate, serving.engine.reference_scoring, serving.commands.score
from serving.commands.main import main
from serving.engine.translator import DecodeOptions, Translator

partials = []
for runtime in ("onnxruntime", "openvino"):
    translator = Translator.load(package, runtime=runtime, threads=1)
    translator.translate(["A dog runs.", ""], DecodeOptions(beam_size=1), on_partial=lambda i, t: partials.append(t))
    translator.translate(["A dog runs."], DecodeOptions(beam_size=4))
    translator.score(["A dog runs."], ["Ein Hund rennt."])
code = main(["translate", "-m", package, "--threads", "1", "Two men talk."])
banned = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
sys.stderr.write(json.dumps({"code": code, "banned": banned, "partials": len(partials)}) + "\n")
"""


@pytest.fixture(scope="module")
def package(tiny_package: Path) -> Path:
    """The shared tiny package (tests/conftest.py), converted for both runtimes."""
    pytest.importorskip("openvino")
    return tiny_package


def test_translating_never_imports_torch_or_transformers(package: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(package)], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] == 0
    assert report["partials"] > 0
    assert report["banned"] == []
    assert len(result.stdout.splitlines()) == 1  # the CLI's one translation
