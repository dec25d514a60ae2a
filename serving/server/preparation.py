"""A request's texts checked against the server's limits and prepared by the model's engine (tokenized once,
length-checked once), the engine's errors reworded as the request names its texts (``text[i]``, the index in the
request, the limit's name). :meth:`serving.server.service.TranslationService.admit` calls it before admission."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from serving.engine.documents import Document, too_long
from serving.engine.errors import InputTooLong
from serving.engine.request import DecodeOptions, Prepared
from serving.engine.tokenizers.base import InvalidText
from serving.server.limits import RequestLimits
from serving.server.model_runner import ModelRunner


def _at(indexes: Sequence[int] | None, index: int) -> int:
    """A text's index in the request (``indexes``: of the texts sent to the engine, when some were left out)."""
    return index if indexes is None else indexes[index]


async def prepare(runner: ModelRunner, limits: RequestLimits, texts: Sequence[str], options: DecodeOptions,
                  documents: Sequence[Document] | None = None, target_prefix: Sequence[str] | None = None,
                  indexes: Sequence[int] | None = None) -> Prepared:
    """Check the request-size limits and have the engine prepare the texts (tokenized once, length-checked once).
    With ``documents``, ``texts`` are their sentences (:meth:`TranslationService.translate_documents` has checked the limits);
    ``indexes``: each text's index in the request, for the messages (default: its own).

    Raises:
        LimitExceeded: too many sentences, or a sentence too long in characters.
        InvalidInput: an empty sentence.
        InvalidText: a sentence that is not valid Unicode (a lone surrogate), named by its index.
        InputTooLong: a sentence with more tokens than the model has positions.
    """
    total = limits.check_texts(texts) if documents is None else sum(len(text) for text in texts)
    assert runner.translator is not None
    translator = runner.translator
    try:
        # Tokenizing is cheap but not free: keep big requests off the event loop.
        prefixes = None if target_prefix is None else list(target_prefix)
        if total <= 4096:
            return translator.prepare(list(texts), options, prefixes)
        return await asyncio.to_thread(translator.prepare, list(texts), options, prefixes)
    except InvalidText as e:  # the tokenizer does not know which text of the request it was
        where = (f"text[{_at(indexes, list(texts).index(e.text))}]" if e.text in texts
                 else f"target_prefix[{_at(indexes, list(target_prefix or []).index(e.text))}]")
        raise e.about(where) from None
    except InputTooLong as e:  # the server's wording: the index as in the request, the limit's name
        if documents is not None:
            e = too_long(e, documents)
            raise InputTooLong(f"text[{e.index}] {e}", index=e.index, tokens=e.tokens, limit=e.limit) from None
        index = _at(indexes, e.index)
        raise InputTooLong(
            f"text[{index}] is {e.tokens} tokens long; the model takes at most {e.limit} (max_input_tokens; "
            "truncate cuts it instead)", index=index, tokens=e.tokens, limit=e.limit,
        ) from None
