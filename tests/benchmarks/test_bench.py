"""The benchmark (benchmarks/bench): the measuring loop and the analysis on fakes, then its ``--quick`` run end to end.

The end-to-end tests build the tiny random Marian model (torch + transformers, the test extra), convert it with
``mtgate convert`` and run real engine processes; they share one cache folder so the model is built once.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.bench import run as bench
from benchmarks.bench.analysis import agreement, analyze, merge_rounds, summarize_case
from benchmarks.bench.cli import main
from benchmarks.bench.measure import Case, measure
from benchmarks.bench.report import render_markdown
from benchmarks.bench.workload import random_ids_like

TARGETS = {"speedup": 1.25, "latency": 0.8, "fp32": 1.0}


# --------------------------------------------------------------------------------------------- measuring loop


def test_measure_uses_the_same_batches_and_counts_every_token() -> None:
    calls: list[tuple[int, int]] = []

    def generate(batch: list[list[int]], beam: int) -> list[list[int]]:
        calls.append((len(batch), beam))
        return [[7] * 3 for _ in batch]

    sentences = [[5, 6]] * 5
    results = measure(generate, sentences, [Case(beam=4, batch=2)], repeats=2, warmup_sentences=3)
    # warm-up: 3 sentences in batches of 2 (2 + 1), then two passes of 2 + 2 + 1
    assert calls == [(2, 4), (1, 4)] + [(2, 4), (2, 4), (1, 4)] * 2
    (row,) = results
    assert row["tokens"] == 15 and row["lengths"] == [3] * 5
    assert len(row["seconds"]) == 2 and all(s >= 0 for s in row["seconds"])
    assert row["outputs"] == [[7, 7, 7]] * 5


def test_random_ids_follow_word_counts_and_avoid_special_ids() -> None:
    texts = ["a b c d e", "one", "x y"]
    ids = random_ids_like(texts, vocab_size=50, special=[0, 1, 49], seed=3)
    assert [len(s) for s in ids] == [7, 1, 3]  # round(words x 1.4), at least 1
    assert all(2 <= t <= 48 for s in ids for t in s)
    assert ids == random_ids_like(texts, vocab_size=50, special=[0, 1, 49], seed=3)
    assert ids != random_ids_like(texts, vocab_size=50, special=[0, 1, 49], seed=4)


def test_agreement_counts_identical_sentences_and_the_shared_prefix() -> None:
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert agreement(ref, ref) == {"identical": 1.0, "prefix": 1.0, "first_mismatch": None}
    result = agreement([[1, 2, 3, 4], [5, 9, 7, 8]], ref)
    assert result["identical"] == 0.5
    assert result["prefix"] == pytest.approx((1.0 + 0.25) / 2)  # tokens after the first difference do not count
    assert result["first_mismatch"] == 1


# --------------------------------------------------------------------------------------------- analysis


def _engine(
    engine_id: str, family: str, fp32: bool, tps: list[float], outputs: list[list[int]], lengths: int = 2
) -> tuple[dict[str, Any], dict[str, list[list[int]]]]:
    cases = [Case(1, 1), Case(4, 16)]
    rows, outs = [], {}
    for case, rate in zip(cases, tps, strict=True):
        tokens = sum(len(o) for o in outputs)
        raw = {
            "beam": case.beam,
            "batch": case.batch,
            "seconds": [tokens / rate] * 3,
            "cpu_seconds": [tokens / rate] * 3,
            "tokens": tokens,
            "lengths": [len(o) for o in outputs],
            "outputs": outputs,
        }
        rows.append(summarize_case(raw, sentences=len(outputs), new_tokens=lengths))
        outs[case.name] = outputs
    entry = {
        "id": engine_id,
        "label": engine_id,
        "family": family,
        "fp32": fp32,
        "status": "ok",
        "cases": rows,
        "peak_rss_mib": 100.0,
        "versions": {},
        "settings": {},
    }
    return entry, outs


def _analyze(
    *engines: tuple[dict[str, Any], dict[str, list[list[int]]]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    entries = [e for e, _ in engines]
    outputs = {e["id"]: o for e, o in engines}
    return entries, analyze(entries, outputs, [Case(1, 1), Case(4, 16)], TARGETS)


def test_analysis_picks_the_best_peer_and_checks_the_targets() -> None:
    same = [[3, 4], [5, 6]]
    entries, result = _analyze(
        _engine("transformers-fp32", "peer", True, [10, 100], same),
        _engine("ct2-int8", "peer", False, [40, 400], [[3, 4], [5, 7]]),
        _engine("mtgate-onnxruntime-fp32", "mtgate", True, [30, 450], same),
        _engine("mtgate-onnxruntime-int8", "mtgate", False, [60, 480], same),
    )
    greedy, beam = result["comparison"]
    assert greedy["best_peer"] == "ct2-int8" and greedy["best_mtgate"] == "mtgate-onnxruntime-int8"
    assert greedy["speedup"] == 1.5 and greedy["speedup_ok"]
    assert greedy["latency_ratio"] == pytest.approx(40 / 60, abs=1e-3) and greedy["latency_ok"]
    assert greedy["fp32_ratio"] == 3.0 and greedy["fp32_ok"]
    assert beam["speedup"] == 1.2 and not beam["speedup_ok"] and "latency_ratio" not in beam
    assert not result["targets_met"]
    assert result["checks"]["reference"] == "transformers-fp32"
    assert result["checks"]["fp32_mismatches"] == [] and result["checks"]["token_count_problems"] == []
    ct2 = entries[1]["cases"][0]
    assert ct2["agreement"]["identical"] == 0.5 and ct2["vs_best_peer"] == 1.0
    assert "| ct2-int8 |" in render_markdown(_report(entries, result))


def test_an_engine_that_generates_fewer_tokens_is_flagged_and_cannot_win() -> None:
    entries, result = _analyze(
        _engine("transformers-fp32", "peer", True, [10, 100], [[3, 4], [5, 6]]),
        _engine("ov-int8", "peer", False, [1000, 1000], [[3], [5]]),  # stopped early
        _engine("mtgate-onnxruntime-fp32", "mtgate", True, [20, 200], [[3, 4], [5, 9]]),
    )
    assert [c["best_peer"] for c in result["comparison"]] == ["transformers-fp32", "transformers-fp32"]
    assert any(
        p.startswith("ov-int8 greedy b1: generated 2 tokens, expected 4")
        for p in result["checks"]["token_count_problems"]
    )
    assert result["checks"]["fp32_mismatches"][0].startswith("mtgate-onnxruntime-fp32 greedy b1: 0.500")
    assert not result["targets_met"]
    markdown = render_markdown(_report(entries, result))
    assert "(!)" in markdown and "NO" in markdown


def _rounds_engine(engine_id: str, family: str, rounds: list[float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An engine measured in ``len(rounds)`` rounds, one pass per round at the given tokens/s, greedy b1 only."""
    outputs = [[3, 4], [5, 6]]
    raw = [[{"beam": 1, "batch": 1, "seconds": [4 / tps], "cpu_seconds": [4 / tps], "tokens": 4, "lengths": [2, 2],
             "outputs": outputs}] for tps in rounds]
    merged = merge_rounds(raw, [Case(1, 1)])
    assert merged[0]["seconds"] == [4 / tps for tps in rounds] and len(merged[0]["round_seconds"]) == len(rounds)
    row = summarize_case(merged[0], sentences=2, new_tokens=2)
    entry = {"id": engine_id, "label": engine_id, "family": family, "fp32": True, "status": "ok", "cases": [row],
             "peak_rss_mib": 100.0, "versions": {}, "settings": {}}
    return entry, {"greedy b1": outputs}


def test_ratios_are_paired_round_by_round() -> None:
    """The machine's speed drifts over a run: engines are compared within a round (the median of the rounds' ratios),
    not by their medians over every pass, which may come from rounds far apart."""
    mine, mine_out = _rounds_engine("mtgate-onnxruntime-fp32", "mtgate", [100, 200, 300])
    peer, peer_out = _rounds_engine("ct2-float32", "peer", [50, 400, 200])
    assert mine["cases"][0]["tokens_per_s_rounds"] == [100, 200, 300] and mine["cases"][0]["tokens_per_s"] == 200
    result = analyze([mine, peer], {mine["id"]: mine_out, peer["id"]: peer_out}, [Case(1, 1)], TARGETS)
    row = result["comparison"][0]
    assert row["speedup_rounds"] == [2.0, 0.5, 1.5] and row["speedup"] == 1.5  # the medians' ratio would be 1.0
    assert row["fp32_ratio"] == 1.5 and row["fp32_ratio_rounds"] == [2.0, 0.5, 1.5]
    assert row["latency_ratio"] == pytest.approx(1 / 1.5, abs=1e-3)
    report = _report([mine, peer], result)
    report["workload"]["rounds"] = 3
    report["machine"]["load_end"] = [2.3, 2.1, 1.9]  # the bench's own engines: no warning
    markdown = render_markdown(report)
    assert "1.50x ok (2.00, 0.50, 1.50)" in markdown and "3 rounds" in markdown and "Warning" not in markdown
    report["workload"]["interleave"] = "case"
    assert "a process per engine, case and round" in render_markdown(report)
    report["machine"]["load_start"] = [1.5, 1.0, 1.0]  # something else was running
    assert "**Warning:** load average 1.5 on 2 cores when the run started" in render_markdown(report)


def _report(entries: list[dict[str, Any]], analysis: dict[str, Any]) -> dict[str, Any]:
    return {
        "created": "now",
        "command": "mtgate bench",
        "engines": entries,
        "analysis": analysis,
        "machine": {"cpu": "cpu", "cores": 2, "load_start": [0, 0, 0], "load_end": [0, 0, 0]},
        "workload": {
            "cases": [{"beam": 1, "batch": 1}, {"beam": 4, "batch": 16}],
            "new_tokens": 2,
            "sentences": 2,
            "sentences_from": "test",
            "repeats": 3,
            "threads": 2,
            "model": {"description": "m"},
            "source_tokens_incl_eos": {"mean": 3, "min": 3, "max": 3},
        },
    }


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "mtgate-onnxruntime-fp32,nope"], "unknown engine(s) nope"),
        (["--checkpoint", "/nonexistent/marian"], "not a Hugging Face model directory"),
        (["--model", "/nonexistent/marian"], "not a Hugging Face model directory"),  # the old spelling, hidden
        (["--sentences", "/nonexistent/file.txt"], "no such file"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--rounds", "0"], "--rounds must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--cache-dir", str(tmp_path), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    if "--model" in argv:  # the old spelling says so first, in one line of its own (serving.commands.options.add_alias)
        assert err[0] == ("python -m benchmarks.bench: warning: --model is deprecated, use --checkpoint (the old "
                          "spelling goes in the next release)")
        err = err[1:]
    assert len(err) == 1 and message in err[0] and err[0].startswith("mtgate bench: error:")


# --------------------------------------------------------------------------------------------- end to end


needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="building the random model needs torch + transformers (test extra)",
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-cache")


@needs_transformers
def test_quick_runs_every_mtgate_engine_and_writes_valid_json(cache_dir: Path, tmp_path: Path) -> None:
    code = main(["--quick", "--rounds", "2", "--cache-dir", str(cache_dir), "-o", str(tmp_path), "--name", "quick"])
    assert code == 0
    report = json.loads((tmp_path / "quick.json").read_text(encoding="utf-8"))
    assert report["format"] == bench.FORMAT
    workload = report["workload"]
    assert workload["sentences"] == 4 and workload["new_tokens"] == 8 and workload["threads"] == 2
    assert workload["rounds"] == 2 and workload["repeats"] == 1
    assert [(c["beam"], c["batch"]) for c in workload["cases"]] == [(1, 1), (1, 4), (4, 1), (4, 4)]
    engines = {e["id"]: e for e in report["engines"]}
    assert set(engines) == {"mtgate-onnxruntime-fp32", "mtgate-openvino-fp32"}
    for engine in engines.values():
        assert engine["status"] == "ok", engine.get("error")
        assert engine["peak_rss_mib"] > 0 and engine["versions"]["onnxruntime"]
        assert len(engine["cases"]) == 4
        for row in engine["cases"]:
            assert row["tokens"] == row["expected_tokens"] == 4 * 8 and row["tokens_ok"]
            assert row["tokens_per_s"] > 0 and len(row["seconds"]) == 2 and len(row["tokens_per_s_rounds"]) == 2
    checks = report["analysis"]["checks"]
    assert checks["token_count_problems"] == [] and checks["fp32_mismatches"] == []
    # one process per engine and round, the second round in the reverse order
    run_dir = cache_dir / "runs" / "quick"
    logs = sorted(run_dir.glob("*.round*.result.json"), key=lambda path: path.stat().st_mtime_ns)
    assert [path.name.split(".")[0] for path in logs] == ["mtgate-onnxruntime-fp32", "mtgate-openvino-fp32",
                                                          "mtgate-openvino-fp32", "mtgate-onnxruntime-fp32"]
    assert (tmp_path / "quick.md").read_text(encoding="utf-8").startswith("# mtgate bench")


@needs_transformers
def test_transformers_generates_the_same_tokens_as_mtgate(cache_dir: Path, tmp_path: Path) -> None:
    """The peer worker (benchmarks/peers.py) on transformers, run with this interpreter, against mtgate fp32."""
    code = main(
        [
            "--quick",
            "--engines",
            "mtgate-onnxruntime-fp32,transformers-fp32",
            "--peer-python",
            sys.executable,
            "--batch-sizes",
            "2",
            "--interleave",
            "case",
            "--cache-dir",
            str(cache_dir),
            "-o",
            str(tmp_path),
            "--name",
            "peer",
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "peer.json").read_text(encoding="utf-8"))
    # a process per engine and case, the engines' order reversed from one case to the next
    run_dir = cache_dir / "runs" / "peer"
    results = sorted(run_dir.glob("*.result.json"), key=lambda path: path.stat().st_mtime_ns)
    assert [path.name.rsplit(".", 2)[0] for path in results] == [
        "mtgate-onnxruntime-fp32.round1.case1", "transformers-fp32.round1.case1",
        "transformers-fp32.round1.case2", "mtgate-onnxruntime-fp32.round1.case2"]
    engines = {e["id"]: e for e in report["engines"]}
    assert engines["transformers-fp32"]["status"] == "ok", engines["transformers-fp32"].get("error")
    assert engines["transformers-fp32"]["versions"]["transformers"]
    analysis = report["analysis"]
    assert analysis["checks"]["reference"] == "transformers-fp32"
    assert analysis["checks"]["fp32_mismatches"] == [] and analysis["checks"]["token_count_problems"] == []
    assert [row["best_peer"] for row in analysis["comparison"]] == ["transformers-fp32"] * 2
    assert all(row["agreement"]["identical"] == 1.0 for row in engines["mtgate-onnxruntime-fp32"]["cases"])


# --------------------------------------------------------------------------------------------- the package cache


def test_the_cached_package_is_converted_again_when_the_converter_changes(
        tmp_path: Path, tiny_onnx_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached package in the format this mtgate reads is reused only while the converter code that wrote it is
    unchanged: a graph change that keeps the package format must not leave the bench measuring the old graph."""
    conversions: list[list[str]] = []

    def fake_convert(cmd: list[str], what: str, timeout: float, env: Any = None, log: Any = None) -> Any:
        conversions.append(cmd)
        out = Path(cmd[cmd.index("-o") + 1])
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tiny_onnx_package, out)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bench, "_run", fake_convert)
    plan: Any = SimpleNamespace(precisions=["fp32"], verify=False, threads=1)
    folder = tmp_path / "cache"
    folder.mkdir()
    said: list[str] = []
    package = bench._ensure_package(plan, tmp_path / "model", folder, said.append)
    assert len(conversions) == 1 and package == folder / "mtgate-package-fp32"
    assert bench._ensure_package(plan, tmp_path / "model", folder, said.append) == package
    assert len(conversions) == 1  # reused
    monkeypatch.setattr(bench, "converter_stamp", lambda: "another converter")
    bench._ensure_package(plan, tmp_path / "model", folder, said.append)
    assert len(conversions) == 2 and any("the converter changed" in line for line in said)
    (folder / "mtgate-package-fp32.converter").unlink()  # converted before stamps existed
    bench._ensure_package(plan, tmp_path / "model", folder, said.append)
    assert len(conversions) == 3

    # the stamp follows the converters' and the package code's sources
    root = tmp_path / "root"
    for part in ("converters", "serving/package"):
        shutil.copytree(bench.ROOT / part, root / part)
    monkeypatch.undo()  # converter_stamp is the real one again
    monkeypatch.setattr(bench, "ROOT", root)
    before = bench.converter_stamp()
    emitter = root / "converters" / "onnx_emitter.py"
    emitter.write_text(emitter.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert bench.converter_stamp() != before
