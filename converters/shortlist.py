"""Building a package's vocabulary shortlist (``serving.engine.shortlist``) from parallel data, at conversion.

For each source token, the candidates are the target tokens that most often occur in the translations of sentences
holding it: ``count(s, t) / count(s)`` over sentence pairs (each token counted once per sentence), best first, at
most ``candidates`` of them, the always-allowed tokens left out (they are in every sentence's set anyway). Every
sentence may use the ``frequent`` most frequent target tokens of the corpus, EOS and UNK; with shared vocabularies a
source token is also a candidate for itself (names and numbers are copied). No aligner is needed: a corpus of a
few tens of thousands of pairs is counted in seconds.

The converter then writes a shortlist decoder per ONNX Runtime artifact and, when given evaluation data (sources
and references), translates it with and without the shortlist and records the BLEU of both, how many translations
are identical and the decoding time of each, in the manifest's ``shortlist`` section.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import ConversionError
from converters.spec import TransformerSpec
from serving.engine.shortlist import Shortlist
from serving.engine.tokenizers import load_tokenizer
from serving.package import Artifact, Manifest, SpecialIds, write_manifest
from serving.package.text_files import CorpusError, read_lines

logger = logging.getLogger(__name__)

TABLE = "shortlist/table.npz"
DEFAULT_CANDIDATES = 50
DEFAULT_FREQUENT = 500


@dataclass(frozen=True)
class ShortlistRequest:
    """What ``mtgate convert --shortlist-corpus`` asked for.

    Attributes:
        corpus: parallel text, one sentence per line: (source file, target file), plain or gzip.
        candidates: candidates per source token.
        frequent: the most frequent target tokens every sentence may use.
        evaluation: (source file, reference file) to measure the shortlist's BLEU cost on, or None.
        max_sentences: at most this many corpus pairs are counted (None: all).
    """

    corpus: tuple[Path, Path]
    candidates: int = DEFAULT_CANDIDATES
    frequent: int = DEFAULT_FREQUENT
    evaluation: tuple[Path, Path] | None = None
    max_sentences: int | None = None


def read_pairs(source: Path, target: Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """Parallel lines of two files, plain text or gzip (``serving.package.text_files.read_lines``, blank lines kept so that the
    files stay aligned; the first ``limit``).

    Raises:
        ConversionError: unreadable, not UTF-8, no sentence, or the two files have different numbers of lines.
    """
    try:
        sources, targets = read_lines(source, keep_empty=True), read_lines(target, keep_empty=True)
    except CorpusError as e:
        raise ConversionError(str(e)) from e
    if len(sources) != len(targets):
        raise ConversionError(f"{source} has {len(sources)} lines and {target} {len(targets)}: not parallel")
    return sources[:limit], targets[:limit]


def build_table(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, source_vocab: int,
                target_vocab: int, always: Sequence[int], candidates: int, frequent: int,
                copy_source: bool) -> Shortlist:
    """The shortlist of tokenized parallel sentences (module docstring).

    Arguments:
        sources: source ids per sentence.
        targets: target ids per sentence.
        source_vocab: source vocabulary size.
        target_vocab: target vocabulary size.
        always: target ids every sentence may use besides the frequent ones (EOS, UNK).
        candidates: candidates per source token.
        frequent: most frequent target tokens every sentence may use.
        copy_source: a source token is a candidate for itself (shared vocabularies).
    """
    pair_keys: list[np.ndarray] = []
    source_count = np.zeros(source_vocab, dtype=np.int64)
    target_count = np.zeros(target_vocab, dtype=np.int64)
    for source, target in zip(sources, targets, strict=True):
        s = np.unique(np.asarray(source, dtype=np.int64))
        t = np.unique(np.asarray(target, dtype=np.int64))
        s, t = s[(s >= 0) & (s < source_vocab)], t[(t >= 0) & (t < target_vocab)]
        source_count[s] += 1
        target_count[t] += 1
        pair_keys.append((s[:, None] * target_vocab + t[None, :]).reshape(-1))
    allowed = {int(i) for i in always if 0 <= i < target_vocab}
    by_frequency = [int(i) for i in np.argsort(-target_count, kind="stable") if target_count[i] > 0
                    and int(i) not in allowed]
    allowed |= set(by_frequency[:frequent])
    always_ids = np.array(sorted(allowed), dtype=np.int64)

    keys, counts = np.unique(np.concatenate(pair_keys) if pair_keys else np.zeros(0, np.int64), return_counts=True)
    s, t = keys // target_vocab, keys % target_vocab
    keep = ~np.isin(t, always_ids)
    s, t, counts = s[keep], t[keep], counts[keep]
    score = counts / source_count[s]
    order = np.lexsort((t, -score, s))  # by source, best first, ties by id
    s, t = s[order], t[order]
    rank = np.arange(s.size) - np.searchsorted(s, s)  # position within its source's run
    s, t = s[rank < candidates], t[rank < candidates]
    if copy_source:
        own = np.arange(min(source_vocab, target_vocab))
        own = own[~np.isin(own, always_ids)]
        pairs = np.unique(np.concatenate([s * target_vocab + t, own * target_vocab + own]))
        s, t = pairs // target_vocab, pairs % target_vocab
    offsets = np.zeros(source_vocab + 1, dtype=np.int64)
    np.add.at(offsets, s + 1, 1)
    return Shortlist(np.cumsum(offsets), t.astype(np.int64), always_ids, target_vocab)


def add_shortlist(package: Path, manifest: Manifest, spec: TransformerSpec, request: ShortlistRequest,
                  say: Callable[[str], None]) -> Manifest:
    """Build the table from ``request.corpus``, write it and a shortlist decoder per ONNX Runtime artifact (from
    ``spec``) into the package being written at ``package``, check the decoders and measure the shortlist on
    ``request.evaluation``; return the manifest with them.

    Raises:
        ConversionError: no ONNX Runtime artifact, unreadable data, or a decoder that cannot keep a stationary cache.
    """
    runtimes = [a for a in manifest.artifacts if a.runtime == "onnxruntime"]
    if not runtimes:
        raise ConversionError("a vocabulary shortlist runs on onnxruntime: convert with --runtimes including it")
    arch = manifest.architecture
    tokenizer = load_tokenizer(package, manifest.tokenizer.to_dict())
    say(f"building the vocabulary shortlist from {request.corpus[0]}")
    started = time.perf_counter()
    sources, targets = read_pairs(*request.corpus, request.max_sentences)
    ids = manifest.special_ids
    source_ids = [tokenizer.encode(line) for line in sources]
    target_ids = [tokenizer.encode_target(line) for line in targets]
    table = build_table(source_ids, target_ids, source_vocab=arch.source_vocab_size, target_vocab=arch.target_vocab_size,
                        always=[i for i in (ids.eos, ids.unk) if i is not None], candidates=request.candidates,
                        frequent=request.frequent, copy_source=arch.shared_embeddings)
    table.save(package / TABLE)
    built = time.perf_counter() - started
    from converters.onnx_emitter import emit_decoder
    from converters.quantize import quantize_onnx_int8

    try:
        fp32 = emit_decoder(spec, package / "onnx" / "decoder.shortlist.onnx", "stationary", shortlist=True)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    artifacts = []
    for artifact in manifest.artifacts:
        path = None
        if artifact.runtime == "onnxruntime":
            path = fp32 if artifact.precision == "fp32" else quantize_onnx_int8(
                fp32, package / "onnx" / f"decoder.shortlist.{artifact.precision}.onnx")
        artifacts.append(dataclasses.replace(
            artifact, shortlist_decoder=None if path is None else path.relative_to(package).as_posix()))
    if not any(a.key == "onnxruntime/fp32" for a in artifacts):
        fp32.unlink()  # only its int8 version was asked for
    section: dict[str, Any] = {
        "table": TABLE,
        "corpus": {"source": str(request.corpus[0]), "target": str(request.corpus[1]), "sentences": len(sources)},
        "candidates_per_token": request.candidates,
        "frequent_targets": request.frequent,
        "always_allowed": int(table.always.size),
        "mean_candidates_per_source_token": round(float(table.targets.size) / max(1, table.source_vocab), 2),
        "build_seconds": round(built, 2),
    }
    say("checking the shortlist decoders against the decoders")
    section["parity"] = {a.key: decoder_parity(package, a, table, ids, source_ids[:8], target_ids[:8])
                         for a in artifacts if a.shortlist_decoder is not None}
    manifest = dataclasses.replace(manifest, artifacts=tuple(artifacts), shortlist=section)
    if request.evaluation is not None:
        say(f"measuring the shortlist on {request.evaluation[0]}")
        section["evaluation"] = evaluate(package, manifest, table, request.evaluation)
    return manifest


PARITY_TOLERANCE = 1e-3  # float32 log-probs of the same graph but for the gathered projection
PARITY_STEPS = 12


def decoder_parity(package: Path, artifact: Artifact, table: Shortlist, ids: SpecialIds,
                   sources: list[list[int]], targets: list[list[int]]) -> dict[str, Any]:
    """The artifact's shortlist decoder, asked for every id, against its decoder: the same teacher-forced steps
    (``sources`` and ``targets``, the corpus's first sentence pairs tokenized) through both. float32 must agree within ``PARITY_TOLERANCE``; int8 reports
    its next-token agreement (its projection is quantized per row, the decoder's by ONNX Runtime's quantizer).

    Raises:
        ConversionError: a float32 shortlist decoder that computes something else than the decoder.
    """
    from serving.engine.backends.base import empty_past
    from serving.engine.backends.onnxruntime import OnnxRuntimeBackend

    assert artifact.shortlist_decoder is not None
    full = OnnxRuntimeBackend(package / artifact.encoder, package / artifact.decoder, threads=1)
    short = OnnxRuntimeBackend(package / artifact.encoder, package / artifact.shortlist_decoder, threads=1,
                               shortlist=table)
    source_ids = [[*source, ids.eos] for source in sources]
    target_ids = [[ids.decoder_start, *target][:PARITY_STEPS] for target in targets]
    width, steps = max(map(len, source_ids)), min(map(len, target_ids))
    input_ids = np.array([s + [ids.pad] * (width - len(s)) for s in source_ids], dtype=np.int64)
    encoded = full.encode(input_ids)
    pasts = [empty_past(encoded.cross_kv)] * 2
    worst, agree, total = 0.0, 0, 0
    for step in range(steps):
        tokens = np.array([[t[step]] for t in target_ids], dtype=np.int64)
        outputs = [backend.decode_step(tokens, step, past, encoded.cross_kv, encoded.src_bias)
                   for backend, past in zip((full, short), pasts, strict=True)]
        (expected, _), (got, _) = outputs
        pasts = [present for _, present in outputs]
        worst = max(worst, float(np.abs(expected - got).max()))
        agree += int((expected.argmax(axis=1) == got.argmax(axis=1)).sum())
        total += expected.shape[0]
    result: dict[str, Any] = {"sentences": len(source_ids), "decoder_steps": steps,
                              "log_probs_max_abs": round(worst, 6), "next_token_agreement": round(agree / total, 4)}
    if artifact.precision == "fp32":
        result["tolerance"] = PARITY_TOLERANCE
        if not worst <= PARITY_TOLERANCE:
            raise ConversionError(f"{artifact.shortlist_decoder}: log-probs differ from {artifact.decoder}'s by "
                                  f"{worst:.3g} > {PARITY_TOLERANCE:g}")
    return result


def evaluate(package: Path, manifest: Manifest, table: Shortlist, data: tuple[Path, Path]) -> dict[str, Any]:
    """BLEU (sacrebleu, default 13a tokenization) of the package's ONNX Runtime artifact (int8 when there is one)
    on ``data``, without and with the shortlist, at the package's decoding defaults; the share of identical
    translations, the mean number of target ids a sentence may use, and the decoding time of each."""
    try:
        import sacrebleu
    except ImportError as e:  # pragma: no cover - sacrebleu comes with the convert extra
        raise ConversionError("measuring a shortlist needs sacrebleu (pip install 'mtgate[convert]')") from e
    from serving.engine.translator import Translator

    sources, references = read_pairs(*data)
    artifact = next(a for a in sorted(manifest.artifacts, key=lambda a: a.precision != "int8")
                    if a.shortlist_decoder is not None)
    write_manifest(package, manifest)  # loadable as it is now; the final manifest replaces this one
    result: dict[str, Any] = {"data": str(data[0]), "references": str(data[1]), "sentences": len(sources),
                              "artifact": artifact.key}
    outputs: dict[bool, list[str]] = {}
    for shortlist in (False, True):
        translator = Translator.load(package, artifact.runtime, artifact.precision, shortlist=shortlist)
        started = time.perf_counter()
        outputs[shortlist] = [t.text for t in translator.translate(sources)]
        seconds = time.perf_counter() - started
        bleu = sacrebleu.corpus_bleu(outputs[shortlist], [references]).score
        key = "shortlist" if shortlist else "full_vocabulary"
        result[key] = {"bleu": round(bleu, 2), "seconds": round(seconds, 2)}
        if shortlist:
            allowed = [int(table.candidates(np.asarray([ids])).sum()) for ids in translator.encode(sources)]
            result[key]["mean_allowed_ids_per_sentence"] = round(float(np.mean(allowed)), 1)
    result["bleu_cost"] = round(result["full_vocabulary"]["bleu"] - result["shortlist"]["bleu"], 2)
    result["identical_translations"] = round(
        sum(a == b for a, b in zip(outputs[False], outputs[True], strict=True)) / len(sources), 4)
    logger.info("shortlist: BLEU %.2f -> %.2f, %.1f%% identical", result["full_vocabulary"]["bleu"],
                result["shortlist"]["bleu"], 100 * result["identical_translations"])
    return result

