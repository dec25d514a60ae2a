"""SubwordTextEncoder against the hand-derived examples of tensor2tensor's encoder and round trips on real vocabs."""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

import pytest

from serving.engine.tokenizers.subword import SubwordTextEncoder, split_words, unescape_token

DATA = Path(__file__).resolve().parents[2] / "data" / "t2t"
VOCAB_8K = DATA / "vocab.translate_ende_wmt8k.8192.subwords"
VOCAB_32K = DATA / "vocab.translate_ende_wmt32k.32768.subwords"


@pytest.fixture(scope="module")
def enc8k() -> SubwordTextEncoder:
    return SubwordTextEncoder(VOCAB_8K)


@pytest.fixture(scope="module")
def enc32k() -> SubwordTextEncoder:
    return SubwordTextEncoder(VOCAB_32K)


def test_vocab_sizes(enc8k: SubwordTextEncoder, enc32k: SubwordTextEncoder) -> None:
    assert enc8k.vocab_size == 8190
    assert enc32k.vocab_size == 33708
    assert enc8k.subtokens[:3] == ("<pad>", "<EOS>", "_")


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("Hello world.", [4928, 4071, 220, 4]),
        ("Snow\u2603man", [222, 248, 5134, 615, 606, 584, 1735, 3384, 173]),
        ("snake_case\\path", [2451, 4018, 2, 1792, 914, 5134, 5134, 2, 3552, 2]),
        ("I \u2764 Tensor2Tensor!", [52, 155, 5134, 3136, 421, 522, 364, 133, 1214, 1268, 572, 541, 1214, 1268, 61, 253]),
    ],
)
def test_worked_examples_8k(enc8k: SubwordTextEncoder, text: str, ids: list[int]) -> None:
    assert enc8k.encode(text) == ids
    assert enc8k.decode(ids) == text
    # The per-word cache gives the same answer the second time.
    assert enc8k.encode(text) == ids


def test_worked_example_32k(enc32k: SubwordTextEncoder) -> None:
    assert enc32k.encode("Hello world.") == [26228, 145, 178, 3]
    assert enc32k.decode([26228, 145, 178, 3]) == "Hello world."


def test_word_tokenizer() -> None:
    assert split_words("Dude - that's so cool.") == ["Dude", " - ", "that", "'", "s", "so", "cool", "."]
    # A single space is kept as the first or the last token only.
    assert split_words(" a b ") == [" ", "a", "b", " "]
    assert split_words("") == []
    assert split_words("x\u00b2") == ["x\u00b2"]  # superscript two is category No: alphanumeric


def test_alphanumeric_rule_matches_unicodedata() -> None:
    """The regex/str.isalnum shortcut equals T2T's 'category starts with L or N' on every code point."""
    mismatches = [
        hex(i)
        for i in range(sys.maxunicode + 1)
        if chr(i).isalnum() != (unicodedata.category(chr(i))[0] in "LN")
    ]
    assert mismatches == []


def test_escapes_and_unescapes(enc8k: SubwordTextEncoder) -> None:
    assert enc8k.escape("a_b\\c") == "a\\ub\\\\c_"
    assert enc8k.escape("\u2603") == "\\9731;_"
    assert enc8k.escape("\n") == "\\10;_"
    assert unescape_token("a\\ub\\\\c_") == "a_b\\c"
    assert unescape_token("\\9731;_") == "\u2603"
    assert unescape_token("\\99999999999;_") == "\u3013"  # invalid code point


def test_decode_edge_cases(enc8k: SubwordTextEncoder) -> None:
    assert enc8k.decode([]) == ""
    assert enc8k.decode([999999, -1]) == ""
    assert enc8k.decode([0]) == "<pad>"
    assert enc8k.encode("") == []


ROUND_TRIP = [
    "Hello world.",
    "  leading and trailing spaces  ",
    "Tabs\tand\nnewlines\r\n",
    "Die Bundesregierung hat am 3. Oktober 2019 € 1.234,56 ausgegeben.",
    "Ärger über Öl: Straße, Maß, Fuß – „Anführungszeichen“ und »Guillemets«.",
    "snake_case_name and __dunder__ and trailing_",
    "C:\\Users\\name\\file.txt and \\u escapes \\123; literally",
    "Emoji: 😀👍🏽 🇩🇪 and ZWJ 👩‍💻!",
    "日本語のテキストと中文文本 and 한국어",
    "Ελληνικά, русский, עברית, العربية",
    "x² + y³ = z⁴ ½ ⅓ Ⅻ",
    "!!!???...---",
    "a",
    " ",
    "_",
    "\\",
    "URL https://example.com/a_b?c=1&d=2#frag",
    "mixed123numbers456 and 7.89e-10",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_both_vocabs(enc8k: SubwordTextEncoder, enc32k: SubwordTextEncoder, text: str) -> None:
    for enc in (enc8k, enc32k):
        ids = enc.encode(text)
        assert all(2 <= i < enc.vocab_size for i in ids)  # never PAD or EOS
        assert enc.decode(ids) == text


def test_quoted_and_unquoted_lines(tmp_path: Path) -> None:
    vocab = tmp_path / "v.subwords"
    vocab.write_text("'<pad>'\n'<EOS>'\n\"ab_\"\nc_  \n'\n'x y'\n", encoding="utf-8")
    enc = SubwordTextEncoder(vocab)
    assert enc.subtokens == ("<pad>", "<EOS>", "ab_", "c_", "", "x y")
    assert enc.encode("ab c") == [2, 3]


def test_not_utf8(tmp_path: Path) -> None:
    vocab = tmp_path / "v.subwords"
    vocab.write_bytes(b"'\xff\xfe'\n")
    with pytest.raises(ValueError, match="not a UTF-8"):
        SubwordTextEncoder(vocab)
