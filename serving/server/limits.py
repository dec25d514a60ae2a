"""The server's limits on a request, checked before any work (``ServingSettings``): its decoding options within
the server's maxima, its deadline, and its texts' number and size. ``TranslationService.limits`` holds them; the
HTTP and gRPC layers and the service call them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serving.engine.errors import InvalidInput, LimitExceeded
from serving.engine.options import DecodeOptions, Label
from serving.server.settings import ServingSettings


class RequestLimits:
    """A request's limits under ``settings``."""

    def __init__(self, settings: ServingSettings) -> None:
        self.settings = settings

    def options(self, values: Mapping[str, Any], label: Label = "{}") -> DecodeOptions:
        """The decoding options among ``values`` (``serving.engine.request.OPTION_NAMES``), within the server's limits.

        Arguments:
            values: a request's options by name (a ``/v1`` body, ``/v2`` or gRPC parameters); others are ignored.
            label: how messages name an option (``"parameter {!r}"`` for protocol parameters).

        Raises:
            InvalidInput: a value of the wrong type or out of range, or options that do not go together (named, with
                the limit and its setting).
        """
        s = self.settings
        for name, limit, setting in (("beam_size", s.max_beam_size, "max_beam_size"),
                                     ("num_hypotheses", s.max_beam_size, "max_beam_size"),
                                     ("max_length", s.max_output_tokens, "max_output_tokens"),
                                     ("min_length", s.max_output_tokens, "max_output_tokens")):
            value = values.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise InvalidInput(f"{name} must be an integer from 1 to {limit} ({setting}), got {value!r}")
        return DecodeOptions.from_parameters(values, label)

    def deadline(self, started: float, timeout_s: float | None) -> float:
        """Monotonic deadline: the server's request timeout, shortened (never extended) by the client's."""
        limit = self.settings.request_timeout_s
        if timeout_s is not None:
            if not timeout_s > 0:
                raise InvalidInput(f"timeout must be positive, got {timeout_s!r}")
            limit = min(limit, timeout_s)
        return started + limit

    def check_texts(self, texts: Sequence[str], subject: str = "text", work: str = "translate",
                    more: str = "; use /v1/translate/bulk for more", *, sentences: bool = True,
                    blank: bool = False) -> int:
        """Check a request's texts against the server's limits; returns their characters.

        Arguments:
            texts: the request's texts.
            subject: what the messages call them (``text[3]``).
            work: what the request does with them (``no text to translate``).
            more: the end of the too-many-sentences message (where to send more).
            sentences: each text is a sentence (its characters are limited); False: documents, whose sentences
                are checked once split.
            blank: empty or blank texts are allowed (they get an empty translation, untranslated).

        Raises:
            LimitExceeded: too many sentences, or a sentence too long in characters.
            InvalidInput: no sentence, or an empty one.
        """
        s = self.settings
        if not texts:
            raise InvalidInput(f"no {subject} to {work}")
        if len(texts) > s.max_sentences_per_request:
            raise LimitExceeded(
                f"{len(texts)} sentences in one request; the limit is {s.max_sentences_per_request} "
                f"(max_sentences_per_request{more})",
                limit="max_sentences_per_request",
            )
        total = 0
        for i, text in enumerate(texts if sentences else ()):
            if not text.strip():
                if blank:
                    continue
                raise InvalidInput(f"{subject}[{i}] is empty; nothing to {work}")
            if len(text) > s.max_chars_per_sentence:
                raise LimitExceeded(
                    f"{subject}[{i}] has {len(text)} characters; the limit is {s.max_chars_per_sentence} "
                    "(max_chars_per_sentence)",
                    limit="max_chars_per_sentence",
                )
            total += len(text)
        return total
