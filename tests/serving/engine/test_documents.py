"""``serving.engine.documents``: sentence spans and the text's whitespace kept, the limits, and a document's sentences through
an engine in one prepare and one run (the fake engine; the real one behind the server:
tests/serving/server/test_documents_api.py)."""

from __future__ import annotations

import pytest

from serving.engine.documents import split_documents, split_sentences, translate_documents
from serving.engine.errors import InputTooLong, LimitExceeded
from serving.engine.request import DecodeOptions
from serving.engine.tokenizers import InvalidText
from tests.fakes import EchoTranslator, echo


def _check_spans(text: str, sentences: list[str]) -> None:
    document = split_sentences(text)
    assert document.sentences == sentences
    for start, end in document.spans:
        assert text[start:end] == text[start:end].strip() != ""
    assert document.join(document.sentences) == text  # every character between the sentences is kept


def test_sentences_and_their_spans() -> None:
    text = "Dr. Smith paid $3.5 million.  He left at 5 p.m. on Friday. Did he? Yes!"
    _check_spans(text, ["Dr. Smith paid $3.5 million.", "He left at 5 p.m. on Friday.", "Did he?", "Yes!"])
    assert split_sentences(text).spans[1] == (30, 58)


def test_abbreviations_and_decimals_do_not_end_a_sentence() -> None:
    _check_spans("Prof. Klein and Mrs. Green met Mr. Brown, e.g. at 7.30 for 2.5 hours. It rained.",
                 ["Prof. Klein and Mrs. Green met Mr. Brown, e.g. at 7.30 for 2.5 hours.", "It rained."])


def test_layout_is_reproduced() -> None:
    text = "\n  First one. Second one.\n\nA new paragraph.\r\n- a list item\n- another\t\n \n"
    _check_spans(text, ["First one.", "Second one.", "A new paragraph.", "- a list item", "- another"])
    document = split_sentences(text)
    joined = document.join([s.upper() for s in document.sentences])
    assert joined == "\n  FIRST ONE. SECOND ONE.\n\nA NEW PARAGRAPH.\r\n- A LIST ITEM\n- ANOTHER\t\n \n"


def test_a_line_break_ends_a_sentence() -> None:
    _check_spans("A heading\nThe text under it", ["A heading", "The text under it"])


def test_non_latin_punctuation() -> None:
    _check_spans("今日は晴れです。明日は雨でしょう！本当？", ["今日は晴れです。", "明日は雨でしょう！", "本当？"])
    hindi = "यह एक वाक्य है। यह दूसरा है।"
    assert split_sentences(hindi, "hi").sentences == ["यह एक वाक्य है।", "यह दूसरा है।"]


def test_whitespace_has_no_sentence() -> None:
    assert split_sentences(" \n\t ").spans == ()
    assert split_sentences("").spans == ()
    blank = split_documents(["Fine.", " \n "])[1]  # translated as its own whitespace, as mtgate translate does
    assert blank.spans == () and blank.join([]) == " \n "


def test_limits_name_their_setting() -> None:
    with pytest.raises(LimitExceeded, match=r"more than 3 sentences.*\(max_document_sentences\)") as info:
        split_documents(["One. Two.", "Three. Four."], max_sentences=(3, "max_document_sentences"))
    assert info.value.limit == "max_document_sentences"
    with pytest.raises(LimitExceeded, match=r"text\[0\] sentence 1 has 12 characters; the limit is 10"):
        split_documents(["Short. Much longer."], max_chars=10)
    with pytest.raises(InvalidText):
        split_documents(["bad \udc80 text."])


def test_a_document_is_one_prepare_and_one_run() -> None:
    engine = EchoTranslator()
    texts = ["Dr. Smith left.  He came back.\n\nThe end!", "one two"]
    documents = translate_documents(engine, texts)
    assert engine.batches == [["Dr. Smith left.", "He came back.", "The end!", "one two"]]
    assert [d.text for d in documents] == [f"{echo('Dr. Smith left.')}  {echo('He came back.')}\n\n{echo('The end!')}",
                                           echo("one two")]
    first = documents[0].sentences
    assert [(s.source, s.start, s.end) for s in first] == [("Dr. Smith left.", 0, 15), ("He came back.", 17, 30),
                                                           ("The end!", 32, 40)]
    assert [s.translation.text for s in first] == [echo(s.source) for s in first]


def test_over_long_sentences_are_refused_or_cut() -> None:
    engine = EchoTranslator(max_input_tokens=4)
    texts = ["Fine.", "Short. a b c d e f."]
    with pytest.raises(InputTooLong, match="^sentence 1 is 7 tokens long; the model takes at most 4") as info:
        translate_documents(engine, texts)
    assert (info.value.index, info.value.tokens, info.value.limit) == (1, 7, 4)
    documents = translate_documents(engine, texts, DecodeOptions(truncate=True))
    assert [d.truncated for d in documents] == [False, True]
    cut = documents[1].sentences[1].translation
    assert (cut.truncated, cut.input_tokens, cut.text) == (True, 4, "C B A")
    assert engine.batches[-1] == ["Fine.", "Short.", "a b c"]
