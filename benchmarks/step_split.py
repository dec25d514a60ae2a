"""Where one ONNX Runtime decoder call goes: the package's decoder graph alone, against copies of it without its
weight matmuls.

    .venv/bin/python benchmarks/step_split.py --package models/demo-en-de --precision int8 --rows 1
    .venv/bin/python benchmarks/step_split.py --package models/demo-en-de --precision int8 --rows 4 \\
        --graph build/variant/decoder.int8.onnx -o /tmp/split.json

The decoder step runs alone in a loop (one ``run_with_iobinding`` per step on fixed random inputs: ``--rows`` rows at
position ``--position``, a ``--src-len`` source; the present caches written in place), ``--threads`` intra-op threads
(default 1, timed with the thread's CPU clock so a shared machine's load inflates it less; with more threads, wall
time). Each graph is timed ``--rounds`` times, alternating, each round the median of ``--runs`` calls; the report is
the median of the rounds. The graphs, all from ONNX Runtime's optimized form of the package's decoder (its fusions
applied, e.g. ``DynamicQuantizeMatMul``):

- ``full``: as it is;
- ``no_vocab``: the vocabulary projection (the node named ``logits*``, ``converters/onnx_emitter.py``) and the
  log-softmax removed (``log_probs`` is the last hidden state);
- ``no_layer_matmuls``: every other matmul with a constant weight replaced by a copy of its input cut or repeated to
  the output's width (one cheap node each: the node count stays);
- ``no_matmuls``: both.

So ``vocab_projection_us = full - no_vocab``, ``layer_matmuls_us = full - no_layer_matmuls`` and ``rest_us =
no_matmuls`` (every other node: attention, norms, reshapes, the session's own cost). ``--graph PATH`` (repeatable)
times other decoder graphs beside them (a variant of the export) and says whether their ``log_probs`` are the same
bytes as the package's. Weights stay in the CPU's caches in this loop: a translator's step, with the search and the
encoder between two calls, costs more (``benchmarks/profile_engine.py``); compare graphs here, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.engine.backends.onnxruntime import session_options  # noqa: E402
from serving.package import open_package  # noqa: E402

MATMULS = ("MatMul", "DynamicQuantizeMatMul", "Gemm", "MatMulNBits", "MatMulIntegerToFloat")


def optimized(graph: Path, out: Path, threads: int) -> Path:
    """ONNX Runtime's optimized form of ``graph`` (all its graph optimizations), written to ``out``."""
    import onnxruntime as ort

    options = session_options(threads)
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    return out


def ablated(model: Any, vocab: bool, layers: bool) -> Any:
    """A copy of ``model`` (an optimized decoder) without the vocabulary projection (``vocab``) and/or with its other
    constant-weight matmuls replaced by copies of their inputs cut or repeated to the output width (``layers``)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    nodes: list[Any] = []
    hidden = None
    for node in graph.node:
        is_matmul = node.op_type in MATMULS and len(node.input) > 1 and node.input[1] in shapes
        if vocab and (node.name.startswith("logits") or node.op_type == "LogSoftmax"):
            hidden = hidden or node.input[0]
            continue
        if layers and is_matmul and not node.name.startswith("logits"):
            width_in, width_out = _widths(node, shapes[node.input[1]])
            x, y = node.input[0], node.output[0]
            copies = math.ceil(width_out / width_in)
            wide = x if copies == 1 else f"{y}.repeated"
            if copies > 1:
                nodes.append(helper.make_node("Concat", [x] * copies, [wide], name=wide, axis=-1))
            if copies * width_in == width_out:
                nodes.append(helper.make_node("Identity", [wide], [y], name=node.name))
            else:
                limits = [f"{y}.{part}" for part in ("starts", "ends", "axes")]
                for name, value in zip(limits, (0, width_out, -1), strict=True):
                    graph.initializer.append(numpy_helper.from_array(np.array([value], dtype=np.int64), name))
                nodes.append(helper.make_node("Slice", [wide, *limits], [y], name=node.name))
            continue
        nodes.append(node)
    if vocab:
        if hidden is None:
            raise ValueError("no vocabulary projection (a node named logits*) in the decoder")
        nodes.append(helper.make_node("Identity", [hidden], ["log_probs"], name="log_probs.hidden"))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _widths(node: Any, weight: tuple[int, ...]) -> tuple[int, int]:
    """(input width, output width) of a constant-weight matmul node."""
    transposed = any(a.name == "transB" and a.i == 1 for a in node.attribute)
    if node.op_type == "MatMulNBits":
        attrs = {a.name: a.i for a in node.attribute}
        return int(attrs["K"]), int(attrs["N"])
    return (int(weight[1]), int(weight[0])) if transposed else (int(weight[0]), int(weight[1]))


def feeds(session: Any, rows: int, position: int, src_len: int, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for one step of ``rows`` rows at ``position`` (a cache of ``2 * position + 8`` slots)."""
    rng = np.random.default_rng(seed)
    sizes = {"batch": rows, "capacity": 2 * position + 8, "past_len": position, "src_len": src_len}
    out: dict[str, np.ndarray] = {}
    for value in session.get_inputs():
        if value.name in ("vocab_ids", "vocab_bias"):
            raise ValueError("a shortlist decoder: time the package's full decoder")
        shape = [d if isinstance(d, int) else sizes[d] for d in value.shape]
        if value.name == "input_ids":
            out[value.name] = rng.integers(2, 100, shape).astype(np.int64)
        elif value.name == "position_ids":
            out[value.name] = np.full(shape, position, dtype=np.int64)
        elif value.name == "row_order":
            out[value.name] = np.arange(rows, dtype=np.int64)
        elif value.name.endswith("bias"):
            out[value.name] = np.zeros(shape, dtype=np.float32)
        else:
            out[value.name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return out


class Step:
    """One graph's session, bound once to its inputs (present caches in place of the past ones)."""

    def __init__(self, path: Path, threads: int, rows: int, position: int, src_len: int, seed: int) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        self.inputs = feeds(self.session, rows, position, src_len, seed)
        self.binding = self.session.io_binding()
        for name, value in self.inputs.items():
            self.binding.bind_cpu_input(name, value)
        for output in self.session.get_outputs():
            past = self.inputs.get(output.name.replace("present_", "past_"))
            if output.name.startswith("present_") and past is not None and past.shape[2] > position:
                self.binding.bind_output(output.name, "cpu", 0, np.float32, list(past.shape), past.ctypes.data)
            else:
                self.binding.bind_output(output.name, "cpu")

    def time(self, runs: int, clock: Any) -> float:
        """The median microseconds of ``runs`` calls (after a few unmeasured ones)."""
        for _ in range(max(5, runs // 20)):
            self.session.run_with_iobinding(self.binding)
        times = []
        for _ in range(runs):
            start = clock()
            self.session.run_with_iobinding(self.binding)
            times.append(clock() - start)
        return float(np.median(times)) * 1e6

    def log_probs(self) -> np.ndarray:
        return np.asarray(self.binding.copy_outputs_to_cpu()[0])


def main(argv: list[str] | None = None) -> int:
    import onnx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=ROOT / "models" / "demo-en-de")
    parser.add_argument("--precision", default="int8", choices=["fp32", "int8"])
    parser.add_argument("--rows", type=int, default=1, help="rows in the step (beam x batch; default 1)")
    parser.add_argument("--position", type=int, default=16, help="each row's position (default 16)")
    parser.add_argument("--src-len", type=int, default=14, help="source tokens (default 14)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1000, help="calls per round and graph (default 1000)")
    parser.add_argument("--graph", type=Path, action="append", default=[], help="another decoder graph to time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)
    clock = time.thread_time if args.threads == 1 else time.perf_counter

    package = open_package(args.package)
    decoder = args.package / package.artifact("onnxruntime", args.precision).decoder
    with tempfile.TemporaryDirectory(prefix="step-split-") as tmp:
        base = onnx.load(str(optimized(decoder, Path(tmp) / "optimized.onnx", args.threads)))
        paths = {"full": decoder}
        for name, vocab, layers in (("no_vocab", True, False), ("no_layer_matmuls", False, True),
                                    ("no_matmuls", True, True)):
            paths[name] = Path(tmp) / f"{name}.onnx"
            onnx.save(ablated(base, vocab, layers), str(paths[name]))
        paths.update({str(path): path for path in args.graph})
        steps = {name: Step(path, args.threads, args.rows, args.position, args.src_len, args.seed)
                 for name, path in paths.items()}
        rounds: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                rounds[name].append(step.time(args.runs, clock))
    us = {name: round(float(np.median(times)), 1) for name, times in rounds.items()}
    reference = steps["full"].log_probs()
    report: dict[str, Any] = {
        "package": str(args.package), "precision": args.precision, "rows": args.rows, "position": args.position,
        "src_len": args.src_len, "threads": args.threads, "clock": "thread" if args.threads == 1 else "wall",
        "us_per_step": us, "rounds_us": {name: [round(t, 1) for t in times] for name, times in rounds.items()},
        "split_us": {"vocab_projection": round(us["full"] - us["no_vocab"], 1),
                     "layer_matmuls": round(us["full"] - us["no_layer_matmuls"], 1), "rest": us["no_matmuls"]},
        "nodes": {"optimized": len(base.graph.node)},
    }
    if args.graph:
        report["same_log_probs"] = {str(path): bool(np.array_equal(steps[str(path)].log_probs(), reference))
                                    for path in args.graph}
    text = json.dumps(report, indent=1)
    sys.stdout.write(text + "\n")
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
