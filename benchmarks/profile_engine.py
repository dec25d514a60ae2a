"""Where mtgate's engine spends a decoding step: session run vs Python vs cache copies vs vocabulary projection.

    .venv/bin/python benchmarks/profile_engine.py --package ~/.cache/mtgate/bench/random-opus-mt-en-de-seed0/mtgate-package-fp32-int8
    .venv/bin/python benchmarks/profile_engine.py --package DIR --runtime openvino --precision int8 -n 8 -o prof.json
    .venv/bin/python benchmarks/profile_engine.py --package models/demo-en-de --precision int8 --beam 4 --threads 1 --clock thread

Three views of the same workload as the benchmark (``python -m benchmarks.bench``) (random source ids with Multi30k test_2016 lengths, exactly
``--new-tokens`` tokens, EOS banned), at ``--beam`` / ``--batch`` (default greedy, batch 1):

1. time split (wall time, or with ``--clock thread`` the calling thread's CPU time): ``Translator.translate`` with timing wrappers around the backend and around the runtime's own
   calls (the sessions' ``run``/``run_with_iobinding``, OpenVINO's ``infer``): encoder calls, decoder-step calls (the
   backend's step: the runtime plus its input binding), the runtime's calls alone, and everything else. **Outside the
   runtime** is the step's wall time minus the runtime's calls (input binding, the search, the rows' bookkeeping,
   batching, detokenizing): ``outside_runtime_ms_per_step`` and its share of the step (issue 37's target: at most 15%
   at batch 1 and at 64 rows, demo int8, beam 4). With ONNX Runtime, ``binds_per_step`` counts the inputs and outputs
   the stationary decoder's binding bound (``serving.engine.backends.binding``: a steady step binds none). A second
   pass splits the time outside the runtime per step by part (``outside_runtime_us_per_step_by_part``): the search's
   setup per batch, the rows' decode call outside the runtime (the step's inputs and binding), the search's step, the
   rows' advance (slot assignment and copies) and the rest (preparing, encoding's Python, detokenizing).
2. inside the decoder step (ONNX Runtime only): the same pass with a session on the same ``decoder.onnx`` with ONNX
   Runtime's profiler in place of the backend's decoder session; node times are grouped (vocabulary projection,
   log-softmax, self/cross attention, FFN, cache concat or the in-place attention, layer norms, other) and compared
   with the session's own run time and with the Python-side ``run()`` time, and listed per operator type with the
   number of nodes of the optimized graph (the node count is what a small model's step pays per node). With
   ``--nodes N``, also every operator type's node count, calls per step and microseconds per call
   (``ops_per_call``) and the ``N`` costliest nodes with theirs (``top_nodes``). The profiler adds a few microseconds
   to every node (a profiled step of the demo is 2-3x an unprofiled one): compare nodes with each other, and time
   graph changes with the unprofiled ``wall_split`` (``--clock thread``, ``--threads 1``).
3. ``cProfile`` of the translate loop: the Python functions that cost the most.

Prints a report and, with ``-o``, writes it as JSON.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench.mtgate_worker import forced_length_translator  # noqa: E402
from benchmarks.bench.workload import DEFAULT_SENTENCES, random_ids_like, read_sentences, special_ids  # noqa: E402
from serving.package import DEFAULT_RUNTIME, RUNTIMES, open_package  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
_clock = CLOCKS["wall"]


def now() -> float:
    """The clock of the run (``--clock``): wall time, or the calling thread's CPU time."""
    return _clock()


class TimedBackend:
    """Wraps a backend and adds up the time of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encode_s = 0.0
        self.step_s = 0.0
        self.steps = 0
        self.step_by_past: dict[int, list[float]] = collections.defaultdict(list)

    def encode(self, input_ids: np.ndarray) -> Any:
        start = now()
        out = self.inner.encode(input_ids)
        self.encode_s += now() - start
        return out

    def decode_step(self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray,
                    src_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._step(int(past_kv.shape[4]), self.inner.decode_step, input_ids, step, past_kv, cross_kv, src_bias)

    def decode_in_place(self, input_ids: np.ndarray, positions: np.ndarray, cache: np.ndarray, cross_kv: np.ndarray,
                        src_bias: np.ndarray, order: np.ndarray) -> np.ndarray:
        """The stationary decoder's step (package format 4, ONNX Runtime); keyed by the longest row's past (its
        position)."""
        return self._step(int(np.max(positions)), self.inner.decode_in_place, input_ids, positions, cache, cross_kv,
                          src_bias, order)

    def _step(self, past_len: int, call: Any, *args: Any) -> Any:
        """One decoder step, timed and counted under ``past_len``."""
        start = now()
        out = call(*args)
        elapsed = now() - start
        self.step_s += elapsed
        self.steps += 1
        self.step_by_past[past_len].append(elapsed)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TimedRows:
    """Wraps a search's decode rows (``serving.engine.rows``) and adds up, into ``parts``, the time of their calls
    outside the runtime: ``rows_decode`` (the step's inputs, the binding), ``rows_advance`` (the plan applied to the
    cache slots) and, with ``arrange`` and the search's construction, ``setup`` (once per batch)."""

    def __init__(self, inner: Any, parts: dict[str, float], clock: dict[str, float]) -> None:
        self.inner = inner
        self.parts = parts
        self.clock = clock

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        runtime, start = self.clock["runtime"], now()
        out = self.inner.decode(tokens)
        self.parts["rows_decode"] += now() - start - (self.clock["runtime"] - runtime)
        return np.asarray(out)

    def advance(self, parents: np.ndarray, encoder_rows: np.ndarray | None) -> None:
        start = now()
        self.inner.advance(parents, encoder_rows)
        self.parts["rows_advance"] += now() - start

    def arrange(self, *args: Any) -> None:
        start = now()
        self.inner.arrange(*args)
        self.parts["setup"] += now() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TimedSearch:
    """Wraps a search (``serving.engine.decoding``) and adds its ``advance`` (the search step, finished hypotheses,
    the streaming hook) into ``parts["search_advance"]``."""

    def __init__(self, inner: Any, parts: dict[str, float]) -> None:
        self.inner = inner
        self.parts = parts

    def advance(self, log_probs: np.ndarray, columns: np.ndarray | None = None) -> Any:
        start = now()
        plan = self.inner.advance(log_probs, columns)
        self.parts["search_advance"] += now() - start
        return plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


OUTSIDE_PARTS = ("setup", "rows_decode", "search_advance", "rows_advance")


def time_search_loop(clock: dict[str, float]) -> tuple[dict[str, float], Any]:
    """Put :class:`TimedRows` and :class:`TimedSearch` around what ``serving.engine.decoding.search.search`` opens;
    returns the parts they add up and a callable that takes them off again."""
    import importlib

    module = importlib.import_module("serving.engine.decoding.search")
    parts = dict.fromkeys(OUTSIDE_PARTS, 0.0)
    kept = module.start_search, module.open_rows

    def start_search(*args: Any, **kwargs: Any) -> Any:
        start = now()
        search = TimedSearch(kept[0](*args, **kwargs), parts)
        parts["setup"] += now() - start
        return search

    def open_rows(backend: Any) -> Any:
        start = now()
        rows = TimedRows(kept[1](backend), parts, clock)
        parts["setup"] += now() - start
        return rows

    module.start_search, module.open_rows = start_search, open_rows

    def restore() -> None:
        module.start_search, module.open_rows = kept

    return parts, restore


def outside_split(parts: dict[str, float], outside_s: float, steps: int) -> dict[str, float]:
    """Microseconds per decoder step of the time outside the runtime, by part: the search's setup per batch
    (the search, the rows and their first arrangement), the rows' decode call outside the runtime (the step's inputs
    and binding), the search's step, the rows' advance (slot assignment and copies), and the rest (preparing,
    encoding's Python, detokenizing, the planner; the timing wrappers' own cost lands in the parts they wrap)."""
    split = {f"{name}_us_per_step": round(1e6 * parts[name] / steps, 1) for name in OUTSIDE_PARTS}
    split["rest_us_per_step"] = round(1e6 * (outside_s - sum(parts.values())) / steps, 1)
    return split


def outside_by_part(translator: Any, texts: list[str], beam: int, batch: int, clock: dict[str, float],
                    steps: int) -> dict[str, float]:
    """A second pass of the timed workload (``steps`` decoder steps) with the search loop's calls timed: the time
    outside the runtime per step, by part (:func:`outside_split`). Its own pass, so that the wrappers' cost stays out
    of the wall split's numbers."""
    parts, restore = time_search_loop(clock)
    runtime = clock["runtime"]
    try:
        wall = run_pass(translator, texts, beam, batch)
    finally:
        restore()
    outside = wall - (clock["runtime"] - runtime)
    split = outside_split(parts, outside, steps)
    split["outside_us_per_step"] = round(1e6 * outside / steps, 1)
    return split


def run_pass(translator: Any, texts: list[str], beam: int, batch: int) -> float:
    from serving.engine.translator import DecodeOptions

    start = now()
    for i in range(0, len(texts), batch):
        translator.translate(texts[i : i + batch], DecodeOptions(beam_size=beam))
    return now() - start


# Node groups of the decoder graph (node names follow converters/onnx_emitter.py; ONNX Runtime's fusions keep the
# first node's name as a prefix).
_GROUPS = [
    ("vocab projection (Gemm [B,D]x[V,D]^T)", re.compile(r"^logits")),
    ("log-softmax over the vocabulary", re.compile(r"LogSoftmax|log_probs")),
    ("cache concat (present_k/v)", re.compile(r"present_[kv]")),
    ("self-attention over the cache in place (GroupQueryAttention)", re.compile(r"GroupQueryAttention")),
    ("self-attention projections", re.compile(r"self_attn\.(qkv|o)\.")),
    ("cross-attention projections", re.compile(r"cross_attn\.(q|o)\.")),
    ("FFN", re.compile(r"\.ffn\.|swish|sigmoid")),
    ("layer norms", re.compile(r"_norm")),
    ("attention scores/softmax/context", re.compile(r"matmul|softmax|reducesum|concat|slice|mul|add|transpose",
                                                    re.I)),
]


def _group(node: str, op: str) -> str:
    for label, pattern in _GROUPS:
        if pattern.search(node) or pattern.search(op) and label.startswith(("log-softmax", "self-attention over")):
            return label
    return "other (gather, reshape, cast...)"


class TimedRuntime:
    """Wraps a runtime object (an ONNX Runtime session, an OpenVINO infer request) and adds up the time of its runs
    into ``clock["runtime"]``; every other attribute is the wrapped object's."""

    _RUNS = ("run", "run_with_iobinding", "infer")

    def __init__(self, inner: Any, clock: dict[str, float]) -> None:
        self.inner = inner
        self.clock = clock

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in self._RUNS:
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = now()
            try:
                return attribute(*args, **kwargs)
            finally:
                self.clock["runtime"] += now() - start

        return timed


def time_runtime(backend: Any, clock: dict[str, float]) -> None:
    """Put :class:`TimedRuntime` around the backend's runtime objects (ONNX Runtime's sessions, OpenVINO's
    requests)."""
    for name in ("encoder", "decoder", "_encoder_request", "_decoder_request"):
        inner = getattr(backend, name, None)
        if inner is not None and not (backend.runtime == "openvino" and name in ("encoder", "decoder")):
            setattr(backend, name, TimedRuntime(inner, clock))


def binds(backend: Any) -> int:
    """Inputs and outputs the backend's stationary-decoder binding has bound so far (0 without one)."""
    return int(getattr(getattr(backend, "_binding", None), "binds", 0))


def ort_decoder_profile(translator: Any, package: Path, precision: str, threads: int, texts: list[str], beam: int,
                        batch: int, top_nodes: int = 0) -> dict[str, Any]:
    """One pass of the workload with ONNX Runtime's profiler on the decoder session (a profiling session on the same
    graph in place of the backend's); node times grouped per step and listed per operator type."""
    import onnxruntime as ort

    from serving.engine.backends.onnxruntime import session_options

    artifact = open_package(package).artifact("onnxruntime", precision)
    options = session_options(threads)
    prefix_dir = Path(tempfile.mkdtemp(prefix="ort-profile-"))
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix_dir / "decoder")
    options.optimized_model_filepath = str(prefix_dir / "decoder.optimized.onnx")
    decoder = ort.InferenceSession(str(package / artifact.decoder), options, providers=["CPUExecutionProvider"])
    backend = translator.backend
    kept = backend.decoder
    clock = {"runtime": 0.0}
    backend.decoder = TimedRuntime(decoder, clock)
    try:
        run_pass(translator, texts, beam, batch)
    finally:
        backend.decoder = kept
    profile_path = Path(decoder.end_profiling())
    events = json.loads(profile_path.read_text(encoding="utf-8"))
    groups: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
    nodes: dict[str, str] = {}
    node_calls: collections.Counter[str] = collections.Counter()
    node_total: collections.Counter[str] = collections.Counter()
    model_run_us = 0.0
    node_us = 0.0
    runs = 0
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            model_run_us += event["dur"]
            runs += 1
        elif event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            node = event["name"][: -len("_kernel_time")]
            op = event.get("args", {}).get("op_name", "?")
            nodes[node] = op
            groups[_group(node, op)] += event["dur"]
            ops[op] += event["dur"]
            node_us += event["dur"]
            node_calls[node] += 1
            node_total[node] += event["dur"]
    # The first run of each shape is slower (allocation planning); the profile covers every run. The profiler adds
    # a few microseconds to every node: compare groups and operators with each other, not with an unprofiled step.
    per_run = 1.0 / 1000.0 / max(1, runs)
    detail: dict[str, Any] = {}
    if top_nodes:
        detail = {"ops_per_call": _per_call(nodes, node_calls, node_total, runs),
                  "top_nodes": [{"node": node, "op": nodes[node], "calls_per_step": round(node_calls[node] / max(1, runs), 2),
                                 "us_per_call": round(total / node_calls[node], 1)}
                                for node, total in node_total.most_common(top_nodes)]}
    return {
        "steps": runs,
        "nodes": len(nodes),
        "nodes_per_op": dict(collections.Counter(nodes.values()).most_common()),
        "python_run_ms_per_step": round(clock["runtime"] * 1000.0 / max(1, runs), 3),
        "ort_model_run_ms_per_step": round(model_run_us * per_run, 3),
        "ort_nodes_ms_per_step": round(node_us * per_run, 3),
        "groups_ms_per_step": {k: round(v * per_run, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "ops_ms_per_step": {k: round(v * per_run, 3) for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:16]},
        "profile_file": str(profile_path),
        "optimized_graph": options.optimized_model_filepath,
        **detail,
    }


def _per_call(nodes: dict[str, str], calls: collections.Counter[str], total: collections.Counter[str],
              runs: int) -> dict[str, dict[str, float]]:
    """Per operator type: its nodes in the optimized graph, their calls per step and microseconds per call, and its
    milliseconds per step; costliest first."""
    table: dict[str, dict[str, float]] = {}
    for op in sorted(set(nodes.values())):
        members = [node for node, kind in nodes.items() if kind == op]
        op_calls = sum(calls[node] for node in members)
        op_us = sum(total[node] for node in members)
        table[op] = {"nodes": len(members), "calls_per_step": round(op_calls / max(1, runs), 2),
                     "us_per_call": round(op_us / max(1, op_calls), 1), "ms_per_step": round(op_us / 1000.0 / max(1, runs), 3)}
    return dict(sorted(table.items(), key=lambda kv: -kv[1]["ms_per_step"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path,
                        default=Path.home() / ".cache/mtgate/bench/random-opus-mt-en-de-seed0/mtgate-package-fp32-int8")
    parser.add_argument("--runtime", default=DEFAULT_RUNTIME, choices=RUNTIMES)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    parser.add_argument("-n", "--num-sentences", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: wall time; thread: the calling thread's CPU time, which with --threads 1 (every "
                             "node of ONNX Runtime then runs on that thread) other processes' load does not inflate, "
                             "for profiles taken on a shared machine (default wall)")
    parser.add_argument("--nodes", type=int, default=0, metavar="N",
                        help="ONNX Runtime: also report each operator type's calls and microseconds per call and the N "
                             "costliest nodes of the decoder step (default 0: operator totals only)")
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]

    manifest = open_package(args.package).manifest
    vocab = manifest.architecture.source_vocab_size
    texts_src = read_sentences(DEFAULT_SENTENCES, args.num_sentences)
    sources = random_ids_like(texts_src, vocab, special_ids(manifest), args.seed)
    texts = [" ".join(map(str, s)) for s in sources]

    translator = forced_length_translator(args.package, args.runtime, args.precision, args.threads,
                                          args.new_tokens)
    clock = {"runtime": 0.0}
    time_runtime(translator.backend, clock)
    warm = max(4, 2 * args.batch)  # the bench's warm-up: every shape of the timed pass seen once
    run_pass(translator, (texts * warm)[:warm], args.beam, args.batch)
    clock["runtime"] = 0.0
    binds_before = binds(translator.backend)
    timed = TimedBackend(translator.backend)
    translator.backend = timed
    wall = run_pass(translator, texts, args.beam, args.batch)
    tokens = len(texts) * args.new_tokens
    steps = max(1, timed.steps)
    # The step's share of the wall time: the whole pass per decoder step (the encoder's calls are runtime time).
    outside = wall - clock["runtime"]
    split = {
        "sentences": len(texts),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "wall_ms_per_sentence": round(1000 * wall / len(texts), 2),
        "decoder_steps": timed.steps,
        "wall_ms_per_step": round(1000 * wall / steps, 3),
        "decode_step_ms_per_step": round(1000 * timed.step_s / steps, 3),
        "encoder_ms_per_sentence": round(1000 * timed.encode_s / len(texts), 3),
        "other_python_ms_per_step": round(1000 * (wall - timed.step_s - timed.encode_s) / steps, 3),
        "runtime_ms_per_step": round(1000 * clock["runtime"] / steps, 3),
        "outside_runtime_ms_per_step": round(1000 * outside / steps, 3),
        "outside_runtime_share": round(outside / wall, 3),
        "binds_per_step": round((binds(timed.inner) - binds_before) / steps, 3),
        "decode_step_ms_by_past_len": {str(t): round(1000 * float(np.median(v)), 3)
                                       for t, v in sorted(timed.step_by_past.items()) if t in (0, 1, 8, 16, 31)},
    }
    translator.backend = timed.inner
    split["outside_runtime_us_per_step_by_part"] = outside_by_part(translator, texts, args.beam, args.batch, clock,
                                                                   steps)

    profiler = cProfile.Profile(_clock)
    profiler.enable()
    run_pass(translator, texts[: max(2, len(texts) // 2)], args.beam, args.batch)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(14)
    top = [line for line in stream.getvalue().splitlines() if line.strip()][-16:]

    report: dict[str, Any] = {"package": str(args.package), "runtime": args.runtime, "precision": args.precision,
                              "threads": args.threads, "clock": args.clock, "beam": args.beam, "batch": args.batch,
                              "new_tokens": args.new_tokens, "wall_split": split, "cprofile_top_tottime": top}
    if args.runtime == "onnxruntime":
        report["ort_decoder_profile"] = ort_decoder_profile(translator, args.package, args.precision, args.threads,
                                                            texts, args.beam, args.batch, args.nodes)
    text = json.dumps(report, indent=1)
    sys.stdout.write(text + "\n")
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
