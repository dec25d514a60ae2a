"""Step-level (continuous) batching in the engine: sentences join a running decode batch at step boundaries and
leave it when they are done.

:class:`ContinuousDecoder` holds decoder rows that belong to many *groups* (the sentences of one request that joined
together, each with its own options and caps). :meth:`~ContinuousDecoder.add` queues a group;
:meth:`~ContinuousDecoder.step` encodes every queued sentence in one encoder call, appends their rows, runs one
decoder step, hands each search its slice of the log-probs (``serving.decoding.Search.advance``) and rebuilds the
batch from the plans: finished sentences leave, beams are reordered, and a group whose last sentence is done gets its
translations. Sentences with the same search options share one search (``Search.join``), so the per-step search work
is one call per distinct option set, not per request. It knows nothing of HTTP or asyncio; the server's step batcher
(``serving.step_batching``) calls it from its one worker thread.

Rows at different steps share one decoder call because the decoder-step graph takes a position per row
(``position_ids``) and a mask over the self-attention cache (``self_bias``): rows that join when the cache holds
``T`` steps get ``T`` masked (zero) slots; the cache is cut from the left as soon as no row needs its oldest slots.
Source lengths differ too: the encoder outputs are padded to the longest source and masked by ``src_bias``, as in a
request-level batch.

The cache is as wide as its oldest row is old, and every row pays for that width (attention over masked slots, the
cache copy of the beam reorder). So that one long-running sentence (beam search can run to the length cap) does not
make every later request pay for its width, the rows live in *lanes*: dense batches of their own, each run with its
own decoder call. New sentences join the youngest lane while its cache is narrower than ``MAX_JOIN_WIDTH`` slots,
else they open a new lane; a lane ends when its last sentence is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from serving.backends.base import StepBackend
from serving.decoding import Search, SearchOptions, is_identity, start_search, take_rows
from serving.engine import DecodeOptions, OnStep, Translation, Translator
from serving.errors import InferenceFailed, InvalidInput, ServingError
from serving.package import MASK_VALUE

logger = logging.getLogger(__name__)

MAX_JOIN_WIDTH = 8
"""New sentences join a lane only while its cache holds fewer steps than this (their masked slots)."""

OnResult = Callable[[list[Translation] | ServingError], None]
"""``on_result(translations or error)``: a group's translations in its input order, or why it failed."""


@dataclass(eq=False)
class _Group:
    """The sentences of one :meth:`ContinuousDecoder.add` call."""

    ids: range  # sentence ids: text i of the group is sentence ids[i]
    options: SearchOptions
    caps: np.ndarray
    sources: list[list[int]]
    on_result: OnResult
    alive: Callable[[], bool]
    on_step: OnStep | None
    results: dict[int, Translation] = field(default_factory=dict)
    partial: dict[int, str] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)
class _Block:
    """The rows of one search (all sentences of a lane with the same search options), contiguous in the lane."""

    options: SearchOptions
    search: Search
    rows: int


class ContinuousDecoder:
    """Decode batches that sentences join and leave at step boundaries (module docstring).

    Arguments:
        translator: the engine (backend, tokenizer, decoding defaults) the rows run on.
        max_join_width: see :data:`MAX_JOIN_WIDTH`.
    """

    def __init__(self, translator: Translator, *, max_join_width: int = MAX_JOIN_WIDTH) -> None:
        if not isinstance(translator.backend, StepBackend):
            raise TypeError(f"{type(translator.backend).__name__} cannot decode rows at different steps")
        self.translator = translator
        self.backend: StepBackend = translator.backend
        self.max_join_width = max_join_width
        self._lanes: list[_Lane] = []
        self._joining: list[_Group] = []
        self._owner: dict[int, tuple[_Group, int]] = {}  # sentence id -> (group, index in the group)
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
        texts: Sequence[str],
        options: DecodeOptions | None,
        on_result: OnResult,
        *,
        on_step: OnStep | None = None,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """Let ``texts`` join at the next :meth:`step` (which encodes every joining text in one call).

        Arguments:
            texts: the group's texts (at least one).
            options: beam size / max length overrides.
            on_result: called (from :meth:`step`) with the group's translations in order, or with the error that
                failed it.
            on_step: streaming hook, as in :meth:`serving.engine.Translator.translate`.
            alive: polled before every step; once it returns False the group leaves the batch (``on_result`` gets a
                ServingError).

        Raises:
            InputTooLong, InvalidInput: the texts or options are refused (nothing joins).
        """
        if not texts:
            raise InvalidInput("no texts to translate")
        translator = self.translator
        search_options = translator.search_options(options)
        sources = translator.encode(texts)
        lengths = np.array([len(source) for source in sources], dtype=np.int64)
        translator.check_lengths(lengths)
        ids = range(self._next_id, self._next_id + len(sources))
        self._next_id += len(sources)
        group = _Group(ids, search_options, translator.max_steps(lengths, options), sources, on_result, alive,
                       on_step)
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
        for lane in self._lanes:
            try:
                lane.step(self._deliver, private=private)
            except Exception as e:
                self.fail(InferenceFailed(f"{self.translator.info.runtime} failed on a step of {lane.rows} rows: {e}"))
                return
        self._lanes = [lane for lane in self._lanes if lane.blocks]

    def fail(self, error: ServingError) -> None:
        """Fail every group (decoding or joining) with ``error`` and empty the decoder."""
        groups = {id(group): group for group, _ in self._owner.values()}
        self._lanes, self._joining, self._owner = [], [], {}
        for group in groups.values():
            _call(group.on_result, error)

    def _join(self) -> None:
        """Encode every joining sentence in one call; their rows join the youngest lane, or a new one."""
        groups, self._joining = self._joining, []
        groups = [group for group in groups if _alive(group) or self._abandon(group)]
        if not groups:
            return
        sources = [source for group in groups for source in group.sources]
        lengths = np.array([len(source) for source in sources], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")
        encoded = self.translator.encode_batch(sources, order)
        row_of = np.empty_like(order)
        row_of[order] = np.arange(order.size)  # sentence i of `sources` is row row_of[i] of `encoded`
        encoder_rows: list[np.ndarray] = []
        start = 0
        for group in groups:
            encoder_rows.append(row_of[start : start + len(group.sources)])
            start += len(group.sources)
        if not self._lanes or self._lanes[-1].width >= self.max_join_width:
            for lane in self._lanes:  # from now on several lanes use the backend: none may keep its buffers
                lane.detach()
            self._lanes.append(_Lane(self.backend))
        self._lanes[-1].join(groups, encoder_rows, encoded.cross_kv, encoded.src_bias, self._stream_hook)

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
            group.results[index] = self.translator.translation(hypothesis, len(group.sources[index]))
            if len(group.results) == len(group.sources):
                logger.debug("group of %d done in %.1f ms", len(group.sources),
                             (time.perf_counter() - group.started) * 1000)
                _call(group.on_result, [group.results[i] for i in range(len(group.sources))])

    def _stream_hook(self, ids: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """The searches' streaming hook: sentence ``ids[i]`` now reads ``tokens[i, :lengths[i]]``."""
        if not any(group.on_step is not None for group, _ in self._owner.values()):
            return
        for sentence, row_tokens, length in zip(ids.tolist(), tokens, lengths.tolist(), strict=True):
            group, index = self._owner.get(sentence, (None, 0))
            if group is None or group.on_step is None:
                continue
            text = self.translator.detokenize(row_tokens[:length].tolist())
            if group.partial.get(index) != text:
                group.partial[index] = text
                group.on_step(index, text)


class _Lane:
    """One dense batch: blocks of rows (one search per option set) and the arrays of the decoder step."""

    _tokens: np.ndarray
    _positions: np.ndarray
    _past: np.ndarray | None
    _cross_kv: np.ndarray | None
    _src_bias: np.ndarray | None
    _self_bias: np.ndarray

    def __init__(self, backend: StepBackend) -> None:
        self.backend = backend
        self.blocks: list[_Block] = []
        self._clear()

    @property
    def rows(self) -> int:
        return int(self._tokens.shape[0])

    @property
    def width(self) -> int:
        """Cache slots (the steps of its oldest row)."""
        return 0 if self._past is None else int(self._past.shape[4])

    def join(self, groups: list[_Group], encoder_rows: list[np.ndarray], cross_kv: np.ndarray,
             src_bias: np.ndarray, on_step: Callable[[np.ndarray, np.ndarray, np.ndarray], None]) -> None:
        """Append the groups' rows (position 0, an all-masked cache) after the block of their search options (a new
        option set gets a new block); ``encoder_rows[i]``: group i's rows of ``cross_kv``/``src_bias``."""
        by_options: dict[SearchOptions, list[tuple[_Group, np.ndarray]]] = {}
        for group, rows in zip(groups, encoder_rows, strict=True):
            by_options.setdefault(group.options, []).append((group, rows))
        pieces: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # block index -> (new tokens, their encoder rows)
        for options, members in by_options.items():
            ids = np.concatenate([np.asarray(group.ids, dtype=np.int64) for group, _ in members])
            caps = np.concatenate([group.caps for group, _ in members])
            search = start_search(caps, options, on_step, ids=ids, joinable=True)
            rows = np.repeat(np.concatenate([rows for _, rows in members]), search.tokens.shape[0] // ids.size)
            index = next((i for i, block in enumerate(self.blocks) if block.options == options), None)
            if index is None:
                self.blocks.append(_Block(options, search, 0))
                index = len(self.blocks) - 1
            else:
                self.blocks[index].search.join(search)
            pieces[index] = (search.tokens, rows)
        self._insert_rows(pieces, cross_kv, src_bias)

    def detach(self) -> None:
        """Copy the cache out of the backend's reused buffers (another lane's step would overwrite them)."""
        if self._past is not None:
            self._past = np.array(self._past)

    def step(self, deliver: Callable[[Search], None], *, private: bool = False) -> None:
        """One decoder call for the lane's rows; each search advances on its slice and ``deliver`` collects what it
        finished. ``private``: keep the next cache in an array of the lane's own, not in the backend's reused
        buffers (other lanes use the backend too). Raises what the runtime raises."""
        if not self.blocks:
            return
        assert self._past is not None and self._cross_kv is not None and self._src_bias is not None
        log_probs, present = self.backend.decode_step(
            self._tokens, self._positions, self._past, self._cross_kv, self._src_bias, self._self_bias
        )
        rows: list[np.ndarray] = []
        encoder_rows: list[np.ndarray] = []
        tokens: list[np.ndarray] = []
        kept: list[_Block] = []
        offset = 0
        for block in self.blocks:
            size = block.rows
            plan = block.search.advance(log_probs[offset : offset + size])
            deliver(block.search)
            if plan is not None:
                rows.append(offset + plan.rows)
                encoder_rows.append(offset + (np.arange(size) if plan.encoder_rows is None else plan.encoder_rows))
                tokens.append(plan.tokens)
                block.rows = plan.rows.size
                kept.append(block)
            offset += size
        self.blocks = kept
        if not kept:
            self._clear()
            return
        self._tokens = np.concatenate(tokens)
        self._advance_rows(present, np.concatenate(rows), np.concatenate(encoder_rows), private)

    def remove(self, ids: np.ndarray) -> None:
        """Drop the sentences ``ids`` (requests nobody waits for)."""
        index: list[np.ndarray] = []
        kept: list[_Block] = []
        offset = 0
        for block in self.blocks:
            size = block.rows
            rows = block.search.remove(ids)
            if rows is not None:
                index.append(offset + rows)
                block.rows = rows.size
                kept.append(block)
            offset += size
        self.blocks = kept
        if kept:
            self._keep_rows(np.concatenate(index))
        else:
            self._clear()

    def _clear(self) -> None:
        self._tokens = np.zeros((0, 1), dtype=np.int64)
        self._positions = np.zeros(0, dtype=np.int64)
        self._past = self._cross_kv = self._src_bias = None
        self._self_bias = np.zeros((0, 1, 1, 0), dtype=np.float32)

    def _insert_rows(
        self, pieces: dict[int, tuple[np.ndarray, np.ndarray]], cross_kv: np.ndarray, src_bias: np.ndarray
    ) -> None:
        """Rebuild the batch with each block's new rows after its old ones (``pieces[block] = (tokens, rows of
        cross_kv/src_bias)``): new rows are at position 0 with an all-masked cache."""
        layers, _, _, heads, _, head_dim = cross_kv.shape
        width = cross_kv.shape[4] if self._cross_kv is None else max(self._cross_kv.shape[4], cross_kv.shape[4])
        new_cross, new_bias = _pad_source(cross_kv, src_bias, width)
        if self._cross_kv is None or self._src_bias is None or self._past is None:
            old_cross = np.zeros((layers, 2, 0, heads, width, head_dim), dtype=np.float32)
            old_bias = np.zeros((0, 1, 1, width), dtype=np.float32)
            old_past = np.zeros((layers, 2, 0, heads, 0, head_dim), dtype=np.float32)
        else:
            old_cross, old_bias = _pad_source(self._cross_kv, self._src_bias, width)
            old_past = self._past
        past_len = old_past.shape[4]
        # Block by block: its old rows, then its new ones. Each array is built with one concatenation of slices.
        old_slices: list[slice] = []
        new_slices: list[np.ndarray] = []
        offset = 0
        for index, block in enumerate(self.blocks):
            old_slices.append(slice(offset, offset + block.rows))
            offset += block.rows
            new_slices.append(pieces[index][1] if index in pieces else np.zeros(0, dtype=np.int64))
            block.rows += new_slices[-1].size
        added = sum(rows.size for rows in new_slices)
        fresh_past = np.zeros((layers, 2, added, heads, past_len, head_dim), dtype=np.float32)
        masked = np.full((added, 1, 1, past_len), MASK_VALUE, dtype=np.float32)
        fresh_tokens = [pieces[i][0] if i in pieces else np.zeros((0, 1), np.int64) for i in range(len(self.blocks))]
        cross, bias, past, self_bias, tokens, positions = [], [], [], [], [], []
        start = 0
        for old, new, new_tokens in zip(old_slices, new_slices, fresh_tokens, strict=True):
            cross += [old_cross[:, :, old], np.take(new_cross, new, axis=2)]
            bias += [old_bias[old], np.take(new_bias, new, axis=0)]
            fresh = slice(start, start + new.size)
            start += new.size
            past += [old_past[:, :, old], fresh_past[:, :, fresh]]
            self_bias += [self._self_bias[old], masked[fresh]]
            tokens += [self._tokens[old], new_tokens]
            positions += [self._positions[old], np.zeros(new.size, dtype=np.int64)]
        self._cross_kv = np.concatenate(cross, axis=2)
        self._src_bias = np.concatenate(bias)
        self._past = np.concatenate(past, axis=2)
        self._self_bias = np.concatenate(self_bias)
        self._tokens = np.concatenate(tokens)
        self._positions = np.concatenate(positions)

    def _advance_rows(self, present: np.ndarray, rows: np.ndarray, encoder_rows: np.ndarray, private: bool) -> None:
        """The next step's arrays: the cache rows ``rows`` of ``present`` (cut from the left where no row has
        anything), their positions and masks; the encoder rows ``encoder_rows``."""
        assert self._cross_kv is not None and self._src_bias is not None
        positions = self._positions[rows] + 1  # = the cache slots each row has filled (the last ones)
        cut = present.shape[4] - int(positions.max())
        self_bias = np.concatenate([self._self_bias, np.zeros(self._self_bias.shape[:3] + (1,), np.float32)], axis=3)
        if cut or not is_identity(rows, present.shape[2]):
            source = present[:, :, :, :, cut:] if cut else present
            self._past = np.take(source, rows, axis=2) if private else take_rows(self.backend, source, rows)
            self._self_bias = np.ascontiguousarray(self_bias[rows, :, :, cut:])
        else:
            self._past = np.array(present) if private else present
            self._self_bias = self_bias
        if not is_identity(encoder_rows, self._src_bias.shape[0]):
            self._cross_kv = np.take(self._cross_kv, encoder_rows, axis=2)
            self._src_bias = np.take(self._src_bias, encoder_rows, axis=0)
        self._positions = positions

    def _keep_rows(self, index: np.ndarray) -> None:
        """Keep only the rows ``index`` (in that order) of every array."""
        assert self._past is not None and self._cross_kv is not None and self._src_bias is not None
        self._past = np.take(self._past, index, axis=2)
        self._cross_kv = np.take(self._cross_kv, index, axis=2)
        self._src_bias = np.take(self._src_bias, index, axis=0)
        self._self_bias = self._self_bias[index]
        self._positions = self._positions[index]
        self._tokens = self._tokens[index]


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


def _pad_source(cross_kv: np.ndarray, src_bias: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Encoder outputs padded to ``width`` source positions (zeros, masked)."""
    pad = width - cross_kv.shape[4]
    if pad == 0:
        return cross_kv, src_bias
    cross = np.pad(cross_kv, [(0, 0)] * 4 + [(0, pad), (0, 0)])
    bias = np.pad(src_bias, [(0, 0)] * 3 + [(0, pad)], constant_values=MASK_VALUE)
    return cross, bias
