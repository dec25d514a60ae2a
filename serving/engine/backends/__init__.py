"""Runtimes behind one protocol: ``OnnxRuntimeBackend`` and ``OpenVinoBackend`` (imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from serving.engine.backends.base import Backend, BackendUnavailable, EncoderOutput, empty_past

if TYPE_CHECKING:
    from serving.engine.shortlist import Shortlist

__all__ = ["Backend", "BackendUnavailable", "EncoderOutput", "create_backend", "empty_past"]


def create_backend(
    runtime: str, encoder_path: Path, decoder_path: Path, threads: int | None = None, *, reuse_buffers: bool = False,
    shortlist: Shortlist | None = None, spin: bool = True,
) -> Backend:
    """Open the artifact's two graphs with the named runtime.

    Arguments:
        runtime: ``"onnxruntime"`` or ``"openvino"``.
        encoder_path: the encoder graph (``.onnx`` or ``.xml``).
        decoder_path: the decoder-step graph.
        threads: intra-op threads (None: the runtime's default).
        reuse_buffers: let the backend hand out decoder outputs in buffers it reuses (``OnnxRuntimeBackend``; the
            engine's search loop allows it); other runtimes ignore it.
        shortlist: decode with this vocabulary shortlist (ONNX Runtime; ``decoder_path`` is then the package's
            shortlist decoder).
        spin: let the decoder's worker threads spin between calls (ONNX Runtime; OpenVINO manages its own threads).

    Raises:
        ValueError: unknown runtime.
        BackendUnavailable: the runtime package is not installed.
        PackageError: the runtime cannot load a graph file (truncated or corrupt), naming the file.
    """
    if runtime == "onnxruntime":
        from serving.engine.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(encoder_path, decoder_path, threads, reuse_buffers=reuse_buffers, shortlist=shortlist,
                                  spin=spin)
    if shortlist is not None:
        raise ValueError(f"a vocabulary shortlist runs on onnxruntime only, not on {runtime}")
    if runtime == "openvino":
        from serving.engine.backends.openvino import OpenVinoBackend

        return OpenVinoBackend(encoder_path, decoder_path, threads)
    raise ValueError(f"unknown runtime {runtime!r} (supported runtimes are: onnxruntime, openvino)")
