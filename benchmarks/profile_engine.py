"""Where mtgate's engine spends a decoding step: session run vs Python vs cache copies vs vocabulary projection.

    .venv/bin/python benchmarks/profile_engine.py --package ~/.cache/mtgate/bench/random-opus-mt-en-de-seed0/mtgate-package-fp32-int8
    .venv/bin/python benchmarks/profile_engine.py --package DIR --runtime openvino --precision int8 -n 8 -o prof.json

Three views of the same workload as the benchmark (``python -m benchmarks.bench``) (random source ids with Multi30k test_2016 lengths, exactly
``--new-tokens`` tokens, EOS banned), at ``--beam`` / ``--batch`` (default greedy, batch 1):

1. wall clock split: ``Translator.translate`` with a timing wrapper around the backend: encoder calls, decoder-step
   calls (the runtime, plus its input/output conversions), and everything else (search, batching, detokenizing).
2. inside the decoder step (ONNX Runtime only; greedy, batch 1): a session on the same ``decoder.onnx`` with ONNX
   Runtime's profiler in place of the backend's decoder session, driven through the backend's own step call
   (``decode_in_place`` for a stationary cache, ``decode_step`` for a growing one); node times are grouped
   (vocabulary projection, log-softmax, self/cross attention, FFN, cache concat or the in-place attention, layer
   norms, other) and compared with the session's own run time and with the Python-side ``run()`` time.
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


class TimedBackend:
    """Wraps a backend and adds up the time of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encode_s = 0.0
        self.step_s = 0.0
        self.steps = 0
        self.step_by_past: dict[int, list[float]] = collections.defaultdict(list)

    def encode(self, input_ids: np.ndarray) -> Any:
        start = time.perf_counter()
        out = self.inner.encode(input_ids)
        self.encode_s += time.perf_counter() - start
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
        start = time.perf_counter()
        out = call(*args)
        elapsed = time.perf_counter() - start
        self.step_s += elapsed
        self.steps += 1
        self.step_by_past[past_len].append(elapsed)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_pass(translator: Any, texts: list[str], beam: int, batch: int) -> float:
    from serving.engine.translator import DecodeOptions

    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        translator.translate(texts[i : i + batch], DecodeOptions(beam_size=beam))
    return time.perf_counter() - start


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


def ort_decoder_profile(package: Path, precision: str, threads: int, sources: list[list[int]], new_tokens: int,
                        eos: int, start_id: int, pad: int) -> dict[str, Any]:
    """Greedy decoding with ONNX Runtime's profiler on the decoder session; node times grouped per step. The steps
    go through the backend's own call for the package's decoder contract (a stationary cache written in place, or a
    growing one), with a profiling session on the same graph in place of the backend's decoder session."""
    import onnxruntime as ort

    from serving.engine.backends.onnxruntime import OnnxRuntimeBackend, session_options

    artifact = open_package(package).artifact("onnxruntime", precision)
    backend = OnnxRuntimeBackend(package / artifact.encoder, package / artifact.decoder, threads)
    options = session_options(threads)
    prefix_dir = Path(tempfile.mkdtemp(prefix="ort-profile-"))
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix_dir / "decoder")
    decoder = ort.InferenceSession(str(package / artifact.decoder), options, providers=["CPUExecutionProvider"])
    backend.decoder = decoder
    run_s = 0.0
    steps = 0
    for source in sources:
        encoded = backend.encode(np.array([[*source, eos]], dtype=np.int64))
        cross_kv, src_bias = encoded.cross_kv, encoded.src_bias
        layers, _, _, heads, _, head_dim = cross_kv.shape
        token = np.array([[start_id]], dtype=np.int64)
        cache = np.zeros((layers, 2, 1, heads, new_tokens + 1 if backend.stationary else 0, head_dim),
                         dtype=np.float32)
        for step in range(new_tokens):
            start = time.perf_counter()
            if backend.stationary:
                log_probs = backend.decode_in_place(token, np.array([step]), cache, cross_kv, src_bias,
                                                    np.zeros(1, dtype=np.int64))
            else:
                log_probs, cache = backend.decode_step(token, step, cache, cross_kv, src_bias)
            run_s += time.perf_counter() - start
            steps += 1
            log_probs[:, [eos, pad]] = -np.inf
            token = log_probs.argmax(axis=1)[:, None]
    profile_path = Path(decoder.end_profiling())
    events = json.loads(profile_path.read_text(encoding="utf-8"))
    groups: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
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
            groups[_group(node, op)] += event["dur"]
            ops[op] += event["dur"]
            node_us += event["dur"]
    # The first run of each shape is slower (allocation planning); the profile covers every run.
    per_step = 1000.0 / max(1, steps)
    return {
        "steps": steps,
        "python_run_ms_per_step": round(run_s * per_step, 3),
        "ort_model_run_ms_per_step": round(model_run_us / 1000.0 / max(1, runs), 3),
        "ort_nodes_ms_per_step": round(node_us / 1000.0 / max(1, runs), 3),
        "groups_ms_per_step": {k: round(v / 1000.0 / max(1, runs), 3) for k, v in
                               sorted(groups.items(), key=lambda kv: -kv[1])},
        "ops_ms_per_step": {k: round(v / 1000.0 / max(1, runs), 3) for k, v in
                            sorted(ops.items(), key=lambda kv: -kv[1])[:12]},
        "profile_file": str(profile_path),
    }


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
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)

    manifest = open_package(args.package).manifest
    special = manifest.special_ids
    vocab = manifest.architecture.source_vocab_size
    texts_src = read_sentences(DEFAULT_SENTENCES, args.num_sentences)
    sources = random_ids_like(texts_src, vocab, special_ids(manifest), args.seed)
    texts = [" ".join(map(str, s)) for s in sources]

    translator = forced_length_translator(args.package, args.runtime, args.precision, args.threads,
                                          args.new_tokens)
    warm = max(4, 2 * args.batch)  # the bench's warm-up: every shape of the timed pass seen once
    run_pass(translator, (texts * warm)[:warm], args.beam, args.batch)
    timed = TimedBackend(translator.backend)
    translator.backend = timed
    wall = run_pass(translator, texts, args.beam, args.batch)
    tokens = len(texts) * args.new_tokens
    steps = max(1, timed.steps)
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
        "decode_step_ms_by_past_len": {str(t): round(1000 * float(np.median(v)), 3)
                                       for t, v in sorted(timed.step_by_past.items()) if t in (0, 1, 8, 16, 31)},
    }
    translator.backend = timed.inner

    profiler = cProfile.Profile()
    profiler.enable()
    run_pass(translator, texts[: max(2, len(texts) // 2)], args.beam, args.batch)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(14)
    top = [line for line in stream.getvalue().splitlines() if line.strip()][-16:]

    report: dict[str, Any] = {"package": str(args.package), "runtime": args.runtime, "precision": args.precision,
                              "threads": args.threads, "beam": args.beam, "batch": args.batch,
                              "new_tokens": args.new_tokens, "wall_split": split, "cprofile_top_tottime": top}
    if args.runtime == "onnxruntime" and args.batch == 1 and args.beam == 1:
        report["ort_decoder_profile"] = ort_decoder_profile(
            args.package, args.precision, args.threads, sources, args.new_tokens, special.eos,
            special.decoder_start, special.pad)
    text = json.dumps(report, indent=1)
    sys.stdout.write(text + "\n")
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
