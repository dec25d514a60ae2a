"""The FSMT tokenizer's Moses pre-steps (sacremoses' replace-unicode-punctuation inside its punctuation normalizer, then
remove-non-printing-char) against transformers' FSMTTokenizer on text made of what those steps rewrite: fullwidth
and CJK punctuation, the two stops with their spaces, control and format characters, characters newer than Python's
Unicode tables. (tests/converters/test_fsmt.py compares whole packages on real sentences.)"""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

from serving.engine.tokenizers.fsmt_bpe import FsmtBpeTokenizer

PUNCTUATION = list("，。、”“∶：？《》）！（；１」「０３２５６９７８４～’…━〈〉【】％．")
CONTROL = ["\x00", "\x07", "\x1f", "\x7f", "\x85", "\u200b", "\u200e", "\u2028", "\ufeff", "\U000e0001"]
TEXT = list("ab.,:;!?'\"-()%~") + [" ", "  ", "\t", "\n", "\u3000", "\u00a0"]


def _newer_than_python(count: int) -> list[str]:
    """Characters the running Python counts as unassigned (Cn) that a newer Unicode assigns (the regex module's)."""
    regex = pytest.importorskip("regex")
    found = [chr(c) for c in range(0x300, 0x20000) if unicodedata.category(chr(c)) == "Cn"
             and not regex.match(r"\p{C}", chr(c))]
    return found[:count]


def test_pre_steps_match_fsmt_tokenizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a</w>": 4, "b</w>": 5, "a": 6, "ab</w>": 7}
    for name in ("vocab-src.json", "vocab-tgt.json"):
        (tmp_path / name).write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("a b</w> 5\n", encoding="utf-8")
    files = [tmp_path / "vocab-src.json", tmp_path / "vocab-tgt.json", tmp_path / "merges.txt"]
    ours = FsmtBpeTokenizer(*files, "en", "de")
    theirs = transformers.FSMTTokenizer(langs=["en", "de"], src_vocab_file=str(files[0]),
                                        tgt_vocab_file=str(files[1]), merges_file=str(files[2]))
    alphabet = PUNCTUATION + CONTROL + TEXT + _newer_than_python(20) + ["。 ", "． ", "。\u3000", "a b"]
    rng = random.Random(0)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16))) for _ in range(1000)]
    mismatches = [t for t in texts if ours.encode(t) != theirs(t).input_ids[:-1]]
    assert not mismatches, [(t, ours.pieces(t), theirs.tokenize(t)) for t in mismatches[:3]]
