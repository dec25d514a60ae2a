"""The server's limits on a request, checked before any work (``ServingSettings``): its decoding options within
the server's maxima, its deadline, and its texts' number and size. ``TranslationService.limits`` holds them.

Every route (``/v1`` translate, stream, score and bulk, ``/v2`` infer, gRPC) turns what it parsed into one
:class:`Admission` with :meth:`RequestLimits.admission` (its options parsed and checked once, its deadline, its tag
and target prefix) and hands that to the service; the service checks the texts (:meth:`RequestLimits.check_texts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving.engine.errors import InvalidInput, LimitExceeded
from serving.engine.options import DecodeOptions, Label
from serving.server.settings import ServingSettings


@dataclass(frozen=True)
class Admission:
    """A request's terms, parsed and checked once where it arrived (:meth:`RequestLimits.admission`); what the
    service admits a request under.

    Attributes:
        options: its decoding options (checked once, within the server's limits).
        started: when it arrived (``time.monotonic()``).
        timeout_s: how long it may take: the server's request timeout, shortened by the client's.
        tag: an id for log lines (the request id).
        target_prefix: the start each text's translation is forced to (one per text), or None.
    """

    options: DecodeOptions
    started: float
    timeout_s: float
    tag: str = ""
    target_prefix: list[str] | None = None

    @property
    def deadline(self) -> float:
        """Monotonic deadline."""
        return self.started + self.timeout_s


class RequestLimits:
    """A request's limits under ``settings``."""

    def __init__(self, settings: ServingSettings) -> None:
        self.settings = settings

    def admission(self, values: Mapping[str, Any], started: float, timeout_s: float | None = None, *,
                  label: Label = "{}", tag: str = "", target_prefix: Sequence[str] | None = None) -> Admission:
        """A request's :class:`Admission`: its options (:meth:`options`) and deadline (:meth:`timeout`), checked
        once, with its tag and target prefix: what every route hands the service.

        Arguments:
            values: the request's options by name (a ``/v1`` body, ``/v2`` or gRPC parameters); others are ignored.
            started: when it arrived (``time.monotonic()``).
            timeout_s: the client's timeout in seconds, or None.
            label: how messages name an option (``"parameter {!r}"`` for protocol parameters).
            tag: an id for log lines.
            target_prefix: one per text, or None.

        Raises:
            InvalidInput: an option of the wrong type, out of range or beyond the server's limits, options that do
                not go together, or a timeout that is not positive.
        """
        return Admission(self.options(values, label), started, self.timeout(timeout_s), tag,
                         None if target_prefix is None else list(target_prefix))

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

    def timeout(self, timeout_s: float | None) -> float:
        """How long a request may take: the server's request timeout, shortened (never extended) by the client's.

        Raises:
            InvalidInput: a client timeout that is not positive.
        """
        limit = self.settings.request_timeout_s
        if timeout_s is not None:
            if not timeout_s > 0:
                raise InvalidInput(f"timeout must be positive, got {timeout_s!r}")
            limit = min(limit, timeout_s)
        return limit

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
