"""``mtgate loadtest`` and ``mtgate validate`` end to end: real Locust (headless, in a subprocess, a few seconds)
against a real ``mtgate serve`` on 127.0.0.1 with the tiny random Marian package of tests/utils/marian_factory.py.

Its translations are meaningless but deterministic and never empty (it runs to max_length). For validate, the test
set's references are the candidate's own translations, so the candidate scores BLEU 100; the "worse baseline" is the
same package with its max_length cut to a few tokens. Expected scores come from sacrebleu directly.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch.tensorboard import read_events
from loadtest.corpus import DEFAULT_SOURCE, read_lines
from loadtest.locust_run import GRACE_S, STOP_TIMEOUT_S
from loadtest.scrape import read as read_metrics
from loadtest.server import start_server
from loadtest.stats import PERCENTILE_FRACTIONS, read_run
from serving.commands.main import main

pytestmark = pytest.mark.timeout(300)
N = 16
# Greedy and short: each request takes milliseconds even on a loaded 2-core machine.
FAST = {"beam_size": 1, "max_length": 8}


@pytest.fixture(scope="module")
def package(tiny_onnx_package: Path) -> Path:
    """The shared tiny package for onnxruntime only (tests/conftest.py): validate checks every artifact's parity."""
    return tiny_onnx_package


@pytest.fixture(scope="module")
def server(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with start_server(package, log, extra_args=["--threads", "1"]) as running:
        yield running.url


def _targets(path: Path, scenarios: list[dict[str, Any]], **extra: Any) -> Path:
    path.write_text(json.dumps({"scenarios": scenarios, **extra}), encoding="utf-8")  # JSON is YAML
    return path


def test_gate_passes_an_easy_target_and_fails_an_impossible_one(
        server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    easy = _targets(tmp_path / "easy.yaml", [{
        "name": "everything", "users": {"TranslateUser": 1, "BulkUser": 1, "StreamUser": 1, "TritonUser": 1},
        "concurrency": 4, "spawn_rate": 4, "duration": "3s", "bulk_size": 3, **FAST,
        "targets": {"p95_ms": 30000, "ttfe_p95_ms": 30000, "max_error_rate": 0.0, "min_rps": 0.1,
                    "min_tokens_per_s": 1}}])
    started = time.monotonic()
    assert main(["loadtest", "--host", server, "--targets", str(easy), "--report", str(tmp_path / "easy")]) == 0
    assert time.monotonic() - started < 3 + STOP_TIMEOUT_S + GRACE_S  # the hard limit of a 3 s scenario
    out = capsys.readouterr().out
    assert "PASS: report" in out and "FAIL" not in out
    run = read_run(tmp_path / "easy" / "everything" / "locust")
    by_label = {e.label: e for e in run.entries}
    for label in ("POST /v1/translate", "POST /v1/translate/bulk", "POST /v1/translate/stream",
                  "TTFE /v1/translate/stream", "V2 /v2/models/tiny-marian/infer"):
        assert by_label[label].requests > 0 and by_label[label].failures == 0, label
    assert run.tokens is not None and run.tokens.output_tokens > 0
    # Locust ran for its --run-time: not less (gevent's stale clock made short runs end at once), not much more
    assert 2.5 <= run.tokens.seconds <= 3 + STOP_TIMEOUT_S
    # counted on every kind of request, and max_length bounds every sentence
    assert 0 < run.tokens.output_tokens <= FAST["max_length"] * run.tokens.translated
    report = (tmp_path / "easy" / "report.md").read_text(encoding="utf-8")
    assert report.startswith("# Load test: PASS") and "V2 /v2/models/tiny-marian/infer" in report
    # The server's /metrics was scraped during the run: queue wait and batch sizes, charted in the report
    scraped = read_metrics(tmp_path / "easy" / "everything" / "server_metrics.json")
    assert scraped is not None and len(scraped.samples) >= 3
    whole = scraped.whole_run()
    assert whole is not None and whole.batch_size_mean is not None and whole.batch_size_mean >= 1
    assert whole.queue_wait_mean_ms is not None and whole.queue_wait_mean_ms >= 0
    assert "everything-server.svg" in report and 'data-chart="server"' in (
        tmp_path / "easy" / "report.html").read_text(encoding="utf-8")

    impossible = _targets(tmp_path / "impossible.yaml", [{
        "name": "impossible", "users": {"TranslateUser": 1}, "concurrency": 1, "duration": "1s", **FAST,
        "targets": {"p50_ms": 0.001, "min_rps": 1e6}}])
    assert main(["loadtest", "--host", server, "--targets", str(impossible),
                 "--report", str(tmp_path / "impossible")]) == 1
    out = capsys.readouterr().out
    lines = {line.split("  ")[1].strip(): line.split()[-1] for line in out.splitlines()[2:] if line.startswith("imp")}
    assert lines == {"successful requests >= 1": "pass", "p50 latency <= 0.001 ms": "FAIL",
                     "error rate <= 0 %": "pass", "requests/s >= 1e+06 req/s": "FAIL"}
    assert (tmp_path / "impossible" / "report.html").read_text(encoding="utf-8").count("FAIL") >= 3


def test_adhoc_run_without_a_targets_file(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Locust's -u/-r/-t, --csv and --html against the built-in users; the gate checks only failures."""
    code = main(["loadtest", "--host", server, "-u", "2", "-r", "2", "-t", "2s", "--user-class", "TranslateUser",
                 "--user-class", "StreamUser", "--beam-size", "1", "--max-length", "8", "--csv",
                 str(tmp_path / "run"), "--html", str(tmp_path / "locust.html"), "--report", str(tmp_path / "r"),
                 "--tensorboard", str(tmp_path / "tb")])
    out = capsys.readouterr().out
    assert code == 0, out
    checks = {re.split(r"\s{2,}", line)[1] for line in out.splitlines()[2:] if line.startswith("adhoc")}
    assert checks == {"successful requests >= 1", "error rate <= 0 %"}
    run = read_run(tmp_path / "run")  # Locust's own CSV files, under the prefix asked for
    assert {e.label for e in run.entries} == {"POST /v1/translate", "POST /v1/translate/stream",
                                              "TTFE /v1/translate/stream"}
    assert all(e.failures == 0 and e.requests > 0 for e in run.entries)
    # The Aggregated row counts real requests: a stream is one request, its time-to-first-event entry is not another.
    assert run.aggregated.requests == sum(e.requests for e in run.request_entries)
    assert run.aggregated.requests < sum(e.requests for e in run.entries)
    assert run.history and (tmp_path / "run_failures.csv").exists()
    assert "<html" in (tmp_path / "locust.html").read_text(encoding="utf-8").lower()
    tokens = read_run(tmp_path / "r" / "adhoc" / "locust").tokens  # the report's copy has the token counts too
    assert tokens is not None and tokens.output_tokens > 0 and 1.5 <= tokens.seconds
    # and each entry's response-time histogram (Locust's own): it gives back Locust's percentiles and median
    reported = read_run(tmp_path / "r" / "adhoc" / "locust")
    for entry in [*reported.entries, reported.aggregated]:
        histogram = entry.histogram
        assert histogram is not None and histogram.requests == entry.requests, entry.label
        assert {p: float(histogram.percentile(f)) for p, f in PERCENTILE_FRACTIONS.items()} == entry.percentiles
        assert histogram.median() == entry.median_ms
    # TensorBoard: one run directory, read back with TensorFlow's event reader
    [tb_run] = list((tmp_path / "tb").iterdir())
    assert tb_run.name.startswith("loadtest-") and f"tensorboard: {tb_run}" in out
    events = read_events(tb_run)
    post = next(e for e in run.request_entries if e.label == "POST /v1/translate")
    assert events["load/adhoc/requests"] == [(0, float(sum(e.requests for e in read_run(
        tmp_path / "r" / "adhoc" / "locust").request_entries)))]
    assert events["load/adhoc/p95_ms"][0][1] >= (post.percentile("95%") or 0)
    assert events["load/adhoc/error_rate"] == [(0, 0.0)] and events["load/adhoc/passed"] == [(0, 1.0)]
    assert events["load/adhoc/output_tokens_per_s"][0][1] == pytest.approx(tokens.output_tokens_per_s)
    assert len(events["load/adhoc/over_time/requests_per_s"]) >= 1
    [(_, verdict)] = events["verdict"]
    assert verdict.startswith("**PASS**") and "| adhoc | error rate <= 0 % | 0.00 % | pass |" in verdict


def test_mixed_stream_user_logs_sentences_and_paragraphs_apart(server: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """MixedStreamUser: single sentences and paragraphs (consecutive sentences as one text) over the stream, each class
    in its own request and time-to-first-event entries."""
    monkeypatch.setenv("MTGATE_LONG_FRACTION", "0.5")
    monkeypatch.setenv("MTGATE_PARAGRAPH", "2-3")  # the tiny model has 128 positions
    code = main(["loadtest", "--host", server, "-u", "2", "-r", "2", "-t", "2s", "--user-class", "MixedStreamUser",
                 "--beam-size", "1", "--max-length", "8", "--csv", str(tmp_path / "run"),
                 "--report", str(tmp_path / "r")])
    assert code == 0
    run = read_run(tmp_path / "run")
    assert {e.label for e in run.entries} == {f"{kind} /v1/translate/stream ({size})"
                                              for kind in ("POST", "TTFE") for size in ("short", "long")}
    assert all(e.failures == 0 and e.requests > 0 for e in run.entries)
    assert run.aggregated.requests == sum(e.requests for e in run.request_entries)


def _translate(package: Path, sources: list[str]) -> list[str]:
    from serving.engine.translator import DecodeOptions, Translator

    translator = Translator.load(package, threads=1)
    return [t.text for t in translator.translate(sources, DecodeOptions(beam_size=1))]


def _truncated(package: Path, directory: Path, max_length: int) -> Path:
    """The same model with its max_length cut: a deliberately worse package."""
    from serving.package import read_manifest, write_manifest

    shutil.copytree(package, directory)
    manifest = read_manifest(directory)
    manifest["decoding"]["max_length"] = max_length
    manifest["version"] = f"truncated-{max_length}"
    write_manifest(directory, manifest)
    return directory


def test_validate_promotes_the_better_model_and_rejects_the_worse(
        package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sacrebleu
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF
    from sacrebleu.significance import PairedTest

    sources = read_lines(DEFAULT_SOURCE)[:N]
    good = _translate(package, sources)
    worse_package = _truncated(package, tmp_path / "worse", 5)
    worse = _translate(worse_package, sources)
    assert worse != good
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    ref.write_text("".join(s + "\n" for s in good), encoding="utf-8")  # the candidate's own output: BLEU 100
    targets = _targets(tmp_path / "targets.yaml", [{
        "name": "single", "users": {"TranslateUser": 1}, "concurrency": 2, "duration": "2s", **FAST,
        "targets": {"p95_ms": 30000, "min_tokens_per_s": 1}}],
        quality={"min_bleu": 50, "max_bleu_drop": 1.0}, cost={"max_per_million_tokens": 1000})

    common = ["--testset", str(src), str(ref), "--threads", "1", "--beam-size", "1", "--price-per-core-hour", "0.1",
              "--cores", "2"]
    code = main(["validate", "--candidate", str(package), "--baseline", str(worse_package), "--targets", str(targets),
                 "--report", str(tmp_path / "promote"), *common])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "promote" / "validate.json").read_text(encoding="utf-8"))
    assert report["verdict"] == "PROMOTE" and out.startswith("PROMOTE")
    assert {c["name"] for c in report["checks"] if c["passed"]} == {
        "candidate checksums", "candidate parity", "BLEU >= 50", "BLEU not worse than baseline",
        "chrF not worse than baseline", "load scenario single", "cost per million tokens <= 1000"}
    # Every number equals a direct computation.
    cand, base = report["quality"]["candidate"], report["quality"]["baseline"]
    assert cand["bleu"] == pytest.approx(sacrebleu.corpus_bleu(good, [good]).score) == pytest.approx(100.0)
    assert base["bleu"] == pytest.approx(sacrebleu.corpus_bleu(worse, [good]).score)
    assert cand["chrf"] == pytest.approx(sacrebleu.corpus_chrf(good, [good]).score)
    assert base["chrf"] == pytest.approx(sacrebleu.corpus_chrf(worse, [good]).score)
    assert base["bleu"] < 50
    _, direct = PairedTest([("baseline", worse), ("candidate", good)],
                           {"BLEU": BLEU(references=[good]), "chrF": CHRF(references=[good])},
                           references=None, test_type="bs", n_samples=1000)()
    bleu = next(c for c in report["comparison"] if c["metric"] == "BLEU")
    assert bleu["p_value"] == pytest.approx(direct["BLEU"][1].p_value) and bleu["p_value"] < 0.05
    assert bleu["delta"] == pytest.approx(cand["bleu"] - base["bleu"])
    assert (tmp_path / "promote" / "candidate.hyp.txt").read_text(encoding="utf-8").splitlines() == good
    tokens = read_run(tmp_path / "promote" / "single" / "locust").tokens
    assert tokens is not None
    cost = report["cost"]
    assert cost["tokens_per_s"] == pytest.approx(tokens.output_tokens_per_s)
    assert cost["per_million_tokens"] == pytest.approx(0.1 * 2 / 3600 / tokens.output_tokens_per_s * 1e6)
    assert "PROMOTE" in (tmp_path / "promote" / "validate.html").read_text(encoding="utf-8")

    # The other way round, without load: the drop is significant, so REJECT, and the report says why.
    code = main(["validate", "--candidate", str(worse_package), "--baseline", str(package),
                 "--report", str(tmp_path / "reject"), *common])
    out = capsys.readouterr().out
    assert code == 1, out
    report = json.loads((tmp_path / "reject" / "validate.json").read_text(encoding="utf-8"))
    assert report["verdict"] == "REJECT"
    assert [r.split(":")[0] for r in report["reasons"]] == ["BLEU not worse than baseline",
                                                             "chrF not worse than baseline"]
    assert report["cost"]["throughput_source"] == "test set, in process" and report["load"] is None


def test_validate_rejects_a_modified_package(package: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(package, broken)
    with (broken / "onnx" / "decoder.onnx").open("ab") as f:
        f.write(b"\0")
    src = tmp_path / "src.txt"
    src.write_text("A dog runs.\n", encoding="utf-8")
    assert main(["validate", "--candidate", str(broken), "--testset", str(src), str(src),
                 "--report", str(tmp_path / "r")]) == 1
    report = json.loads((tmp_path / "r" / "validate.json").read_text(encoding="utf-8"))
    assert report["verdict"] == "REJECT"
    assert report["reasons"] == ["candidate checksums: " + report["checks"][0]["detail"]]
    assert "onnx/decoder.onnx: sha256 mismatch" in report["reasons"][0]
