"""The bundled demo model (models/demo-en-de, built from models/demo-en-de-src by `make demo`).

Its checksums verify, it translates five fixed sentences, and the paragraph they make, to the exact outputs recorded
when it was trained (beam 4, the package's default) with the fp32 artifacts of both runtimes, it is the default of
`mtgate translate`, and its manifest carries the quality the model card states.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serving.engine.translator import Translator
from serving.package import read_manifest, verify_checksums
from serving.server.settings import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[1]
QUALITY = ROOT / "models" / "demo-en-de-src" / "quality.json"

EXPECTED = {
    "A man is riding a bike.": "Ein Mann fährt Fahrrad.",
    "Two dogs are playing in the snow.": "Zwei Hunde spielen im Schnee.",
    "A little girl in a pink dress is climbing the stairs.": "Ein kleines Mädchen in einem pinkfarbenen Kleid klettert die Treppe hinauf.",
    "A group of people are standing in front of a building.": "Eine Gruppe von Menschen steht vor einem Gebäude.",
    "A woman with a red hat sells vegetables at a market.": "Eine Frau mit einem roten Hut verkauft Gemüse auf einem Markt.",
}
# The five sentences as one paragraph: translated whole (no sentence splitting), every sentence in turn.
PARAGRAPH = " ".join(EXPECTED)
PARAGRAPH_EXPECTED = (
    "Ein Mann fährt auf einem Fahrrad. Zwei Hunde spielen im Schnee. Ein kleines Mädchen in einem pinkfarbenen Kleid "
    "klettert die Treppe hoch. Eine Gruppe von Menschen steht vor einem Gebäude. Eine Frau mit einem roten Hut verkauft "
    "auf einem Markt Gemüse."
)


@pytest.fixture(scope="module")
def package() -> Path:
    if not (DEFAULT_MODEL_DIR / "manifest.json").is_file():
        pytest.fail(f"the demo package is not built ({DEFAULT_MODEL_DIR}): run `make demo` (make test does)")
    return DEFAULT_MODEL_DIR


def test_checksums_verify(package: Path) -> None:
    manifest = read_manifest(package)
    assert manifest["name"] == "demo-en-de"
    assert verify_checksums(package, manifest) == []
    assert {(a["runtime"], a["precision"]) for a in manifest["artifacts"]} == {
        (runtime, precision) for runtime in ("onnxruntime", "openvino") for precision in ("fp32", "int8")
    }


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_translates_the_fixed_sentences(package: Path, runtime: str) -> None:
    translator = Translator.load(package, runtime=runtime, precision="fp32", threads=1)
    got = [t.text for t in translator.translate(list(EXPECTED))]
    assert dict(zip(EXPECTED, got, strict=True)) == EXPECTED
    assert [t.text for t in translator.translate([PARAGRAPH])] == [PARAGRAPH_EXPECTED]


def test_is_the_default_of_mtgate_translate(package: Path) -> None:
    sentence = "A man is riding a bike."
    # EXPECTED are the fp32 translations; the default precision (auto) is int8 for the demo
    proc = subprocess.run([sys.executable, "-m", "serving.commands.main", "translate", "--threads", "1", "--precision", "fp32",
                           sentence],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == EXPECTED[sentence] + "\n"


def test_manifest_records_the_measured_quality(package: Path) -> None:
    recorded = json.loads(QUALITY.read_text(encoding="utf-8"))
    assert read_manifest(package)["quality"] == recorded
    scores = {(s["testset"].split()[1], s["runtime"], s["precision"]): s for s in recorded["scores"]}
    fp32 = scores[("test_2016_flickr", "onnxruntime", "fp32")]
    assert fp32["beam_size"] == 4 and fp32["sentences"] == 1000
    assert fp32["bleu"] >= 37.0  # the quality bar of the demo model (models/README.md)
    for runtime in ("onnxruntime", "openvino"):
        assert abs(scores[("test_2016_flickr", runtime, "int8")]["bleu"] - fp32["bleu"]) <= 1.0
    # Paragraphs (4-8 consecutive test sentences joined): the output grows with the input as for single sentences.
    paragraphs = scores[("test_2016_flickr-paragraphs", "onnxruntime", "fp32")]
    assert paragraphs["beam_size"] == 4 and (paragraphs["sentences"], paragraphs["paragraphs"]) == (997, 162)
    assert abs(paragraphs["length_ratio"] - fp32["length_ratio"]) <= 0.1
    assert paragraphs["bleu"] >= 25.0  # the published model before paragraph training: 1.75
    for runtime in ("onnxruntime", "openvino"):
        int8 = scores[("test_2016_flickr-paragraphs", runtime, "int8")]
        assert abs(int8["bleu"] - paragraphs["bleu"]) <= 1.0
