"""TFRecord (written by tensorflow), JSONL and text inputs (batch/inputs.py, framing.py), schema detection (schema.py),
parsing and corrupt records (records.py), output items (outputs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from batch.errors import InputError  # noqa: E402
from batch.framing import masked_crc32c  # noqa: E402
from batch.inputs import count_entries, detect_format, resolve_inputs, scan  # noqa: E402
from batch.outputs import OutputEncoder  # noqa: E402
from batch.records import EOS_ID, Record, RecordParser, Reject, Translated, load_vocab  # noqa: E402
from batch.schema import detect_schema  # noqa: E402

VOCAB_8K = Path(__file__).resolve().parents[1] / "data" / "t2t" / "vocab.translate_ende_wmt8k.8192.subwords"
SENTENCES = ["Hello world.", "Snow\u2603man", "snake_case\\path", "I \u2764 Tensor2Tensor!", "A dog runs."]


def text_example(source: str | bytes, target: str | None = None) -> bytes:
    ex = tf.train.Example()
    ex.features.feature["inputs"].bytes_list.value.append(source if isinstance(source, bytes) else source.encode())
    if target is not None:
        ex.features.feature["targets"].bytes_list.value.append(target.encode())
    return ex.SerializeToString()


def ids_example(inputs: list[int], targets: list[int]) -> bytes:
    ex = tf.train.Example()
    ex.features.feature["inputs"].int64_list.value.extend(inputs)
    ex.features.feature["targets"].int64_list.value.extend(targets)
    return ex.SerializeToString()


def write_tfrecord(path: Path, records: list[bytes]) -> list[int]:
    """Write with tensorflow; return each record's byte offset."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)
    offsets, pos = [], 0
    for r in records:
        offsets.append(pos)
        pos += 16 + len(r)
    return offsets


def parse_all(path: Path, **schema_kw: str) -> list[Record | Reject]:
    inputs = resolve_inputs([str(path)])
    schema = detect_schema(inputs, **schema_kw)
    vocab = load_vocab(VOCAB_8K) if schema.needs_vocab else None
    parser = RecordParser(schema, vocab)
    return [parser.parse(e) for e in scan(inputs)]


def test_masked_crc_matches_tensorflow_framing(tmp_path: Path) -> None:
    write_tfrecord(tmp_path / "a.tfrecord", [b"abc"])
    raw = (tmp_path / "a.tfrecord").read_bytes()
    assert int.from_bytes(raw[8:12], "little") == masked_crc32c(raw[:8])
    assert int.from_bytes(raw[-4:], "little") == masked_crc32c(b"abc")


def test_text_schema_detected_and_parsed(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecord"
    write_tfrecord(path, [text_example(s, s.upper()) for s in SENTENCES])
    inputs = resolve_inputs([str(path)])
    schema = detect_schema(inputs)
    assert (schema.input_key, schema.input_kind, schema.reference_key, schema.reference_kind) == (
        "inputs", "text", "targets", "text")
    records = parse_all(path)
    assert [r.source for r in records if isinstance(r, Record)] == SENTENCES
    assert [r.reference for r in records if isinstance(r, Record)] == [s.upper() for s in SENTENCES]


def test_t2t_int64_schema_decoded_with_the_real_wmt8k_vocab(tmp_path: Path) -> None:
    from serving.engine.tokenizers.subword import SubwordTextEncoder

    encoder = SubwordTextEncoder(VOCAB_8K)
    assert encoder.encode("Hello world.") == [4928, 4071, 220, 4]  # reference section 4, worked example 1
    path = tmp_path / "translate_ende_wmt8k-dev-00000-of-00001"  # T2T shard name: no suffix, sniffed
    write_tfrecord(path, [ids_example(encoder.encode(s) + [EOS_ID], encoder.encode(s[::-1]) + [EOS_ID])
                          for s in SENTENCES])
    assert detect_format(path) == "tfrecord"
    schema = detect_schema(resolve_inputs([str(path)]))
    assert (schema.input_kind, schema.reference_kind) == ("ids", "ids") and schema.needs_vocab
    records = parse_all(path)
    assert [r.source for r in records if isinstance(r, Record)] == SENTENCES
    assert [r.reference for r in records if isinstance(r, Record)] == [s[::-1] for s in SENTENCES]


def test_input_key_and_missing_field_message(tmp_path: Path) -> None:
    ex = tf.train.Example()
    ex.features.feature["sentence"].bytes_list.value.append(b"hi")
    path = tmp_path / "x.tfrecord"
    write_tfrecord(path, [ex.SerializeToString()])
    inputs = resolve_inputs([str(path)])
    with pytest.raises(InputError, match="fields: sentence.*--input-key"):
        detect_schema(inputs)
    assert detect_schema(inputs, input_key="sentence").input_key == "sentence"


def test_malformed_records_are_rejected_with_index_and_reason(tmp_path: Path) -> None:
    wrong_type = tf.train.Example()
    wrong_type.features.feature["inputs"].float_list.value.append(1.0)
    records = [
        text_example("one", "eins"),                 # 0 good
        b"\x0a\xff\xff\xff\xff\x0f garbage",         # 1 bad proto
        wrong_type.SerializeToString(),              # 2 wrong feature type
        text_example(b"\xff\xfe bad utf8"),           # 3 undecodable bytes
        text_example("two", "zwei"),                 # 4 good, data checksum broken below
        text_example("three", "drei"),               # 5 good, length checksum broken below (resync)
        text_example("four", "vier"),                # 6 good
        text_example("five", "fünf"),                # 7 good
        text_example("six", "sechs"),                # 8 truncated below
    ]
    path = tmp_path / "mixed.tfrecord"
    offsets = write_tfrecord(path, records)
    raw = bytearray(path.read_bytes())
    raw[offsets[4] + 12 + 2] ^= 0x01  # flip a data byte of record 4
    raw[offsets[5] + 3] ^= 0x40       # flip a length byte of record 5: its extent is unknown
    del raw[-7:]                      # truncate the last record
    path.write_bytes(bytes(raw))

    parsed = parse_all(path)
    good = [(r.index, r.source) for r in parsed if isinstance(r, Record)]
    bad = {r.index: r.reason for r in parsed if isinstance(r, Reject)}
    assert good == [(0, "one"), (6, "four"), (7, "five")]
    assert "not a tf.train.Example" in bad[1]
    assert "is float_list, expected bytes_list" in bad[2]
    assert "not valid UTF-8" in bad[3]
    assert "corrupt record data" in bad[4]
    assert "corrupt record length" in bad[5] and f"skipped {offsets[6] - offsets[5]} bytes" in bad[5]
    assert "truncated record" in bad[8]
    assert sorted(bad) == [1, 2, 3, 4, 5, 8]
    assert count_entries(resolve_inputs([str(path)])) == 9


def test_globs_shards_and_skipping(tmp_path: Path) -> None:
    for shard in range(3):
        write_tfrecord(tmp_path / f"data-{shard:05d}-of-00003.tfrecord",
                       [text_example(f"s{shard}r{i}") for i in range(4)])
    inputs = resolve_inputs([str(tmp_path / "data-*.tfrecord")])
    assert [i.path.name for i in inputs] == [f"data-{s:05d}-of-00003.tfrecord" for s in range(3)]
    entries = list(scan(inputs, want=lambda i: i % 5 == 2))
    assert [e.index for e in entries] == list(range(12))
    assert [e.index for e in entries if e.data is not None] == [2, 7]
    with pytest.raises(InputError, match="no file matches"):
        resolve_inputs([str(tmp_path / "nothing-*.tfrecord")])


def test_jsonl_and_text_with_references(tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"src": "a b", "tgt": "A B", "id": 7}\n\n{"src": 3}\nnot json\n{"src": "c"}\n', encoding="utf-8")
    parsed = parse_all(jsonl)
    assert [(type(p).__name__, p.index) for p in parsed] == [("Record", 0), ("Reject", 1), ("Reject", 2),
                                                             ("Record", 3)]
    assert parsed[0].reference == "A B" and parsed[0].original["id"] == 7  # type: ignore[union-attr]
    assert "expected a string" in parsed[1].reason and "invalid JSON" in parsed[2].reason  # type: ignore[union-attr]

    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_bytes(b"one\ntwo\n\xff\n")
    ref.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    inputs = resolve_inputs([str(src)], references=[str(ref)])
    parser = RecordParser(detect_schema(inputs))
    parsed = [parser.parse(e) for e in scan(inputs)]
    assert [(p.source, p.reference) for p in parsed[:2]] == [("one", "eins"), ("two", "zwei")]  # type: ignore[union-attr]
    assert isinstance(parsed[2], Reject) and parsed[2].position == 3
    ref.write_text("eins\n", encoding="utf-8")
    with pytest.raises(InputError, match="1 lines but"):
        resolve_inputs([str(src)], references=[str(ref)])


def test_output_example_keeps_input_features_and_is_deterministic(tmp_path: Path) -> None:
    ex = tf.train.Example()
    ex.features.feature["inputs"].bytes_list.value.append(b"hi")
    ex.features.feature["zeta"].int64_list.value.append(3)
    ex.features.feature["outputs"].int64_list.value.append(9)  # replaced, not appended to
    encoder = OutputEncoder("tfrecord")
    record = Record(0, "hi", None, tf.train.Example.FromString(ex.SerializeToString()))
    data = encoder.encode(record, Translated("hallo", -1.5, 2, 2))
    out = tf.train.Example.FromString(data)
    assert out.features.feature["outputs"].bytes_list.value == [b"hallo"]
    assert list(out.features.feature["score"].float_list.value) == [-1.5]
    assert out.features.feature["zeta"].int64_list.value == [3]
    again = Record(0, "hi", None, tf.train.Example.FromString(ex.SerializeToString()))
    assert encoder.encode(again, Translated("hallo", -1.5, 2, 2)) == data
    line = json.loads(OutputEncoder("jsonl").encode(Record(4, "hi", "ref"), Translated("hallo", None, 2, 2)))
    assert line == {"index": 4, "source": "hi", "reference": "ref", "outputs": "hallo", "score": None}
