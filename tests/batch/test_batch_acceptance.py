"""batch-score end to end with a real converted model: TFRecords written by tensorflow (text and T2T int64 schemas,
the latter encoded with the real wmt8k vocabulary), in process and through a real ``mtgate serve``; SIGKILL and
resume; malformed records including a truncated last record.

The model is the tiny random Marian package of tests/utils/marian_factory.py (its translations are meaningless but
deterministic); expected translations come from ``serving.engine.translator.Translator`` directly and expected scores from
sacrebleu directly.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")
sacrebleu = pytest.importorskip("sacrebleu")

from batch.cli import main  # noqa: E402
from batch.framing import frame_record  # noqa: E402
from batch.records import EOS_ID  # noqa: E402
from tests.utils.server import wait_until_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VOCAB_8K = ROOT / "tests" / "data" / "t2t" / "vocab.translate_ende_wmt8k.8192.subwords"
N = 40
SOURCES = (ROOT / "tests" / "data" / "marian" / "corpus.en").read_text(encoding="utf-8").splitlines()[:N]
REFERENCES = (ROOT / "tests" / "data" / "marian" / "corpus.de").read_text(encoding="utf-8").splitlines()[:N]
FAST = ["--workers", "1", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def package(tiny_onnx_package: Path) -> Path:
    """The shared tiny package for onnxruntime (tests/conftest.py); batch-score writes next to its input, not here."""
    return tiny_onnx_package


@pytest.fixture(scope="module")
def translator(package: Path) -> Any:
    from serving.engine.translator import Translator

    return Translator.load(package, runtime="onnxruntime", precision="fp32", threads=1)


@pytest.fixture(scope="module")
def expected(translator: Any) -> list[Any]:
    """What the Translator itself answers for SOURCES."""
    from serving.engine.translator import DecodeOptions

    return list(translator.translate(SOURCES, DecodeOptions()))


def text_examples(sources: list[str], references: list[str]) -> list[bytes]:
    out = []
    for i, (src, ref) in enumerate(zip(sources, references, strict=True)):
        ex = tf.train.Example()
        ex.features.feature["inputs"].bytes_list.value.append(src.encode())
        ex.features.feature["targets"].bytes_list.value.append(ref.encode())
        ex.features.feature["id"].int64_list.value.append(i)
        out.append(ex.SerializeToString())
    return out


def t2t_examples(encoder: Any, sources: list[str], references: list[str]) -> list[bytes]:
    """tensor2tensor datagen's records: ``inputs`` and ``targets`` as ``encoder``'s ids, EOS-terminated."""
    out = []
    for src, ref in zip(sources, references, strict=True):
        ex = tf.train.Example()
        ex.features.feature["inputs"].int64_list.value.extend(encoder.encode(src) + [EOS_ID])
        ex.features.feature["targets"].int64_list.value.extend(encoder.encode(ref) + [EOS_ID])
        out.append(ex.SerializeToString())
    return out


def write_tfrecord(path: Path, records: list[bytes]) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)
    return path


def read_examples(path: Path) -> list[Any]:
    return [tf.train.Example.FromString(r) for r in tf.compat.v1.io.tf_record_iterator(str(path))]


def feature_text(ex: Any, key: str) -> str:
    return str(ex.features.feature[key].bytes_list.value[0].decode())


def summary_of(out: Path) -> dict[str, Any]:
    return dict(json.loads(out.with_name(out.stem + ".summary.json").read_text()))


def assert_scores_equal_sacrebleu(summary: dict[str, Any], hyps: list[str], refs: list[str]) -> None:
    scores = summary["scores"]
    assert scores["bleu"]["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-4)
    assert scores["chrf"]["score"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-4)
    assert scores["ter"]["score"] == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score, abs=1e-4)
    assert scores["bleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")


def test_text_schema_in_process(tmp_path: Path, package: Path, expected: list[Any],
                                capsys: pytest.CaptureFixture[str]) -> None:
    source = write_tfrecord(tmp_path / "test.tfrecord", text_examples(SOURCES, REFERENCES))
    out = tmp_path / "scored.tfrecord"
    rc = main([str(source), "-m", str(package), "-o", str(out), "--chunk-size", "7", *FAST])
    assert rc == 0
    examples = read_examples(out)
    assert [e.features.feature["id"].int64_list.value[0] for e in examples] == list(range(N))  # order preserved
    assert [feature_text(e, "inputs") for e in examples] == SOURCES
    hyps = [feature_text(e, "outputs") for e in examples]
    assert hyps == [t.text for t in expected]
    scores = [e.features.feature["score"].float_list.value[0] for e in examples]
    assert scores == pytest.approx([t.score for t in expected], rel=1e-4, abs=1e-4)
    summary = summary_of(out)
    assert (summary["records"], summary["translated"], summary["rejects"]) == (N, N, 0)
    assert summary["tokens"]["source"] == sum(t.input_tokens for t in expected)
    assert summary["tokens"]["target"] == sum(t.output_tokens for t in expected)
    assert_scores_equal_sacrebleu(summary, hyps, REFERENCES)
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"batch-score: {N} of {N} records translated") and "BLEU" in line and "\n" not in line


def test_t2t_int64_schema_with_the_wmt8k_vocab(tmp_path: Path, package: Path, translator: Any) -> None:
    from serving.engine.tokenizers.subword import SubwordTextEncoder
    from serving.engine.translator import DecodeOptions

    encoder = SubwordTextEncoder(VOCAB_8K)
    source = write_tfrecord(tmp_path / "translate_ende_wmt8k-dev-00000-of-00001",
                            t2t_examples(encoder, SOURCES, REFERENCES))
    out = tmp_path / "scored.tfrecord"

    rc = main([str(source), "-m", str(package), "-o", str(out), "--dry-run", *FAST])
    assert rc == 2  # int64 ids and a sentencepiece package: the vocabulary must be given
    rc = main([str(source), "-m", str(package), "-o", str(out), "--vocab", str(VOCAB_8K), *FAST])
    assert rc == 0
    decoded = [encoder.decode(encoder.encode(s)) for s in SOURCES]
    want = translator.translate(decoded, DecodeOptions())
    examples = read_examples(out)
    assert [list(e.features.feature["inputs"].int64_list.value) for e in examples] == [
        encoder.encode(s) + [EOS_ID] for s in SOURCES]  # the input Example is kept as it was
    hyps = [feature_text(e, "outputs") for e in examples]
    assert hyps == [t.text for t in want]
    refs = [encoder.decode(encoder.encode(r)) for r in REFERENCES]
    assert_scores_equal_sacrebleu(summary_of(out), hyps, refs)


@pytest.fixture(scope="module")
def t2t_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real tensor2tensor test checkpoint (transformer_test, translate_ende_wmt8k) converted into a package."""
    import shutil

    from converters.convert import convert

    tmp = tmp_path_factory.mktemp("t2t-model")
    source = tmp / "ckpt"
    shutil.copytree(ROOT / "tests" / "data" / "t2t" / "transformer_test_ckpt", source)
    shutil.copy(VOCAB_8K, source)
    convert(source, tmp / "package", runtimes=["onnxruntime"], verify=False, name="t2t-test", version="test")
    return tmp / "package"


def test_t2t_datagen_records_with_a_t2t_package_use_its_vocab(tmp_path: Path, t2t_package: Path) -> None:
    """T2T datagen records scored with a converted T2T model: ids decoded with the package's own vocabulary."""
    from serving.engine.tokenizers.subword import SubwordTextEncoder
    from serving.engine.translator import DecodeOptions, Translator

    encoder = SubwordTextEncoder(VOCAB_8K)
    sources, references = SOURCES[:8], REFERENCES[:8]
    source = write_tfrecord(tmp_path / "translate_ende_wmt8k-dev-00000-of-00001",
                            t2t_examples(encoder, sources, references))
    out = tmp_path / "scored.tfrecord"
    # the 1-step test checkpoint babbles: keep outputs short
    rc = main([str(source), "-m", str(t2t_package), "-o", str(out), "--beam-size", "1", "--max-length", "6", *FAST])
    assert rc == 0
    translator = Translator.load(t2t_package, threads=1)
    want = translator.translate([encoder.decode(encoder.encode(s)) for s in sources], DecodeOptions(1, 6))
    hyps = [feature_text(e, "outputs") for e in read_examples(out)]
    assert hyps == [t.text for t in want]
    summary = summary_of(out)
    assert summary["engine"]["name"] == "t2t-test" and summary["schema"]["input_kind"] == "ids"
    assert_scores_equal_sacrebleu(summary, hyps, [encoder.decode(encoder.encode(r)) for r in references])


def test_t2t_ids_written_with_the_packages_vocab_reach_the_engine_as_ids(
    tmp_path: Path, t2t_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records' ids are the package's own: they are decoded for the output's text fields, but the engine gets
    the ids themselves (``Translator.prepare_ids``): the tokenizer never encodes a source."""
    from serving.engine.tokenizers.subword import SubwordTextEncoder
    from serving.engine.translator import DecodeOptions, Translator

    encoder = SubwordTextEncoder(VOCAB_8K)
    ids = [encoder.encode(s) for s in SOURCES[:6]]
    records = []
    for sentence in ids:
        ex = tf.train.Example()
        ex.features.feature["inputs"].int64_list.value.extend(sentence + [EOS_ID])
        records.append(ex.SerializeToString())
    source = write_tfrecord(tmp_path / "translate_ende_wmt8k-dev-00000-of-00001", records)
    out = tmp_path / "scored.tfrecord"
    encoded: list[str] = []
    original = SubwordTextEncoder.encode
    monkeypatch.setattr(SubwordTextEncoder, "encode", lambda self, text: encoded.append(text) or original(self, text))
    assert main([str(source), "-m", str(t2t_package), "-o", str(out), "--beam-size", "1", "--max-length", "6",
                 *FAST]) == 0
    assert encoded == []
    monkeypatch.undo()
    translator = Translator.load(t2t_package, threads=1)
    want = translator.run(translator.prepare_ids(ids, DecodeOptions(1, 6)))
    assert [feature_text(e, "outputs") for e in read_examples(out)] == [t.text for t in want]


def test_jsonl_and_text_inputs(tmp_path: Path, package: Path, expected: list[Any]) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"src": s, "tgt": r, "n": i}) + "\n"
                             for i, (s, r) in enumerate(zip(SOURCES, REFERENCES, strict=True))), encoding="utf-8")
    assert main([str(jsonl), "-m", str(package), *FAST]) == 0
    rows = [json.loads(line) for line in (tmp_path / "in.scored.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["n"] for r in rows] == list(range(N))
    assert [r["outputs"] for r in rows] == [t.text for t in expected]

    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    out = tmp_path / "hyp.txt"
    assert main([str(src), "--references", str(ref), "-m", str(package), "-o", str(out), *FAST]) == 0
    hyps = out.read_text(encoding="utf-8").splitlines()
    assert hyps == [t.text for t in expected]
    assert_scores_equal_sacrebleu(summary_of(out), hyps, REFERENCES)


def test_malformed_records_go_to_rejects_and_set_the_exit_code(
    tmp_path: Path, package: Path, expected: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    good = text_examples(SOURCES[:6], REFERENCES[:6])
    wrong_type = tf.train.Example()
    wrong_type.features.feature["inputs"].float_list.value.append(0.5)
    bad_utf8 = tf.train.Example()
    bad_utf8.features.feature["inputs"].bytes_list.value.append(b"caf\xe9 au lait")
    records = [good[0], b"\x0a\x05\x0a\x03", good[1], wrong_type.SerializeToString(), good[2],
               bad_utf8.SerializeToString(), good[3], good[4], good[5]]
    path = tmp_path / "mixed.tfrecord"
    path.write_bytes(b"".join(frame_record(r) for r in records)[:-9])  # the last record (good[5]) is truncated
    out = tmp_path / "mixed.scored.tfrecord"

    assert main([str(path), "-m", str(package), "--dry-run", *FAST]) == 0
    dry = capsys.readouterr().out
    assert "source 'inputs' (text), reference 'targets' (text)" in dry
    assert "records: 9 (5 readable, 4 malformed" in dry

    assert main([str(path), "-m", str(package), "--chunk-size", "4", *FAST]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "4 record(s) rejected" in err
    rejects = [json.loads(line) for line in (tmp_path / "mixed.scored.rejects.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rejects] == [1, 3, 5, 8]
    reasons = [r["reason"] for r in rejects]
    assert "not a tf.train.Example" in reasons[0] or "no source feature" in reasons[0]
    assert "float_list" in reasons[1] and "UTF-8" in reasons[2] and "truncated record" in reasons[3]
    assert [feature_text(e, "outputs") for e in read_examples(out)] == [t.text for t in expected[:5]]
    assert summary_of(out)["rejects"] == 4

    assert main([str(path), "-m", str(package), "--allow-rejects", *FAST]) == 0


def _child(argv: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os._exit(main(argv))


def _committed(state: Path) -> int:
    return sum(1 for p in state.glob("[0-9]*.json")) if state.is_dir() else 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_sigkill_at_any_point_then_rerun_gives_identical_output(tmp_path: Path, package: Path) -> None:
    records = text_examples(SOURCES, REFERENCES)
    records.insert(17, b"not an example at all \xff")  # a reject, so resume keeps rejects exact too
    source = write_tfrecord(tmp_path / "in.tfrecord", records)
    clean = tmp_path / "clean.tfrecord"
    argv = [str(source), "-m", str(package), "--chunk-size", "3", "--allow-rejects", *FAST]
    assert main([*argv, "-o", str(clean)]) == 0

    out = tmp_path / "resumed.tfrecord"
    state = out.with_name(out.name + ".partial")
    n_chunks = -(-len(records) // 3)
    ctx = multiprocessing.get_context("fork")  # tensorflow is already imported here: children start fast
    killed_at = []
    for kill_after in (0, 1, 5, 9, n_chunks - 2):
        proc = ctx.Process(target=_child, args=([*argv, "-o", str(out)], str(tmp_path / "child.log")))
        proc.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.is_alive():
            if (state / "job.json").exists() and _committed(state) >= kill_after:
                break
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        killed_at.append((_committed(state), proc.exitcode))
        assert not out.exists() or out.read_bytes() == clean.read_bytes()  # never a partial output file
    assert any(code == -signal.SIGKILL for _, code in killed_at), killed_at

    # a kill while worker processes run: the workers die with the parent, the rerun resumes
    proc = ctx.Process(target=_child, args=([*argv, "-o", str(out), "--workers", "2"], str(tmp_path / "w2.log")))
    proc.start()
    workers: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.is_alive() and len(workers) < 2:
        workers = _children(proc.pid)
        time.sleep(0.05)
    assert workers, "no worker process seen"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.05)
    assert not any(Path(f"/proc/{w}/status").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text()
                   for w in workers), "worker processes outlived the killed parent"

    assert main([*argv, "-o", str(out)]) == 0  # the same command resumes and finishes
    assert out.read_bytes() == clean.read_bytes(), killed_at
    assert not state.exists()
    assert (tmp_path / "resumed.rejects.jsonl").read_bytes() == (tmp_path / "clean.rejects.jsonl").read_bytes()
    resumed, fresh = summary_of(out), summary_of(clean)
    assert (resumed["records"], resumed["translated"], resumed["rejects"]) == (len(records), N, 1)
    assert resumed["scores"] == fresh["scores"]


def test_worker_processes_give_the_same_output(tmp_path: Path, package: Path) -> None:
    source = write_tfrecord(tmp_path / "in.tfrecord", text_examples(SOURCES, REFERENCES))
    one, two = tmp_path / "one.tfrecord", tmp_path / "two.tfrecord"
    base = [str(source), "-m", str(package), "--chunk-size", "5", "--threads", "1", "--no-progress"]
    assert main([*base, "-o", str(one), "--workers", "1"]) == 0
    assert main([*base, "-o", str(two), "--workers", "2"]) == 0
    assert one.read_bytes() == two.read_bytes()
    assert summary_of(two)["engine"]["workers"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


API_KEY = "batch-test-key"


@pytest.fixture(scope="module")
def server(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving.commands.main", "serve", "-m", str(package), "--port", str(port), "--threads", "1"],
            stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "MTGATE_API_KEY": API_KEY},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, 120, lambda: "\n" + log.read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_through_a_real_server(tmp_path: Path, server: str, expected: list[Any],
                               capsys: pytest.CaptureFixture[str]) -> None:
    source = write_tfrecord(tmp_path / "test.tfrecord", text_examples(SOURCES, REFERENCES))
    out = tmp_path / "remote.tfrecord"
    refused = tmp_path / "no-key.tfrecord"
    assert main([str(source), "--server", server, "-o", str(refused), "--no-progress"]) == 1  # the server wants a key
    err = capsys.readouterr().err
    assert "401" in err and "--api-key" in err and not refused.exists()
    rc = main([str(source), "--server", server, "-o", str(out), "--workers", "3", "--max-batch-size", "8",
               "--chunk-size", "10", "--no-progress", "--api-key", API_KEY])
    assert rc == 0
    examples = read_examples(out)
    assert [feature_text(e, "inputs") for e in examples] == SOURCES
    hyps = [feature_text(e, "outputs") for e in examples]
    assert hyps == [t.text for t in expected]
    scores = [e.features.feature["score"].float_list.value[0] for e in examples]
    assert scores == pytest.approx([t.score for t in expected], rel=1e-3, abs=1e-3)
    summary = summary_of(out)
    assert summary["engine"]["server"] == server
    assert summary["tokens"]["target"] == sum(t.output_tokens for t in expected)
    assert_scores_equal_sacrebleu(summary, hyps, REFERENCES)


def test_console_script_usage_errors_are_one_line(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("batch-score")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "batch.cli"]
    proc = subprocess.run([*cmd, str(tmp_path / "missing-*.tfrecord"), "-m", str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no file matches" in proc.stderr
    mtgate = Path(sys.executable).with_name("mtgate")
    cmd = [str(mtgate)] if mtgate.exists() else [sys.executable, "-c", "import sys; from serving.commands.main import main; "
                                                 "sys.exit(main())"]
    proc = subprocess.run([*cmd, "batch-score", "x.tfrecord", "--num-shards", "2", "--shard-index", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 2 and "--shard-index 2 out of range" in proc.stderr
