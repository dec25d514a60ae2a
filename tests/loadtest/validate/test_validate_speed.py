"""``mtgate validate``'s in-process speed: the median and range of ``--speed-repeats`` timed passes, the systems'
passes alternating, the cost priced from that median; left to the load scenario when one decodes as the quality
run did (no timed passes then, and the report says so)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadtest.corpus import DEFAULT_SOURCE, read_lines
from loadtest.validate.speed import Speed, measure_speed
from serving.commands.main import main

pytestmark = pytest.mark.timeout(300)


def test_speed_is_the_median_with_its_range() -> None:
    speed = Speed((900.0, 450.0, 1500.0))
    assert (speed.median, speed.low, speed.high) == (900.0, 450.0, 1500.0)
    assert speed.text() == "900.0 (median of 3 passes, 450.0-1500.0)"
    assert speed.to_json() == {"repeats": 3, "median": 900.0, "min": 450.0, "max": 1500.0,
                               "samples": [900.0, 450.0, 1500.0]}


@dataclass
class _Translation:
    text: str
    output_tokens: int


class _Prepared:
    def __init__(self, n: int) -> None:
        self.n = n

    def take(self, rows: range) -> _Prepared:
        return _Prepared(len(rows))


class _Recorder:
    """A translator that records which system ran each pass."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order = name, order

    def prepare(self, sources: list[str], options: Any) -> _Prepared:
        self.order.append(self.name)
        return _Prepared(len(sources))

    def run(self, prepared: _Prepared) -> list[_Translation]:
        return [_Translation("x", 2)] * prepared.n


def test_the_systems_passes_alternate() -> None:
    order: list[str] = []
    systems: dict[str, Any] = {"candidate": _Recorder("c", order), "baseline": _Recorder("b", order)}
    speeds = measure_speed(systems, ["a"] * 5, None, 2, 3)  # type: ignore[arg-type]
    assert order == ["c", "b", "c", "b", "c", "b"]
    assert {role: len(s.samples) for role, s in speeds.items()} == {"candidate": 3, "baseline": 3}


def test_validate_reports_the_median_of_repeated_passes(tiny_onnx_package: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    sources = read_lines(DEFAULT_SOURCE)[:8]
    src = tmp_path / "src.txt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    pkg = str(tiny_onnx_package)
    common = ["-m", pkg, "--baseline", pkg, "--testset", str(src), str(src), "--threads", "1", "--beam-size", "1",
              "--max-length", "6", "--skip-parity", "--cores", "1"]
    assert main(["validate", *common, "--speed-repeats", "4", "--report", str(tmp_path / "r")]) in (0, 1)
    out, err = capsys.readouterr()
    assert "timing 4 pass(es) of the test set per system" in err
    assert len([line for line in out.splitlines() if "(median of 4 passes, " in line]) == 2  # both systems
    report = json.loads((tmp_path / "r" / "validate.json").read_text(encoding="utf-8"))
    for role in ("candidate", "baseline"):
        speed = report["quality"][role]["speed"]
        assert speed["repeats"] == 4 and len(speed["samples"]) == 4
        assert speed["median"] == pytest.approx(statistics.median(speed["samples"]))
        assert speed["min"] == min(speed["samples"]) <= speed["median"] <= speed["max"] == max(speed["samples"])
        assert report["quality"][role]["tokens_per_s"] == pytest.approx(speed["median"])
    cost = report["cost"]
    assert cost["throughput_source"] == "test set, in process"
    assert cost["tokens_per_s"] == pytest.approx(report["quality"]["candidate"]["speed"]["median"])
    assert "median of 4 passes" in cost["throughput_note"] and report["speed_left_to"] is None
    page = (tmp_path / "r" / "validate.html").read_text(encoding="utf-8")
    assert page.count("(median of 4 passes, ") >= 2 and "Speed: median and range of 4 timed passes" in page

    # A load scenario that decodes with the quality run's beam measures the throughput: no timed passes.
    targets = tmp_path / "targets.yaml"
    targets.write_text(json.dumps({"scenarios": [{"name": "greedy", "users": {"TranslateUser": 1}, "duration": "1s",
                                                  "beam_size": 1, "max_length": 6}]}), encoding="utf-8")
    assert main(["validate", *common, "--targets", str(targets), "--report", str(tmp_path / "load")]) in (0, 1)
    assert "timing" not in capsys.readouterr().err
    report = json.loads((tmp_path / "load" / "validate.json").read_text(encoding="utf-8"))
    assert report["speed_left_to"] == "greedy"
    assert report["quality"]["candidate"]["speed"] is None and report["quality"]["candidate"]["tokens_per_s"] is None
    assert report["cost"]["throughput_source"] == "load scenario greedy"
    assert report["load"]["scenarios"][0]["model"] == "tiny-marian version test (onnxruntime/fp32)"
    page = (tmp_path / "load" / "validate.html").read_text(encoding="utf-8")
    assert "– (load scenario greedy)" in page and "the cost uses the throughput of load scenario greedy" in page
