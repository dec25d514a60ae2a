"""Parity: does every artifact of a package compute what its reference computes? Used by ``mtgate convert`` (against
the numpy forward pass of the source weights) and ``mtgate verify`` (against the package's fp32 ONNX graphs, and the
source checkpoint with ``--source``).

Every artifact is run on the same deterministic inputs (fixed sentences through the package tokenizer, or fixed
pseudo-random ids when no tokenizer loads) and compared with a reference:

- fp32 artifacts: max abs difference of ``memory``, ``cross_kv``, the teacher-forced decoder-step ``log_probs``
  (``DECODER_STEPS`` steps) and the grown cache, gated by ``FP32_TOLERANCE``; plus greedy token agreement with the
  fp32 ONNX graphs (reported).
- int8 artifacts: agreement with the fp32 ONNX graphs. Gated: next-token agreement (the fp32 greedy output is fed
  to the int8 decoder; fraction of steps where both pick the same arg-max), which measures the quantization error
  step by step. Reported: free-running greedy token agreement (positions with the same token; one early difference
  shifts the rest of a sentence, so it mostly counts sentences that diverge), identical sentences, log-prob diffs.

:func:`compare_artifacts` is the one loop over a package's artifacts; :func:`run_parity` is what ``verify`` runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.backends import Backend, create_backend, empty_past
from serving.engine.tokenizers import Tokenizer, load_tokenizer
from serving.package import Architecture, Manifest, PackageError, SpecialIds, parse_manifest

logger = logging.getLogger(__name__)

# fp32 artifacts must match the reference within this (max abs, on memory, cross_kv and log_probs). Measured
# differences are ~1e-6 (float32 rounding); 1e-3 leaves room for deep/wide models without hiding a wrong graph,
# which shows up as differences of 1e-1 and more.
FP32_TOLERANCE = 1e-3
# int8 artifacts must pick the fp32 arg-max on at least this fraction of teacher-forced steps. Measured on
# random-weight Marian models (flat next-token distributions, the hardest case for quantization): 0.979-0.998 for
# onnxruntime int8, 0.992-0.998 for OpenVINO int8 (converters/quantize.py, converters/openvino.py); a broken
# quantization (wrong scales or a mis-mapped weight) falls far below, toward chance.
INT8_AGREEMENT_FLOOR = 0.9
DECODER_STEPS = 6
MAX_GREEDY_STEPS = 32
# Teacher-forced comparisons use the first sentences only: the float64 reference is slow on big models.
TEACHER_FORCED_SENTENCES = 8

# Fixed source sentences (English; varied lengths and punctuation) for parity runs through the package tokenizer.
PARITY_SENTENCES: tuple[str, ...] = (
    "Hello world.",
    "A man in a blue shirt is riding a bike.",
    "Two dogs are playing in the snow.",
    "The children are sitting on a bench in the park and eating ice cream.",
    "Yes.",
    "A woman with a red hat walks down the street while talking on her phone.",
    "Several people are waiting for the train at a busy station in the city center.",
    "What time is it?",
    "The old fisherman repaired his nets on the beach before the storm arrived in the evening.",
    "A little girl in a pink dress is climbing the stairs.",
    "Four men are working on the roof of a house.",
    "Is this the right way to the museum?",
    "A group of young musicians plays guitar and drums on a stage in front of a large crowd at night.",
    "The cat sleeps.",
    "A brown dog is running through the grass with a ball in its mouth.",
    "Two women are drinking coffee at a small table outside a cafe.",
)


@dataclass(frozen=True)
class ParityInputs:
    """Deterministic inputs: source ids ``[B, S]`` (EOS-terminated, right-padded) for greedy decoding; the first
    ``TEACHER_FORCED_SENTENCES`` of them (``tf_source_ids``) with teacher-forced decoder ids ``target_ids``
    ``[b, DECODER_STEPS]`` (column 0 is the decoder start id) for the output differences."""

    source_ids: np.ndarray
    tf_source_ids: np.ndarray
    target_ids: np.ndarray
    from_tokenizer: bool


@dataclass(frozen=True)
class DecodeRules:
    """What greedy parity decoding needs from the manifest."""

    decoder_start: int
    eos: int
    bad_word_ids: tuple[int, ...]
    max_steps: int


def make_parity_inputs(
    special_ids: SpecialIds, architecture: Architecture, tokenizer: Tokenizer | None = None
) -> ParityInputs:
    """Build the parity inputs from the package tokenizer (when given) or fixed pseudo-random ids."""
    pad, eos, start = special_ids.pad, special_ids.eos, special_ids.decoder_start
    max_len = max(2, architecture.max_positions - 1)
    specials = {pad, eos, start}
    rng = np.random.default_rng(1234)
    rows: list[list[int]] = []
    if tokenizer is not None:
        rows = [list(tokenizer.encode(s))[: max_len - 1] + [eos] for s in PARITY_SENTENCES]
    if not rows or any(len(r) < 2 for r in rows):
        tokenizer = None
        source_vocab = architecture.source_vocab_size
        candidates = np.array([i for i in range(source_vocab) if i not in specials] or [0], dtype=np.int64)
        lengths = [3, 5, 8, 12, 17, 24, 31, 40, 2, 6, 10, 14, 20, 27, 35, 9]
        rows = [rng.choice(candidates, size=min(n, max_len - 1)).tolist() + [eos] for n in lengths]
    width = max(len(r) for r in rows)
    source = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        source[i, : len(row)] = row
    target_vocab = architecture.target_vocab_size
    candidates = np.array([i for i in range(target_vocab) if i not in specials] or [0], dtype=np.int64)
    n_tf = min(TEACHER_FORCED_SENTENCES, len(rows))
    tf_source = source[:n_tf, : max(len(r) for r in rows[:n_tf])]
    steps = min(DECODER_STEPS, architecture.max_positions)
    target = np.empty((n_tf, steps), dtype=np.int64)
    target[:, 0] = start
    target[:, 1:] = rng.choice(candidates, size=(n_tf, steps - 1))
    return ParityInputs(source_ids=source, tf_source_ids=np.ascontiguousarray(tf_source), target_ids=target,
                        from_tokenizer=tokenizer is not None)


def decode_rules(manifest: Manifest) -> DecodeRules:
    """Greedy parity decoding's rules: the package's ids and bad words, at most ``MAX_GREEDY_STEPS`` steps."""
    special, decoding = manifest.special_ids, manifest.decoding
    cap = min(MAX_GREEDY_STEPS, decoding.max_length, manifest.architecture.max_positions)
    return DecodeRules(decoder_start=special.decoder_start, eos=special.eos, bad_word_ids=decoding.bad_word_ids,
                       max_steps=max(1, cap))


def greedy(backend: Backend, source_ids: np.ndarray, rules: DecodeRules) -> list[list[int]]:
    """Greedy search exactly as serving runs it (``serving.engine.decoding.search``, beam 1), capped at ``max_steps``."""
    from serving.engine.decoding import SearchOptions, search

    enc = backend.encode(source_ids)
    options = SearchOptions(eos_id=rules.eos, decoder_start_id=rules.decoder_start, beam_size=1,
                            bad_word_ids=rules.bad_word_ids)
    caps = np.full(source_ids.shape[0], rules.max_steps, dtype=np.int64)
    return [list(h.token_ids) for h in search(backend, enc.cross_kv, enc.src_bias, caps, options)]


def token_agreement(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> tuple[float, float]:
    """(positions with the same token / positions in the longer of each pair, fraction of identical sentences)."""
    same = total = exact = 0
    for h, r in zip(hyps, refs, strict=True):
        same += sum(1 for a, b in zip(h, r, strict=False) if a == b)
        total += max(len(h), len(r), 1)
        exact += int(list(h) == list(r))
    return same / max(total, 1), exact / max(len(refs), 1)


def next_token_agreement(backend: Backend, source_ids: np.ndarray, rules: DecodeRules,
                         ref_tokens: Sequence[Sequence[int]]) -> float:
    """Feed ``ref_tokens`` (a greedy output) and count the steps where ``backend`` picks the same next token."""
    batch = source_ids.shape[0]
    width = max((len(t) for t in ref_tokens), default=0)
    if width == 0:
        return 1.0
    ref = np.full((batch, width), rules.eos, dtype=np.int64)
    valid = np.zeros((batch, width), dtype=bool)
    for i, tokens in enumerate(ref_tokens):
        ref[i, : len(tokens)] = tokens
        valid[i, : len(tokens)] = True
    fed = np.concatenate([np.full((batch, 1), rules.decoder_start, dtype=np.int64), ref[:, :-1]], axis=1)
    enc = backend.encode(source_ids)
    past = empty_past(enc.cross_kv)
    bad = np.array(rules.bad_word_ids, dtype=np.int64)
    same = 0
    for step in range(width):
        log_probs, past = backend.decode_step(fed[:, step : step + 1], step, past, enc.cross_kv, enc.src_bias)
        if bad.size:
            log_probs = np.array(log_probs, dtype=np.float32)
            log_probs[:, bad] = -np.inf
        same += int(((log_probs.argmax(axis=-1) == ref[:, step]) & valid[:, step]).sum())
    return same / int(valid.sum())


def teacher_forced(backend: Backend, inputs: ParityInputs) -> dict[str, np.ndarray]:
    """Encoder outputs and the decoder's log_probs ``[B, steps, V]`` fed ``inputs.target_ids``."""
    enc = backend.encode(inputs.tf_source_ids)
    past = empty_past(enc.cross_kv)
    steps = []
    for step in range(inputs.target_ids.shape[1]):
        log_probs, past = backend.decode_step(inputs.target_ids[:, step : step + 1], step, past, enc.cross_kv,
                                              enc.src_bias)
        steps.append(np.asarray(log_probs))
    return {"memory": enc.memory, "cross_kv": enc.cross_kv, "log_probs": np.stack(steps, axis=1),
            "present_kv": np.asarray(past)}


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    # Finite-only: -inf log-probs (masked ids) on both sides are equal, not NaN.
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    diff = np.where(both_inf, 0.0, np.abs(a.astype(np.float64) - b.astype(np.float64)))
    return float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0


def compare_fp32(candidate: Backend, reference: Backend, inputs: ParityInputs, rules: DecodeRules,
                 reference_outputs: dict[str, np.ndarray] | None = None,
                 greedy_tokens: list[list[int]] | None = None) -> dict[str, Any]:
    """Max abs output differences of an fp32 artifact against a reference backend (gated), and its greedy
    agreement with ``greedy_tokens`` when given (reported)."""
    ref = reference_outputs if reference_outputs is not None else teacher_forced(reference, inputs)
    got = teacher_forced(candidate, inputs)
    agreement = exact = None
    if greedy_tokens is not None:
        agreement, exact = token_agreement(greedy(candidate, inputs.source_ids, rules), greedy_tokens)
    result: dict[str, Any] = {name + "_max_abs": _max_abs(got[name], ref[name])
                              for name in ("memory", "cross_kv", "log_probs", "present_kv")}
    result |= {"greedy_token_agreement": agreement, "greedy_sentence_exact": exact, "tolerance": FP32_TOLERANCE}
    result["passed"] = all(result[k] <= FP32_TOLERANCE for k in result if k.endswith("_max_abs"))
    return result


def compare_int8(candidate: Backend, fp32: Backend, inputs: ParityInputs, rules: DecodeRules,
                 fp32_outputs: dict[str, np.ndarray] | None = None,
                 fp32_tokens: list[list[int]] | None = None, floor: float = INT8_AGREEMENT_FLOOR) -> dict[str, Any]:
    """Agreement of an int8 artifact with fp32 (gated on next-token agreement; the rest is informational)."""
    ref = fp32_outputs if fp32_outputs is not None else teacher_forced(fp32, inputs)
    got = teacher_forced(candidate, inputs)
    ref_tokens = fp32_tokens if fp32_tokens is not None else greedy(fp32, inputs.source_ids, rules)
    agreement, exact = token_agreement(greedy(candidate, inputs.source_ids, rules), ref_tokens)
    next_token = next_token_agreement(candidate, inputs.source_ids, rules, ref_tokens)
    return {
        "next_token_agreement": next_token,
        "greedy_token_agreement": agreement,
        "greedy_sentence_exact": exact,
        "memory_max_abs": _max_abs(got["memory"], ref["memory"]),
        "log_probs_max_abs": _max_abs(got["log_probs"], ref["log_probs"]),
        "agreement_floor": floor,
        "passed": next_token >= floor,
    }


# --- one package, every artifact -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """What fp32 artifacts are compared with: ``backend`` (the source model, or the package's fp32 ONNX graphs),
    named ``label`` in the rows."""

    label: str
    backend: Backend


@dataclass(frozen=True)
class ParityRow:
    """One comparison: ``artifact`` (``runtime/precision``, or ``"onnx fp32 graphs"``) against ``reference``."""

    artifact: str
    reference: str
    result: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "reference": self.reference} | self.result


@dataclass(frozen=True)
class ParityRun:
    """The shared part of a parity run: inputs, decoding rules, and the package's fp32 ONNX graphs (``graphs``,
    on onnxruntime) with their teacher-forced outputs and greedy tokens, which int8 artifacts are compared with."""

    inputs: ParityInputs
    rules: DecodeRules
    graphs: Backend
    graph_outputs: dict[str, np.ndarray]
    graph_tokens: list[list[int]]


REFERENCE_GRAPHS = "onnx fp32 graphs"


def start_run(root: Path, manifest: Manifest, threads: int | None = None) -> ParityRun:
    """Parity inputs (through the package's tokenizer when it loads) and the fp32 ONNX graphs' own results."""
    inputs = make_parity_inputs(manifest.special_ids, manifest.architecture, _tokenizer(root, manifest))
    rules = decode_rules(manifest)
    graphs = create_backend("onnxruntime", root / manifest.reference["encoder"], root / manifest.reference["decoder"],
                            threads)
    return ParityRun(inputs, rules, graphs, teacher_forced(graphs, inputs), greedy(graphs, inputs.source_ids, rules))


def _tokenizer(root: Path, manifest: Manifest) -> Tokenizer | None:
    try:
        return load_tokenizer(root, manifest.tokenizer.to_dict())
    except (ImportError, PackageError) as e:  # parity still runs, on fixed ids, without a tokenizer
        logger.warning("parity inputs: tokenizer unavailable (%s); using fixed pseudo-random ids", e)
        return None


def compare_artifacts(root: Path, manifest: Manifest, run: ParityRun, references: Sequence[Reference], *,
                      threads: int | None = None, int8_floor: float = INT8_AGREEMENT_FLOOR) -> list[ParityRow]:
    """Compare the fp32 ONNX graphs with every reference but themselves, then every artifact: fp32 ones with each
    reference (greedy agreement with the graphs on the first row), int8 ones with the graphs.

    Arguments:
        root: the package directory (or the staging directory of one being written).
        manifest: its manifest.
        run: from :func:`start_run`.
        references: fp32 references, in order; ``run.graphs`` may be one of them.
        threads: runtime threads (None: the runtime's default).
        int8_floor: the least next-token agreement an int8 artifact passes with.
    """
    outputs = {ref.label: run.graph_outputs if ref.backend is run.graphs else teacher_forced(ref.backend, run.inputs)
               for ref in references}
    rows = [ParityRow(REFERENCE_GRAPHS, ref.label, compare_fp32(run.graphs, ref.backend, run.inputs, run.rules,
                                                               outputs[ref.label]))
            for ref in references if ref.backend is not run.graphs]
    reference_files = (manifest.reference["encoder"], manifest.reference["decoder"])
    for artifact in manifest.artifacts:
        if artifact.runtime == "onnxruntime" and (artifact.encoder, artifact.decoder) == reference_files:
            continue  # the graphs themselves: the rows above
        backend = create_backend(artifact.runtime, root / artifact.encoder, root / artifact.decoder, threads)
        if artifact.precision == "int8":
            result = compare_int8(backend, run.graphs, run.inputs, run.rules, run.graph_outputs, run.graph_tokens,
                                  floor=int8_floor)
            rows.append(ParityRow(artifact.key, "onnx fp32", result))
            continue
        for n, ref in enumerate(references):
            result = compare_fp32(backend, ref.backend, run.inputs, run.rules, outputs[ref.label],
                                  run.graph_tokens if n == 0 else None)
            rows.append(ParityRow(artifact.key, ref.label, result))
    return rows


def run_parity(package_dir: Path, manifest: Manifest | Mapping[str, Any], *, threads: int | None = None,
               source_backend: Backend | None = None, int8_floor: float = INT8_AGREEMENT_FLOOR) -> list[dict[str, Any]]:
    """Parity of every artifact of a (checksum-verified) package against its fp32 ONNX graphs, and against the
    source model when ``source_backend`` is given; one row (a dict with ``artifact`` and ``reference``) per
    comparison."""
    if not isinstance(manifest, Manifest):
        manifest = parse_manifest(manifest)
    run = start_run(package_dir, manifest, threads)
    references = [Reference("onnx fp32", run.graphs)]
    if source_backend is not None:
        references.append(Reference("source", source_backend))
    rows = compare_artifacts(package_dir, manifest, run, references, threads=threads, int8_floor=int8_floor)
    return [row.as_dict() for row in rows]
