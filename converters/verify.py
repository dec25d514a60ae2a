"""Parity checks shared by ``mtgate convert`` and ``mtgate verify``, and the ``mtgate verify`` subcommand.

Every artifact is run on the same deterministic inputs (fixed sentences through the package tokenizer, or fixed
pseudo-random ids when no tokenizer loads) and compared with a reference:

- fp32 artifacts: max abs difference of ``memory``, ``cross_kv`` and the teacher-forced decoder-step ``log_probs``
  (``DECODER_STEPS`` steps), plus greedy token agreement. ``convert`` compares with the numpy forward pass of the
  source weights (``converters/reference.py``); ``verify`` with the package's fp32 ONNX graphs on onnxruntime, or
  with the source checkpoint when ``--source`` is given.
- int8 artifacts: agreement with the fp32 ONNX graphs. Gated: next-token agreement (the fp32 greedy output is fed
  to the int8 decoder; fraction of steps where both pick the same arg-max), which measures the quantization error
  step by step. Reported: free-running greedy token agreement (positions with the same token; one early difference
  shifts the rest of a sentence, so it mostly counts sentences that diverge), identical sentences, log-prob diffs.

``mtgate verify DIR``: checksums of every file first (a modified file is named and the exit code is 1), then parity
of every artifact, printed as a table; exit 0 when every check passes, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.backends import Backend, create_backend, empty_past
from serving.package import PackageError, artifacts, read_manifest, verify_checksums

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
    special_ids: dict[str, Any], architecture: dict[str, Any], tokenizer: Any | None = None
) -> ParityInputs:
    """Build the parity inputs from the package tokenizer (when given) or fixed pseudo-random ids."""
    pad, eos, start = int(special_ids["pad"]), int(special_ids["eos"]), int(special_ids["decoder_start"])
    max_len = max(2, int(architecture["max_positions"]) - 1)
    specials = {pad, eos, start}
    rng = np.random.default_rng(1234)
    rows: list[list[int]] = []
    if tokenizer is not None:
        rows = [list(tokenizer.encode(s))[: max_len - 1] + [eos] for s in PARITY_SENTENCES]
    if not rows or any(len(r) < 2 for r in rows):
        tokenizer = None
        source_vocab = int(architecture["source_vocab_size"])
        candidates = np.array([i for i in range(source_vocab) if i not in specials] or [0], dtype=np.int64)
        lengths = [3, 5, 8, 12, 17, 24, 31, 40, 2, 6, 10, 14, 20, 27, 35, 9]
        rows = [rng.choice(candidates, size=min(n, max_len - 1)).tolist() + [eos] for n in lengths]
    width = max(len(r) for r in rows)
    source = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        source[i, : len(row)] = row
    target_vocab = int(architecture["target_vocab_size"])
    candidates = np.array([i for i in range(target_vocab) if i not in specials] or [0], dtype=np.int64)
    n_tf = min(TEACHER_FORCED_SENTENCES, len(rows))
    tf_source = source[:n_tf, : max(len(r) for r in rows[:n_tf])]
    steps = min(DECODER_STEPS, int(architecture["max_positions"]))
    target = np.empty((n_tf, steps), dtype=np.int64)
    target[:, 0] = start
    target[:, 1:] = rng.choice(candidates, size=(n_tf, steps - 1))
    return ParityInputs(source_ids=source, tf_source_ids=np.ascontiguousarray(tf_source), target_ids=target,
                        from_tokenizer=tokenizer is not None)


def decode_rules(manifest: dict[str, Any], inputs: ParityInputs) -> DecodeRules:
    special, decoding = manifest["special_ids"], manifest.get("decoding", {})
    cap = min(MAX_GREEDY_STEPS, int(decoding.get("max_length", MAX_GREEDY_STEPS)),
              int(manifest["architecture"]["max_positions"]))
    return DecodeRules(decoder_start=int(special["decoder_start"]), eos=int(special["eos"]),
                       bad_word_ids=tuple(int(i) for i in decoding.get("bad_word_ids", ())), max_steps=max(1, cap))


def greedy(backend: Backend, source_ids: np.ndarray, rules: DecodeRules) -> list[list[int]]:
    """Greedy search exactly as serving runs it (``serving.decoding.search``, beam 1), capped at ``max_steps``."""
    from serving.decoding import SearchOptions, search

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


# --- mtgate verify ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", type=Path, metavar="DIR", help="model package directory")
    parser.add_argument("--source", type=Path, default=None,
                        help="also compare the fp32 artifacts with this source checkpoint (Marian dir or T2T dir)")
    parser.add_argument("--threads", type=int, default=None, help="runtime threads (default: the runtime's)")
    parser.add_argument("--int8-floor", type=float, default=INT8_AGREEMENT_FLOOR,
                        help=f"minimum int8 next-token agreement with fp32 (default: {INT8_AGREEMENT_FLOOR})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--hparams-set", default=None, help="T2T source only: hparams set (as for convert)")
    parser.add_argument("--vocab", type=Path, default=None, help="T2T source only: .subwords vocab (as for convert)")
    parser.add_argument("--target-space-id", type=int, default=None, help="T2T source only (as for convert)")


def _load_tokenizer(package_dir: Path, manifest: dict[str, Any]) -> Any | None:
    try:
        from serving.tokenizers import load_tokenizer

        return load_tokenizer(package_dir, manifest["tokenizer"])
    except (ImportError, PackageError, KeyError) as e:
        logger.warning("parity inputs: tokenizer unavailable (%s); using fixed pseudo-random ids", e)
        return None


def run_parity(package_dir: Path, manifest: dict[str, Any], *, threads: int | None = None,
               source_backend: Backend | None = None, int8_floor: float = INT8_AGREEMENT_FLOOR) -> list[dict[str, Any]]:
    """Parity of every artifact of a (checksum-verified) package; one row per (artifact, reference)."""
    reference_files = manifest.get("reference") or {"encoder": "onnx/encoder.onnx", "decoder": "onnx/decoder.onnx"}
    inputs = make_parity_inputs(manifest["special_ids"], manifest["architecture"],
                                _load_tokenizer(package_dir, manifest))
    rules = decode_rules(manifest, inputs)
    onnx_fp32 = create_backend("onnxruntime", package_dir / reference_files["encoder"],
                               package_dir / reference_files["decoder"], threads)
    onnx_outputs = teacher_forced(onnx_fp32, inputs)
    onnx_tokens = greedy(onnx_fp32, inputs.source_ids, rules)
    rows: list[dict[str, Any]] = []
    if source_backend is not None:
        row = compare_fp32(onnx_fp32, source_backend, inputs, rules)
        rows.append({"artifact": "onnx fp32 graphs", "reference": "source"} | row)
    for artifact in artifacts(manifest):
        key = f"{artifact.runtime}/{artifact.precision}"
        backend = create_backend(artifact.runtime, package_dir / artifact.encoder, package_dir / artifact.decoder,
                                 threads)
        if artifact.precision == "int8":
            row = compare_int8(backend, onnx_fp32, inputs, rules, onnx_outputs, onnx_tokens, floor=int8_floor)
            rows.append({"artifact": key, "reference": "onnx fp32"} | row)
            continue
        if not (artifact.runtime == "onnxruntime" and artifact.encoder == reference_files["encoder"]):
            row = compare_fp32(backend, onnx_fp32, inputs, rules, onnx_outputs, onnx_tokens)
            rows.append({"artifact": key, "reference": "onnx fp32"} | row)
        if source_backend is not None and artifact.runtime != "onnxruntime":
            row = compare_fp32(backend, source_backend, inputs, rules)
            rows.append({"artifact": key, "reference": "source"} | row)
    return rows


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _format_table(rows: list[dict[str, Any]]) -> str:
    header = ("artifact", "reference", "memory diff", "log_probs diff", "next-token", "greedy", "identical",
              "result")
    lines = [header]
    for row in rows:
        next_token = row.get("next_token_agreement")
        lines.append((
            row["artifact"], row["reference"], f"{row['memory_max_abs']:.2e}", f"{row['log_probs_max_abs']:.2e}",
            _fraction(next_token), _fraction(row["greedy_token_agreement"]),
            _fraction(row["greedy_sentence_exact"]), "PASS" if row["passed"] else "FAIL",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines) + "\n"


def _source_backend(args: argparse.Namespace) -> Backend:
    from converters.base import ConversionError
    from converters.convert import load_source
    from converters.reference import ReferenceModel
    from serving.cli import UsageError

    options = {k: v for k, v in (("hparams_set", args.hparams_set), ("vocab", args.vocab),
                                 ("target_space_id", args.target_space_id)) if v is not None}
    try:
        loaded = load_source(args.source, options)
    except ConversionError as e:
        raise UsageError(str(e)) from e
    return ReferenceModel(loaded.spec)


def run(args: argparse.Namespace) -> int:
    from serving.cli import UsageError

    package_dir: Path = args.package
    try:
        manifest = read_manifest(package_dir)
    except PackageError as e:
        raise UsageError(str(e)) from e
    started = time.perf_counter()
    problems = verify_checksums(package_dir, manifest)
    if problems:
        for problem in problems:
            sys.stderr.write(f"mtgate verify: FAIL checksum {problem}\n")
        sys.stdout.write(f"checksums: FAIL ({len(problems)} file(s) missing or modified)\n")
        return 1
    n_files = len(manifest.get("files", {}))
    source = _source_backend(args) if args.source is not None else None
    rows = run_parity(package_dir, manifest, threads=args.threads, source_backend=source, int8_floor=args.int8_floor)
    passed = all(row["passed"] for row in rows)
    if args.json:
        sys.stdout.write(json.dumps({"checksums": {"files": n_files, "passed": True}, "parity": rows,
                                     "passed": passed}, indent=2) + "\n")
    else:
        reference = manifest.get("reference") or {"encoder": "onnx/encoder.onnx"}
        sys.stdout.write(f"checksums: OK ({n_files} files)\n")
        sys.stdout.write(f"reference: onnx fp32 = the package's fp32 ONNX graphs ({reference['encoder']}, ...) on "
                         f"onnxruntime{'; source = ' + str(args.source) if args.source else ''}\n")
        sys.stdout.write(_format_table(rows))
        sys.stdout.write(f"{'PASS' if passed else 'FAIL'} ({time.perf_counter() - started:.1f}s)\n")
    return 0 if passed else 1
