"""Documents: a text split into sentences, the sentences translated as one batch, the translations joined with the
text's own whitespace (``split_sentences`` of ``/v1/translate``, ``mtgate translate --split-sentences``).

:func:`split_sentences` keeps each sentence's character span (``text[start:end]``, no whitespace at either end) and
every character between them, so :meth:`Document.join` puts the translations back into the original layout: spaces,
newlines, paragraph breaks, leading and trailing whitespace. A line break always ends a sentence (as DeepL's
``split_sentences=1``): lists, headings and lines without final punctuation stay lines of their own.

The splitter is sentencex (Wikimedia, MIT): rule-based, about 300 languages (a language it lacks falls back along its
chain, ending in English rules), no dependencies, maintained, and fast (Rust: a 2,000-word text in well under a
millisecond, so it can run at admission). It is a base dependency because the server splits at serve time. pysbd,
the pure-Python alternative, has had no release since 2021 and takes about a millisecond per sentence.

Language: the package's source language when its manifest names one (``ModelInfo.source_language``), else ``en``.
A sentence still longer than the model's positions is the over-long policy's (``DecodeOptions.truncate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sentencex

from serving.engine.errors import InputTooLong, LimitExceeded
from serving.engine.request import DecodeOptions, Engine, ModelInfo, Translation
from serving.engine.tokenizers.base import check_text

DEFAULT_LANGUAGE = "en"


@dataclass(frozen=True)
class Document:
    """A text and its sentences' spans, in order.

    Attributes:
        text: the whole text.
        spans: each sentence's ``(start, end)`` character offsets; ``text[start:end]`` is the sentence, with no
            whitespace at either end; what lies between two spans (and before the first, after the last) is
            whitespace only.
    """

    text: str
    spans: tuple[tuple[int, int], ...]

    @property
    def sentences(self) -> list[str]:
        """Each sentence's text."""
        return [self.text[start:end] for start, end in self.spans]

    def join(self, translations: Sequence[str]) -> str:
        """``translations`` (one per sentence, in order) with the text's whitespace around and between them.

        Raises:
            ValueError: not one translation per sentence.
        """
        if len(translations) != len(self.spans):
            raise ValueError(f"{len(translations)} translations for {len(self.spans)} sentences")
        parts, last = [], 0
        for (start, end), translation in zip(self.spans, translations, strict=True):
            parts += [self.text[last:start], translation]
            last = end
        parts.append(self.text[last:])
        return "".join(parts)


@dataclass(frozen=True)
class SentenceTranslation:
    """One sentence of a document and its translation.

    Attributes:
        source: the sentence, ``text[start:end]``.
        start: its first character's offset in the document.
        end: the offset after its last character.
        translation: the engine's translation of it.
    """

    source: str
    start: int
    end: int
    translation: Translation


@dataclass(frozen=True)
class DocumentTranslation:
    """A translated document.

    Attributes:
        text: the sentences' translations joined with the document's whitespace (:meth:`Document.join`).
        sentences: each sentence with its translation, in order.
    """

    text: str
    sentences: list[SentenceTranslation]

    @property
    def truncated(self) -> bool:
        """Whether a sentence's source was cut to the model's positions."""
        return any(s.translation.truncated for s in self.sentences)


def split_sentences(text: str, language: str = DEFAULT_LANGUAGE) -> Document:
    """Split ``text`` into sentences (module docstring); a text of whitespace only has none."""
    spans: list[tuple[int, int]] = []
    offset = 0
    for line in text.splitlines(keepends=True):
        position = offset
        for segment in sentencex.segment(language, line):
            core = segment.strip()
            if core:
                start = position + (len(segment) - len(segment.lstrip()))
                spans.append((start, start + len(core)))
            position += len(segment)
        if position != offset + len(line):  # sentencex's segments always concatenate to their input
            raise AssertionError(f"the sentence splitter lost characters of {line!r}")
        offset += len(line)
    return Document(text, tuple(spans))


def split_documents(texts: Sequence[str], language: str = DEFAULT_LANGUAGE, *,
                    max_sentences: tuple[int, str] | None = None, max_chars: int | None = None) -> list[Document]:
    """Split every text, within the server's limits when given.

    Arguments:
        texts: the documents.
        language: their language (:func:`source_language`).
        max_sentences: most sentences of all the texts together, and the setting that says so (the server's
            ``max_document_sentences``, or ``max_queue_size`` when lower).
        max_chars: longest sentence, in characters (the server's ``max_chars_per_sentence``).

    Raises:
        InvalidText: a text that is not valid Unicode (the error holds the text; callers name it).
        LimitExceeded: more sentences than ``max_sentences``, or a sentence longer than ``max_chars``.

    A text without a sentence (empty, or whitespace only) is a document of no sentence: its translation is its own
    whitespace, as ``mtgate translate`` gives an empty line for a blank one.
    """
    documents: list[Document] = []
    total = 0
    for i, text in enumerate(texts):
        check_text(text)  # the splitter, like the tokenizers, takes Unicode only
        document = split_sentences(text, language)
        total += len(document.spans)
        if max_sentences is not None and total > max_sentences[0]:
            limit, setting = max_sentences
            raise LimitExceeded(f"the texts hold more than {limit} sentences; the limit of a request with "
                                f"split_sentences is {limit} ({setting})", limit=setting)
        for j, (start, end) in enumerate(document.spans):
            if max_chars is not None and end - start > max_chars:
                raise LimitExceeded(f"text[{i}] sentence {j} has {end - start} characters; the limit is {max_chars} "
                                    "(max_chars_per_sentence)", limit="max_chars_per_sentence")
        documents.append(document)
    return documents


def sentences_of(documents: Sequence[Document]) -> list[str]:
    """Every sentence of ``documents``, in order: what is translated, as one batch."""
    return [sentence for document in documents for sentence in document.sentences]


def locate(documents: Sequence[Document], index: int) -> tuple[int, int]:
    """``(text, sentence)``: where sentence ``index`` of :func:`sentences_of` comes from."""
    for i, document in enumerate(documents):
        if index < len(document.spans):
            return i, index
        index -= len(document.spans)
    raise IndexError(index)


def assemble(documents: Sequence[Document], translations: Sequence[Translation]) -> list[DocumentTranslation]:
    """Each document's translation from those of :func:`sentences_of`, in order.

    Raises:
        ValueError: not one translation per sentence.
    """
    if len(translations) != sum(len(d.spans) for d in documents):
        raise ValueError(f"{len(translations)} translations for {sum(len(d.spans) for d in documents)} sentences")
    results, first = [], 0
    for document in documents:
        mine = translations[first : first + len(document.spans)]
        first += len(document.spans)
        sentences = [SentenceTranslation(document.text[start:end], start, end, t)
                     for (start, end), t in zip(document.spans, mine, strict=True)]
        results.append(DocumentTranslation(document.join([t.text for t in mine]), sentences))
    return results


def source_language(info: ModelInfo | object) -> str:
    """The language to split a model's sources in: its manifest's source language, else ``en``."""
    return getattr(info, "source_language", None) or DEFAULT_LANGUAGE


def too_long(error: InputTooLong, documents: Sequence[Document]) -> InputTooLong:
    """``error`` (about sentence ``error.index`` of :func:`sentences_of`) about its text: ``index`` is the text's,
    the message names the sentence within it (callers name the text: ``text[i]``, ``line N``)."""
    text, sentence = locate(documents, error.index)
    return InputTooLong(
        f"sentence {sentence} is {error.tokens} tokens long; the model takes at most {error.limit} "
        "(max_input_tokens; truncate cuts it instead)", index=text, tokens=error.tokens, limit=error.limit)


def translate_documents(engine: Engine, texts: Sequence[str], options: DecodeOptions | None = None,
                        language: str | None = None) -> list[DocumentTranslation]:
    """Translate documents without a server: every sentence of every text in one ``prepare`` and one ``run``.

    Arguments:
        engine: a ``serving.engine.request.Engine`` (``serving.engine.translator.Translator``).
        texts: the documents.
        options: decoding options and the over-long policy, the same for every sentence.
        language: the texts' language (default: the model's source language, :func:`source_language`).

    Raises:
        InvalidInput: a text that is not valid Unicode (``InvalidText``); a blank text is a document of no sentence.
        InputTooLong: a sentence longer than the model's positions (without ``options.truncate``); ``index`` is
            its text's.
        InferenceFailed: the runtime failed.
    """
    documents = split_documents(texts, language or source_language(engine.info))
    try:
        prepared = engine.prepare(sentences_of(documents), options)
    except InputTooLong as e:
        raise too_long(e, documents) from None
    return assemble(documents, engine.run(prepared))
