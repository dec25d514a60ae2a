"""benchmarks/step_split.py on the tiny package: the decoder alone and its copies without the vocabulary projection
and the weight matmuls run, keep their node counts' meaning (the copies replace each matmul with one cheap node), and
a graph given with --graph is compared by its log-probs' bytes (the package's own decoder: the same)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from benchmarks import step_split
from serving.package import open_package


def test_split_of_the_tiny_package(tiny_onnx_package: Path, tmp_path: Path) -> None:
    decoder = tiny_onnx_package / open_package(tiny_onnx_package).artifact("onnxruntime", "fp32").decoder
    out = tmp_path / "split.json"
    code = step_split.main(["--package", str(tiny_onnx_package), "--precision", "fp32", "--rows", "2", "--rounds", "1",
                            "--runs", "5", "--position", "3", "--src-len", "4", "--graph", str(decoder),
                            "-o", str(out)])
    assert code == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert set(report["us_per_step"]) == {"full", "no_vocab", "no_layer_matmuls", "no_matmuls", str(decoder)}
    assert all(us > 0 for us in report["us_per_step"].values())
    assert report["split_us"]["rest"] == report["us_per_step"]["no_matmuls"]
    assert report["same_log_probs"] == {str(decoder): True}


def test_ablated_graphs_keep_the_shapes(tiny_onnx_package: Path, tmp_path: Path) -> None:
    decoder = tiny_onnx_package / open_package(tiny_onnx_package).artifact("onnxruntime", "fp32").decoder
    base = onnx.load(str(step_split.optimized(decoder, tmp_path / "optimized.onnx", 1)))
    weights = {init.name for init in base.graph.initializer}
    matmuls = [n for n in base.graph.node if n.op_type in step_split.MATMULS and n.input[1:2] and n.input[1] in weights]
    no_layers = step_split.ablated(base, vocab=False, layers=True)
    left = [n for n in no_layers.graph.node if n.op_type in step_split.MATMULS and n.input[1:2]
            and n.input[1] in weights]
    assert len(matmuls) > 1 and [n.name for n in left] == [n.name for n in matmuls if n.name.startswith("logits")]
    no_vocab = step_split.ablated(base, vocab=True, layers=False)
    assert not any(n.name.startswith("logits") or n.op_type == "LogSoftmax" for n in no_vocab.graph.node)
    # Every ablated copy runs on the step's inputs and still writes every output.
    for model in (no_layers, no_vocab, step_split.ablated(base, vocab=True, layers=True)):
        path = tmp_path / "ablated.onnx"
        onnx.save(model, str(path))
        step = step_split.Step(path, 1, rows=2, position=3, src_len=4, seed=0)
        assert step.time(3, step_split.time.perf_counter) > 0
        assert step.log_probs().shape[0] == 2
