"""Step-level (continuous) batching in the engine: sentences join a running decode batch at step boundaries and
leave it when they are done.

:class:`ContinuousDecoder` holds decoder rows that belong to many *groups* (the sentences of one request that joined
together, each with its own options and caps). :meth:`~ContinuousDecoder.add` queues a group;
:meth:`~ContinuousDecoder.step` encodes every queued sentence in one encoder call, appends their rows, runs one
decoder step, hands each search its slice of the log-probs (``serving.engine.decoding.Search.advance``) and rebuilds the
batch from the plans: finished sentences leave, beams are reordered, and a group whose last sentence is done gets its
translations. Sentences with the same search options share one search (``Search.join``), so the per-step search work
is one call per distinct option set, not per request. It knows nothing of HTTP or asyncio; the server's step batcher
(``serving.server.batching.step``) calls it from its one worker thread. How rows at different steps share one decoder call
is ``serving.engine.lane``'s and ``serving.engine.rows``'.

With a stationary cache (ONNX Runtime, ``serving.engine.rows.SlotRows``) each row attends over its own slots only, nothing
is masked, and one lane takes every row. With a growing cache (``DenseRows``) the cache is as wide as its oldest row
is old, and every row pays for that width (attention over masked slots, the cache copy of the beam reorder). So that
one long-running sentence (beam search can run to the length cap) does not make every later request pay for its
width, the rows live in *lanes*: batches of their own, each run with its own decoder call. New sentences join the
youngest lane while its cache is narrower than ``MAX_JOIN_WIDTH`` slots, else they open a new lane; a lane ends when
its last sentence is done.

Short and long sentences run in lanes of their own: a step costs about what its rows cost, so a short sentence that
shares a lane with paragraphs at beam 4 pays for their rows at every one of its steps (one sentence alone: 0.54 ms a
step; beside 8 paragraphs, 32 rows: 3.55 ms). A sentence of more than ``long_tokens`` source tokens joins a long
lane, the others a short one; while short rows are in flight the long lanes step once every ``long_every`` steps
(the short lanes every step), so short sentences finish at their own pace and leave, and the paragraphs take every
step again once they are alone. Only a beam search makes a sentence long: greedy, a paragraph is one row, and a lane
of its own costs a second decoder call a step for one row's worth of work (served, greedy, 25% paragraphs:
benchmarks/README.md, "Mixed traffic"). Every sentence still gets exactly the translation it gets alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from serving.engine.backends import Backend
from serving.engine.decoding import Search
from serving.engine.errors import InferenceFailed, InvalidInput, ServingError
from serving.engine.lane import Joining, Lane
from serving.engine.planner import order as decode_order
from serving.engine.request import OnPartial, Prepared, Translation
from serving.engine.shortlist import allow_prefixes
from serving.engine.streaming import PartialTexts
from serving.engine.translator import Translator

logger = logging.getLogger(__name__)

MAX_JOIN_WIDTH = 8
"""New sentences join a lane only while its cache holds fewer steps than this (their masked slots)."""

LONG_TOKENS = 48
"""Sentences of more source tokens than this run in long lanes when they decode with a beam (the step batcher caps
long items by it too)."""

LONG_EVERY = 2
"""While short rows are in flight, the long lanes step once every this many steps."""

OnResult = Callable[[list[Translation] | ServingError], None]
"""``on_result(translations or error)``: a group's translations in its input order, or why it failed."""


@dataclass(eq=False)
class _Group:
    """The sentences of one :meth:`ContinuousDecoder.add` call."""

    ids: range  # sentence ids: text i of the group is sentence ids[i]
    prepared: Prepared  # the group's sentences, options and caps; marks its translations (Prepared.mark)
    on_result: OnResult
    alive: Callable[[], bool]
    texts: PartialTexts | None  # the streamed text of its sentences (streaming only)
    results: dict[int, Translation] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)


class ContinuousDecoder:
    """Decode batches that sentences join and leave at step boundaries (module docstring).

    Arguments:
        translator: the engine (backend, tokenizer, decoding defaults) the rows run on.
        max_join_width: see :data:`MAX_JOIN_WIDTH`.
        long_tokens: see :data:`LONG_TOKENS` (None: one kind of lane for every sentence); greedy sentences are never
            long.
        long_every: see :data:`LONG_EVERY` (1: every lane steps every step).
    """

    def __init__(self, translator: Translator, *, max_join_width: int = MAX_JOIN_WIDTH,
                 long_tokens: int | None = LONG_TOKENS, long_every: int = LONG_EVERY) -> None:
        if long_every < 1:
            raise ValueError(f"long_every must be at least 1, got {long_every}")
        self.translator = translator
        self.backend: Backend = translator.backend
        self.max_join_width = max_join_width
        self.long_tokens = long_tokens
        self.long_every = long_every
        self._steps = 0
        self._lanes: list[Lane] = []
        self._joining: list[_Group] = []
        self._owner: dict[int, tuple[_Group, int]] = {}  # sentence id -> (group, index in the group)
        self._to_score: list[tuple[_Group, list[Translation]]] = []  # done groups awaiting their token scores
        self._next_id = 0

    @property
    def sentences(self) -> int:
        """Sentences added and not yet done."""
        return len(self._owner)

    @property
    def rows(self) -> int:
        """Rows of the next decoder calls (sentences x beams, joining ones excluded)."""
        return sum(lane.rows for lane in self._lanes)

    @property
    def lanes(self) -> int:
        """Dense batches in flight (decoder calls per step)."""
        return len(self._lanes)

    @property
    def idle(self) -> bool:
        """Nothing to decode."""
        return not self._owner

    def add(
        self,
        prepared: Prepared,
        on_result: OnResult,
        *,
        on_partial: OnPartial | None = None,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """Let prepared sentences (``Translator.prepare``) join at the next :meth:`step` (which encodes every joining
        sentence in one call).

        Arguments:
            prepared: the group's sentences (at least one).
            on_result: called (from :meth:`step`) with the group's translations in order, or with the error that
                failed it.
            on_partial: streaming hook, as in :meth:`serving.engine.translator.Translator.run`.
            alive: polled before every step; once it returns False the group leaves the batch (``on_result`` gets a
                ServingError).

        Raises:
            InvalidInput: no sentences (nothing joins).
        """
        if not len(prepared):
            raise InvalidInput("no texts to translate")
        ids = range(self._next_id, self._next_id + len(prepared))
        self._next_id += len(prepared)
        texts = None if on_partial is None else PartialTexts(self.translator.tokenizer, self.translator.ids.eos,
                                                            on_partial)
        group = _Group(ids, prepared, on_result, alive, texts)
        self._joining.append(group)
        for index, sentence in enumerate(ids):
            self._owner[sentence] = (group, index)

    def step(self) -> None:
        """Let the added groups join, then run one decoder step for every row (one call per lane); groups that are
        done get their result and leave.

        A runtime failure fails every group (their ``on_result`` gets an InferenceFailed) and empties the decoder.
        """
        try:
            self._join()
        except Exception as e:
            self.fail(e if isinstance(e, ServingError) else
                      InferenceFailed(f"{self.translator.info.runtime} encoder failed: {e}"))
            return
        self._drop_abandoned()
        private = len(self._lanes) > 1
        self._steps += 1
        short_rows = any(not lane.long for lane in self._lanes)
        for lane in self._lanes:
            if lane.long and short_rows and self._steps % self.long_every:
                continue  # short sentences step ahead (module docstring)
            try:
                lane.step(self._deliver, private=private)
            except Exception as e:
                self.fail(InferenceFailed(f"{self.translator.info.runtime} failed on a step of {lane.rows} rows: {e}"))
                return
        self._lanes = [lane for lane in self._lanes if lane.blocks]
        if self._to_score:
            self._score_finished()

    def detach(self) -> None:
        """Let other work run the backend between two steps (reference scoring, a warm-up): no lane keeps the
        backend's reused output buffers after this."""
        for lane in self._lanes:
            lane.detach()

    def fail(self, error: ServingError) -> None:
        """Fail every group (decoding or joining) with ``error`` and empty the decoder."""
        groups = {id(group): group for group, _ in [*self._owner.values(), *self._to_score]}
        self._lanes, self._joining, self._owner, self._to_score = [], [], {}, []
        for group in groups.values():
            _call(group.on_result, error)

    def _join(self) -> None:
        """Encode every joining sentence in one call; their rows join the youngest lane of their kind (short or long:
        more than ``long_tokens`` source tokens and a beam), or a new one."""
        groups, self._joining = self._joining, []
        groups = [group for group in groups if _alive(group) or self._abandon(group)]
        if not groups:
            return
        sources = [source for group in groups for source in group.prepared.sources]
        lengths = np.array([len(source) for source in sources], dtype=np.int64)
        order = decode_order(lengths)
        encoded = self.translator.encode_batch(sources, order)
        row_of = np.empty_like(order)
        row_of[order] = np.arange(order.size)  # sentence i of `sources` is row row_of[i] of `encoded`
        joining: dict[bool, list[Joining]] = {}  # long or not -> the sentences that join its lanes
        start = 0
        for group in groups:
            count = len(group.prepared.sources)
            rows = row_of[start : start + count]
            is_long = (lengths[start : start + count] > self.long_tokens
                       if self.long_tokens is not None and group.prepared.search.beam_size > 1
                       else np.zeros(count, dtype=bool))
            start += count
            for kind in (False, True):
                part = np.flatnonzero(is_long == kind)
                if part.size:
                    joining.setdefault(kind, []).append(self._joining_part(group, part, rows))
        for long, members in joining.items():
            lanes = [lane for lane in self._lanes if lane.long == long]
            if not lanes or lanes[-1].width >= self.max_join_width:
                for lane in self._lanes:  # from now on several lanes use the backend: none may keep its buffers
                    lane.detach()
                lanes.append(Lane(self.backend, long=long))
                self._lanes.append(lanes[-1])
            for joiner in members:
                allow_prefixes(encoded.candidates, joiner.rows, joiner.prefixes)
            lanes[-1].join(members, encoded.cross_kv, encoded.src_bias, self._stream_hook, encoded.candidates)

    @staticmethod
    def _joining_part(group: _Group, part: np.ndarray, rows: np.ndarray) -> Joining:
        """The sentences ``part`` (indexes into the group) of a joining group; ``rows``: the group's encoder rows."""
        prepared = group.prepared
        prefixes = None if prepared.prefixes is None else [prepared.prefixes[i] for i in part.tolist()]
        return Joining(prepared.search, np.asarray(group.ids, dtype=np.int64)[part], prepared.caps[part], rows[part],
                       None if prepared.seeds is None else prepared.seeds[part], prefixes,
                       stream=group.texts is not None)

    # -- groups ------------------------------------------------------------------------------------------------------

    def _drop_abandoned(self) -> None:
        """Remove the sentences of groups whose requests are gone (cancelled, timed out); their ``on_result`` gets a
        ServingError that says so (every group gets exactly one result)."""
        gone = {id(group): group for group, _ in self._owner.values() if not _alive(group)}
        if not gone:
            return
        ids = np.array([sentence for group in gone.values() for sentence in group.ids], dtype=np.int64)
        for group in gone.values():
            self._abandon(group)
        for lane in self._lanes:
            lane.remove(ids)
        self._lanes = [lane for lane in self._lanes if lane.blocks]

    def _abandon(self, group: _Group) -> bool:
        """Forget a group nobody waits for; its ``on_result`` says so. Returns False (for filters)."""
        for sentence in group.ids:
            self._owner.pop(sentence, None)
        _call(group.on_result, ServingError("abandoned: nobody waits for these sentences any more"))
        return False

    def _deliver(self, search: Search) -> None:
        """Move the search's finished sentences to their groups; a group whose every sentence is done gets its
        translations."""
        if not search.results:
            return
        finished, search.results = search.results, {}
        for sentence, hypothesis in finished.items():
            owner = self._owner.pop(sentence, None)
            if owner is None:
                continue
            group, index = owner
            group.results[index] = translation = self.translator.translation(hypothesis,
                                                                              len(group.prepared.sources[index]))
            if group.texts is not None:
                group.texts.finish(index, translation.token_ids)
            if len(group.results) == len(group.prepared.sources):
                logger.debug("group of %d done in %.1f ms", len(group.prepared.sources),
                             (time.perf_counter() - group.started) * 1000)
                translations = [group.results[i] for i in range(len(group.prepared.sources))]
                if group.prepared.search.return_scores:  # scored after the step: the decoder's buffers are in use now
                    self._to_score.append((group, translations))
                    continue
                _call(group.on_result, group.prepared.mark(translations))

    def _score_finished(self) -> None:
        """Give the groups that asked for token scores (``return_scores``) their translations, scored."""
        done, self._to_score = self._to_score, []
        self.detach()  # scoring runs the decoder too
        for group, translations in done:
            try:
                result: list[Translation] | ServingError = group.prepared.mark(
                    self.translator.with_token_scores(group.prepared.sources, translations))
            except ServingError as e:
                result = e
            except Exception as e:
                result = InferenceFailed(f"{self.translator.info.runtime} failed scoring tokens: {e}")
            _call(group.on_result, result)

    def _stream_hook(self, ids: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """The streamed searches' hook (``OnTokens``): sentence ``ids[i]``'s output starts with
        ``tokens[i, :lengths[i]]``; its group's texts detokenize the new tokens (``serving.engine.streaming``)."""
        for sentence, row_tokens, length in zip(ids.tolist(), tokens, lengths.tolist(), strict=True):
            group, index = self._owner.get(sentence, (None, 0))
            if group is not None and group.texts is not None:
                group.texts.tokens(index, row_tokens, length)


def _alive(group: _Group) -> bool:
    try:
        return bool(group.alive())
    except Exception:  # a consumer's bug must not stop the other groups
        logger.exception("alive() callback failed")
        return False


def _call(on_result: OnResult, value: list[Translation] | ServingError) -> None:
    try:
        on_result(value)
    except Exception:  # a consumer's bug must not stop the other groups
        logger.exception("on_result callback failed")
