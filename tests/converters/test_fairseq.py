"""fairseq checkpoint_best.pt -> package (issue 16 item 3), with no fairseq installed.

Checkpoints are written by the test the way fairseq writes them (tests/utils/fairseq_factory.py: fairseq's
parameter names, ``args`` or fairseq >= 0.10's omegaconf ``cfg``, classes of packages that are not installed in the
pickle), in several shapes: post-norm with unequal stacks and separate vocabularies; the pre-norm t2t preset with
learned positions, ``layernorm_embedding``, unscaled embeddings and an untied output; ``share_all_embeddings`` with
a pre-norm decoder without final norm over a post-norm encoder. The reference is an independent numpy forward pass
written from fairseq's parameter names (tests/utils/fairseq_reference.py), itself checked against transformers'
FSMT (its port of fairseq) on the post-norm shape. Encoder outputs and teacher-forced decoder-step log-probs are
within 1e-4 of it, and mtgate's search over the ONNX graphs gives exactly its tokens and beam scores on 16
sentences: greedy, beam 4, a length penalty with forced EOS and bad words, early stopping.
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
from converters.convert import convert, load_source
from converters.torch_checkpoint import Stub, load_checkpoint
from serving.engine.backends import create_backend, empty_past
from serving.engine.tokenizers import load_tokenizer
from serving.package import open_package
from tests.utils.decoding_parity import CASES, search_tokens
from tests.utils.fairseq_factory import PAD, dictionaries, fairseq_model, make_fairseq_dir
from tests.utils.fairseq_reference import FairseqReference, fairseq_sinusoids
from tests.utils.fsmt_factory import moses_words

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
MAX_STEPS = 23
EOS = 2

SHAPES: dict[str, dict[str, Any]] = {
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
}
OPENVINO_SHAPE = "t2t preset: pre-norm, learned positions, layernorm_embedding, unscaled, untied (cfg)"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, FairseqReference]]:
    """shape -> (checkpoint dir, package dir, numpy reference): one conversion per shape."""
    root = tmp_path_factory.mktemp("fairseq")
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        source = make_fairseq_dir(root / f"src{i}", **shape)
        package = root / f"pkg{i}"
        runtimes = ["onnxruntime", "openvino"] if name == OPENVINO_SHAPE else ["onnxruntime"]
        convert(source, package, runtimes=runtimes, precisions=["fp32"], verify=i == 0)
        opts, state = fairseq_model(**{k: v for k, v in shape.items() if k != "cfg_style"})
        out[name] = (source, package, FairseqReference(dict(state), opts))
    return out


def _inputs(package: Path) -> np.ndarray:
    """16 Multi30k sentences through the package's tokenizer, EOS-terminated, right-padded."""
    manifest = open_package(package).manifest
    tokenizer = load_tokenizer(package, manifest.tokenizer.to_dict())
    with gzip.open(ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        rows = [tokenizer.encode(line) + [EOS] for line in f.read().splitlines()[:N_SENTENCES]]
    ids = np.full((len(rows), max(map(len, rows))), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids


def _backend(package: Path, runtime: str = "onnxruntime") -> Any:
    pkg = open_package(package)
    artifact = pkg.artifact(runtime, "fp32")
    return create_backend(runtime, pkg.path(artifact.encoder), pkg.path(artifact.decoder), threads=1)


def test_reference_matches_transformers_fsmt(models: dict[str, Any]) -> None:
    """The numpy reference is fairseq's math: on the post-norm shape it equals transformers' FSMT (its port of
    fairseq) given the same tensors under FSMT's names."""
    transformers = pytest.importorskip("transformers")
    source, package, ref = models["post-norm, unequal stacks, separate vocabularies"]
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
    ids = _inputs(package)
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


@pytest.mark.parametrize("shape", list(SHAPES))
def test_forward_matches_reference(models: dict[str, Any], shape: str) -> None:
    _, package, ref = models[shape]
    ids = _inputs(package)
    mask = ids != PAD
    vocab = open_package(package).manifest.architecture.target_vocab_size
    targets = np.random.default_rng(5).integers(4, vocab, size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = EOS
    memory = ref.encode(ids, mask)
    log_probs = ref.decode(memory, mask, targets)
    for runtime in ["onnxruntime", "openvino"] if shape == OPENVINO_SHAPE else ["onnxruntime"]:
        backend = _backend(package, runtime)
        enc = backend.encode(ids)
        assert np.abs(enc.memory - memory)[mask].max() <= TOL, runtime
        past = empty_past(enc.cross_kv)
        for step in range(DECODER_STEPS):
            got, past = backend.decode_step(targets[:, step : step + 1], step, past, enc.cross_kv, enc.src_bias)
            assert np.abs(got - log_probs[:, step]).max() <= TOL, (runtime, step)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_search_equals_reference(models: dict[str, Any], shape: str, case: str) -> None:
    _, package, ref = models[shape]
    ids = _inputs(package)
    expected, scores = search_tokens(ref.backend(), ids, EOS, EOS, PAD, CASES[case], MAX_STEPS)
    got, got_scores = search_tokens(_backend(package), ids, EOS, EOS, PAD, CASES[case], MAX_STEPS)
    assert got == expected
    np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-4)


def test_manifest_records_the_model(models: dict[str, Any]) -> None:
    manifest = open_package(models[OPENVINO_SHAPE][1]).manifest
    arch = manifest.architecture
    assert manifest.source_framework == "fairseq" and manifest.source["arch"] == "transformer_wmt_en_de_big_t2t"
    assert arch.encoder.pre_norm and arch.decoder.pre_norm and arch.encoder.final_norm and arch.decoder.final_norm
    assert arch.encoder.embed_norm and arch.decoder.embed_norm and not arch.shared_positions
    assert arch.embedding_scale == 1.0 and not arch.tied_output and arch.encoder.activation == "gelu"
    decoding = manifest.decoding
    assert (decoding.beam_size, decoding.max_length, decoding.bad_word_ids) == (5, 200, (PAD,))
    assert decoding.forced_eos and decoding.early_stopping
    assert manifest.special_ids.decoder_start == manifest.special_ids.eos == EOS
    shared = open_package(models["shared vocabulary, pre-norm decoder without final norm, gelu_accurate"][1])
    arch = shared.manifest.architecture
    assert arch.shared_embeddings and arch.decoder.pre_norm and not arch.decoder.final_norm
    assert not arch.encoder.pre_norm and arch.decoder.activation == "gelu_tanh" and arch.decoder.heads == 8
    assert open_package(models["post-norm, unequal stacks, separate vocabularies"][1]).manifest.parity[
        "onnxruntime/fp32"]["passed"]


def test_tokenizer_applies_the_dictionaries_and_codes(models: dict[str, Any]) -> None:
    """The package's tokenizer gives the ids fairseq's pipeline gives (Moses, the codes' BPE with ``@@``, the
    dictionary's ids) on 200 Multi30k sentences."""
    source, package, _ = models["post-norm, unequal stacks, separate vocabularies"]
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
            merged, j, pair = [], 0, (parts[i], parts[i + 1])
            while j < len(parts):
                if j < len(parts) - 1 and (parts[j], parts[j + 1]) == pair:
                    merged.append(parts[j] + parts[j + 1])
                    j += 2
                else:
                    merged.append(parts[j])
                    j += 1
            parts = merged
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
    with pytest.raises(ConversionError) as info:
        load_source(source)
    lines = str(info.value).splitlines()
    assert "cannot convert this fairseq checkpoint" in lines[0]
    for reason in ("adaptive_softmax_cutoff", "activation_fn 'tanh'", "decoder_embed_dim=48 differs",
                   "bpe 'sentencepiece'", "missing vocab/tokenizer file(s): BPE codes"):
        assert sum(reason in line for line in lines[1:]) == 1, reason
    assert len(lines) == 6


def test_missing_dictionary_and_format_forced(tmp_path: Path) -> None:
    source = make_fairseq_dir(tmp_path / "src")
    shutil.move(source / "dict.de.txt", tmp_path / "dict.de.txt")
    with pytest.raises(ConversionError, match=r"missing vocab/tokenizer file\(s\): dict\.de\.txt"):
        load_source(source)
    with pytest.raises(ConversionError, match="cannot convert this Marian checkpoint"):
        load_source(source, fmt="marian")  # --format forces the reader, whatever the directory holds
