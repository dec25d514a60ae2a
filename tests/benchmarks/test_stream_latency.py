"""benchmarks/stream_latency.py on the tiny package, a few sentences (tests/data's Multi30k): request-level batching
on the native core, step-level on numpy (tests/serving/engine/test_streaming.py has every pair in the engine). It
serves the package and a copy with a length penalty, measures the time to the first stable text and to the full
sentence, checks the streamed text alone and in mixed batches (fp32: exactly the non-streamed translation), and
writes its report; both runs translate alike."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks import stream_latency

SOURCES = Path(__file__).resolve().parents[1] / "data" / "multi30k" / "test_2016_flickr.en.gz"


def _run(package: Path, mode: str, out: Path) -> dict[str, Any]:
    code = stream_latency.main(["--package", str(package), "--sources", str(SOURCES), "--precision", "fp32",
                                "--modes", mode,
                                "--sentences", "4", "--check", "--clients", "3", "--out-dir", str(out / "report"),
                                "--work-dir", str(out / "work")])
    assert code == 0
    [report] = (out / "report").glob("stream-latency-*.json")
    data: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
    md = (out / "report" / report.name.replace(".json", ".md")).read_text(encoding="utf-8")
    assert f"| {mode} |" in md
    return data


def test_stream_latency_on_the_tiny_package(tiny_onnx_package: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    native = os.environ.get("MTGATE_NATIVE", "1").strip() != "0"
    digests = []
    for core, mode in (("native" if native else "numpy", "request"), ("numpy", "step")):
        monkeypatch.setenv("MTGATE_NATIVE", "1" if core == "native" else "0")
        data = _run(tiny_onnx_package, mode, tmp_path / core)
        assert data["config"]["core"] == core
        latency = data["modes"][mode]["latency"]
        assert latency["sentences"] == 4 and latency["full_ms"]["median"] > 0
        assert latency["without_partial_event"] == 0
        assert latency["first_event_ms"]["median"] <= latency["full_ms"]["median"]
        checks = data["modes"][mode]["checks"]
        assert [(c["beam"], c["failed"], c["alone_failures"], c["streamed_not_final"], c["streamed_not_alone"],
                 c["plain_not_alone"]) for c in checks] == [(4, 0, 0, 0, 0, 0), (5, 0, 0, 0, 0, 0)]
        assert checks[1]["model"].endswith("-lp0.6")
        digests.append([c["translations_sha256"] for c in checks])
    assert digests[0] == digests[1]  # the cores' and the modes' translations alike
