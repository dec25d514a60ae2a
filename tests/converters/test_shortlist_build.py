"""Building a vocabulary shortlist at conversion (converters/shortlist.py, ``mtgate convert --shortlist-corpus``): the
table, the package it lands in, what the manifest records, and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from converters.shortlist import build_table
from serving.commands.main import main
from serving.engine.shortlist import Shortlist
from serving.package import PackageError, open_package


def test_candidates_are_the_targets_seen_most_often_with_a_source_token() -> None:
    sources = [[1, 2], [1, 3], [1, 2], [4]]
    targets = [[10, 11, 0], [10, 12, 0], [10, 11, 0], [13, 0]]
    table = build_table(sources, targets, source_vocab=6, target_vocab=16, always=[0], candidates=2, frequent=1,
                        copy_source=False)
    assert table.always.tolist() == [0, 10]  # EOS, and the most frequent target (10, in three sentences)
    # token 1: 11 in 2 of its 3 sentences, 12 in 1; 10 is always allowed, so not a candidate
    assert table.targets[table.offsets[1]:table.offsets[2]].tolist() == [11, 12]
    assert table.targets[table.offsets[4]:table.offsets[5]].tolist() == [13]
    assert table.offsets[5] == table.offsets[6]  # token 5 never seen: no candidates
    allowed = table.candidates(np.array([[4, 99], [5, 5]]))  # 99: outside the source vocabulary (padding)
    assert np.flatnonzero(allowed[0]).tolist() == [0, 10, 13]
    assert np.flatnonzero(allowed[1]).tolist() == [0, 10]
    with_copies = build_table(sources, targets, source_vocab=6, target_vocab=16, always=[0], candidates=2,
                              frequent=1, copy_source=True)
    assert 5 in with_copies.targets[with_copies.offsets[5]:with_copies.offsets[6]].tolist()


def test_a_table_is_refused_for_another_model(tmp_path: Path) -> None:
    table = Shortlist(np.array([0, 1, 1]), np.array([3]), np.array([0]), 4)
    table.save(tmp_path / "t.npz")
    assert Shortlist.load(tmp_path / "t.npz", 2, 4).targets.tolist() == [3]
    with pytest.raises(PackageError, match="target vocabulary of 4, the model's has 5"):
        Shortlist.load(tmp_path / "t.npz", 2, 5)
    with pytest.raises(PackageError, match="offsets do not index 3 source ids"):
        Shortlist.load(tmp_path / "t.npz", 3, 4)
    (tmp_path / "bad.npz").write_bytes(b"not a table")
    with pytest.raises(PackageError, match="not a vocabulary shortlist table"):
        Shortlist.load(tmp_path / "bad.npz", 2, 4)


def test_the_package_records_the_shortlist_and_its_bleu_cost(tiny_shortlist_package: Path) -> None:
    package = open_package(tiny_shortlist_package)  # every file checksummed, the shortlist's included
    manifest = package.manifest
    assert manifest.shortlist is not None
    assert manifest.shortlist["table"] in manifest.files
    for artifact in manifest.artifacts:
        assert artifact.shortlist_decoder is not None and artifact.shortlist_decoder in manifest.files
    assert manifest.artifact("onnxruntime", "int8").shortlist_decoder == "onnx/decoder.shortlist.int8.onnx"
    evaluation = manifest.shortlist["evaluation"]
    assert evaluation["sentences"] == 40 and evaluation["artifact"] == "onnxruntime/int8"
    for key in ("full_vocabulary", "shortlist"):
        assert 0 <= evaluation[key]["bleu"] <= 100 and evaluation[key]["seconds"] > 0
    assert evaluation["bleu_cost"] == pytest.approx(
        evaluation["full_vocabulary"]["bleu"] - evaluation["shortlist"]["bleu"], abs=0.011)
    assert 0 <= evaluation["identical_translations"] <= 1
    vocab = manifest.architecture.target_vocab_size
    assert 20 < evaluation["shortlist"]["mean_allowed_ids_per_sentence"] < vocab  # a real restriction
    parity = manifest.shortlist["parity"]  # each shortlist decoder asked for every id, against its decoder
    assert parity["onnxruntime/fp32"]["log_probs_max_abs"] <= parity["onnxruntime/fp32"]["tolerance"] == 1e-3
    assert parity["onnxruntime/int8"]["next_token_agreement"] >= 0.9
    data = json.loads((tiny_shortlist_package / "manifest.json").read_text(encoding="utf-8"))
    assert data["shortlist"]["candidates_per_token"] == 10 and data["shortlist"]["frequent_targets"] == 20


def test_convert_refuses_shortlist_options_it_cannot_use(tmp_path: Path, tiny_marian_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pkg"
    assert main(["convert", str(tiny_marian_dir), "-o", str(out), "--shortlist-eval", "a", "b"]) == 2
    assert "--shortlist-eval needs --shortlist-corpus" in capsys.readouterr().err
    source, target = tmp_path / "s.txt", tmp_path / "t.txt"
    source.write_text("a\nb\n", encoding="utf-8")
    target.write_text("a\n", encoding="utf-8")
    assert main(["convert", str(tiny_marian_dir), "-o", str(out), "--shortlist-corpus", str(source),
                 str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: no such file" in capsys.readouterr().err
    assert main(["convert", str(tiny_marian_dir), "-o", str(out), "--runtimes", "onnxruntime", "--precisions", "fp32",
                 "--no-verify", "--shortlist-corpus", str(source), str(target)]) == 2
    err = capsys.readouterr().err
    assert "has 2 lines" in err and "not parallel" in err and "Traceback" not in err
    assert main(["convert", str(tiny_marian_dir), "-o", str(out), "--runtimes", "openvino", "--precisions", "fp32",
                 "--no-verify", "--shortlist-corpus", str(source), str(source)]) == 2
    assert "runs on onnxruntime" in capsys.readouterr().err
    assert not out.exists()  # nothing written on any refusal


def test_a_damaged_table_is_refused_at_load(tiny_shortlist_package: Path, tmp_path: Path) -> None:
    from serving.engine.translator import Translator

    copy = tmp_path / "pkg"
    shutil.copytree(tiny_shortlist_package, copy)
    (copy / "shortlist" / "table.npz").write_bytes(b"x")
    with pytest.raises(PackageError, match="table.npz"):
        Translator.load(copy, shortlist=True)


def test_the_int8_shortlist_decoder_projects_with_int8_rows(tiny_shortlist_package: Path) -> None:
    import onnx
    from onnx import numpy_helper

    manifest = open_package(tiny_shortlist_package).manifest
    vocab = manifest.architecture.target_vocab_size
    path = manifest.artifact("onnxruntime", "int8").shortlist_decoder
    assert path is not None
    graph = onnx.load(str(tiny_shortlist_package / path)).graph
    assert any(n.op_type == "DynamicQuantizeMatMul" and n.name == "decoder.shortlist.int8.matmul" for n in graph.node)
    tables = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.dims and i.dims[0] == vocab
              and len(i.dims) == 2}
    assert tables and all(t.dtype in (np.int8, np.uint8) for t in tables.values()), {k: t.dtype for k, t in tables.items()}
    # no step dequantizes a whole table: every DequantizeLinear reads gathered rows, not an initializer
    initializers = {i.name for i in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in initializers]
