"""The engine: ``Translator`` turns texts into translations with a model package on one runtime (the
``serving.engine.request.Engine`` protocol).

``prepare`` tokenizes (EOS appended), checks the lengths and resolves the options, once per sentence
(``serving.engine.preparation``: ids, target prefixes, caps on generated tokens, seeds); ``run`` cuts
the prepared sentences into sub-batches under the engine's budget (``serving.engine.planner``: sentences, and padded
source tokens times beams; a batch planned under the same budget runs as it is), encodes each sub-batch once (``serving.engine.encoding``), decodes it (``serving.engine.decoding``), detokenizes, and
returns the results in input order; ``translate`` is both. ``score`` is reference scoring (``serving.engine.reference_scoring``). It
knows nothing of HTTP; the server and ``batch-score`` call it from one worker thread.

Output length: ``serving.engine.preparation.max_steps``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from serving.engine import preparation
from serving.engine.backends import Backend, BackendUnavailable, EncoderOutput, create_backend
from serving.engine.decoding import Alive, Hypothesis, OnTokens, SearchOptions, search
from serving.engine.encoding import encode_sorted
from serving.engine.errors import InferenceFailed, ServingError
from serving.engine.planner import DEFAULT_BUDGET, BatchBudget, in_order, plan
from serving.engine.reference_scoring import check_pairs, encode_texts, fit_scored_sources, score_references
from serving.engine.request import (
    DecodeOptions,
    ModelInfo,
    OnPartial,
    Prepared,
    ReferenceScore,
    Translation,
)
from serving.engine.shortlist import allow_prefixes, open_shortlist
from serving.engine.streaming import PartialTexts
from serving.engine.tokenizers import Tokenizer, load_tokenizer
from serving.package import PackageError, choose_precision, open_package

__all__ = ["BatchBudget", "DecodeOptions", "ModelInfo", "ReferenceScore", "TokenIds", "Translation", "Translator"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenIds:
    """The token ids with a fixed meaning (the manifest's ``special_ids``)."""

    pad: int
    eos: int
    decoder_start: int
    unk: int | None = None


class Translator:
    """Texts in, translations out, on one backend.

    Build it with :meth:`load` from a package directory; the constructor takes ready parts (tests use it with other
    backends).

    Arguments:
        backend: runs the encoder and decoder-step graphs.
        tokenizer: the package's tokenizer.
        info: model description (``info.decoding`` gives the decoding defaults).
        ids: pad, EOS and decoder start ids.
        max_batch_size: most sentences in one sub-batch (None: no bound of its own).
        max_batch_tokens: most padded source tokens times beams in one sub-batch (``sentences x beams x longest
            source``); the two are the engine's :attr:`budget` (``serving.engine.planner.BatchBudget``), by default
            ``serving.engine.planner.DEFAULT_BUDGET``'s.
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        info: ModelInfo,
        ids: TokenIds,
        *,
        max_batch_size: int | None = DEFAULT_BUDGET.max_batch_size,
        max_batch_tokens: int = DEFAULT_BUDGET.max_batch_tokens,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.info = info
        self.ids = ids
        self.budget = BatchBudget(max_batch_size, max_batch_tokens)

    @property
    def max_batch_tokens(self) -> int:
        """The budget's padded source tokens times beams (settable: e.g. one sub-batch for a benchmark)."""
        return self.budget.max_batch_tokens

    @max_batch_tokens.setter
    def max_batch_tokens(self, value: int) -> None:
        self.budget = replace(self.budget, max_batch_tokens=value)

    @classmethod
    def load(
        cls,
        package_dir: str | Path,
        runtime: str = "onnxruntime",
        precision: str = "fp32",
        threads: int | None = None,
        *,
        max_batch_size: int | None = DEFAULT_BUDGET.max_batch_size,
        max_batch_tokens: int = DEFAULT_BUDGET.max_batch_tokens,
        shortlist: bool = False,
        spin: bool = True,
    ) -> Translator:
        """Load a model package (format and every checksum verified) on a runtime.

        Arguments:
            package_dir: the package directory.
            runtime: ``onnxruntime`` or ``openvino``.
            precision: ``fp32``, ``int8`` or ``auto`` (the package's choice, ``serving.package.choose_precision``;
                logged, and :attr:`info` holds the precision loaded).
            threads: intra-op threads of the runtime (None: its default).
            max_batch_size, max_batch_tokens: the engine's budget (the class's arguments): ``mtgate serve`` passes
                its settings, ``batch-score`` its flags.
            shortlist: decode with the package's vocabulary shortlist (``serving.engine.shortlist``; ONNX Runtime).
            spin: let the runtime's decoder threads spin between steps (``serving.engine.backends.create_backend``).

        Returns:
            A ready Translator.

        Raises:
            PackageError: not a package, unknown format, an invalid manifest (a path outside the package, an id
                outside the vocabulary, ...), a file missing, modified or not in the checksum list, no such artifact,
                an unusable tokenizer, a graph the runtime cannot load, the runtime is not installed, or a
                shortlist asked of a package or runtime without one.
        """
        package = open_package(package_dir)
        choice = choose_precision(package.manifest, runtime, precision)  # "auto": the package's choice, and why
        manifest, artifact = package.manifest, package.artifact(runtime, precision := choice.precision)
        ids = TokenIds(pad=manifest.special_ids.pad, eos=manifest.special_ids.eos,
                       decoder_start=manifest.special_ids.decoder_start, unk=manifest.special_ids.unk)
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
            source_language=manifest.tokenizer.settings.get("source_lang") or None,
            shortlist=shortlist,
        )
        tokenizer = load_tokenizer(package.root, manifest.tokenizer.to_dict())
        decoder, table = open_shortlist(package, artifact) if shortlist else (package.path(artifact.decoder), None)
        try:
            backend = create_backend(runtime, package.path(artifact.encoder), decoder, threads, reuse_buffers=True,
                                     shortlist=table, spin=spin)
        except BackendUnavailable as e:
            raise PackageError(str(e)) from e
        # DEBUG: a server names the model as it serves it (a repository's directories), once it is warm (runner)
        logger.debug("loaded %s %s (%s/%s: %s) from %s", info.name, info.version, runtime, precision, choice.reason,
                     package.root)
        return cls(backend, tokenizer, info, ids, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids of each text, EOS appended (the tokenizer runs once per text)."""
        eos = self.ids.eos
        return [[*self.tokenizer.encode(text), eos] for text in texts]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Source tokens of each text, EOS included."""
        return [len(ids) for ids in self.encode(texts)]

    def prepare(self, texts: Sequence[str], options: DecodeOptions | None = None,
                target_prefix: Sequence[str] | None = None) -> Prepared:
        """Tokenize ``texts``, check their lengths and resolve ``options``: what :meth:`run` decodes.

        Arguments:
            texts: source texts; an empty text is translated as a source of just EOS.
            options: decoding overrides, the over-long policy (``truncate``).
            target_prefix: for each text, the start its translation is forced to (CTranslate2's ``target_prefix``;
                an empty string: none), or None.

        Raises:
            InputTooLong: a text has more tokens than the model has positions (unless ``options.truncate``).
            InvalidInput: not one target prefix per text, or a prefix as long as the translation may be.
        """
        prefixes = preparation.prefix_ids(self.tokenizer.encode_target, target_prefix, len(texts))
        return self._prepared(self.encode(texts), options, prefixes)

    def prepare_ids(self, ids: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                    target_prefix: Sequence[str] | None = None) -> Prepared:
        """:meth:`prepare` for sentences already tokenized with this package's source vocabulary: each sentence's
        ids as the tokenizer gives them, without EOS (e.g. tensor2tensor records, with their EOS cut off);
        ``target_prefix`` as :meth:`prepare` takes it (text, one per sentence).

        Raises:
            InvalidInput: an id outside the source vocabulary, not one target prefix per sentence, or a prefix as
                long as the translation may be.
            InputTooLong: a sentence has more tokens than the model has positions.
        """
        prefixes = preparation.prefix_ids(self.tokenizer.encode_target, target_prefix, len(ids))
        return self._prepared(self._source_ids(ids), options, prefixes)

    def _prepared(self, sources: list[list[int]], options: DecodeOptions | None,
                  prefixes: list[list[int]] | None = None) -> Prepared:
        options = options or DecodeOptions()
        return preparation.prepared(self.info, sources, options, self.search_options(options), prefixes)

    def _source_ids(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        return preparation.source_ids(ids, self.info.source_vocab_size, self.ids.eos)

    def search_options(self, options: DecodeOptions | None = None) -> SearchOptions:
        """The search options a request resolves to (the package's defaults overridden by ``options``).

        Raises:
            InvalidInput: ``disable_unk`` for a model without an unknown token.
        """
        ids = self.ids
        return (options or DecodeOptions()).resolve(self.info.decoding, ids.eos, ids.decoder_start, ids.unk)

    def max_steps(self, source_lengths: np.ndarray, options: DecodeOptions | None = None) -> np.ndarray:
        """Per-sentence cap on generated tokens, EOS included (``serving.engine.preparation.max_steps``)."""
        return preparation.max_steps(self.info, source_lengths, options or DecodeOptions())

    def run(self, prepared: Prepared, on_partial: OnPartial | None = None, alive: Alive | None = None
            ) -> list[Translation]:
        """Decode prepared sentences (any number; cut into sub-batches under :attr:`budget`: a batch planned under
        the same budget, in the planner's order, runs as it is).

        Arguments:
            prepared: from :meth:`prepare` (or :meth:`prepare_ids`), possibly gathered with others of the same options.
            on_partial: streaming hook ``on_partial(index, delta)``, called with the text a sentence's translation
                continues with once it can no longer change: as greedy search decodes each token, as the prefix all
                live beams share grows with beam search (``serving.engine.streaming``); the deltas of a sentence
                concatenate to its text.
            alive: ``alive(indexes)`` -> which of the sentences ``indexes`` (of ``prepared``) still decoding are still
                wanted, polled between decoder steps (``serving.engine.decoding.Alive``): the others leave their
                batch and get an empty translation.

        Returns:
            One :class:`Translation` per sentence, in order.

        Raises:
            InferenceFailed: the runtime failed.
        """
        sources = prepared.sources
        lengths = np.array(prepared.lengths, dtype=np.int64)
        results: list[Translation | None] = [None] * len(sources)
        for batch in self._batches(lengths, prepared.search.beam_size):
            part = prepared if in_order(batch) and batch.size == len(prepared) else prepared.take(batch.tolist())
            self._translate_batch(batch, part, results, on_partial, alive)
        translations = [r for r in results if r is not None]
        if prepared.search.return_scores:
            translations = self.with_token_scores(sources, translations)
        return prepared.mark(translations)

    def with_token_scores(self, sources: list[list[int]], translations: list[Translation]) -> list[Translation]:
        """``translations`` (and their alternatives) with ``token_scores``: each output token and EOS after them
        scored teacher-forced (``serving.engine.reference_scoring``), in one pass; ``sources[i]`` is the source of
        ``translations[i]``."""
        flat = [(i, t) for i, translation in enumerate(translations) for t in (translation, *translation.alternatives)]
        scored = score_references(self.backend, self.encode_batch, [sources[i] for i, _ in flat],
                                  [[*t.token_ids, self.ids.eos] for _, t in flat], decoder_start=self.ids.decoder_start,
                                  budget=self.budget, runtime=self.info.runtime)
        scores = iter(tuple(score.token_log_probs) for score in scored)
        return [replace(t, token_scores=next(scores),
                        alternatives=tuple(replace(a, token_scores=next(scores)) for a in t.alternatives))
                for t in translations]

    def translate(
        self, texts: Sequence[str], options: DecodeOptions | None = None, on_partial: OnPartial | None = None
    ) -> list[Translation]:
        """Translate texts: :meth:`run` of :meth:`prepare`.

        Raises:
            InputTooLong: a text has more tokens than the model has positions (nothing is translated).
            InferenceFailed: the runtime failed.
        """
        return self.run(self.prepare(texts, options), on_partial)

    def _batches(self, lengths: np.ndarray, beam_size: int) -> list[np.ndarray]:
        """The sub-batches of sentences of ``lengths`` (``serving.engine.planner.plan`` under :attr:`budget`)."""
        return plan(lengths, self.budget, beam_size)

    def score(self, sources: Sequence[str], targets: Sequence[str], *, truncate: bool = False
              ) -> list[ReferenceScore]:
        """The model's log-likelihood of each target given its source, teacher-forced (``serving.engine.reference_scoring``).

        Arguments:
            sources: source texts.
            targets: one target text per source (its tokens and EOS are scored).
            truncate: cut an over-long source as :meth:`prepare` cuts it with ``DecodeOptions.truncate`` (the
                reference is then scored against what was translated); a target is never cut.

        Returns:
            One :class:`ReferenceScore` per pair, in order.

        Raises:
            InvalidInput: not as many targets as sources, or a text that is not valid Unicode (``source[i]``,
                ``target[i]``).
            InputTooLong: a target, or without ``truncate`` a source, with more tokens than the model has positions.
            InferenceFailed: the runtime failed.
        """
        check_pairs(len(sources), len(targets))
        ids = encode_texts(self.tokenizer.encode, sources, self.ids.eos, None, "source")  # checked by _score
        return self._score(ids, targets, truncate)

    def score_ids(self, ids: Sequence[Sequence[int]], targets: Sequence[str], *, truncate: bool = False
                  ) -> list[ReferenceScore]:
        """:meth:`score` for sources already tokenized with this package's source vocabulary (without EOS, as
        :meth:`prepare_ids` takes them).

        Raises:
            InvalidInput: not as many targets as sources, an id outside the source vocabulary, a target that is not
                valid Unicode.
            InputTooLong: a target, or without ``truncate`` a source, with more tokens than the model has positions.
            InferenceFailed: the runtime failed.
        """
        check_pairs(len(ids), len(targets))
        return self._score(self._source_ids(ids), targets, truncate)

    def _score(self, sources: list[list[int]], targets: Sequence[str], truncate: bool) -> list[ReferenceScore]:
        sources = fit_scored_sources(sources, self.info.max_input_tokens, truncate)
        target_ids = encode_texts(self.tokenizer.encode_target, targets, self.ids.eos, self.info.max_input_tokens,
                                  "target")
        return score_references(self.backend, self.encode_batch, sources, target_ids,
                                decoder_start=self.ids.decoder_start, budget=self.budget, runtime=self.info.runtime)

    def _translate_batch(
        self,
        batch: np.ndarray,
        part: Prepared,
        results: list[Translation | None],
        on_partial: OnPartial | None,
        alive: Alive | None = None,
    ) -> None:
        """Decode one sub-batch: ``part`` holds the sentences ``batch`` of the request, in that order."""
        started = time.perf_counter()
        options = part.search
        texts = None if on_partial is None else PartialTexts(self.tokenizer, self.ids.eos, on_partial)
        hook = None if texts is None else self._stream_hook(batch, texts)
        try:
            encoded = self.encode_batch(part.sources, np.arange(batch.size))
            allow_prefixes(encoded.candidates, np.arange(batch.size), part.prefixes)
            hypotheses = search(self.backend, encoded.cross_kv, encoded.src_bias, part.caps, options, hook,
                                prefixes=part.prefixes, seeds=part.seeds, candidates=encoded.candidates,
                                alive=None if alive is None else lambda rows: alive(batch[rows]))
        except ServingError:
            raise
        except Exception as e:
            raise InferenceFailed(f"{self.info.runtime} failed on a batch of {batch.size}: {e}") from e
        generated = 0
        for row, index in enumerate(batch):
            translation = self.translation(hypotheses[row], len(part.sources[row]))
            generated += translation.output_tokens
            results[index] = translation
            if texts is not None:
                texts.finish(int(index), translation.token_ids)
        logger.debug(
            "batch of %d (source length %d, beam %d): %d tokens in %.1f ms", batch.size, encoded.src_bias.shape[3],
            options.beam_size, generated, (time.perf_counter() - started) * 1000,
        )

    def translation(self, hypothesis: Hypothesis, input_tokens: int) -> Translation:
        """A decoded hypothesis as a :class:`Translation` (EOS and what follows dropped, detokenized)."""
        ids = _until_eos(hypothesis.token_ids, self.ids.eos)
        alternatives = tuple(self.translation(h, input_tokens) for h in hypothesis.alternatives)
        return Translation(text=self.tokenizer.decode(ids), input_tokens=input_tokens, output_tokens=len(ids),
                           score=hypothesis.score, token_ids=ids, alternatives=alternatives)

    def encode_batch(self, sources: list[list[int]], rows: np.ndarray) -> EncoderOutput:
        """Encode the sources ``rows`` (sorted by decreasing length), right-padded with the pad id."""
        lengths = np.array([len(sources[i]) for i in rows], dtype=np.int64)
        input_ids = np.full((rows.size, int(lengths.max())), self.ids.pad, dtype=np.int64)
        for row, index in enumerate(rows):
            input_ids[row, : lengths[row]] = sources[index]
        return self._encode(input_ids, lengths)

    def _encode(self, input_ids: np.ndarray, lengths: np.ndarray) -> EncoderOutput:
        return encode_sorted(self.backend, input_ids, lengths)

    def _stream_hook(self, batch: np.ndarray, texts: PartialTexts) -> OnTokens:
        """The search's streaming hook for a batch whose row ``i`` is sentence ``batch[i]``: each sentence's stable
        tokens to ``texts`` (``serving.engine.streaming``: only the new tokens are detokenized)."""

        def hook(rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
            for row, row_tokens, length in zip(rows.tolist(), tokens, lengths.tolist(), strict=True):
                texts.tokens(int(batch[row]), row_tokens, length)

        return hook


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids

