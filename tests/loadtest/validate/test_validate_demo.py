"""``mtgate validate`` on the bundled demo package: an int8 candidate against the fp32 model in production, and a
model against itself (no difference, p = 1); the capacity plan from the scenario that decodes as the quality run
did; the report's quality section; TensorBoard read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.capacity import CapacityConfig, plan
from loadtest.corpus import DEFAULT_REFERENCE, DEFAULT_SOURCE, read_lines
from loadtest.stats import read_run
from serving.commands.main import main

pytestmark = pytest.mark.timeout(300)
DEMO = Path(__file__).resolve().parents[3] / "models" / "demo-en-de"
N = 24
CAPACITY = {"load": {"peak_rps": 25, "hours_per_day": 8}, "prices": {"cloud_per_core_hour": 0.05}, "headroom": 0.2}


@pytest.fixture(scope="module")
def testset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    if not (DEMO / "manifest.json").exists():
        pytest.skip("the demo package is not built (make demo)")
    directory = tmp_path_factory.mktemp("testset")
    sources, references = read_lines(DEFAULT_SOURCE)[:N], read_lines(DEFAULT_REFERENCE)[:N]
    (directory / "src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (directory / "ref.txt").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    return directory / "src.txt", directory / "ref.txt", sources


def _translate(precision: str, sources: list[str]) -> list[str]:
    from serving.engine.translator import DecodeOptions, Translator

    translator = Translator.load(DEMO, precision=precision, threads=1)
    return [t.text for t in translator.translate(sources, DecodeOptions(beam_size=1))]


def test_int8_candidate_against_the_fp32_baseline(testset: tuple[Path, Path, list[str]], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src, ref, sources = testset
    targets = tmp_path / "targets.yaml"
    targets.write_text(json.dumps({"scenarios": [
        {"name": "greedy", "users": {"TranslateUser": 1}, "concurrency": 2, "duration": "2s", "beam_size": 1,
         "targets": {"p95_ms": 30000}},
        {"name": "beam4", "users": {"TranslateUser": 1}, "concurrency": 1, "duration": "1s", "beam_size": 4,
         "targets": {"p95_ms": 30000}}], "capacity": CAPACITY}), encoding="utf-8")
    code = main(["validate", "-m", str(DEMO), "--precision", "int8", "--baseline", str(DEMO),
                 "--baseline-precision", "fp32", "--testset", str(src), str(ref), "--beam-size", "1", "--threads", "1",
                 "--skip-parity", "--targets", str(targets), "--report", str(tmp_path / "r"),
                 "--tensorboard", str(tmp_path / "tb")])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    report = json.loads((tmp_path / "r" / "validate.json").read_text(encoding="utf-8"))
    assert (report["candidate"]["precision"], report["baseline"]["precision"]) == ("int8", "fp32")
    # Each system was translated with its own artifact.
    candidate = (tmp_path / "r" / "candidate.hyp.txt").read_text(encoding="utf-8").splitlines()
    baseline = (tmp_path / "r" / "baseline.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert candidate == _translate("int8", sources) and baseline == _translate("fp32", sources)
    bleu = next(c for c in report["comparison"] if c["metric"] == "BLEU")
    assert bleu["identical"] == (candidate == baseline)
    # The cost is measured where the quality run decoded (greedy), not in the faster or slower scenario.
    cost = report["cost"]
    greedy = read_run(tmp_path / "r" / "greedy" / "locust")
    assert greedy.tokens is not None
    assert cost["throughput_source"] == "load scenario greedy" and cost["beam_size"] == 1
    assert cost["tokens_per_s"] == pytest.approx(greedy.tokens.output_tokens_per_s)
    requests = sum(e.requests for e in greedy.request_entries)
    expected = plan(CapacityConfig.model_validate(CAPACITY), cost["tokens_per_s"], 1,
                    greedy.tokens.output_tokens / requests)
    html = (tmp_path / "r" / "validate.html").read_text(encoding="utf-8")
    assert expected is not None and f"{expected.replicas} replica(s) x 1 core(s)" in html
    # The quality section: per-sentence scores, length buckets, the changed sentences side by side.
    analysis = report["analysis"]
    assert len(analysis["sentence_chrf"]["candidate"]) == N and sum(analysis["bucket_sizes"]) == N
    for chart in ("chrf-distribution", "length-buckets", "latency", "throughput", "server"):
        assert f'data-chart="{chart}"' in html, chart
    changed = [i for i in range(N) if candidate[i] != baseline[i]]
    assert len(analysis["losses"]) + len(analysis["gains"]) <= len(changed)
    for example in analysis["losses"] + analysis["gains"]:
        i = example["index"]
        assert (example["candidate"], example["baseline"], example["source"]) == (candidate[i], baseline[i],
                                                                                 sources[i])
    from batch.tensorboard import read_events

    [run] = list((tmp_path / "tb").iterdir())
    events = read_events(run)
    assert events["quality/candidate_bleu"] == [(0, pytest.approx(report["quality"]["candidate"]["bleu"]))]
    assert events["quality/baseline_chrf"] == [(0, pytest.approx(report["quality"]["baseline"]["chrf"]))]
    assert events["cost/per_million_tokens"] == [(0, pytest.approx(cost["per_million_tokens"]))]
    assert events["capacity/replicas"] == [(0, float(expected.replicas))]
    assert "load/greedy/p95_ms" in events and events["verdict"][0][1].startswith(f"**{report['verdict']}**")


def test_identical_models_are_no_difference(testset: tuple[Path, Path, list[str]], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    src, ref, _ = testset
    code = main(["validate", "-m", str(DEMO), "--baseline", str(DEMO), "--testset", str(src), str(ref),
                 "--beam-size", "1", "--threads", "1", "--skip-parity", "--report", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "r" / "validate.json").read_text(encoding="utf-8"))
    assert [(c["metric"], c["delta"], c["p_value"], c["identical"]) for c in report["comparison"]] == [
        ("BLEU", 0.0, 1.0, True), ("chrF", 0.0, 1.0, True)]
    assert "delta +0.00, p = 1.0000: identical translations: no difference" in out
    assert report["analysis"]["losses"] == [] and report["analysis"]["gains"] == []
    html = (tmp_path / "r" / "validate.html").read_text(encoding="utf-8")
    assert "BLEU: identical translations: no difference." in html
