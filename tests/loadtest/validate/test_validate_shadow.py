"""``mtgate validate --shadow-log``: the live-traffic section from the pair log of ``mtgate serve --shadow``, and the
targets file's ``shadow:`` rules gating the verdict (a good and a bad candidate's logs, written as the server
writes them: one JSON object per pair, rotated files beside)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from loadtest.targets import ShadowTargets
from loadtest.validate.shadow import ShadowLogError, log_files, shadow_checks, summarize
from serving.commands.main import main
from serving.server.settings import demo_model


def _pair(i: int, identical: bool, chrf: float) -> dict[str, Any]:
    return {"time": f"2026-12-06T08:00:{i % 60:02d}.000+00:00", "request_id": f"r{i}", "index": 0,
            "model": "demo-en-de", "candidate": "demo-en-de@1/int8", "source": f"source {i}",
            "production_text": f"Produktion {i}", "candidate_text": f"Produktion {i}" if identical else f"Kandidat {i}",
            "identical": identical, "chrf": 100.0 if identical else chrf, "bleu": 100.0 if identical else chrf / 2,
            "length_ratio": 1.0 if identical else 0.8, "production_seconds": 0.1 + i / 1000,
            "candidate_seconds": 0.05}


def _log(path: Path, agreement: float, chrf: float, pairs: int = 60) -> Path:
    """A log of ``pairs`` pairs, ``agreement`` of them identical, the others at about ``chrf``, rotated into two
    files (as PairLog rotates)."""
    rng = random.Random(0)
    lines = [json.dumps(_pair(i, i < agreement * pairs, max(0.0, chrf + rng.uniform(-5, 5)))) + "\n"
             for i in range(pairs)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(path.name + ".1").write_text("".join(lines[: pairs // 2]), encoding="utf-8")
    path.write_text("".join(lines[pairs // 2:]), encoding="utf-8")
    return path


RULES = ShadowTargets(min_pairs=50, min_agreement=0.5, min_chrf_p10=60)


def test_the_summary_reads_rotated_files_and_the_rules_tell_good_from_bad(tmp_path: Path) -> None:
    good = _log(tmp_path / "good" / "pairs.jsonl", agreement=0.8, chrf=85)
    with good.open("a", encoding="utf-8") as f:
        f.write('{"not": "a pair"}\n')  # skipped, counted
    bad = _log(tmp_path / "bad" / "pairs.jsonl", agreement=0.0, chrf=30)
    assert log_files(good) == [good.with_name("pairs.jsonl.1"), good]
    summary = summarize(good)
    assert summary["pairs"] == 60 and summary["requests"] == 60 and summary["skipped_lines"] == 1
    assert summary["agreement"] == 0.8 and summary["chrf"]["p10"] > 60 and summary["files"] == 2
    assert summary["worst"][0]["chrf"] <= summary["worst"][-1]["chrf"] and len(summary["worst"]) == 10
    assert all(passed for _, passed, _ in shadow_checks(summary, RULES))
    failed = [name for name, passed, _ in shadow_checks(summarize(bad), RULES) if not passed]
    assert failed == ["shadow agreement >= 0.5", "shadow chrF p10 >= 60"]
    with pytest.raises(ShadowLogError, match="no such file"):
        summarize(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(ShadowLogError, match="no compared pair"):
        summarize(tmp_path / "empty.jsonl")


@pytest.fixture
def demo() -> Path:
    package = demo_model()
    if package is None:
        pytest.skip("the bundled demo model is not built (make demo)")
    return package


def test_validate_adds_the_live_traffic_section_and_gates_on_its_targets(
    demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import loadtest.validate.command

    monkeypatch.setattr(loadtest.validate.command, "_load", lambda *args: None)  # no load scenario here: the shadow rules only
    targets = tmp_path / "targets.yaml"
    targets.write_text("scenarios:\n  - {name: single, users: {TranslateUser: 1}, concurrency: 1, duration: 1s}\n"
                       "shadow: {min_pairs: 50, min_agreement: 0.5, min_chrf_p10: 60}\n", encoding="utf-8")
    verdicts = {}
    for name, agreement, chrf in (("good", 0.8, 85.0), ("bad", 0.0, 30.0)):
        log = _log(tmp_path / name / "pairs.jsonl", agreement, chrf)
        report = tmp_path / f"report-{name}"
        code = main(["validate", "-m", str(demo), "--precision", "fp32", "--limit", "3", "--beam-size", "1",
                     "--threads", "1", "--skip-parity", "--speed-repeats", "1", "--targets", str(targets),
                     "--shadow-log", str(log), "--report", str(report)])
        out = capsys.readouterr().out
        data = json.loads((report / "validate.json").read_text(encoding="utf-8"))
        verdicts[name] = (code, data["verdict"])
        shadow_checks_ = {c["name"]: c["passed"] for c in data["checks"] if c["name"].startswith("shadow")}
        assert shadow_checks_ == {"shadow pairs >= 50": True, "shadow agreement >= 0.5": name == "good",
                                  "shadow chrF p10 >= 60": name == "good"}, out
        assert data["shadow"]["pairs"] == 60 and data["shadow"]["agreement"] == agreement
        page = (report / "validate.html").read_text(encoding="utf-8")
        assert "Live traffic (shadow)" in page and "Worst disagreements" in page and "<svg" in page
    assert verdicts["bad"] == (1, "REJECT")
    assert verdicts["good"] == (0, "PROMOTE"), verdicts
    assert main(["validate", "-m", str(demo), "--shadow-log", str(tmp_path / "missing.jsonl")]) == 2
