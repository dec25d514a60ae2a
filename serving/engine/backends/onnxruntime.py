"""ONNX Runtime backend: one InferenceSession per graph, CPU execution provider, all graph optimizations on."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.backends.base import BackendUnavailable, EncoderOutput, as_floats, as_ids, decoder_feeds, open_graph
from serving.engine.backends.binding import StepBinding
from serving.engine.shortlist import Shortlist
from serving.package import ENCODER_OUTPUTS, PackageError, present_names, stacked

logger = logging.getLogger(__name__)


def physical_cores() -> int:
    """The machine's physical cores, which is how many intra-op threads ONNX Runtime runs when not told (Linux: the
    distinct (package, core) pairs of the online CPUs; elsewhere, or when unreadable, ``os.cpu_count()``)."""
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text()
                       .strip()))
        except OSError:
            return os.cpu_count() or 1
    return len(cores) or os.cpu_count() or 1


def threads_note(threads: int | None) -> str:
    """How many intra-op threads a session runs, for the load log line."""
    return f"threads={threads}" if threads is not None else \
        f"threads={physical_cores()}, ONNX Runtime's default: one per physical core"


def session_options(threads: int | None, *, spin: bool = True) -> Any:
    """SessionOptions for one graph: ``threads`` intra-op threads (None: ONNX Runtime's default, all cores).

    ``spin=False``: the session's worker threads sleep as soon as a run ends instead of spinning for more work. The
    encoder runs once per batch and is followed by the decoder, whose own threads would otherwise compete with the
    encoder's spinning ones for the same cores during the first decoder steps.
    """
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover - onnxruntime is a runtime dependency
        raise BackendUnavailable("the onnxruntime backend needs the 'onnxruntime' package") from e
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OnnxRuntimeBackend:
    """Runs ``encoder.onnx`` and ``decoder.onnx`` with ONNX Runtime on CPU.

    Arguments:
        encoder_path: the encoder graph.
        decoder_path: the decoder-step graph.
        threads: intra-op threads per session (None: all cores).
        reuse_buffers: write the decoder step's outputs into buffers the backend keeps (ONNX Runtime I/O binding)
            instead of fresh arrays; see :meth:`decode_step` for how long they stay valid. The search loop of the
            engine turns it on; callers that keep every step's outputs leave it off.
        shortlist: decode with this vocabulary shortlist (``serving.engine.shortlist``); ``decoder_path`` must then be the
            package's shortlist decoder (input ``vocab_ids``).
        spin: let the decoder's worker threads spin between calls (:func:`session_options`): the fastest steps when
            nothing else wants the cores (``ServingSettings.spin``).
    """

    runtime = "onnxruntime"

    def __init__(
        self, encoder_path: Path, decoder_path: Path, threads: int | None = None, *, reuse_buffers: bool = False,
        shortlist: Shortlist | None = None, spin: bool = True,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:  # pragma: no cover
            raise BackendUnavailable("the onnxruntime backend needs the 'onnxruntime' package") from e
        providers = ["CPUExecutionProvider"]
        self.encoder = open_graph(self.runtime, encoder_path, lambda: ort.InferenceSession(
            str(encoder_path), session_options(threads, spin=False), providers=providers))
        self.decoder = open_graph(self.runtime, decoder_path, lambda: ort.InferenceSession(
            str(decoder_path), session_options(threads, spin=spin), providers=providers))
        self.threads = threads
        self.reuse_buffers = reuse_buffers
        # Package format 4: the decoder keeps each row's cache in place (serving.engine.backends.base.STATIONARY_NOTE).
        inputs = {i.name for i in self.decoder.get_inputs()}
        self.stationary = "self_bias" not in inputs
        if (shortlist is not None) != ("vocab_ids" in inputs):
            raise PackageError(f"{decoder_path}: " + ("not a shortlist decoder (no vocab_ids input)" if shortlist
                                                      else "a shortlist decoder needs its shortlist table"))
        self.shortlist = shortlist
        self._caches = CacheBuffers()
        self._log_probs = np.empty(0, dtype=np.float32)
        self._log_probs_view = self._log_probs.reshape(0, 0)
        self._binding: StepBinding | None = None  # the stationary decoder's, kept across steps
        self._vocab: int | None = None if shortlist is None else shortlist.target_vocab
        logger.info("onnxruntime %s: loaded %s, %s (%s)", ort.__version__, encoder_path, decoder_path,
                    threads_note(threads))

    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        memory, cross_kv, src_bias = self.encoder.run(list(ENCODER_OUTPUTS), {"input_ids": as_ids(input_ids)})
        candidates = None if self.shortlist is None else self.shortlist.candidates(input_ids)
        return EncoderOutput(memory=memory, cross_kv=cross_kv, src_bias=src_bias, candidates=candidates)

    def decode_step(
        self,
        input_ids: np.ndarray,
        step: int | np.ndarray,
        past_kv: np.ndarray,
        cross_kv: np.ndarray,
        src_bias: np.ndarray,
        self_bias: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decoder step (the ``Backend`` contract).

        A stationary decoder (``self.stationary``) runs it in place on a cache one slot wider, holding ``past_kv``;
        its rows must all be at position ``T`` with nothing masked (``decode_in_place`` is its own contract).

        ONNX Runtime writes the outputs in place (I/O binding); nothing is copied out. Without ``reuse_buffers``
        they are new arrays. With it, nothing is allocated per step: ``log_probs`` is a view of one buffer, valid
        until the next call; ``present_kv`` is a view of one of two cache buffers, the one that does not hold
        ``past_kv`` (nor, when ``past_kv`` is elsewhere, the last ``present_kv``), so it stays valid while it is
        fed back as the next ``past_kv``.
        """
        layers, _, rows, heads, past_len, head_dim = past_kv.shape
        present_shape = (layers, 2, rows, heads, past_len + 1, head_dim)
        present_kv = (self._caches.next(present_shape, past_kv) if self.reuse_buffers
                      else np.empty(present_shape, dtype=np.float32))
        if self.stationary:
            if np.any(np.asarray(step) != past_len) or (self_bias is not None and np.any(self_bias)):
                raise ValueError("a stationary decoder steps rows at their own positions: use decode_in_place")
            present_kv[:, :, :, :, :past_len] = past_kv
            positions = np.full(rows, past_len, dtype=np.int64)
            log_probs = self.decode_in_place(input_ids, positions, present_kv, cross_kv, src_bias, np.arange(rows))
            return log_probs, present_kv
        feeds = decoder_feeds(input_ids, step, past_kv, cross_kv, src_bias, self_bias)
        log_probs = self._log_probs_out(rows)
        # Every output is written by the runtime straight into its place: the present caches into the slices of
        # one stacked array.
        binding = self.decoder.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        outputs = [("log_probs", log_probs)]
        outputs += [(name, present_kv[index]) for name, index in stacked(present_names(layers))]
        for name, out in outputs:
            binding.bind_output(name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self.decoder.run_with_iobinding(binding)
        return log_probs, present_kv

    def decode_in_place(
        self, input_ids: np.ndarray, positions: np.ndarray, cache: np.ndarray, cross_kv: np.ndarray,
        src_bias: np.ndarray, order: np.ndarray, vocab_ids: np.ndarray | None = None,
        vocab_bias: np.ndarray | None = None,
    ) -> np.ndarray:
        """One step of a stationary decoder for rows ``0..n-1`` (``n = len(input_ids)``): row ``i`` feeds
        ``input_ids[i]`` at ``positions[i]``, attends over its cache slots ``0..positions[i]`` and writes its new keys
        and values into ``cache[:, :, i, :, positions[i]]``; nothing else of the cache is read or moved.

        Arguments:
            input_ids: ``[n, 1]``.
            positions: ``[n]`` each row's position (= the cache slots it has filled).
            cache: ``[L, 2, R, H, M, Dh]`` float32, C-contiguous, ``R >= n``, ``M > max(positions)``.
            cross_kv: ``[L, 2, R', H, S, Dh]`` with ``R' >= n``; rows ``0..n-1`` are used.
            src_bias: ``[R', 1, 1, S]``.
            order: ``[n]`` a permutation of ``0..n-1``: row ``i`` of the log-probs is row ``order[i]``'s.
            vocab_ids: with a shortlist, the sorted target ids ``[K]`` to score (None: every id).
            vocab_bias: with ``vocab_ids``, ``[n, K]`` float32 in output order: 0 where the row may produce the id,
                -inf elsewhere.

        Returns:
            ``log_probs [n, V]``, or with a shortlist ``[n, K]`` (a column per id of ``vocab_ids``, each row's
            log-softmax over its own ids); with ``reuse_buffers`` a view of a buffer valid until the next call.
        """
        rows = int(input_ids.shape[0])
        if not (cache.flags.c_contiguous and cache.dtype == np.float32):
            raise ValueError("the stationary cache must be a C-contiguous float32 array")
        binding = self._binding
        if binding is None or binding.session is not self.decoder:  # the first step, or a session swapped in
            binding = self._binding = StepBinding(self.decoder, cache.shape[0])
        extra: dict[str, np.ndarray] | None = None
        if self.shortlist is not None:
            if vocab_ids is None:
                vocab_ids = np.arange(self._vocab_size())
            if vocab_bias is None:
                vocab_bias = np.zeros((rows, vocab_ids.size), dtype=np.float32)
            log_probs = self._log_probs_out(rows, vocab_ids.size)
            extra = {"vocab_ids": as_ids(vocab_ids), "vocab_bias": as_floats(vocab_bias)}
        else:
            log_probs = self._log_probs_out(rows)
        # The present caches are the past ones: GroupQueryAttention writes each row's new slot in place.
        binding.run(input_ids, positions, cache, cross_kv, src_bias, order, log_probs, extra)
        return log_probs

    def _log_probs_out(self, rows: int, columns: int | None = None) -> np.ndarray:
        """Where the step writes its log-probs (``columns`` per row, default the vocabulary): the reused buffer, or
        a new array."""
        vocab = self._vocab_size() if columns is None else columns
        if not self.reuse_buffers:
            return np.empty((rows, vocab), dtype=np.float32)
        if self._log_probs_view.shape == (rows, vocab):
            return self._log_probs_view  # the same array as the last step's: its binding holds
        if self._log_probs.size < rows * vocab:
            self._log_probs = np.empty(rows * vocab, dtype=np.float32)
        self._log_probs_view = self._log_probs[: rows * vocab].reshape(rows, vocab)
        return self._log_probs_view

    def take_rows(self, cache: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``np.take(cache, rows, axis=2)``; with ``reuse_buffers``, into the cache buffer that does not hold it."""
        if not self.reuse_buffers:
            return np.take(cache, rows, axis=2)
        rows = np.asarray(rows, dtype=np.intp)
        out = self._caches.next(cache.shape[:2] + (rows.size,) + cache.shape[3:], cache)
        np.take(cache, rows, axis=2, out=out, mode="clip")  # rows are valid; "clip" writes straight into out
        return out

    def _vocab_size(self) -> int:
        if self._vocab is None:
            dim = next(o.shape[-1] for o in self.decoder.get_outputs() if o.name == "log_probs")
            if not isinstance(dim, int):
                raise ValueError("decoder.onnx: log_probs has no fixed vocabulary size")
            self._vocab = dim
        return self._vocab


class CacheBuffers:
    """Two flat float32 buffers for the self-attention cache, used in turn: a new cache goes into the buffer that
    does not hold the cache it is made from (nor, when that one is elsewhere, the cache handed out last)."""

    def __init__(self) -> None:
        self._buffers = [np.empty(0, dtype=np.float32), np.empty(0, dtype=np.float32)]
        self._last = 1

    def next(self, shape: tuple[int, ...], source: np.ndarray) -> np.ndarray:
        """A C-contiguous ``shape`` view of the buffer that neither ``source`` nor the last view lives in."""
        index = 1 - self._last
        for i, buffer in enumerate(self._buffers):
            if buffer.size and np.may_share_memory(source, buffer):
                index = 1 - i
        size = int(np.prod(shape))
        if self._buffers[index].size < size:
            self._buffers[index] = np.empty(size + size // 4, dtype=np.float32)  # headroom: the cache grows
        self._last = index
        return self._buffers[index][:size].reshape(shape)
