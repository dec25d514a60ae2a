"""batch-score reads and writes TFRecords of Examples without tensorflow (batch/example.py, batch/framing.py): the
bytes are tensorflow's, both ways, and a whole run imports no tensorflow."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from batch.example import Example, example_class  # noqa: E402
from batch.framing import encode_items, scan_tfrecord  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _random_tf_example(rng: random.Random) -> object:
    ex = tf.train.Example()
    for key in rng.sample(["inputs", "targets", "outputs", "score", "ids", "zz", ""], 4):
        feature = ex.features.feature[key]
        kind = rng.choice(["bytes", "float", "int64", "empty"])
        if kind == "bytes":
            feature.bytes_list.value.extend(rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 3)))
        elif kind == "float":
            feature.float_list.value.extend(rng.uniform(-1e6, 1e6) for _ in range(rng.randint(0, 4)))
        elif kind == "int64":
            feature.int64_list.value.extend(rng.randint(-2**62, 2**62) for _ in range(rng.randint(0, 6)))
    return ex


def test_examples_are_tensorflows_byte_for_byte() -> None:
    rng = random.Random(7)
    assert Example is example_class()
    for _ in range(300):
        theirs = _random_tf_example(rng)
        data = theirs.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
        ours = Example.FromString(data)
        assert ours.SerializeToString(deterministic=True) == data
        assert tf.train.Example.FromString(ours.SerializeToString()) == theirs
        for key, feature in theirs.features.feature.items():  # type: ignore[attr-defined]
            assert ours.features.feature[key].WhichOneof("kind") == feature.WhichOneof("kind")


def test_framing_reads_and_writes_what_tensorflow_does(tmp_path: Path) -> None:
    rng = random.Random(3)
    items = [rng.randbytes(rng.randint(0, 3000)) for _ in range(50)]
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for item in items:
            writer.write(item)
    assert encode_items(items, "tfrecord") == path.read_bytes()
    assert [e.data for e in scan_tfrecord(path, 0, lambda i: True)] == items
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == items


def test_batch_score_imports_no_tensorflow(tmp_path: Path) -> None:
    """What batch-score does with a TFRecord, without the engine: scan, detect the schema, parse the Examples and
    encode the output Examples. tensorflow is never imported (it is not in the batch extra any more)."""
    path = tmp_path / "in.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(5):
            ex = tf.train.Example()
            ex.features.feature["inputs"].bytes_list.value.append(f"sentence {i}".encode())
            ex.features.feature["targets"].bytes_list.value.append(f"satz {i}".encode())
            writer.write(ex.SerializeToString())
    code = f"""
import sys
from batch.framing import scan_tfrecord
from batch.inputs import resolve_inputs
from batch.outputs import OutputEncoder
from batch.records import RecordParser, Translated
from batch.schema import detect_schema
inputs = resolve_inputs([{str(path)!r}])
parser = RecordParser(detect_schema(inputs))
encoder = OutputEncoder("tfrecord")
items = [encoder.encode(r, Translated("x", -1.0, 2, 1)) for r in map(parser.parse, scan_tfrecord(inputs[0].path, 0, lambda i: True))]
assert len(items) == 5, items
assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if m.startswith("tensorflow"))
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
