"""Session-wide artifacts: one tiny random Marian checkpoint and the model packages converted from it.

Converting a model (OpenVINO IR, parity checks) is the slow part of many tests. A module that needs *a* converted
tiny model, rather than one built with options of its own, uses these instead of converting again:

- ``tiny_marian_dir``: tests/utils/marian_factory.py's tiny checkpoint (seed 0), opus-mt layout.
- ``tiny_package``: that checkpoint converted for onnxruntime and openvino (fp32), parity verified.
- ``tiny_onnx_package``: the same checkpoint for onnxruntime only (fp32, not verified), for tests whose cost grows
  with the number of artifacts (``mtgate validate`` checks the parity of every artifact).
- ``tiny_shortlist_package``: the same checkpoint for onnxruntime (fp32 and int8, not verified) with a vocabulary
  shortlist built from the tokenizers' corpus and measured on its first 40 lines.
- ``en_de_shaped_package``: (source dir, package): a random checkpoint with opus-mt-en-de's shape (d_model 512, 2
  layers, 2000 ids) whose EOS is made likelier, converted for onnxruntime and openvino (fp32, not verified); for the
  parity tests of the converter and the decoding-feature tests of the engine.

The tiny packages are named ``tiny-marian``, version ``test``. They are shared, so they are read-only: a test that
damages, edits or deletes anything copies it into its own ``tmp_path`` first (``shutil.copytree``). Each fixture
checks at the end of the session that no file was added, removed or changed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Set before anything imports torch or transformers (here, in test modules, or in the subprocesses tests start):
# - idle OpenMP threads sleep instead of spinning. torch (transformers references, bench's peer worker) runs 2 OpenMP
#   threads; when the other core is busy, spinning made generate() some 60x slower (bench's transformers worker:
#   7 instead of 500 tokens/s) and test_marian's references 40% slower. Results are the same either way.
# - transformers would otherwise import TensorFlow (installed for batch-score) on top of torch: seconds per process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("USE_FLAX", "0")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.utils` when pytest runs without the repository root on sys.path
    sys.path.insert(0, str(ROOT))

from serving.package import file_checksums, sha256_of  # noqa: E402

PACKAGE_NAME = "tiny-marian"
PACKAGE_VERSION = "test"


def _snapshot(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path``, the manifest included."""
    sums = file_checksums(path)
    if (path / "manifest.json").is_file():
        sums["manifest.json"] = sha256_of(path / "manifest.json")
    return sums


def _unchanged(path: Path) -> Iterator[Path]:
    """Yield ``path``; afterwards fail if any file under it was added, removed or modified."""
    before = _snapshot(path)
    yield path
    after = _snapshot(path)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a test modified the shared {path} ({', '.join(changed)}): copy it into tmp_path first"


@pytest.fixture(scope="session")
def tiny_marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tiny random Marian checkpoint (d_model 32, 2 layers, seed 0) as a Hugging Face directory."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.utils.marian_factory import make_marian_dir

    yield from _unchanged(make_marian_dir(tmp_path_factory.mktemp("tiny-marian") / "src"))


def _convert(source: Path, out: Path, runtimes: list[str], verify: bool) -> Path:
    from converters.convert import convert

    convert(source, out, runtimes=runtimes, precisions=["fp32"], verify=verify, name=PACKAGE_NAME,
            version=PACKAGE_VERSION)
    return out


@pytest.fixture(scope="session")
def tiny_package(tiny_marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``tiny_marian_dir`` converted for onnxruntime and openvino, fp32, parity verified."""
    out = tmp_path_factory.mktemp("tiny-package") / "package"
    yield from _unchanged(_convert(tiny_marian_dir, out, ["onnxruntime", "openvino"], verify=True))


@pytest.fixture(scope="session")
def tiny_onnx_package(tiny_marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``tiny_marian_dir`` converted for onnxruntime only, fp32, without the parity check."""
    out = tmp_path_factory.mktemp("tiny-onnx-package") / "package"
    yield from _unchanged(_convert(tiny_marian_dir, out, ["onnxruntime"], verify=False))


@pytest.fixture(scope="session")
def tiny_shortlist_package(tiny_marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``tiny_marian_dir`` for onnxruntime, fp32 and int8, with a vocabulary shortlist (10 candidates per source
    token, the 20 most frequent target tokens) from ``tests.utils.marian_factory.corpus``, measured on its first 40
    lines."""
    from converters.convert import convert
    from converters.shortlist import ShortlistRequest
    from tests.utils.marian_factory import corpus

    data = tmp_path_factory.mktemp("shortlist-data")
    for lang in ("en", "de"):
        (data / f"train.{lang}").write_text("\n".join(corpus(lang)) + "\n", encoding="utf-8")
        (data / f"eval.{lang}").write_text("\n".join(corpus(lang)[:40]) + "\n", encoding="utf-8")
    out = tmp_path_factory.mktemp("tiny-shortlist-package") / "package"
    request = ShortlistRequest(corpus=(data / "train.en", data / "train.de"), candidates=10, frequent=20,
                               evaluation=(data / "eval.en", data / "eval.de"))
    convert(tiny_marian_dir, out, runtimes=["onnxruntime"], precisions=["fp32", "int8"], verify=False,
            name=PACKAGE_NAME, version=PACKAGE_VERSION, shortlist=request)
    yield from _unchanged(out)


EN_DE_SHAPED_EOS_BIAS = 5.0  # added to EOS's output bias: greedy and beam hypotheses of 1 to 19 tokens, not all capped


@pytest.fixture(scope="session")
def en_de_shaped_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(source dir, package dir): ``tests.utils.marian_factory.make_en_de_shaped_dir`` (2 layers, 2000 ids, seed 0)
    with ``EN_DE_SHAPED_EOS_BIAS`` added to final_logits_bias[EOS], converted for onnxruntime and openvino, fp32,
    without the parity check (the tests compare it with transformers themselves)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.utils.marian_factory import make_en_de_shaped_dir

    root = tmp_path_factory.mktemp("en-de-shaped")
    source = make_en_de_shaped_dir(root / "src", layers=2, vocab_size=2000)
    model = transformers.MarianMTModel.from_pretrained(source).eval()
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] += EN_DE_SHAPED_EOS_BIAS
    model.save_pretrained(source)
    from converters.convert import convert

    package = root / "package"
    convert(source, package, runtimes=["onnxruntime", "openvino"], precisions=["fp32"], verify=False,
            name="en-de-shaped", version=PACKAGE_VERSION)
    checks = [_unchanged(source), _unchanged(package)]
    for check in checks:
        next(check)
    yield source, package
    for check in checks:
        next(check, None)
