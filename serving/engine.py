"""The engine: ``Translator`` turns texts into translations with a model package on one runtime.

It tokenizes (EOS appended), sorts the batch by source length, splits it into sub-batches under a budget of padded
source tokens times beams, encodes each sub-batch once, decodes it (``serving.decoding``), detokenizes, and returns
the results in input order. It knows nothing of HTTP; the server and ``batch-score`` call it from one worker thread.

Output length (``DecodeOptions.max_length`` and the package's decoding defaults):

- no override: the package's cap on generated tokens *including* EOS -- ``decoding.max_length`` (HF: the checkpoint's
  ``max_length - 1``), or, when ``decoding.extra_length`` is set (tensor2tensor), ``source tokens incl. EOS +
  extra_length`` per sentence (T2T uses the padded length of its own batch; per sentence keeps a result independent
  of how requests were batched), bounded by ``decoding.max_length``; ``decoding.forced_eos`` as configured.
- ``max_length=N``: at most N tokens *excluding* EOS: the cap is N + 1 and EOS is forced at that last step, so the
  output always ends properly.
- always bounded by the model's position table (``max_positions``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.backends import Backend, BackendUnavailable, EncoderOutput, create_backend
from serving.decoding import Hypothesis, SearchOptions, search
from serving.errors import InferenceFailed, InputTooLong, InvalidInput, ServingError
from serving.package import MASK_VALUE, DecodingDefaults, PackageError, open_package
from serving.tokenizers import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

OnStep = Callable[[int, str], None]
"""``on_step(index, partial_text)``: text ``index`` of the request now reads ``partial_text``."""

DEFAULT_MAX_BATCH_TOKENS = 4096
ENCODER_CALL_COST = 16
"""The fixed cost of one encoder call, in padded source tokens (see :func:`encoder_groups`)."""


@dataclass(frozen=True)
class DecodeOptions:
    """Per-request decoding overrides (None: the package's default).

    Attributes:
        beam_size: beams (1: greedy search).
        max_length: at most this many generated tokens, EOS excluded.
    """

    beam_size: int | None = None
    max_length: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is.

    Attributes:
        name: package name.
        version: package version.
        runtime: ``onnxruntime`` or ``openvino``.
        precision: ``fp32`` or ``int8``.
        source_framework: where the checkpoint came from (``marian``, ``t2t``).
        max_input_tokens: the longest accepted source, in tokens including EOS (the model's positions).
        decoding: the package's decoding defaults.
        source_vocab_size: source vocabulary size.
        target_vocab_size: target vocabulary size.
    """

    name: str
    version: str
    runtime: str
    precision: str
    source_framework: str
    max_input_tokens: int
    decoding: DecodingDefaults
    source_vocab_size: int
    target_vocab_size: int


@dataclass(frozen=True)
class Translation:
    """One translated text.

    Attributes:
        text: the translation.
        input_tokens: source tokens, EOS included.
        output_tokens: generated tokens, EOS excluded (``len(token_ids)``).
        score: length-normalized log-probability of the hypothesis (see ``serving.decoding.Hypothesis``).
        token_ids: generated ids, EOS excluded.
    """

    text: str
    input_tokens: int
    output_tokens: int
    score: float | None
    token_ids: list[int]


@dataclass(frozen=True)
class TokenIds:
    """The token ids with a fixed meaning (the manifest's ``special_ids``)."""

    pad: int
    eos: int
    decoder_start: int


class Translator:
    """Texts in, translations out, on one backend.

    Build it with :meth:`load` from a package directory; the constructor takes ready parts (tests use it with other
    backends).

    Arguments:
        backend: runs the encoder and decoder-step graphs.
        tokenizer: the package's tokenizer.
        info: model description (``info.decoding`` gives the decoding defaults).
        ids: pad, EOS and decoder start ids.
        max_batch_tokens: budget of one sub-batch: sentences x beams x padded source length.
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        info: ModelInfo,
        ids: TokenIds,
        *,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.info = info
        self.ids = ids
        self.max_batch_tokens = max_batch_tokens

    @classmethod
    def load(
        cls,
        package_dir: str | Path,
        runtime: str = "onnxruntime",
        precision: str = "fp32",
        threads: int | None = None,
        *,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ) -> Translator:
        """Load a model package (format and every checksum verified) on a runtime.

        Arguments:
            package_dir: the package directory.
            runtime: ``onnxruntime`` or ``openvino``.
            precision: ``fp32`` or ``int8``.
            threads: intra-op threads of the runtime (None: its default).
            max_batch_tokens: sub-batch budget (sentences x beams x padded source length).

        Returns:
            A ready Translator.

        Raises:
            PackageError: not a package, unknown format, an invalid manifest (a path outside the package, an id
                outside the vocabulary, ...), a file missing, modified or not in the checksum list, no such artifact,
                an unusable tokenizer, a graph the runtime cannot load, or the runtime is not installed.
        """
        package = open_package(package_dir)
        manifest, artifact = package.manifest, package.artifact(runtime, precision)
        ids = TokenIds(pad=manifest.special_ids.pad, eos=manifest.special_ids.eos,
                       decoder_start=manifest.special_ids.decoder_start)
        architecture = manifest.architecture
        info = ModelInfo(
            name=manifest.name or package.root.name,
            version=manifest.version or "",
            runtime=runtime,
            precision=precision,
            source_framework=manifest.source_framework,
            max_input_tokens=architecture.max_positions,
            decoding=manifest.decoding,
            source_vocab_size=architecture.source_vocab_size,
            target_vocab_size=architecture.target_vocab_size,
        )
        tokenizer = load_tokenizer(package.root, manifest.tokenizer.to_dict())
        try:
            backend = create_backend(runtime, package.path(artifact.encoder), package.path(artifact.decoder), threads,
                                     reuse_buffers=True)
        except BackendUnavailable as e:
            raise PackageError(str(e)) from e
        logger.info("loaded %s %s (%s/%s) from %s", info.name, info.version, runtime, precision, package.root)
        return cls(backend, tokenizer, info, ids, max_batch_tokens=max_batch_tokens)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids of each text, EOS appended."""
        eos = self.ids.eos
        return [[*self.tokenizer.encode(text), eos] for text in texts]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Source tokens of each text, EOS included."""
        return [len(ids) for ids in self.encode(texts)]

    def search_options(self, options: DecodeOptions | None = None) -> SearchOptions:
        """The search options a request resolves to (defaults overridden by ``options``).

        Raises:
            InvalidInput: a beam size or max length below 1.
        """
        options = options or DecodeOptions()
        defaults = self.info.decoding
        beam_size = defaults.beam_size if options.beam_size is None else int(options.beam_size)
        if beam_size < 1:
            raise InvalidInput(f"beam_size must be at least 1, got {beam_size}")
        if options.max_length is not None and options.max_length < 1:
            raise InvalidInput(f"max_length must be at least 1, got {options.max_length}")
        return SearchOptions(
            eos_id=self.ids.eos,
            decoder_start_id=self.ids.decoder_start,
            beam_size=beam_size,
            length_penalty=defaults.length_penalty,
            length_penalty_kind=defaults.length_penalty_kind,
            bad_word_ids=tuple(defaults.bad_word_ids),
            forced_eos=defaults.forced_eos or options.max_length is not None,
            early_stopping=defaults.early_stopping,
            renormalize_logits=defaults.renormalize_logits,
        )

    def max_steps(self, source_lengths: np.ndarray, options: DecodeOptions | None = None) -> np.ndarray:
        """Per-sentence cap on generated tokens, EOS included (module docstring)."""
        options = options or DecodeOptions()
        defaults = self.info.decoding
        if options.max_length is not None:
            caps = np.full(source_lengths.shape, int(options.max_length) + 1, dtype=np.int64)
        elif defaults.extra_length is not None:
            caps = np.minimum(source_lengths + int(defaults.extra_length), int(defaults.max_length))
        else:
            caps = np.full(source_lengths.shape, int(defaults.max_length), dtype=np.int64)
        return np.clip(caps, 1, self.info.max_input_tokens).astype(np.int64)

    def translate(
        self, texts: Sequence[str], options: DecodeOptions | None = None, on_step: OnStep | None = None
    ) -> list[Translation]:
        """Translate texts (any number; sub-batched internally).

        Arguments:
            texts: source texts; an empty text is translated as a source of just EOS.
            options: beam size / max length overrides.
            on_step: streaming hook ``on_step(index, partial_text)``, called when a text's partial translation
                changes: after every step with greedy search, once when the sentence is done with beam search.

        Returns:
            One :class:`Translation` per text, in input order.

        Raises:
            InputTooLong: a text has more tokens than the model has positions (nothing is translated).
            InvalidInput: bad options.
            InferenceFailed: the runtime failed.
        """
        search_options = self.search_options(options)
        sources = self.encode(texts)
        lengths = np.array([len(s) for s in sources], dtype=np.int64)
        self.check_lengths(lengths)
        caps = self.max_steps(lengths, options)
        results: list[Translation | None] = [None] * len(sources)
        for batch in self._batches(lengths, search_options.beam_size):
            self._translate_batch(batch, sources, lengths, caps, search_options, results, on_step)
        return [r for r in results if r is not None]

    def _batches(self, lengths: np.ndarray, beam_size: int) -> list[np.ndarray]:
        """Indices sorted by decreasing length, cut so that rows x beams x padded length stays within budget."""
        order = np.argsort(-lengths, kind="stable")
        batches: list[np.ndarray] = []
        start = 0
        while start < order.size:
            longest = int(lengths[order[start]])
            size = max(1, self.max_batch_tokens // max(1, longest * beam_size))
            batches.append(order[start : start + size])
            start += size
        return batches

    def _translate_batch(
        self,
        batch: np.ndarray,
        sources: list[list[int]],
        lengths: np.ndarray,
        caps: np.ndarray,
        options: SearchOptions,
        results: list[Translation | None],
        on_step: OnStep | None,
    ) -> None:
        started = time.perf_counter()
        hook = None if on_step is None else self._stream_hook(batch, on_step)
        try:
            encoded = self.encode_batch(sources, batch)
            hypotheses = search(self.backend, encoded.cross_kv, encoded.src_bias, caps[batch], options, hook)
        except ServingError:
            raise
        except Exception as e:
            raise InferenceFailed(f"{self.info.runtime} failed on a batch of {batch.size}: {e}") from e
        generated = 0
        for row, index in enumerate(batch):
            translation = self.translation(hypotheses[row], int(lengths[index]))
            generated += translation.output_tokens
            results[index] = translation
        logger.debug(
            "batch of %d (source length %d, beam %d): %d tokens in %.1f ms", batch.size, encoded.src_bias.shape[3],
            options.beam_size, generated, (time.perf_counter() - started) * 1000,
        )

    def translation(self, hypothesis: Hypothesis, input_tokens: int) -> Translation:
        """A decoded hypothesis as a :class:`Translation` (EOS and what follows dropped, detokenized)."""
        ids = _until_eos(hypothesis.token_ids, self.ids.eos)
        return Translation(text=self.tokenizer.decode(ids), input_tokens=input_tokens, output_tokens=len(ids),
                           score=hypothesis.score, token_ids=ids)

    def detokenize(self, token_ids: list[int]) -> str:
        """The text of generated ids, up to the first EOS."""
        return self.tokenizer.decode(_until_eos(token_ids, self.ids.eos))

    def check_lengths(self, lengths: np.ndarray) -> None:
        """Refuse sources longer than the model's positions.

        Raises:
            InputTooLong: the first text that is too long (nothing is translated).
        """
        limit = self.info.max_input_tokens
        if lengths.size and lengths.max() > limit:
            index = int(np.argmax(lengths > limit))
            raise InputTooLong(
                f"text {index} has {int(lengths[index])} tokens; the model accepts at most {limit}",
                index=index, tokens=int(lengths[index]), limit=limit,
            )

    def encode_batch(self, sources: list[list[int]], rows: np.ndarray) -> EncoderOutput:
        """Encode the sources ``rows`` (sorted by decreasing length), right-padded with the pad id."""
        lengths = np.array([len(sources[i]) for i in rows], dtype=np.int64)
        input_ids = np.full((rows.size, int(lengths.max())), self.ids.pad, dtype=np.int64)
        for row, index in enumerate(rows):
            input_ids[row, : lengths[row]] = sources[index]
        return self._encode(input_ids, lengths)

    def _encode(self, input_ids: np.ndarray, lengths: np.ndarray) -> EncoderOutput:
        """Encode a batch sorted by decreasing length in groups of similar length (:func:`encoder_groups`), so that
        short sentences are not padded to the longest; the outputs are joined and padded for the decoder."""
        groups = encoder_groups(lengths)
        if len(groups) == 1:
            return self.backend.encode(input_ids)
        parts = [self.backend.encode(input_ids[start:end, : int(lengths[start:end].max())]) for start, end in groups]
        return join_encoder_outputs(parts, [start for start, _ in groups], input_ids.shape)

    def _stream_hook(self, batch: np.ndarray, on_step: OnStep) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
        """The search's streaming hook for a batch whose row ``i`` is text ``batch[i]``: calls ``on_step(index,
        partial_text)`` when a text's partial translation changes."""
        last: dict[int, str] = {}

        def hook(rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
            for row, row_tokens, length in zip(rows.tolist(), tokens, lengths.tolist(), strict=True):
                index = int(batch[row])
                text = self.detokenize(row_tokens[:length].tolist())
                if last.get(index) != text:
                    last[index] = text
                    on_step(index, text)

        return hook


def encoder_groups(lengths: np.ndarray, call_cost: int = ENCODER_CALL_COST) -> list[tuple[int, int]]:
    """Cut rows sorted by decreasing length into contiguous groups ``[start, end)`` for the encoder.

    The encoder's work for a group is about ``rows x longest`` padded tokens (right padding is computed like any
    token), plus a fixed cost per call (``call_cost`` tokens: smaller matrix products, one more graph run). The cut
    minimizes the sum over groups (dynamic programming over the cut points). For the 16-sentence batches of
    ``mtgate bench`` it removes about half of the padding; identical lengths stay one group.
    """
    n = int(lengths.size)
    best = np.zeros(n + 1, dtype=np.float64)  # best[j]: cost of encoding rows [0, j)
    cut = np.zeros(n + 1, dtype=np.int64)  # where the last group of rows [0, j) starts
    longest = np.asarray(lengths, dtype=np.float64)
    for end in range(1, n + 1):
        starts = np.arange(end)
        costs = best[:end] + call_cost + (end - starts) * longest[:end]
        start = int(np.argmin(costs))  # ties: the earliest start, i.e. fewer groups
        best[end], cut[end] = costs[start], start
    groups: list[tuple[int, int]] = []
    end = n
    while end > 0:
        groups.append((int(cut[end]), end))
        end = int(cut[end])
    return groups[::-1]


def join_encoder_outputs(parts: Sequence[EncoderOutput], starts: Sequence[int], shape: tuple[int, ...]) -> EncoderOutput:
    """One batch's encoder output ``[B, S]`` from groups encoded at their own (shorter) lengths: rows padded with
    zeros, and the source bias masks the padding, as the encoder would have."""
    batch, width = shape
    first = parts[0]
    layers, _, _, heads, _, head_dim = first.cross_kv.shape
    memory = np.zeros((batch, width, first.memory.shape[2]), dtype=np.float32)
    cross_kv = np.zeros((layers, 2, batch, heads, width, head_dim), dtype=np.float32)
    src_bias = np.full((batch, 1, 1, width), MASK_VALUE, dtype=np.float32)
    for part, start in zip(parts, starts, strict=True):
        rows, length = part.memory.shape[0], part.memory.shape[1]
        memory[start : start + rows, :length] = part.memory
        cross_kv[:, :, start : start + rows, :, :length] = part.cross_kv
        src_bias[start : start + rows, :, :, :length] = part.src_bias
    return EncoderOutput(memory=memory, cross_kv=cross_kv, src_bias=src_bias)


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids

