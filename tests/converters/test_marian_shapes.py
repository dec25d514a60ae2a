"""Every valid MarianConfig converts and decodes as transformers does (issue 16 item 1).

Random MarianMTModels of several shapes (unequal encoder/decoder depths, heads and FFN widths; separate
vocabularies and embeddings; untied output; unscaled embeddings; the tanh and sigmoid GELUs), each converted once.
The ONNX (and, for one shape, OpenVINO) graphs give encoder outputs and teacher-forced decoder-step log-probs within
1e-4 of transformers' forward pass, and mtgate's search over them gives exactly ``generate``'s tokens (and beam
scores) on 16 corpus sentences: greedy, beam 4, a length penalty with forced EOS and bad words, early stopping; the
package's own decoding defaults (from generation_config.json) through ``Translator`` equal ``generate()`` with none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.translator import Translator
from serving.package import open_package
from tests.utils.checkpoint_parity import convert_each
from tests.utils.decoding_parity import CASES, assert_forward_matches, generate_tokens, package_backend, search_tokens
from tests.utils.marian_factory import corpus, make_marian_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
MAX_LENGTH = 20  # generation_config max_length (counts the start token)

SHAPES: dict[str, dict[str, Any]] = {
    "unequal stacks, gelu_new": {"layers": 3, "heads": 4, "ffn": 96, "decoder_layers": 1, "decoder_heads": 2,
                                 "decoder_ffn": 40, "activation": "gelu_new", "seed": 11},
    "separate vocabularies, untied, unscaled, quick_gelu": {
        "separate_vocabs": True, "source_extra": 7, "tie_word_embeddings": False, "scale_embedding": False,
        "layers": 1, "decoder_layers": 2, "heads": 2, "decoder_heads": 8, "activation": "quick_gelu", "seed": 12},
    "separate vocabularies, tied, deep decoder": {"separate_vocabs": True, "decoder_layers": 4, "decoder_ffn": 16,
                                                  "activation": "relu", "seed": 13},
}
OPENVINO_SHAPE = "unequal stacks, gelu_new"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Any]]:
    """shape -> (checkpoint dir, package dir, the MarianMTModel): one conversion per shape."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("marian-shapes")
    converted = convert_each(SHAPES, make_marian_dir, root, OPENVINO_SHAPE, verify_first=False,
                             generation={"max_length": MAX_LENGTH})
    return {name: (source, package, transformers.MarianMTModel.from_pretrained(source).eval())
            for name, (source, package) in converted.items()}


def _inputs(source: Path) -> np.ndarray:
    tokenizer = transformers.MarianTokenizer.from_pretrained(source)
    batch = tokenizer(corpus("en")[:N_SENTENCES], return_tensors="np", padding=True)
    return np.asarray(batch["input_ids"], dtype=np.int64)


def test_shapes_are_recorded(models: dict[str, Any]) -> None:
    _, package, model = models["separate vocabularies, untied, unscaled, quick_gelu"]
    arch = open_package(package).manifest.architecture
    config = model.config
    assert (arch.encoder.layers, arch.encoder.heads, arch.decoder.layers, arch.decoder.heads) == (1, 2, 2, 8)
    assert arch.encoder.activation == arch.decoder.activation == "gelu_sigmoid"
    assert not arch.shared_embeddings and not arch.tied_output and arch.embedding_scale == 1.0
    assert (arch.source_vocab_size, arch.target_vocab_size) == (config.vocab_size, config.decoder_vocab_size)
    assert arch.source_vocab_size == arch.target_vocab_size + 7
    arch = open_package(models["unequal stacks, gelu_new"][1]).manifest.architecture
    assert (arch.encoder.ffn_dim, arch.decoder.ffn_dim, arch.decoder.activation) == (96, 40, "gelu_tanh")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_forward_matches_transformers(models: dict[str, Any], shape: str) -> None:
    source, package, model = models[shape]
    ids = _inputs(source)
    mask = ids != model.config.pad_token_id
    rng = np.random.default_rng(3)
    targets = rng.integers(2, model.config.decoder_vocab_size - 1, size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        memory = model.get_encoder()(input_ids=torch.from_numpy(ids),
                                     attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
        logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                       decoder_input_ids=torch.from_numpy(targets)).logits
    log_probs = torch.log_softmax(logits, dim=-1).numpy()
    runtimes = ["onnxruntime", "openvino"] if shape == OPENVINO_SHAPE else ["onnxruntime"]
    assert_forward_matches(package, runtimes, ids, targets, memory, log_probs, None, TOL)


# transformers' beam search needs decoder_vocab_size == vocab_size (it reshapes the scores with vocab_size): that
# shape is compared greedily only.
SEARCH_CASES = [(shape, case) for shape in SHAPES for case in CASES
                if CASES[case].beam == 1 or not SHAPES[shape].get("source_extra")]


@pytest.mark.parametrize(("shape", "case"), SEARCH_CASES)
def test_search_equals_generate(models: dict[str, Any], shape: str, case: str) -> None:
    source, package, model = models[shape]
    ids = _inputs(source)
    config = model.config
    expected, scores = generate_tokens(model, ids, config.pad_token_id, config.eos_token_id, CASES[case], MAX_LENGTH)
    got, got_scores = search_tokens(package_backend(package), ids, config.decoder_start_token_id, config.eos_token_id,
                                    config.pad_token_id, CASES[case], MAX_LENGTH - 1)
    assert got == expected
    if scores is not None:
        np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-4)


def test_package_defaults_decode_as_generate(models: dict[str, Any]) -> None:
    """The package's decoding defaults (beam 4, forced EOS, pad as a bad word, from generation_config.json) through
    the Translator, text in and text out, equal ``generate()`` called with no settings at all."""
    source, package, model = models["unequal stacks, gelu_new"]
    tokenizer = transformers.MarianTokenizer.from_pretrained(source)
    texts = corpus("en")[:N_SENTENCES]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        sequences = model.generate(**batch)
    translator = Translator.load(package, threads=1)
    results = translator.translate(texts)
    eos = model.config.eos_token_id
    for row, result in zip(sequences[:, 1:].tolist(), results, strict=True):
        expected = row[: row.index(eos)] if eos in row else [t for t in row if t != model.config.pad_token_id]
        assert result.token_ids == expected
        assert result.text == tokenizer.decode(expected, skip_special_tokens=True)
