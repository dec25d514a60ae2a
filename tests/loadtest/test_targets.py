"""The targets file: schema, clear errors, durations, the shipped examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.targets import TargetsError, load_targets, parse_duration, parse_targets

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "loadtest" / "targets").glob("*.yaml"))


def test_minimal_scenario_gets_defaults() -> None:
    targets = parse_targets({"scenarios": [{"name": "s", "users": {"TranslateUser": 1}}]})
    [s] = targets.scenarios
    assert (s.concurrency, s.duration, s.bulk_size, s.think_time_s) == (1, 10.0, 16, 0.0)
    assert s.targets.max_error_rate == 0.0  # a wrong answer fails the gate unless a rate is allowed
    assert s.targets.p95_ms is None
    assert targets.quality.alpha == 0.05


@pytest.mark.parametrize(("text", "seconds"), [(20, 20.0), ("20s", 20.0), ("2m", 120.0), ("1m30s", 90.0),
                                               ("1h", 3600.0), ("1.5s", 1.5), ("7", 7.0)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", 0, -1, "2h", True])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_every_problem_is_reported_with_its_location() -> None:
    data = {
        "scenarios": [
            {"name": "ok", "users": {"TranslateUser": 1}},
            {"name": "bad name!", "users": {"TranslateUser": 1}, "concurrency": 0, "duration": "forever",
             "targets": {"p95_ms": -5, "max_error_rate": 2, "p96_ms": 1}},
            {"name": "ok", "users": {"NoSuchUser": 1}},
        ],
        "extra": 1,
    }
    with pytest.raises(TargetsError) as e:
        parse_targets(data, "t.yaml")
    lines = str(e.value).splitlines()
    assert all(line.startswith("t.yaml: ") for line in lines)
    text = str(e.value)
    for fragment in ("scenarios[1].name:", "scenarios[1].concurrency:", "scenarios[1].duration: duration 'forever'",
                     "scenarios[1].targets.p95_ms: Input should be greater than 0",
                     "scenarios[1].targets.max_error_rate:", "scenarios[1].targets.p96_ms: Extra inputs",
                     "scenarios[2].users: unknown user class NoSuchUser (known: TranslateUser, BatchUser, BulkUser, StreamUser, "
                     "MixedStreamUser, TritonUser)", "extra: Extra inputs"):
        assert fragment in text, text
    assert len(lines) == 8


def test_duplicate_names_and_streaming_targets_without_a_stream() -> None:
    with pytest.raises(TargetsError, match="duplicate scenario name a"):
        parse_targets({"scenarios": [{"name": "a", "users": {"BulkUser": 1}}] * 2})
    with pytest.raises(TargetsError, match="ttfe_\\* targets need StreamUser"):
        parse_targets({"scenarios": [{"name": "a", "users": {"BulkUser": 1}, "targets": {"ttfe_p95_ms": 100}}]})


def test_not_a_mapping_and_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(TargetsError, match="expected a mapping with a 'scenarios' list, got list"):
        parse_targets([1, 2])
    path = tmp_path / "t.yaml"
    path.write_text("scenarios:\n  - name: a\n   users: [\n", encoding="utf-8")
    with pytest.raises(TargetsError, match=r"t.yaml: not valid YAML at line 3"):
        load_targets(path)
    with pytest.raises(TargetsError, match="no such file"):
        load_targets(tmp_path / "missing.yaml")


def test_corpus_is_relative_to_the_file_and_select(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("scenarios:\n  - {name: a, users: {TranslateUser: 1}, corpus: c.txt}\n"
                    "  - {name: b, users: {TranslateUser: 1}}\n", encoding="utf-8")
    targets = load_targets(path)
    assert targets.scenarios[0].corpus == tmp_path / "c.txt"
    assert [s.name for s in targets.select(["b"])] == ["b"]
    assert [s.name for s in targets.select(None)] == ["a", "b"]
    with pytest.raises(TargetsError, match="no scenario c \\(scenarios: a, b\\)"):
        targets.select(["c"])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_shipped_examples_load(path: Path) -> None:
    assert load_targets(path).scenarios
