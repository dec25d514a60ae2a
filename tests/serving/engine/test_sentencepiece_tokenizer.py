"""SentencePieceTokenizer == transformers' MarianTokenizer (encode without EOS, decode with skip_special_tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.engine.tokenizers import load_tokenizer
from serving.engine.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from serving.package import PackageError
from tests.utils.marian_factory import corpus, write_separate_tokenizer_files, write_tokenizer_files

EDGE_CASES = [
    "",
    " ",
    "A man </s>in a red shirt",
    "x<unk> y",
    "a<pad>b",
    "<unk></s><pad>",
    ">>de<< A dog runs.",
    ">>de<<",
    ">>fr<< unknown code",
    " >>de<< not at the start",
    "a>>de<<b",
    "  two  spaces  ",
    "\ttab and newline\n",
    "Äpfel, Straße ✓ 你好 🙂",
    "UPPER lower 12345 3.14",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spm")
    write_tokenizer_files(path, spm_pieces=200)
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    vocab[">>de<<"] = len(vocab)  # a language code, as multilingual opus-mt vocabularies have
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hf_tokenizer(files: Path):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    return transformers.MarianTokenizer(str(files / "source.spm"), str(files / "target.spm"), str(files / "vocab.json"))


@pytest.fixture(scope="module")
def tokenizer(files: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(files / "source.spm", files / "target.spm", files / "vocab.json")


def test_encode_matches_marian_tokenizer(hf_tokenizer, tokenizer: SentencePieceTokenizer) -> None:  # type: ignore[no-untyped-def]
    texts = corpus("en")[:150] + corpus("de")[:50] + EDGE_CASES
    for text in texts:
        expected = hf_tokenizer(text).input_ids
        assert expected[-1] == hf_tokenizer.eos_token_id
        assert tokenizer.encode(text) == expected[:-1], text


def test_encode_target_matches_marian_tokenizer_text_target(hf_tokenizer, tokenizer: SentencePieceTokenizer) -> None:  # type: ignore[no-untyped-def]
    texts = corpus("de")[:150] + corpus("en")[:30] + EDGE_CASES
    for text in texts:
        expected = hf_tokenizer(text_target=text).input_ids
        assert expected[-1] == hf_tokenizer.eos_token_id
        assert tokenizer.encode_target(text) == expected[:-1], text
    assert any(tokenizer.encode_target(t) != tokenizer.encode(t) for t in texts)  # the target model is used


def test_encode_target_with_separate_vocabularies(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    write_separate_tokenizer_files(tmp_path, spm_pieces=200, source_extra=3)
    theirs = transformers.MarianTokenizer(str(tmp_path / "source.spm"), str(tmp_path / "target.spm"),
                                          str(tmp_path / "vocab.json"), target_vocab_file=str(tmp_path /
                                                                                           "target_vocab.json"),
                                          separate_vocabs=True)
    ours = SentencePieceTokenizer(tmp_path / "source.spm", tmp_path / "target.spm", tmp_path / "vocab.json",
                                  target_vocab=tmp_path / "target_vocab.json")
    for text in corpus("de")[:100] + EDGE_CASES:
        assert ours.encode_target(text) == theirs(text_target=text).input_ids[:-1], text


def test_decode_matches_marian_tokenizer(hf_tokenizer, tokenizer: SentencePieceTokenizer) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    size = tokenizer.vocab_size
    sequences = [rng.integers(0, size + 5, rng.integers(0, 15)).tolist() for _ in range(1500)]  # some unknown ids
    sequences += [tokenizer.encode(t) for t in corpus("de")[:100]]
    for ids in sequences:
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True), ids


def test_round_trip_of_target_text(files: Path) -> None:
    # Source and target models are both trained here on their language; decode uses the target one.
    tok = SentencePieceTokenizer(files / "target.spm", files / "target.spm", files / "vocab.json")
    for line in corpus("de")[:50]:
        assert tok.decode(tok.encode(line)) == " ".join(line.split())


def test_load_tokenizer_dispatch_and_errors(files: Path, tmp_path: Path) -> None:
    entry = {"kind": "sentencepiece", "files": {"source_spm": "source.spm", "target_spm": "target.spm",
                                                "vocab": "vocab.json"}, "unk_id": 1}
    assert isinstance(load_tokenizer(files, entry), SentencePieceTokenizer)
    with pytest.raises(PackageError, match="unknown tokenizer kind 'bpe'.*sentencepiece, t2t_subword"):
        load_tokenizer(files, {"kind": "bpe", "files": {}})
    with pytest.raises(PackageError, match="no 'vocab' file"):
        load_tokenizer(files, {"kind": "sentencepiece", "files": {"source_spm": "source.spm",
                                                                  "target_spm": "target.spm"}})
    with pytest.raises(PackageError, match="missing.json: tokenizer file missing"):
        load_tokenizer(files, entry | {"files": entry["files"] | {"vocab": "missing.json"}})
    (tmp_path / "vocab.json").write_text("[1, 2]", encoding="utf-8")
    (tmp_path / "source.spm").write_bytes((files / "source.spm").read_bytes())
    (tmp_path / "target.spm").write_bytes(b"not a model")
    with pytest.raises(PackageError, match="cannot load the sentencepiece tokenizer"):
        load_tokenizer(tmp_path, entry)


def test_load_t2t_subword(tmp_path: Path) -> None:
    (tmp_path / "vocab.subwords").write_text("'<pad>'\n'<EOS>'\n'a_'\n'b_'\n", encoding="utf-8")
    tok = load_tokenizer(tmp_path, {"kind": "t2t_subword", "files": {"vocab": "vocab.subwords"}})
    assert tok.encode("a b") == [2, 3]
    assert tok.decode([2, 3]) == "a b"


@pytest.mark.parametrize("text", ["A \ud800 man", "\udfff", "ok \udcff"])
def test_text_that_is_not_unicode_is_refused_by_every_loaded_tokenizer(
    tokenizer: SentencePieceTokenizer, tmp_path: Path, text: str
) -> None:
    from serving.engine.tokenizers import InvalidText
    from serving.engine.tokenizers.subword import SubwordTextEncoder

    # SentencePiece cannot take it at all (it used to raise pybind11's RuntimeError "Unable to cast ...").
    with pytest.raises(InvalidText, match="lone surrogate U\\+D[89A-F][0-9A-F]{2} at character") as caught:
        tokenizer.encode(text)
    with pytest.raises(InvalidText, match="lone surrogate"):
        tokenizer.encode_target(text)
    assert caught.value.text == text and caught.value.about("text[3]").message.startswith("text[3] holds")
    # T2T's encoder escapes it, as T2T does; the tokenizer a package loads refuses it like SentencePiece.
    (tmp_path / "vocab.subwords").write_text("'<pad>'\n'<EOS>'\n'a_'\n'b_'\n", encoding="utf-8")
    SubwordTextEncoder(tmp_path / "vocab.subwords").encode(text)  # no error
    loaded = load_tokenizer(tmp_path, {"kind": "t2t_subword", "files": {"vocab": "vocab.subwords"}})
    with pytest.raises(InvalidText):
        loaded.encode(text)
    with pytest.raises(InvalidText):
        loaded.encode_target(text)
    assert loaded.encode("a b") == loaded.encode_target("a b") == [2, 3]
    if text.endswith("\udcff"):  # what surrogateescape makes of the byte 0xff
        assert "an undecodable byte 0xff" in str(caught.value)
