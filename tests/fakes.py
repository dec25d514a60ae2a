"""Fakes shared by unit tests of one layer.

``EchoTranslator`` meets the ``serving.engine.Translator`` interface (``info``, ``count_tokens``, ``translate`` with
``on_step``) without a model: a sentence's translation is its words reversed and upper-cased, one "token" per word,
so tests can predict every answer. It can be slowed down (``step_delay``) to make batching, overload, deadlines and
streaming observable, and it records every batch it ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FakeModelInfo:
    name: str = "echo"
    version: str = "1"
    runtime: str = "fake"
    precision: str = "fp32"
    max_input_tokens: int = 64
    source_language: str = "en"
    target_language: str = "xx"


@dataclass(frozen=True)
class FakeTranslation:
    text: str
    input_tokens: int
    output_tokens: int
    score: float | None
    token_ids: list[int] = field(default_factory=list)


def echo(text: str) -> str:
    """What EchoTranslator answers for ``text``."""
    return " ".join(reversed(text.split())).upper()


class EchoTranslator:
    """A Translator fake; see the module docstring.

    Arguments:
        name: the model name reported in ``info``.
        step_delay: seconds slept per decoding step (one step per output word).
        max_input_tokens: the fake model's position limit (tokens = words + 1 for EOS).
        fail_on: a word that makes ``translate`` raise RuntimeError (tests engine failures).
    """

    def __init__(
        self,
        name: str = "echo",
        *,
        step_delay: float = 0.0,
        max_input_tokens: int = 64,
        fail_on: str | None = None,
    ) -> None:
        self.info = FakeModelInfo(name=name, max_input_tokens=max_input_tokens)
        self.step_delay = step_delay
        self.fail_on = fail_on
        self.batches: list[list[str]] = []
        self.options: list[Any] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) + 1 for t in texts]

    def translate(
        self, texts: Sequence[str], options: Any = None, on_step: Callable[[int, str], None] | None = None
    ) -> list[FakeTranslation]:
        with self._lock:
            self.batches.append(list(texts))
            self.options.append(options)
            self.threads.add(threading.current_thread().name)
        if self.fail_on is not None and any(self.fail_on in t.split() for t in texts):
            raise RuntimeError(f"fake runtime failure on {self.fail_on!r}")
        targets = [echo(t).split() for t in texts]
        max_length = getattr(options, "max_length", None)
        if max_length:
            targets = [words[:max_length] for words in targets]
        for step in range(max((len(w) for w in targets), default=0)):
            if self.step_delay:
                time.sleep(self.step_delay)
            if on_step is not None:
                for i, words in enumerate(targets):
                    if step < len(words):
                        on_step(i, " ".join(words[: step + 1]))
        return [
            FakeTranslation(
                text=" ".join(words),
                input_tokens=n,
                output_tokens=len(words),
                score=-0.5 * len(words),
                token_ids=list(range(len(words))),
            )
            for words, n in zip(targets, self.count_tokens(texts), strict=True)
        ]

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]
