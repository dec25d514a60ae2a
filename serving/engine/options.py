"""A request's options: :class:`DecodeOptions`, the one options type every surface fills (``/v1`` fields, ``/v2``
and gRPC parameters, CLI flags, ``batch-score``), and :func:`check_options`, the one check of their values and of
which go together (the message names each option the way its surface does: ``Label``).

Options are checked once, when a :class:`DecodeOptions` is made (its constructor runs :func:`check_options`; each
surface makes one where a request arrives, :meth:`DecodeOptions.from_parameters`, naming the options its way), and
travel as that object: ``serving.engine.translator.Translator.search_options`` resolves them into the search's
``SearchOptions`` without checking them again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass
from numbers import Integral
from typing import Any

import numpy as np

from serving.engine.decoding import SearchOptions
from serving.engine.errors import InvalidInput
from serving.package import DecodingDefaults


def positive_int(name: str, value: object) -> int | None:
    """``value`` when it is None or an integer of at least 1: the one check of a request's integer options.

    Raises:
        InvalidInput: ``"<name> must be a positive integer, got <value>"``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _number(name: str, value: object, low: float, high: float | None, low_open: bool = True) -> float | None:
    """``value`` as a float when it is None or a finite number in the range (``low`` excluded when ``low_open``)."""
    if value is None:
        return None
    number = float(value) if not isinstance(value, bool) and isinstance(value, int | float) else math.nan
    ok = math.isfinite(number) and (number > low if low_open else number >= low) and (high is None or number <= high)
    if not ok:
        bound = f"above {low:g}" if low_open else f"at least {low:g}"
        upper = "" if high is None else f" and at most {high:g}"
        raise InvalidInput(f"{name} must be a number {bound}{upper}, got {value!r}")
    return number


def boolean(name: str, value: object) -> bool:
    """``value`` when it is a bool (JSON's true or false): the one check of a request's switches.

    Raises:
        InvalidInput: ``"<name> must be true or false, got <value>"``.
    """
    if not isinstance(value, bool | np.bool_):
        raise InvalidInput(f"{name} must be true or false, got {value!r}")
    return bool(value)


SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")
"""The options that apply to sampling only (``do_sample``)."""

OPTION_NAMES = ("beam_size", "max_length", "num_hypotheses", "min_length", "repetition_penalty",
                "no_repeat_ngram_size", "disable_unk", "do_sample", *SAMPLING_OPTIONS, "truncate", "return_scores")
"""Every option of :class:`DecodeOptions`, as each surface names it (``/v1`` fields, ``/v2`` and gRPC parameters, CLI flags)."""


@dataclass(frozen=True)
class DecodeOptions:
    """A request's decoding overrides (None: the package's default); hashable, so it is the batchers' batch key.
    ``serving.engine.translator.Translator.search_options`` resolves it into the search's options, in one place.

    Attributes:
        beam_size: beams (1: greedy search). Default: the package's; 1 when sampling. ``num_hypotheses`` widens it to
            at least that many.
        max_length: at most this many generated tokens, EOS excluded (and the target prefix).
        num_hypotheses: hypotheses per sentence, best first (beam search).
        min_length: EOS is not generated before this many tokens (after the target prefix); ``max_length`` wins
            where the two disagree.
        repetition_penalty: transformers' ``repetition_penalty`` (above 0; 1: none; above 1 discourages
            repeating a token).
        no_repeat_ngram_size: no n-gram of this size occurs twice in a translation.
        disable_unk: never generate the unknown token.
        do_sample: draw each token from the model's distribution instead of searching (beam 1). None: sample when
            any of ``temperature``, ``top_k``, ``top_p``, ``seed`` is given.
        temperature: sampling temperature (above 0; 1: the model's distribution).
        top_k: sample among the k most likely tokens.
        top_p: sample among the most likely tokens whose probability reaches top_p (nucleus sampling).
        seed: makes sampling reproducible: the same seed gives the same output, however requests are batched.
        truncate: the over-long policy: False (the default) refuses a source with more tokens than the model has
            positions (``InputTooLong``); True cuts it to them, EOS kept last, and marks its translation
            (``Translation.truncated``); see :func:`fit_sources`.
        return_scores: also each output token's log-probability (``Translation.token_scores``).

    Arguments:
        label: how the check's messages name an option (not kept): ``"parameter {!r}"`` for protocol parameters,
            ``serving.commands.options.flag_name`` for flags.

    Raises:
        InvalidInput: a value of the wrong type or out of range, or options that do not go together (named): the
            one check (:func:`check_options`), when the options are made.
    """

    beam_size: int | None = None
    max_length: int | None = None
    num_hypotheses: int | None = None
    min_length: int | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    disable_unk: bool = False
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    truncate: bool = False
    return_scores: bool = False
    label: InitVar[Label] = "{}"

    def __post_init__(self, label: Label) -> None:
        check_options({name: getattr(self, name) for name in OPTION_NAMES}, label)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any], label: Label = "parameter {!r}") -> DecodeOptions:
        """The options among ``parameters`` (Open Inference Protocol / Triton request parameters, a ``/v1`` body, CLI
        flags; other keys are not decoding options). JSON's ``4.0`` is the integer 4 for an integer option.

        Raises:
            InvalidInput: e.g. ``"parameter 'beam_size' must be a positive integer, got 0"`` (``label`` names them).
        """
        values: dict[str, Any] = {name: _integral(parameters.get(name)) for name in OPTION_NAMES}
        for switch in ("disable_unk", "truncate", "return_scores"):  # not given: off (a wrong type: the check names it)
            value = values[switch]
            values[switch] = False if value is None else bool(value) if isinstance(value, np.bool_) else value
        return cls(**values, label=label)

    def resolve(self, defaults: DecodingDefaults, eos_id: int, decoder_start_id: int,
                unk_id: int | None) -> SearchOptions:
        """The search these options ask for, the package's ``defaults`` filling what they leave unset (the one place
        options are resolved: ``Translator.search_options``).

        Raises:
            InvalidInput: ``disable_unk`` for a model without an unknown token (``unk_id`` None).
        """
        hypotheses = self.num_hypotheses or 1
        if self.sampling:
            beam_size = 1
        else:
            beam_size = max(defaults.beam_size if self.beam_size is None else self.beam_size, hypotheses)
        bad_word_ids = tuple(defaults.bad_word_ids)
        if self.disable_unk:
            if unk_id is None:
                raise InvalidInput("disable_unk: this model has no unknown token")
            bad_word_ids = (*bad_word_ids, unk_id)
        return SearchOptions(
            eos_id=eos_id,
            decoder_start_id=decoder_start_id,
            beam_size=beam_size,
            length_penalty=defaults.length_penalty,
            length_penalty_kind=defaults.length_penalty_kind,
            bad_word_ids=bad_word_ids,
            forced_eos=defaults.forced_eos or self.max_length is not None,
            early_stopping=defaults.early_stopping,
            renormalize_logits=defaults.renormalize_logits,
            num_hypotheses=hypotheses,
            min_length=self.min_length or 0,
            repetition_penalty=1.0 if self.repetition_penalty is None else float(self.repetition_penalty),
            no_repeat_ngram_size=self.no_repeat_ngram_size or 0,
            sampling=self.sampling,
            temperature=1.0 if self.temperature is None else float(self.temperature),
            top_k=self.top_k or 0,
            top_p=1.0 if self.top_p is None else float(self.top_p),
            return_scores=self.return_scores,
        )

    @property
    def sampling(self) -> bool:
        """Whether these options sample (``do_sample``, or, when it is None, a sampling option given)."""
        return sampling(self.do_sample, [getattr(self, name) for name in SAMPLING_OPTIONS])


def sampling(do_sample: object, sampling_values: Sequence[object]) -> bool:
    if do_sample is None:
        return any(value is not None for value in sampling_values)
    return bool(do_sample)


Label = str | Callable[[str], str]
"""How messages name an option: a format string (``"parameter {!r}"``) or a function of its name."""


def check_options(values: Mapping[str, Any], label: Label = "{}") -> None:
    """Check decoding option values (:data:`OPTION_NAMES`; None: not given) and their combinations: the one check of
    every surface's options. Messages name each option with ``label``.

    Raises:
        InvalidInput: a value of the wrong type or out of range, or options that do not go together.
    """
    name = label.format if isinstance(label, str) else label
    for key in ("beam_size", "max_length", "num_hypotheses", "min_length", "no_repeat_ngram_size", "top_k"):
        positive_int(name(key), values.get(key))
    _number(name("repetition_penalty"), values.get("repetition_penalty"), 0.0, None)
    _number(name("temperature"), values.get("temperature"), 0.0, None)
    _number(name("top_p"), values.get("top_p"), 0.0, 1.0)
    for switch in ("do_sample", "disable_unk", "truncate", "return_scores"):
        if values.get(switch) is not None:
            boolean(name(switch), values.get(switch))
    seed = values.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise InvalidInput(f"{name('seed')} must be an integer from 0 to 2**64 - 1, got {seed!r}")
    beam_size, hypotheses = values.get("beam_size"), values.get("num_hypotheses")
    given = [key for key in SAMPLING_OPTIONS if values.get(key) is not None]
    if values.get("do_sample") is False and given:
        raise InvalidInput(f"{name(given[0])} applies to sampling, and {name('do_sample')} is false")
    if sampling(values.get("do_sample"), [values.get(key) for key in SAMPLING_OPTIONS]):
        if beam_size is not None and beam_size > 1:
            raise InvalidInput(f"sampling draws one token at a time: {name('beam_size')} must be 1, got {beam_size}")
        if hypotheses is not None and hypotheses > 1:
            raise InvalidInput(f"{name('num_hypotheses')} above 1 needs beam search, not sampling")


def _integral(value: object) -> object:
    """JSON's ``4.0`` as the integer 4; anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
