"""batch-score's decoding options (``mtgate translate``'s, n-best excepted): they reach the engine in process and
through ``--server`` (the output is what ``serving.engine.translator.Translator`` itself answers with the same options), bad
combinations are one line and exit 2 before any work, a seeded sampled run is byte-identical on rerun and after a
resume, and a run without them keeps the engine fingerprint it always had (old unfinished runs still resume)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sacrebleu")

from batch.cli import build_parser, main  # noqa: E402
from batch.engines import decoding_of  # noqa: E402
from batch.job import EngineConfig  # noqa: E402
from serving.engine.request import DecodeOptions  # noqa: E402
from tests.batch.helpers import assert_one_line_error, run_cli  # noqa: E402
from tests.utils.server import start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N = 12
SOURCES = (ROOT / "tests" / "data" / "marian" / "corpus.en").read_text(encoding="utf-8").splitlines()[:N]
FAST = ["--workers", "1", "--threads", "1", "--no-progress"]
PREFIX = "Ein Mann"
BEAM_FLAGS = ["--beam-size", "2", "--max-length", "12", "--min-length", "3", "--repetition-penalty", "1.3",
              "--no-repeat-ngram-size", "2", "--disable-unk", "--target-prefix", PREFIX]
BEAM_OPTIONS = DecodeOptions(beam_size=2, max_length=12, min_length=3, repetition_penalty=1.3, no_repeat_ngram_size=2,
                             disable_unk=True)
SAMPLE_FLAGS = ["--temperature", "0.9", "--top-k", "8", "--top-p", "0.95", "--seed", "11", "--max-length", "10"]
SAMPLE_OPTIONS = DecodeOptions(temperature=0.9, top_k=8, top_p=0.95, seed=11, max_length=10)


@pytest.fixture(scope="module")
def translator(tiny_onnx_package: Path) -> Any:
    from serving.engine.translator import Translator

    return Translator.load(tiny_onnx_package, runtime="onnxruntime", precision="fp32", threads=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "in.txt"
    path.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    return path


def _texts(translations: list[Any]) -> list[str]:
    return [t.text for t in translations]


def _summary(out: Path) -> dict[str, Any]:
    return dict(json.loads(out.with_name(out.stem + ".summary.json").read_text(encoding="utf-8")))


def test_options_and_the_target_prefix_reach_the_local_engine(tmp_path: Path, source: Path, translator: Any,
                                                              tiny_onnx_package: Path) -> None:
    long = " ".join(["the man rides a bike"] * 40)  # longer than the model's positions: --truncate cuts it
    assert len(translator.encode([long])[0]) > translator.info.max_input_tokens
    texts = [*SOURCES, long]
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "beam.txt"
    assert main([str(inputs), "-m", str(tiny_onnx_package), "-o", str(out), "--truncate", *BEAM_FLAGS, *FAST]) == 0
    options = dataclasses.replace(BEAM_OPTIONS, truncate=True)
    want = translator.run(translator.prepare(texts, options, [PREFIX] * len(texts)))
    assert out.read_text(encoding="utf-8").splitlines() == _texts(want)
    plain = translator.translate(SOURCES, DecodeOptions(beam_size=2, max_length=12))
    unprefixed = translator.translate(SOURCES, BEAM_OPTIONS)
    assert want[-1].truncated and _texts(want)[:N] != _texts(plain)  # the options changed the translations
    assert all(a != b for a, b in zip(_texts(want), _texts(unprefixed), strict=False))  # and so did the prefix
    assert _summary(out)["engine"]["decoding"] == {"disable_unk": True, "min_length": 3, "no_repeat_ngram_size": 2,
                                                   "repetition_penalty": 1.3, "target_prefix": PREFIX,
                                                   "truncate": True}
    # token ids (T2T records of the package's own vocabulary) take the same prefix
    ids = [translator.tokenizer.encode(t) for t in SOURCES]
    from_ids = translator.run(translator.prepare_ids(ids, BEAM_OPTIONS, [PREFIX] * N))
    assert _texts(from_ids) == _texts(want)[:N]


def test_bad_combinations_and_n_best_are_one_line_before_any_work(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "never.txt"
    proc = run_cli(source, "-m", tmp_path / "no-such-package", "-o", out, "--beam-size", "4", "--temperature", "0.5")
    assert_one_line_error(proc, 2, "--beam-size must be 1", "sampling")
    proc = run_cli(source, "-m", tmp_path / "no-such-package", "-o", out, "--num-hypotheses", "3")
    assert_one_line_error(proc, 2, "--num-hypotheses 3", "one translation per record")
    assert not out.exists() and not list(tmp_path.iterdir())
    assert decoding_of(build_parser().parse_args(["x", "--num-hypotheses", "1"])) == ()


class _Injected(Exception):
    pass


def test_seeded_sampling_is_byte_identical_on_rerun_and_after_resume(tmp_path: Path, source: Path, translator: Any,
                                                                     tiny_onnx_package: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(source), "-m", str(tiny_onnx_package), "--chunk-size", "4", *SAMPLE_FLAGS, "--threads", "1",
            "--no-progress"]
    first, again, resumed = tmp_path / "first.txt", tmp_path / "again.txt", tmp_path / "resumed.txt"
    assert main([*argv, "-o", str(first), "--workers", "1"]) == 0
    assert main([*argv, "-o", str(again), "--workers", "2"]) == 0  # processes build the same options from EngineConfig
    assert first.read_bytes() == again.read_bytes() and _summary(again)["engine"]["workers"] == 2
    # each chunk is one engine call: sentence i of a chunk samples with the i-th stream of the seed
    want = [t for start in range(0, N, 4) for t in _texts(translator.translate(SOURCES[start:start + 4],
                                                                               SAMPLE_OPTIONS))]
    assert first.read_text(encoding="utf-8").splitlines() == want
    assert want != _texts(translator.translate(SOURCES, DecodeOptions(max_length=10)))  # it did sample

    from batch import workers
    from serving.engine.errors import InferenceFailed

    original = workers.LocalChunkWorker.translate_chunk
    calls: list[int] = []

    def failing(self: Any, sources: Any, progress: Any, references: Any = None) -> Any:
        calls.append(len(sources))
        if len(calls) == 2:
            raise InferenceFailed("injected failure")
        return original(self, sources, progress, references)

    monkeypatch.setattr(workers.LocalChunkWorker, "translate_chunk", failing)
    assert main([*argv, "-o", str(resumed), "--workers", "1"]) == 1
    assert "committed chunk(s) are kept" in capsys.readouterr().err
    monkeypatch.setattr(workers.LocalChunkWorker, "translate_chunk", original)
    calls.clear()
    monkeypatch.setattr(workers.LocalChunkWorker, "translate_chunk",
                        lambda self, *a, **k: (calls.append(1), original(self, *a, **k))[1])
    assert main([*argv, "-o", str(resumed), "--workers", "1"]) == 0
    assert len(calls) < -(-N // 4)  # the rerun resumed: committed chunks were not translated again
    assert resumed.read_bytes() == first.read_bytes()


def test_a_run_without_the_options_keeps_its_fingerprint(tiny_onnx_package: Path) -> None:
    args = build_parser().parse_args(["in.txt", "--beam-size", "3"])
    assert decoding_of(args) == ()
    config = EngineConfig(model_dir=tiny_onnx_package, beam_size=3, max_length=None, decoding=decoding_of(args))
    today = {"beam_size": 3, "max_length": None, "max_tokens": 2048, "max_batch_size": 64,
             "model_dir": str(tiny_onnx_package.resolve()), "manifest_sha256": config.fingerprint()["manifest_sha256"],
             "runtime": "onnxruntime", "precision": "fp32"}
    assert config.fingerprint() == today and list(config.fingerprint()) == list(today)
    assert config.options() == DecodeOptions(beam_size=3) and config.parameters() == {"beam_size": 3}
    server = EngineConfig(server="http://x", model_name="m")
    assert server.fingerprint() == {"beam_size": None, "max_length": None, "max_tokens": 2048, "max_batch_size": 64,
                                    "server": "http://x", "model_name": "m"}
    given = decoding_of(build_parser().parse_args(["in.txt", "--min-length", "2", "--target-prefix", "Ein"]))
    assert given == (("min_length", 2), ("target_prefix", "Ein"))
    with_options = EngineConfig(model_dir=tiny_onnx_package, beam_size=3, decoding=given)
    assert with_options.fingerprint() == {**today, "decoding": {"min_length": 2, "target_prefix": "Ein"}}
    assert with_options.options() == DecodeOptions(beam_size=3, min_length=2) and with_options.target_prefix == "Ein"
    assert with_options.parameters() == {"beam_size": 3, "min_length": 2, "target_prefix": "Ein"}
    # what worker processes and Ray actors get: the same options, hashable
    assert pickle.loads(pickle.dumps(with_options)) == with_options and hash(with_options)


@pytest.fixture(scope="module")
def server(tiny_onnx_package: Path) -> Iterator[str]:
    proc = start_server(tiny_onnx_package)
    yield proc.url
    proc.stop()


def test_options_reach_the_server(tmp_path: Path, source: Path, server: str, translator: Any) -> None:
    out = tmp_path / "remote.txt"
    assert main([str(source), "--server", server, "-o", str(out), "--workers", "2", "--max-batch-size", "5",
                 *BEAM_FLAGS, "--no-progress"]) == 0
    want = translator.run(translator.prepare(SOURCES, BEAM_OPTIONS, [PREFIX] * N))
    assert out.read_text(encoding="utf-8").splitlines() == _texts(want)
    assert _summary(out)["engine"]["decoding"]["target_prefix"] == PREFIX
    # sampled through the server: a rerun gives the same bytes
    sampled = [tmp_path / "s1.txt", tmp_path / "s2.txt"]
    for path in sampled:
        assert main([str(source), "--server", server, "-o", str(path), "--max-batch-size", "5", *SAMPLE_FLAGS,
                     "--no-progress"]) == 0
    assert sampled[0].read_bytes() == sampled[1].read_bytes()
    assert sampled[0].read_text(encoding="utf-8").splitlines() != _texts(translator.translate(
        SOURCES, DecodeOptions(max_length=10)))
