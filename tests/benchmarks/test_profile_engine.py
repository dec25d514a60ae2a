"""benchmarks/profile_engine.py on the tiny package: the wall split counts the decoder steps of the package's own
decoder contract (a stationary cache written in place, package format 4) and splits them into the runtime's calls
and what runs outside them, with the binds per step and the outside time by part; the ONNX Runtime node profile
drives that decoder through the translator's own steps (it fed the old growing-cache inputs and failed on format-4
packages), at any beam and batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import profile_engine
from serving.engine.backends.onnxruntime import OnnxRuntimeBackend
from serving.package import open_package


@pytest.mark.parametrize(("beam", "batch"), [(1, 1), (2, 2)])
def test_profile_of_the_tiny_package(tiny_onnx_package: Path, tmp_path: Path, beam: int, batch: int) -> None:
    artifact = open_package(tiny_onnx_package).artifact("onnxruntime", "fp32")
    stationary = OnnxRuntimeBackend(tiny_onnx_package / artifact.encoder, tiny_onnx_package / artifact.decoder,
                                    1).stationary
    out = tmp_path / "profile.json"
    code = profile_engine.main(["--package", str(tiny_onnx_package), "-n", "2", "--new-tokens", "3", "--threads", "1",
                                "--beam", str(beam), "--batch", str(batch), "--nodes", "3", "-o", str(out)])
    assert code == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    split = report["wall_split"]
    assert split["tokens"] == 6 and split["decoder_steps"] == (3 if batch == 2 else 6)
    assert split["decode_step_ms_per_step"] > 0
    assert 0 < split["runtime_ms_per_step"] < split["wall_ms_per_step"]
    assert split["outside_runtime_ms_per_step"] > 0 and 0 < split["outside_runtime_share"] < 1
    parts = split["outside_runtime_us_per_step_by_part"]  # a second pass, the search loop's calls timed
    named = [parts[f"{name}_us_per_step"] for name in profile_engine.OUTSIDE_PARTS]
    assert all(value >= 0 for value in named) and parts["rows_decode_us_per_step"] > 0
    assert parts["search_advance_us_per_step"] > 0 and parts["setup_us_per_step"] > 0
    assert abs(sum(named) + parts["rest_us_per_step"] - parts["outside_us_per_step"]) < 0.5
    if stationary:  # bound on the first step of each batch only (3 sentence-steps per batch, 23 bindings)
        assert 0 < split["binds_per_step"] < 23
    profile = report["ort_decoder_profile"]
    assert profile["steps"] == split["decoder_steps"] and profile["ort_nodes_ms_per_step"] > 0
    assert profile["nodes"] == sum(profile["nodes_per_op"].values()) > 0
    groups = profile["groups_ms_per_step"]
    assert "vocab projection (Gemm [B,D]x[V,D]^T)" in groups or "log-softmax over the vocabulary" in groups
    in_place = "self-attention over the cache in place (GroupQueryAttention)"
    assert (in_place in groups) is stationary, groups
    # --nodes: every operator type's calls and microseconds per call, and the costliest nodes
    per_call = profile["ops_per_call"]
    assert sum(row["nodes"] for row in per_call.values()) == profile["nodes"]
    assert all(row["calls_per_step"] > 0 and row["us_per_call"] >= 0 for row in per_call.values())
    top = profile["top_nodes"]
    assert len(top) == 3 and all(row["op"] in per_call and row["calls_per_step"] > 0 for row in top)
