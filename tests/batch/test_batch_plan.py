"""batch-score's local worker and the one planner: a chunk is prepared once (tokenized once, seeded by position, as
the server prepares a request), cut by the engine's planner under the budget the engine was loaded with (so the
engine runs each batch as it is), and ``--score-references`` scores the ids the chunk was prepared with. The options
are parsed once where the command line is read and travel as one ``DecodeOptions``; the job's fingerprint is what it
was (an unfinished run resumes)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batch.cli import build_parser
from batch.engines import decoding_of, options_of
from batch.job import EngineConfig
from batch.records import Translated
from batch.workers import LocalChunkWorker
from serving.engine.planner import BatchBudget, in_order
from serving.engine.request import DecodeOptions
from serving.engine.translator import Translator
from tests.fakes import CountingTokenizer
from tests.utils.marian_factory import corpus

SOURCES = corpus("en")[:10]
REFERENCES = corpus("de")[:10]


def _spy(translator: Translator) -> tuple[list[int], list[tuple[list[np.ndarray], list[int], int]]]:
    """Count ``prepare`` calls and record every plan the engine makes."""
    prepares: list[int] = []
    plans: list[tuple[list[np.ndarray], list[int], int]] = []
    prepare, batches = translator.prepare, translator._batches

    def counted(texts: Any, options: Any = None, target_prefix: Any = None) -> Any:
        prepares.append(len(texts))
        return prepare(texts, options, target_prefix)

    def recorded(lengths: np.ndarray, beam_size: int) -> list[np.ndarray]:
        plan = batches(lengths, beam_size)
        plans.append((plan, lengths.tolist(), beam_size))
        return plan

    translator.prepare = counted  # type: ignore[method-assign]
    translator._batches = recorded  # type: ignore[method-assign]
    return prepares, plans


def test_a_chunk_is_prepared_once_cut_once_and_its_ids_reused_for_references(tiny_onnx_package: Path) -> None:
    translator = Translator.load(tiny_onnx_package, threads=1, max_batch_size=64, max_batch_tokens=60)
    translator.tokenizer = CountingTokenizer(translator.tokenizer)
    prepares, plans = _spy(translator)
    options = DecodeOptions(beam_size=4, max_length=8)
    worker = LocalChunkWorker(translator, options, max_tokens=60, max_batch_size=64)
    progress: list[int] = []
    outcomes = worker.translate_chunk(list(SOURCES), progress.append, list(REFERENCES))
    assert prepares == [len(SOURCES)]  # one prepare for the chunk
    assert translator.tokenizer.calls == len(SOURCES)  # each source tokenized once, references scored on its ids
    assert sum(progress) == len(SOURCES)
    budget = BatchBudget(64, 60)
    assert len(plans) >= 3  # 10 sentences x 4 beams: several batches
    for plan, lengths, beams in plans:  # the engine runs every batch the worker cut as it is
        assert beams == 4 and len(plan) == 1 and in_order(plan[0]) and plan[0].size == len(lengths)
        assert len(lengths) == 1 or budget.fits(len(lengths), max(lengths), 4)
    want = Translator.load(tiny_onnx_package, threads=1).translate(SOURCES, options)
    scores = Translator.load(tiny_onnx_package, threads=1).score(SOURCES, REFERENCES)
    for outcome, translation, score in zip(outcomes, want, scores, strict=True):
        assert isinstance(outcome, Translated) and outcome.text == translation.text
        assert outcome.ref_tokens == score.tokens and outcome.ref_log_prob == pytest.approx(score.log_prob, abs=1e-4)


def test_a_refused_record_keeps_every_other_record_at_its_seed_stream(tiny_onnx_package: Path) -> None:
    translator = Translator.load(tiny_onnx_package, threads=1)
    long = " ".join(["the man rides a bike"] * 40)
    assert len(translator.encode([long])[0]) > translator.info.max_input_tokens
    options = DecodeOptions(temperature=0.9, top_k=8, seed=11, max_length=10)
    chunk: list[Any] = [SOURCES[0], long, SOURCES[2], SOURCES[3]]
    worker = LocalChunkWorker(translator, options, max_tokens=2048, max_batch_size=64)
    outcomes = worker.translate_chunk(chunk, lambda n: None)
    assert isinstance(outcomes[1], str) and outcomes[1].startswith("source has ")
    # sentence i samples with the i-th stream of the seed, whatever else the chunk holds
    want = translator.translate([SOURCES[0], SOURCES[1], SOURCES[2], SOURCES[3]], options)
    assert [o.text for o in outcomes if isinstance(o, Translated)] == [want[i].text for i in (0, 2, 3)]
    ids = [tuple(translator.tokenizer.encode(s)) for s in (SOURCES[0], SOURCES[2])]
    mixed = worker.translate_chunk([ids[0], long, SOURCES[1], ids[1]], lambda n: None)  # ids and text in one chunk
    want = translator.translate([SOURCES[0], SOURCES[0], SOURCES[1], SOURCES[2]], options)
    assert [o.text if isinstance(o, Translated) else None for o in mixed] == [want[0].text, None, want[2].text,
                                                                               want[3].text]


def test_the_options_are_parsed_once_and_the_fingerprint_is_unchanged(tiny_onnx_package: Path) -> None:
    args = build_parser().parse_args(["in.txt", "--beam-size", "3", "--min-length", "2", "--target-prefix", "Ein"])
    options = options_of(args)
    config = EngineConfig.of(options, args.target_prefix, model_dir=tiny_onnx_package)
    assert config.options() is options  # kept, not rebuilt from pairs
    old_style = EngineConfig(model_dir=tiny_onnx_package, beam_size=3, decoding=decoding_of(args))
    assert config == old_style and config.fingerprint() == old_style.fingerprint()
    assert config.fingerprint() == {
        "beam_size": 3, "max_length": None, "max_tokens": 2048, "max_batch_size": 64,
        "decoding": {"min_length": 2, "target_prefix": "Ein"}, "model_dir": str(tiny_onnx_package.resolve()),
        "manifest_sha256": config.fingerprint()["manifest_sha256"], "runtime": "onnxruntime", "precision": "fp32"}
    again = pickle.loads(pickle.dumps(config))  # what worker processes and Ray actors get
    assert again == config and again.options() == options and hash(again) == hash(config)
