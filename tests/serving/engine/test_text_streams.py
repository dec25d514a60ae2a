"""Incremental detokenization (``serving.engine.tokenizers.stream``): for every tokenizer kind, a sentence's ids fed one
at a time give deltas that concatenate to exactly the one-shot ``decode``, and what has been emitted after ``n`` ids
is the start of ``decode`` of the ids so far and of any longer prefix (it can no longer change); ``add`` never
detokenizes the prefix again.

- SentencePiece: the demo package's tokenizer over the 1,000 German references of the demo's test set and random id
  sequences; a byte-fallback model trained here (bytes of characters cut short, invalid bytes, special ids between
  bytes, pieces the model does not know, control pieces).
- FSMT (BPE + Moses): the fixture sentences (tests/data/fsmt/tricky.de) and 300 of the test set, random pieces made to hit
  Moses' rules (``@-@`` joins, quotes, contractions, punctuation, currency, escapes, CJK) in several languages, with
  and without transformers' clean-up; Czech (rules that read the sentence's end) comes whole at the end.
- T2T subwords: the test set and random subtokens with escapes and underscores.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from serving.engine.tokenizers import TextStream, Tokenizer, load_tokenizer, open_stream
from serving.engine.tokenizers.fsmt_bpe import FsmtBpeTokenizer
from serving.engine.tokenizers.sentencepiece_stream import has_denormalizer
from serving.engine.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from serving.engine.tokenizers.stream import WholeText
from serving.engine.tokenizers.subword import SubwordTextEncoder
from serving.package import read_manifest
from serving.server.settings import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"


def _references(lang: str = "de") -> list[str]:
    with gzip.open(ROOT / "tests" / "data" / "multi30k" / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _deltas(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """The deltas of ``ids`` fed one at a time; the last is ``finish()``'s."""
    stream = open_stream(tokenizer)
    return [*(stream.add([i]) for i in ids), stream.finish()]


def _check(tokenizer: Tokenizer, ids: Sequence[int], *, every_prefix: bool = False) -> None:
    """The deltas concatenate to ``decode(ids)``; after ``n`` ids the text emitted starts ``decode(ids[:n])`` (and,
    with ``every_prefix``, ``decode(ids[:m])`` for every ``m >= n``: it can no longer change)."""
    deltas = _deltas(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids), (ids, deltas)
    emitted = ""
    for n, delta in enumerate(deltas[:-1], start=1):
        emitted += delta
        for m in range(n, len(ids) + 1) if every_prefix else (n, len(ids)):
            assert tokenizer.decode(ids[:m]).startswith(emitted), (ids, n, m, emitted)


def _no_decode(tokenizer: Any, decode: str = "decode") -> Callable[[], None]:
    """Make ``tokenizer.<decode>`` fail while streams add ids (no whole-text detokenizing); returns the undo."""
    original = getattr(tokenizer, decode)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{decode} called while streaming")

    setattr(tokenizer, decode, refuse)
    return lambda: setattr(tokenizer, decode, original)


# ---------------------------------------------------------------------------------------------------------------
# SentencePiece


@pytest.fixture(scope="module")
def demo() -> Tokenizer:
    return load_tokenizer(DEFAULT_MODEL_DIR, read_manifest(DEFAULT_MODEL_DIR)["tokenizer"])


def test_sentencepiece_demo_test_set(demo: Tokenizer) -> None:
    references = _references()
    assert len(references) == 1000
    for line in references:
        _check(demo, demo.encode_target(line))
    rng = random.Random(0)
    for _ in range(300):
        _check(demo, [rng.randrange(8002) for _ in range(rng.randrange(12))], every_prefix=True)


def test_sentencepiece_streams_without_decoding_the_prefix(demo: Tokenizer) -> None:
    ids = [i for line in _references()[:200] for i in demo.encode_target(line)]  # one sentence of ~3,000 pieces
    assert isinstance(demo, SentencePieceTokenizer)
    processor = demo._target
    stream = open_stream(demo)
    undo = [_no_decode(demo), _no_decode(processor, "decode_pieces")]
    try:
        text = "".join(stream.add([i]) for i in ids)
    finally:
        for restore in undo:
            restore()
    assert text + stream.finish() == demo.decode(ids)


@pytest.fixture(scope="module")
def byte_fallback(tmp_path_factory: pytest.TempPathFactory) -> SentencePieceTokenizer:
    """A SentencePiece model with byte fallback and user-defined pieces; vocab.json adds pieces it does not know."""
    import sentencepiece as spm

    tmp = tmp_path_factory.mktemp("spm")
    spm.SentencePieceTrainer.train(
        input=str(DATA / "marian" / "corpus.de"), model_prefix=str(tmp / "t"), vocab_size=400, model_type="unigram",
        byte_fallback=True, character_coverage=0.98, eos_id=0, unk_id=1, bos_id=2, pad_id=-1, num_threads=1,
        minloglevel=2, user_defined_symbols=["<x>", "\u2581\u2581"])
    processor = spm.SentencePieceProcessor(model_file=str(tmp / "t.model"))
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    for extra in ("\u2581raw\u2581piece", "<0xZZ>", "foo\u2581", "<pad>"):
        vocab[extra] = len(vocab)
    (tmp / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    assert not has_denormalizer(processor.serialized_model_proto())
    return SentencePieceTokenizer(tmp / "t.model", tmp / "t.model", tmp / "vocab.json")


def test_sentencepiece_byte_fallback(byte_fallback: SentencePieceTokenizer) -> None:
    vocab = byte_fallback._vocab
    bytes_of = {b: vocab[f"<0x{b:02X}>"] for b in range(256)}
    characters = [bytes_of[b] for b in "ä€😀".encode()]
    stream = byte_fallback.stream()
    # A character is emitted as soon as its last byte is there.
    assert [stream.add([i]) for i in characters] + [stream.finish()] == ["", "ä", "", "", "€", "", "", "", "😀", ""]
    rng = random.Random(1)
    pieces = list(vocab.values())
    for _ in range(3000):
        ids: list[int] = []
        for _ in range(rng.randrange(10)):
            kind = rng.random()
            if kind < 0.4:
                ids.append(rng.choice(list(bytes_of.values())))
            elif kind < 0.6:
                start = rng.randrange(len(characters))
                ids += characters[start : start + rng.randrange(1, 5)]
            else:
                ids.append(rng.choice([*pieces, 10**6]))
        _check(byte_fallback, ids, every_prefix=True)


def test_a_tokenizer_without_a_stream_gets_its_text_at_the_end(demo: Tokenizer) -> None:
    class Plain:
        def encode(self, text: str) -> list[int]:
            return demo.encode(text)

        def encode_target(self, text: str) -> list[int]:
            return demo.encode_target(text)

        def decode(self, ids: Sequence[int]) -> str:
            return demo.decode(ids)

    stream = open_stream(Plain())
    assert isinstance(stream, WholeText) and isinstance(stream, TextStream)
    ids = demo.encode_target("Ein Mann fährt Rad.")
    assert [stream.add([i]) for i in ids] == [""] * len(ids) and stream.finish() == "Ein Mann fährt Rad."


# ---------------------------------------------------------------------------------------------------------------
# FSMT: BPE + Moses

_MOSES_PIECES = [
    "@-@</w>", "@-@", "@", "-@</w>", "'</w>", '"</w>', "&quot;</w>", "&apos;</w>", "n't</w>", "'s</w>", "s</w>",
    "(</w>", "$</w>", "€</w>", "l'</w>", "d'</w>", "„</w>", "“</w>", "”</w>", "日本</w>", "本", "語</w>", ".</w>",
    ",</w>", "?</w>", "!</w>", ":</w>", "''</w>", "``</w>", "`</w>", "&amp;", "amp;</w>", "&#124;</w>", "&lt;",
    "gt;</w>", "&</w>", "'m</w>", "'ve</w>", "'re</w>", "n</w>", "na</w>", "abc</w>", "Xy", "z</w>", "%</w>",
    ";</w>", "[</w>", "]</w>", "¿</w>", "EU:</w>", "n", "ssa</w>", "li</w>", "5</w>", " </w>", "a b</w>",
]


@pytest.fixture(scope="module")
def fsmt_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """FSMT tokenizer files (tests.utils.fsmt_factory) whose target vocabulary also has pieces that hit Moses' rules;
    returns the directory and those pieces' ids."""
    from tests.utils.fsmt_factory import write_fsmt_tokenizer

    path = tmp_path_factory.mktemp("fsmt")
    write_fsmt_tokenizer(path)
    target = json.loads((path / "vocab-tgt.json").read_text(encoding="utf-8"))
    for piece in _MOSES_PIECES:
        target.setdefault(piece, len(target))
    (path / "vocab-tgt.json").write_text(json.dumps(target, ensure_ascii=False), encoding="utf-8")
    return path, [target[piece] for piece in _MOSES_PIECES]


def _fsmt(files: tuple[Path, list[int]], lang: str, clean_up: bool) -> FsmtBpeTokenizer:
    path = files[0]
    return FsmtBpeTokenizer(path / "vocab-src.json", path / "vocab-tgt.json", path / "merges.txt", "en", lang,
                            clean_up_tokenization_spaces=clean_up)


@pytest.mark.parametrize("clean_up", [False, True])
def test_fsmt_fixtures_and_test_set(fsmt_files: tuple[Path, list[int]], clean_up: bool) -> None:
    tokenizer = _fsmt(fsmt_files, "de", clean_up)
    lines = (DATA / "fsmt" / "tricky.de").read_text(encoding="utf-8").splitlines() + _references()[:300]
    for line in lines:
        _check(tokenizer, tokenizer.encode_target(line))


@pytest.mark.parametrize("lang", ["de", "en", "fr", "it", "fi", "zh", "ko", "cs"])
@pytest.mark.parametrize("clean_up", [False, True])
def test_fsmt_random_pieces(fsmt_files: tuple[Path, list[int]], lang: str, clean_up: bool) -> None:
    tokenizer = _fsmt(fsmt_files, lang, clean_up)
    rng = random.Random(f"{lang}{clean_up}")
    size = len(tokenizer._target_encoder)
    for _ in range(250):
        ids = [rng.choice(fsmt_files[1]) if rng.random() < 0.6 else rng.choice([0, 1, 2, 3, rng.randrange(size + 2)])
               for _ in range(rng.randrange(12))]
        _check(tokenizer, ids, every_prefix=True)


def test_fsmt_streams_without_detokenizing_the_prefix(fsmt_files: tuple[Path, list[int]]) -> None:
    tokenizer = _fsmt(fsmt_files, "en", True)
    ids = [i for line in (DATA / "fsmt" / "tricky.de").read_text(encoding="utf-8").splitlines() * 40
           for i in tokenizer.encode_target(line)]
    stream = tokenizer.stream()
    undo = [_no_decode(tokenizer), _no_decode(tokenizer._detokenizer, "detokenize"),
            _no_decode(tokenizer._detokenizer, "tokenize")]
    try:
        deltas = [stream.add([i]) for i in ids]
    finally:
        for restore in undo:
            restore()
    assert sum(1 for delta in deltas if delta) > len(ids) // 4  # it streams as it goes
    assert "".join(deltas) + stream.finish() == tokenizer.decode(ids)


def test_fsmt_czech_comes_at_the_end(fsmt_files: tuple[Path, list[int]]) -> None:
    tokenizer = _fsmt(fsmt_files, "cs", False)
    ids = tokenizer.encode_target("Muž jede na kole.")
    assert _deltas(tokenizer, ids) == [""] * len(ids) + [tokenizer.decode(ids)]


# ---------------------------------------------------------------------------------------------------------------
# T2T subwords


@pytest.fixture(scope="module")
def subwords() -> Tokenizer:
    return load_tokenizer(DATA / "t2t", {"kind": "t2t_subword", "files": {"vocab": "vocab.translate_ende_wmt8k.8192.subwords"}})


def test_subword_test_set_and_random_subtokens(subwords: Tokenizer) -> None:
    lines = _references() + ["a_b \\ c 3.5 €€ ünï\u3013 x__y", "Hello, world!!  ok", "日本語テキスト x"]
    for line in lines:
        _check(subwords, subwords.encode(line))
    inner = subwords.inner  # type: ignore[attr-defined]
    assert isinstance(inner, SubwordTextEncoder)
    tricky = [i for i, s in enumerate(inner.subtokens) if "\\" in s or "_" in s or ";" in s or s.isdigit()]
    rng = random.Random(2)
    for _ in range(2000):
        ids = [rng.choice(tricky) if rng.random() < 0.5 else rng.randrange(-2, inner.vocab_size + 2)
               for _ in range(rng.randrange(10))]
        _check(subwords, ids, every_prefix=True)


def test_subword_streams_without_decoding_the_prefix(subwords: Tokenizer) -> None:
    ids = [i for line in _references()[:200] for i in subwords.encode(line)]
    stream = open_stream(subwords)
    undo = _no_decode(subwords.inner)  # type: ignore[attr-defined]
    try:
        text = "".join(stream.add([i]) for i in ids)
    finally:
        undo()
    assert text + stream.finish() == subwords.decode(ids)
