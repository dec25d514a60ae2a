"""fairseq checkpoint_best.pt -> package (issue 16 item 3), with no fairseq installed: what is fairseq's own.

Checkpoints are written by the test the way fairseq writes them (tests/utils/fairseq_factory.py: fairseq's
parameter names, ``args`` or fairseq >= 0.10's omegaconf ``cfg``, classes of packages that are not installed in the
pickle), in the shapes of tests/utils/checkpoint_parity.py (``FAIRSEQ``): post-norm with unequal stacks and separate
vocabularies; the pre-norm t2t preset with learned positions, ``layernorm_embedding``, unscaled embeddings and an
untied output; ``share_all_embeddings`` with a pre-norm decoder without final norm over a post-norm encoder. Their
parity with an independent numpy forward pass written from fairseq's parameter names
(tests/utils/fairseq_reference.py) is tests/converters/test_checkpoint_parity.py's; here that reference is itself
checked against transformers' FSMT (its port of fairseq) on the post-norm shape, and the manifest, the tokenizer, the
weights-only unpickling and the refusals are checked.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.base import ConversionError
from converters.convert import load_source
from converters.torch_checkpoint import Stub, load_checkpoint
from serving.engine.tokenizers import load_tokenizer
from serving.package import open_package
from tests.utils.checkpoint_parity import FAIRSEQ, Converted, ConvertedCheckpoints, source_ids
from tests.utils.fairseq_factory import PAD, dictionaries, make_fairseq_dir
from tests.utils.fairseq_reference import FairseqReference, fairseq_sinusoids
from tests.utils.fsmt_factory import merge_pair, moses_words
from tests.utils.refusals import assert_refused_at_once

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
EOS = 2
POST_NORM = "post-norm, unequal stacks, separate vocabularies"


@pytest.fixture(scope="module")
def models(converted_checkpoints: ConvertedCheckpoints) -> dict[str, Converted]:
    """shape -> (checkpoint dir, package dir, numpy reference): the session's conversions."""
    return converted_checkpoints(FAIRSEQ)


def test_reference_matches_transformers_fsmt(models: dict[str, Converted]) -> None:
    """The numpy reference is fairseq's math: on the post-norm shape it equals transformers' FSMT (its port of
    fairseq) given the same tensors under FSMT's names."""
    transformers = pytest.importorskip("transformers")
    source, package, ref = models[POST_NORM]
    assert isinstance(ref, FairseqReference)
    o = ref.o
    en, de, _ = dictionaries()
    config = transformers.FSMTConfig(
        langs=["en", "de"], src_vocab_size=len(en) + 4, tgt_vocab_size=len(de) + 4, d_model=32,
        encoder_layers=o["encoder_layers"], decoder_layers=o["decoder_layers"],
        encoder_attention_heads=o["encoder_attention_heads"], decoder_attention_heads=o["decoder_attention_heads"],
        encoder_ffn_dim=o["encoder_ffn_embed_dim"], decoder_ffn_dim=o["decoder_ffn_embed_dim"],
        max_position_embeddings=o["max_source_positions"], pad_token_id=PAD, eos_token_id=EOS)
    model = transformers.FSMTForConditionalGeneration(config).eval()
    state = {f"model.{k}": torch.from_numpy(v.astype(np.float32)) for k, v in ref.w.items()
             if not k.endswith(("version", "_float_tensor"))}
    table = torch.from_numpy(fairseq_sinusoids(o["max_source_positions"] + PAD + 1, 32, PAD).astype(np.float32))
    state |= {"model.encoder.embed_positions.weight": table, "model.decoder.embed_positions.weight": table}
    model.load_state_dict(state, strict=True)
    ids = source_ids(package, FAIRSEQ.ids_of(package), N_SENTENCES)
    mask = ids != PAD
    targets = np.random.default_rng(4).integers(4, config.tgt_vocab_size, size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = EOS
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                    decoder_input_ids=torch.from_numpy(targets), use_cache=False)
    memory = ref.encode(ids, mask)
    assert np.abs(memory - out.encoder_last_hidden_state.numpy())[mask].max() <= TOL
    np.testing.assert_allclose(ref.decode(memory, mask, targets),
                               torch.log_softmax(out.logits, dim=-1).numpy(), rtol=0, atol=TOL)


def test_manifest_records_the_model(models: dict[str, Converted]) -> None:
    manifest = open_package(models[FAIRSEQ.openvino_shape].package).manifest
    arch = manifest.architecture
    assert manifest.source_framework == "fairseq" and manifest.source["arch"] == "transformer_wmt_en_de_big_t2t"
    assert arch.encoder.pre_norm and arch.decoder.pre_norm and arch.encoder.final_norm and arch.decoder.final_norm
    assert arch.encoder.embed_norm and arch.decoder.embed_norm and not arch.shared_positions
    assert arch.embedding_scale == 1.0 and not arch.tied_output and arch.encoder.activation == "gelu"
    decoding = manifest.decoding
    assert (decoding.beam_size, decoding.max_length, decoding.bad_word_ids) == (5, 200, (PAD,))
    assert decoding.forced_eos and decoding.early_stopping
    assert manifest.special_ids.decoder_start == manifest.special_ids.eos == EOS
    shared = open_package(models["shared vocabulary, pre-norm decoder without final norm, gelu_accurate"].package)
    arch = shared.manifest.architecture
    assert arch.shared_embeddings and arch.decoder.pre_norm and not arch.decoder.final_norm
    assert not arch.encoder.pre_norm and arch.decoder.activation == "gelu_tanh" and arch.decoder.heads == 8
    assert open_package(models[POST_NORM].package).manifest.parity[
        "onnxruntime/fp32"]["passed"]


def test_tokenizer_applies_the_dictionaries_and_codes(models: dict[str, Converted]) -> None:
    """The package's tokenizer gives the ids fairseq's pipeline gives (Moses, the codes' BPE with ``@@``, the
    dictionary's ids) on 200 Multi30k sentences."""
    source, package, _ = models[POST_NORM]
    tokenizer = load_tokenizer(package, open_package(package).manifest.tokenizer.to_dict())
    symbols = ["<s>", "<pad>", "</s>", "<unk>"] + [line.rsplit(" ", 1)[0] for line in
                                                   (source / "dict.en.txt").read_text(encoding="utf-8").splitlines()]
    index = {s: i for i, s in enumerate(symbols)}
    ranks = {tuple(line.split()[:2]): i for i, line in enumerate(
        (source / "bpecodes").read_text(encoding="utf-8").splitlines())}

    def apply_bpe(word: str) -> list[str]:  # subword-nmt's apply: merge the best-ranked pair until none is left
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts = merge_pair(parts, (parts[i], parts[i + 1]))
        return [p[:-4] if p.endswith("</w>") else p + "@@" for p in parts]

    with gzip.open(ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[100:300]
    for line in lines:
        expected = [index.get(piece, 3) for word in moses_words([line], "en") for piece in apply_bpe(word)]
        assert tokenizer.encode(line) == expected, line


def test_checkpoint_code_never_runs(tmp_path: Path) -> None:
    """A pickle that would run a command when unpickled normally is read as an inert stub (``subprocess.run``), or
    refused in one line when torch blocks its module outright (``os.system``); the command never runs."""
    marker = tmp_path / "ran"

    class Run:
        def __reduce__(self) -> tuple[Any, ...]:
            return subprocess.run, (["touch", str(marker)],)

    class System:
        def __reduce__(self) -> tuple[Any, ...]:
            return os.system, (f"touch {marker}",)

    source = make_fairseq_dir(tmp_path / "src", extra_state={"payload": Run()})
    loaded = load_checkpoint(source / "checkpoint_best.pt")
    assert isinstance(loaded["extra_state"]["payload"], Stub) and not marker.exists()
    assert isinstance(loaded["args"], argparse.Namespace)
    assert load_source(source).spec.config.encoder.layers == 2 and not marker.exists()
    source = make_fairseq_dir(tmp_path / "src2", extra_state={"payload": System()})
    with pytest.raises(ConversionError) as info:
        load_source(source)
    assert str(info.value).count("\n") == 0 and "posix.system" in str(info.value) and not marker.exists()


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    source = make_fairseq_dir(tmp_path / "src", arch="lightconv_iwslt_de_en")
    with pytest.raises(ConversionError, match=r"architecture 'lightconv_iwslt_de_en' \(supported: transformer, "):
        load_source(source)


def test_unsupported_options_are_listed_at_once(tmp_path: Path) -> None:
    source = make_fairseq_dir(tmp_path / "src", adaptive_softmax_cutoff="1000,2000", activation_fn="tanh",
                              decoder_embed_dim=48, bpe="sentencepiece")
    (source / "bpecodes").unlink()
    assert_refused_at_once(source, "fairseq", [
        "adaptive_softmax_cutoff", "activation_fn 'tanh'", "decoder_embed_dim=48 differs", "bpe 'sentencepiece'",
        "missing vocab/tokenizer file(s): BPE codes"])


def test_missing_dictionary_and_format_forced(tmp_path: Path) -> None:
    source = make_fairseq_dir(tmp_path / "src")
    shutil.move(source / "dict.de.txt", tmp_path / "dict.de.txt")
    with pytest.raises(ConversionError, match=r"missing vocab/tokenizer file\(s\): dict\.de\.txt"):
        load_source(source)
    with pytest.raises(ConversionError, match="cannot convert this Marian checkpoint"):
        load_source(source, fmt="marian")  # --format forces the reader, whatever the directory holds
