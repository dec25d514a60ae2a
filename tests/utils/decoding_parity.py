"""Decode the same inputs two ways and compare: transformers' ``generate`` and mtgate's search over a backend.

``CASES`` are the decoding settings the converter tests check (greedy, beam 4, a length penalty, forced EOS and bad
words as opus-mt sets them); ``generate_tokens`` runs ``model.generate`` with them, ``search_tokens`` runs
``serving.engine.decoding.search`` with the same settings over any backend (ONNX Runtime, OpenVINO, the source framework's
forward pass or an independent numpy one through tests/utils/prefix_backend.py).
Both return each hypothesis' generated ids up to and including EOS. ``package_backend`` opens a converted package's
fp32 graphs as the backend ``search_tokens`` drives; ``assert_forward_matches`` compares its encoder outputs and
teacher-forced decoder steps with a reference's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.backends import Backend, create_backend, empty_past
from serving.engine.decoding import SearchOptions, search
from serving.package import open_package


@dataclass(frozen=True)
class Case:
    beam: int
    length_penalty: float = 1.0
    forced_eos: bool = False
    bad_pad: bool = False
    early_stopping: bool = False


CASES: dict[str, Case] = {
    "greedy": Case(1),
    "beam4": Case(4),
    "beam4-lp0.6-forced-eos-bad-words": Case(4, length_penalty=0.6, forced_eos=True, bad_pad=True),
    "beam4-lp2-early-stopping": Case(4, length_penalty=2.0, early_stopping=True),
}


def generate_tokens(model: Any, input_ids: np.ndarray, pad: int, eos: int, case: Case,
                    max_length: int) -> tuple[list[list[int]], list[float] | None]:
    """``model.generate`` (``max_length`` counts the start token, as in transformers): tokens and beam scores."""
    import torch

    kwargs: dict[str, Any] = {
        "num_beams": case.beam, "max_length": max_length, "length_penalty": case.length_penalty,
        "early_stopping": case.early_stopping, "forced_eos_token_id": eos if case.forced_eos else None,
        "bad_words_ids": [[pad]] if case.bad_pad else None, "do_sample": False, "num_return_sequences": 1,
        "renormalize_logits": False, "min_length": 0, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
    }
    with torch.no_grad():
        out = model.generate(torch.from_numpy(input_ids), attention_mask=torch.from_numpy(input_ids != pad).long(),
                             output_scores=True, return_dict_in_generate=True, **kwargs)
    tokens = []
    for row in out.sequences[:, 1:].tolist():
        tokens.append(row[: row.index(eos) + 1] if eos in row else [t for t in row if t != pad])
    scores = out.sequences_scores.tolist() if case.beam > 1 else None
    return tokens, scores


def search_tokens(backend: Any, input_ids: np.ndarray, start: int, eos: int, pad: int, case: Case,
                  max_steps: int) -> tuple[list[list[int]], list[float]]:
    """mtgate's search over ``backend`` with the case's settings, at most ``max_steps`` generated tokens."""
    encoded = backend.encode(input_ids)
    options = SearchOptions(eos_id=eos, decoder_start_id=start, beam_size=case.beam,
                            length_penalty=case.length_penalty, bad_word_ids=(pad,) if case.bad_pad else (),
                            forced_eos=case.forced_eos, early_stopping=case.early_stopping)
    caps = np.full(input_ids.shape[0], max_steps, dtype=np.int64)
    hypotheses = search(backend, encoded.cross_kv, encoded.src_bias, caps, options)
    return [list(h.token_ids) for h in hypotheses], [float(h.score or 0.0) for h in hypotheses]


def package_backend(package: Path, runtime: str = "onnxruntime") -> Backend:
    """The package's fp32 graphs on ``runtime``, one thread."""
    pkg = open_package(package)
    artifact = pkg.artifact(runtime, "fp32")
    return create_backend(runtime, pkg.path(artifact.encoder), pkg.path(artifact.decoder), threads=1)


def assert_forward_matches(package: Path, runtimes: Sequence[str], input_ids: np.ndarray, targets: np.ndarray,
                           memory: np.ndarray, log_probs: np.ndarray, mask: np.ndarray | None, tol: float) -> None:
    """On each of ``runtimes`` the package's encoder gives ``memory`` (compared where ``mask`` is set; None:
    everywhere) and its decoder, fed ``targets [B, T]`` a step at a time from an empty cache, ``log_probs [B, T, V]``;
    each within ``tol``."""
    for runtime in runtimes:
        backend = package_backend(package, runtime)
        enc = backend.encode(input_ids)
        gap = np.abs(enc.memory - memory)
        assert (gap if mask is None else gap[mask]).max() <= tol, runtime
        past = empty_past(enc.cross_kv)
        for step in range(targets.shape[1]):
            got, past = backend.decode_step(targets[:, step : step + 1], step, past, enc.cross_kv, enc.src_bias)
            assert np.abs(got - log_probs[:, step]).max() <= tol, (runtime, step)
