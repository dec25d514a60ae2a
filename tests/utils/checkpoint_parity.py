"""The training checkpoints checked against an independent numpy forward pass written from the framework's own
parameter names: fairseq, OpenNMT-py and Marian NMT ``.npz``, written by the factories of tests/utils/ (no framework
installed) in several shapes each.

A :class:`Framework` says how to write one framework's checkpoint in each shape, how to build its reference
(tests/utils/fairseq_reference.py, onmt_reference.py, marian_npz_reference.py), which ids its sources and targets
use, and which shape is also converted for OpenVINO. :func:`convert_shapes` converts every shape once;
tests/converters/conftest.py keeps the results for the session, so that the one parametrized parity suite
(tests/converters/test_checkpoint_parity.py) and each framework's own tests (test_fairseq.py, test_opennmt.py,
test_marian_npz.py: manifest, tokenizer, refusals) share the conversions. :func:`convert_each` converts the shapes
of the readers tested against transformers too (test_fsmt.py, test_marian_shapes.py).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from converters.convert import convert
from serving.engine.tokenizers import load_tokenizer
from serving.package import open_package
from tests.utils.fairseq_factory import PAD as FAIRSEQ_PAD
from tests.utils.fairseq_factory import fairseq_model, make_fairseq_dir
from tests.utils.fairseq_reference import FairseqReference
from tests.utils.marian_npz_factory import make_marian_npz_dir, marian_npz_model
from tests.utils.marian_npz_reference import MarianNpzReference
from tests.utils.onmt_factory import make_onmt_dir, onmt_model
from tests.utils.onmt_reference import OnmtReference
from tests.utils.prefix_backend import PrefixBackend

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"


class Reference(Protocol):
    """An independent numpy forward pass (float64) of one checkpoint."""

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray: ...

    def decode(self, memory: np.ndarray, mask: np.ndarray, prefix: np.ndarray) -> np.ndarray: ...

    def backend(self) -> PrefixBackend: ...


@dataclass(frozen=True)
class Ids:
    """The ids a test feeds: padding, the source's EOS, the decoder's first input."""

    pad: int
    eos: int
    start: int


@dataclass(frozen=True)
class Framework:
    """One checkpoint format under test (see the module docstring).

    Attributes:
        name: the reader's ``--format``.
        shapes: shape name -> the factory's options (``seed`` included).
        openvino_shape: the shape converted for OpenVINO too.
        make_dir: ``(path, **options)`` -> the checkpoint directory the factory wrote.
        reference: ``(options, package)`` -> the numpy reference of that checkpoint.
        ids: the framework's own ids (None: the converted package's special ids).
        first_target: random teacher-forced targets are drawn from ``[first_target, target vocabulary)``.
        bad_word: the id the decoding cases' bad-words case bans.
        source_eos: the framework's encoder sees the source's EOS (OpenNMT-py's does not).
        needs_torch: the factory writes a ``torch.save`` checkpoint.
    """

    name: str
    shapes: dict[str, dict[str, Any]]
    openvino_shape: str
    make_dir: Callable[..., Path]
    reference: Callable[[dict[str, Any], Path], Reference]
    ids: Ids | None
    first_target: int
    bad_word: int
    source_eos: bool
    needs_torch: bool

    def runtimes(self, shape: str) -> list[str]:
        """The runtimes ``shape`` was converted for."""
        return ["onnxruntime", "openvino"] if shape == self.openvino_shape else ["onnxruntime"]

    def ids_of(self, package: Path) -> Ids:
        if self.ids is not None:
            return self.ids
        special = open_package(package).manifest.special_ids
        return Ids(special.pad, special.eos, special.decoder_start)


class Converted(NamedTuple):
    """One shape: the checkpoint directory, the package converted from it, the numpy reference."""

    source: Path
    package: Path
    reference: Reference


ConvertedCheckpoints = Callable[["Framework"], dict[str, Converted]]
"""tests/converters/conftest.py's session fixture ``converted_checkpoints``: a framework -> its converted shapes."""


def _fairseq_reference(options: dict[str, Any], package: Path) -> Reference:
    opts, state = fairseq_model(**{k: v for k, v in options.items() if k != "cfg_style"})
    return FairseqReference(dict(state), opts)


ONMT_PAD, ONMT_BOS, ONMT_EOS = 1, 2, 3


def _onmt_reference(options: dict[str, Any], package: Path) -> Reference:
    opts, model, generator, _, _ = onmt_model(**options)
    return OnmtReference(model, generator, opts, ONMT_PAD, ONMT_EOS)


def _marian_npz_reference(options: dict[str, Any], package: Path) -> Reference:
    opts, tensors, _, _ = marian_npz_model(**options)
    return MarianNpzReference(tensors, opts, open_package(package).manifest.special_ids.pad)


FAIRSEQ = Framework(
    name="fairseq",
    shapes={
        "post-norm, unequal stacks, separate vocabularies": {
            "encoder_layers": 3, "decoder_layers": 1, "decoder_attention_heads": 2, "decoder_ffn_embed_dim": 24,
            "seed": 1},
        "t2t preset: pre-norm, learned positions, layernorm_embedding, unscaled, untied (cfg)": {
            "arch": "transformer_wmt_en_de_big_t2t", "encoder_normalize_before": True, "decoder_normalize_before": True,
            "encoder_learned_pos": True, "decoder_learned_pos": True, "layernorm_embedding": True,
            "no_scale_embedding": True, "share_decoder_input_output_embed": False, "activation_fn": "gelu",
            "cfg_style": True, "std": 0.5, "seed": 2},
        "shared vocabulary, pre-norm decoder without final norm, gelu_accurate": {
            "share_all_embeddings": True, "decoder_normalize_before": True, "no_decoder_final_norm": True,
            "encoder_learned_pos": True, "activation_fn": "gelu_accurate", "decoder_layers": 3,
            "decoder_attention_heads": 8, "seed": 3},
    },
    openvino_shape="t2t preset: pre-norm, learned positions, layernorm_embedding, unscaled, untied (cfg)",
    make_dir=make_fairseq_dir,
    reference=_fairseq_reference,
    ids=Ids(pad=FAIRSEQ_PAD, eos=2, start=2),  # fairseq's decoder starts from EOS
    first_target=4,
    bad_word=FAIRSEQ_PAD,
    source_eos=True,
    needs_torch=True,
)

OPENNMT = Framework(
    name="opennmt-py",
    shapes={
        "unequal depths, separate vocabularies, untied generator": {"enc_layers": 3, "dec_layers": 1, "seed": 1},
        "shared embeddings, tied generator, no attention biases, concatenated sinusoids, gelu": {
            "share_embeddings": True, "share_decoder_embeddings": True, "add_qkvbias": False,
            "position_encoding_type": "SinusoidalConcat", "pos_ffn_activation_fn": "gelu", "heads": 8, "seed": 2},
        "wide feed-forward without biases, fast_gelu": {"transformer_ff": 160, "add_ffnbias": False,
                                                        "pos_ffn_activation_fn": "fast_gelu", "dec_layers": 3,
                                                        "seed": 3},
    },
    openvino_shape="shared embeddings, tied generator, no attention biases, concatenated sinusoids, gelu",
    make_dir=make_onmt_dir,
    reference=_onmt_reference,
    ids=Ids(pad=ONMT_PAD, eos=ONMT_EOS, start=ONMT_BOS),
    first_target=4,
    bad_word=ONMT_PAD,
    source_eos=False,  # OpenNMT-py's sources have no EOS: its encoder never sees one
    needs_torch=True,
)

MARIAN_NPZ = Framework(
    name="marian-npz",
    shapes={
        "OPUS-MT post-norm, all tied, unequal depths and FFN": {
            "enc-depth": 3, "dec-depth": 1, "transformer-decoder-dim-ffn": 24, "seed": 1},
        "pre-norm + top norms, embedding norm, learned positions, untied, separate vocabularies": {
            "transformer-preprocess": "n", "transformer-postprocess": "da", "transformer-postprocess-top": "n",
            "transformer-postprocess-emb": "n", "transformer-train-position-embeddings": True,
            "tied-embeddings-all": False, "separate_vocabs": True, "transformer-ffn-activation": "relu", "seed": 2},
        "gelu, decoder tied, no output bias, SentencePiece vocabularies": {
            "tied-embeddings-all": False, "tied-embeddings": True, "output_bias": False, "spm_vocab": True,
            "transformer-ffn-activation": "gelu", "transformer-heads": 8, "dec-depth": 3, "seed": 3},
    },
    openvino_shape="pre-norm + top norms, embedding norm, learned positions, untied, separate vocabularies",
    make_dir=make_marian_npz_dir,
    reference=_marian_npz_reference,
    ids=None,
    first_target=2,
    # Marian has no padding id to ban: the "bad word" of the shared cases is <unk>, which Marian never generates.
    bad_word=1,
    source_eos=True,
    needs_torch=False,
)

FRAMEWORKS = (FAIRSEQ, OPENNMT, MARIAN_NPZ)


def convert_each(shapes: Mapping[str, dict[str, Any]], make_dir: Callable[..., Path], root: Path, openvino_shape: str,
                 *, verify_first: bool = True, **common: Any) -> dict[str, tuple[Path, Path]]:
    """shape -> (checkpoint dir, package dir): ``make_dir(dir, **common, **options)`` converted once per shape, fp32,
    for ONNX Runtime (``openvino_shape`` for OpenVINO too); the first shape's parity verified if ``verify_first``."""
    out = {}
    for i, (name, options) in enumerate(shapes.items()):
        source = make_dir(root / f"src{i}", **common, **options)
        package = root / f"pkg{i}"
        runtimes = ["onnxruntime", "openvino"] if name == openvino_shape else ["onnxruntime"]
        convert(source, package, runtimes=runtimes, precisions=["fp32"], verify=verify_first and i == 0)
        out[name] = (source, package)
    return out


def convert_shapes(framework: Framework, root: Path) -> dict[str, Converted]:
    """shape -> its checkpoint, package and reference (:func:`convert_each`)."""
    converted = convert_each(framework.shapes, framework.make_dir, root, framework.openvino_shape)
    return {name: Converted(source, package, framework.reference(framework.shapes[name], package))
            for name, (source, package) in converted.items()}


def source_ids(package: Path, ids: Ids, sentences: int = 16) -> np.ndarray:
    """The first Multi30k test sentences through the package's tokenizer, EOS-terminated, right-padded."""
    tokenizer = load_tokenizer(package, open_package(package).manifest.tokenizer.to_dict())
    with gzip.open(SOURCES, "rt", encoding="utf-8") as f:
        rows = [tokenizer.encode(line) + [ids.eos] for line in f.read().splitlines()[:sentences]]
    out = np.full((len(rows), max(map(len, rows))), ids.pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
