"""transformers FSMT -> package (issue 16 item 2): parity with FSMTForConditionalGeneration, its decoding, and the
Moses + BPE tokenizer against transformers' FSMTTokenizer.

Random FSMT models of several shapes (unequal encoder/decoder depths, heads and FFN widths; separate vocabularies,
or one shared matrix; the exact and tanh GELUs), each converted once: encoder outputs (at the source tokens: FSMT
gives padding positions the zero position row, which nothing reads) and teacher-forced decoder-step log-probs within
1e-4 of transformers. Decoding on 16 sentences (greedy, beam 4, a length penalty with forced EOS and bad words,
early stopping) equals mtgate's search driven by FSMT's own forward pass over each prefix
(tests/utils/prefix_backend.py), tokens and beam scores, and so does the package's defaults through ``Translator``,
text included. Not ``generate`` itself: in transformers 4.57, FSMT's ``generate`` feeds the decoder one token per
step and FSMT numbers positions from that input alone, so every step gets position 0 (and with ``use_cache=False``
FSMTModel builds no causal mask, as it is given no input_ids); its outputs are not what the model computes.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.decoding import search
from serving.engine.tokenizers import InvalidText, load_tokenizer
from serving.engine.tokenizers.fsmt_bpe import FsmtBpeTokenizer
from serving.engine.translator import Translator
from serving.package import open_package
from tests.utils.checkpoint_parity import convert_each
from tests.utils.decoding_parity import CASES, assert_forward_matches, package_backend, search_tokens
from tests.utils.fsmt_factory import EOS_ID, PAD_ID, make_fsmt_dir
from tests.utils.marian_factory import corpus
from tests.utils.prefix_backend import PrefixBackend
from tests.utils.refusals import assert_refused_at_once

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
MAX_LENGTH = 24

SHAPES: dict[str, dict[str, Any]] = {
    "unequal stacks, separate vocabularies": {"layers": 3, "heads": 4, "ffn": 64, "decoder_layers": 1,
                                              "decoder_heads": 2, "decoder_ffn": 24, "seed": 1},
    # Unscaled embeddings drawn large enough for peaked next-token distributions (no near-ties for float noise).
    "shared vocabulary, gelu, unscaled": {"tie_word_embeddings": True, "activation": "gelu", "init_std": 0.6,
                                          "scale_embedding": False, "layers": 3, "decoder_layers": 2,
                                          "decoder_heads": 8, "seed": 2},
    "wide decoder, gelu_new": {"layers": 1, "heads": 2, "ffn": 16, "decoder_ffn": 128, "activation": "gelu_new",
                               "seed": 3},
}
OPENVINO_SHAPE = "unequal stacks, separate vocabularies"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Any]]:
    """shape -> (checkpoint dir, package dir, the FSMT model): one conversion per shape."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fsmt")
    converted = convert_each(SHAPES, make_fsmt_dir, root, OPENVINO_SHAPE, generation={"max_length": MAX_LENGTH})
    return {name: (source, package, transformers.FSMTForConditionalGeneration.from_pretrained(source).eval())
            for name, (source, package) in converted.items()}


def _inputs(source: Path) -> np.ndarray:
    tokenizer = transformers.FSMTTokenizer.from_pretrained(source)
    return np.asarray(tokenizer(corpus("en")[:N_SENTENCES], return_tensors="np", padding=True)["input_ids"],
                      dtype=np.int64)


def test_manifest_records_the_model(models: dict[str, Any]) -> None:
    _, package, model = models["unequal stacks, separate vocabularies"]
    manifest = open_package(package).manifest
    arch, config = manifest.architecture, model.config
    assert manifest.source_framework == "fsmt"
    assert (arch.encoder.layers, arch.encoder.heads, arch.encoder.ffn_dim) == (3, 4, 64)
    assert (arch.decoder.layers, arch.decoder.heads, arch.decoder.ffn_dim) == (1, 2, 24)
    assert (arch.source_vocab_size, arch.target_vocab_size) == (config.src_vocab_size, config.tgt_vocab_size)
    assert not arch.shared_embeddings and arch.tied_output and not arch.pre_norm and arch.norm_epsilon == 1e-5
    assert manifest.special_ids.pad == PAD_ID and manifest.special_ids.eos == manifest.special_ids.decoder_start == 2
    gen = model.generation_config
    assert (manifest.decoding.beam_size, manifest.decoding.max_length) == (gen.num_beams, gen.max_length - 1)
    assert manifest.decoding.forced_eos and manifest.decoding.bad_word_ids == ()
    assert manifest.tokenizer.kind == "fsmt_bpe" and manifest.tokenizer.settings["source_lang"] == "en"
    assert manifest.parity["onnxruntime/fp32"]["passed"] and manifest.parity["inputs"]["from_tokenizer"]
    shared = open_package(models["shared vocabulary, gelu, unscaled"][1]).manifest.architecture
    assert shared.shared_embeddings and shared.embedding_scale == 1.0 and shared.decoder.heads == 8


@pytest.mark.parametrize("shape", list(SHAPES))
def test_forward_matches_transformers(models: dict[str, Any], shape: str) -> None:
    source, package, model = models[shape]
    ids = _inputs(source)
    mask = ids != PAD_ID
    rng = np.random.default_rng(5)
    targets = rng.integers(4, model.config.tgt_vocab_size, size=(N_SENTENCES, DECODER_STEPS))  # no pad inside
    targets[:, 0] = EOS_ID
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                    decoder_input_ids=torch.from_numpy(targets), use_cache=False)
    memory = out.encoder_last_hidden_state.numpy()
    log_probs = torch.log_softmax(out.logits, dim=-1).numpy()
    runtimes = ["onnxruntime", "openvino"] if shape == OPENVINO_SHAPE else ["onnxruntime"]
    assert_forward_matches(package, runtimes, ids, targets, memory, log_probs, mask, TOL)


def fsmt_backend(model: Any) -> PrefixBackend:
    """FSMT's own forward pass, over each whole prefix (no cache)."""

    def encode(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.model.encoder(input_ids=torch.from_numpy(ids),
                                       attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()

    def step(memory: np.ndarray, mask: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        # FSMTModel builds the decoder's causal mask only when it is given input_ids (their values do not matter
        # once encoder_outputs are given): without them every prefix position would see the later ones.
        placeholder = torch.ones(mask.shape, dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=placeholder, attention_mask=torch.from_numpy(mask).long(),
                           encoder_outputs=(torch.from_numpy(memory),), decoder_input_ids=torch.from_numpy(prefix),
                           use_cache=False).logits[:, -1]
        return torch.log_softmax(logits, dim=-1).numpy()

    return PrefixBackend(encode, step, PAD_ID)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_search_equals_fsmt_forward(models: dict[str, Any], shape: str, case: str) -> None:
    source, package, model = models[shape]
    ids = _inputs(source)
    expected, scores = search_tokens(fsmt_backend(model), ids, EOS_ID, EOS_ID, PAD_ID, CASES[case], MAX_LENGTH - 1)
    got, got_scores = search_tokens(package_backend(package), ids, EOS_ID, EOS_ID, PAD_ID, CASES[case],
                                    MAX_LENGTH - 1)
    assert got == expected
    np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-4)


def test_package_defaults_decode_as_fsmt(models: dict[str, Any]) -> None:
    """The package's decoding defaults (beam 4, forced EOS, 23 tokens, from generation_config.json) through the
    Translator, text in and text out, against the same search over FSMT's forward pass and FSMTTokenizer."""
    source, package, model = models["shared vocabulary, gelu, unscaled"]
    tokenizer = transformers.FSMTTokenizer.from_pretrained(source)
    texts = corpus("en")[N_SENTENCES : 2 * N_SENTENCES]
    translator = Translator.load(package, threads=1)
    results = translator.translate(texts)
    ids = np.asarray(tokenizer(texts, return_tensors="np", padding=True)["input_ids"], dtype=np.int64)
    options = translator.search_options()
    assert (options.beam_size, options.forced_eos) == (4, True)
    encoded = fsmt_backend(model)
    enc = encoded.encode(ids)
    caps = translator.max_steps((ids != PAD_ID).sum(axis=1))
    for hypothesis, result in zip(search(encoded, enc.cross_kv, enc.src_bias, caps, options), results, strict=True):
        expected = hypothesis.token_ids[: hypothesis.token_ids.index(EOS_ID)] if EOS_ID in hypothesis.token_ids \
            else hypothesis.token_ids
        assert result.token_ids == expected
        assert result.text == tokenizer.decode(expected, skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer


def _sentences(lang: str) -> list[str]:
    """400 Multi30k test_2016_flickr sentences (not the ones the BPE was learned on) and the tricky ones."""
    with gzip.open(ROOT / "models" / "data" / "multi30k" / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[:400]
    tricky = (ROOT / "tests" / "data" / "fsmt" / f"tricky.{lang}").read_text(encoding="utf-8").splitlines()
    return lines + tricky


def test_tokenizer_matches_fsmt_tokenizer(models: dict[str, Any]) -> None:
    source, package, _ = models["unequal stacks, separate vocabularies"]
    theirs = transformers.FSMTTokenizer.from_pretrained(source)
    manifest = open_package(package).manifest
    ours = load_tokenizer(package, manifest.tokenizer.to_dict())
    texts = _sentences("en")
    assert len(texts) > 400
    mismatches = [t for t in texts if ours.encode(t) != theirs(t).input_ids[:-1]]
    assert not mismatches, mismatches[:5]
    assert any(theirs.unk_token_id in theirs(t).input_ids for t in texts)  # unknown characters are covered too

    # Decoding: German ids (our target-side BPE) back to text, against FSMTTokenizer.decode.
    german = FsmtBpeTokenizer(source / "vocab-tgt.json", source / "vocab-src.json", source / "merges.txt", "de", "en")
    sentences = _sentences("de")
    ids = [german.encode(s) for s in sentences]
    decoded = [ours.decode(i) for i in ids]
    assert decoded == [theirs.decode(i, skip_special_tokens=True) for i in ids]
    assert ours.decode([EOS_ID, PAD_ID, 10**6]) == theirs.decode([EOS_ID, PAD_ID, 10**6], skip_special_tokens=True)
    with pytest.raises(InvalidText, match="lone surrogate U\\+D800"):
        ours.encode("A man \ud800 rides.")
    with pytest.raises(InvalidText, match="lone surrogate U\\+D800"):
        ours.encode_target("Ein Mann \ud800 fährt.")
    # Targets: German Moses + BPE + vocab-tgt.json, i.e. FSMTTokenizer with the target side as its source (it has no
    # target mode of its own).
    target_side = transformers.FSMTTokenizer(langs=["de", "en"], src_vocab_file=str(source / "vocab-tgt.json"),
                                             tgt_vocab_file=str(source / "vocab-src.json"),
                                             merges_file=str(source / "merges.txt"))
    mismatches = [s for s in sentences if ours.encode_target(s) != target_side(s).input_ids[:-1]]
    assert not mismatches, mismatches[:5]
    assert any(ours.encode_target(s) != ours.encode(s) for s in sentences)
    # Round trip (Moses escaping, BPE, detokenizing): every Multi30k sentence without a character the tiny vocabulary
    # lacks comes back exactly (392 of these 400).
    known = [(s, d) for s, d, i in zip(sentences[:400], decoded, ids, strict=False) if 3 not in i]
    assert len(known) > 380 and all(s == d for s, d in known), [(s, d) for s, d in known if s != d][:3]


# ---------------------------------------------------------------------------------------------------------------
# Bad input


def test_unsupported_options_are_listed_at_once(models: dict[str, Any], tmp_path: Path) -> None:
    source = shutil.copytree(models["wide decoder, gelu_new"][0], tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    config |= {"activation_function": "relu6", "langs": ["en"]}
    (source / "config.json").write_text(json.dumps(config))
    (source / "merges.txt").unlink()
    assert_refused_at_once(source, "FSMT", [
        "activation_function 'relu6'", "langs=['en']", "missing vocab/tokenizer file(s): merges.txt"])


def test_serving_without_sacremoses_says_what_to_install(models: dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An install without sacremoses (the plain install has it; a hand-made environment may not): loading an FSMT
    package then is one PackageError saying what to install."""
    from serving.package import PackageError

    package = models["wide decoder, gelu_new"][1]
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # import sacremoses -> ImportError
    with pytest.raises(PackageError) as info:
        Translator.load(package, threads=1)
    assert "needs sacremoses: pip install sacremoses" in str(info.value) and "\n" not in str(info.value)
