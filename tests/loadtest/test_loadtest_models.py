"""``mtgate loadtest`` against a real ``mtgate serve`` with two models: ``-m PKG`` and ``--model-name NAME`` test
the model named (every user: /v1/translate, bulk, stream, tritonclient), the server's own counters prove it, and
the report says which model was tested; a model the server does not serve is exit 2 before any run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.metrics_text import read_metrics
from loadtest.server import start_server
from loadtest.stats import read_run
from serving.commands.main import main

pytestmark = pytest.mark.timeout(300)
USERS = ["--user-class", "TranslateUser", "--user-class", "BulkUser", "--user-class", "StreamUser",
         "--user-class", "TritonUser"]
FAST = ["--beam-size", "1", "--max-length", "4"]


def _renamed(package: Path, directory: Path, name: str, version: str) -> Path:
    """The same model under another name and version."""
    from serving.package import read_manifest, write_manifest

    shutil.copytree(package, directory)
    manifest = read_manifest(directory)
    manifest["name"], manifest["version"] = name, version
    write_manifest(directory, manifest)
    return directory


@pytest.fixture(scope="module")
def packages(tiny_onnx_package: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The default model (tiny-marian, version test) and a second one (second-model, version 2)."""
    return tiny_onnx_package, _renamed(tiny_onnx_package, tmp_path_factory.mktemp("second") / "pkg",
                                       "second-model", "2")


@pytest.fixture(scope="module")
def server(packages: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    first, second = packages
    log = tmp_path_factory.mktemp("server") / "server.log"
    with start_server(first, log, extra_args=["-m", str(second), "--threads", "1"]) as running:
        yield running.url


def _sentences(url: str) -> dict[str, float]:
    """mtgate_sentences_total per model, from the server's /metrics."""
    return {s.labels["model"]: s.value for family in read_metrics(url, 10) for s in family.samples
            if s.name == "mtgate_sentences_total" and set(s.labels) == {"model"}}


def test_the_named_package_is_the_model_tested(server: str, packages: tuple[Path, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _, second = packages
    before = _sentences(server)
    code = main(["loadtest", "--host", server, "-m", str(second), "-u", "4", "-r", "4", "-t", "2s", *USERS, *FAST,
                 "--report", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0, out
    after = _sentences(server)
    run = read_run(tmp_path / "r" / "adhoc" / "locust")
    assert {e.label for e in run.request_entries} == {"POST /v1/translate", "POST /v1/translate/bulk",
                                                      "POST /v1/translate/stream", "V2 /v2/models/second-model/infer"}
    assert all(e.requests > 0 and e.failures == 0 for e in run.request_entries)
    assert run.tokens is not None
    # Every translated sentence went to second-model; the default model translated none of them.
    assert after.get("tiny-marian", 0) == before.get("tiny-marian", 0)
    assert after["second-model"] - before.get("second-model", 0) >= run.tokens.translated > 0
    described = "second-model version 2 (onnxruntime/fp32)"
    assert f"model tested: {described}" in out
    assert f"model {described}" in (tmp_path / "r" / "report.md").read_text(encoding="utf-8").splitlines()[2]
    assert f"Model: {described}." in (tmp_path / "r" / "report.html").read_text(encoding="utf-8")


def test_by_name_and_by_default(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _sentences(server)
    code = main(["loadtest", "--host", server, "--model-name", "second-model", "-t", "1s", *FAST,
                 "--report", str(tmp_path / "named")])
    assert code == 0, capsys.readouterr().out
    middle = _sentences(server)
    assert middle["second-model"] > before.get("second-model", 0)
    assert middle.get("tiny-marian", 0) == before.get("tiny-marian", 0)
    assert "model second-model version 2" in (tmp_path / "named" / "report.md").read_text(encoding="utf-8")

    code = main(["loadtest", "--host", server, "-t", "1s", *FAST, "--report", str(tmp_path / "default")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert _sentences(server)["tiny-marian"] > middle.get("tiny-marian", 0)
    assert "model tested: tiny-marian version test (onnxruntime/fp32)" in out


def test_a_model_the_server_does_not_serve_is_exit_2(server: str, packages: tuple[Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    first, second = packages

    def refused(argv: list[str]) -> str:
        assert main(["loadtest", "--host", server, "-t", "1s", *argv, "--report", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err.strip().splitlines()[-1]

    assert "serves no model named 'nope' (it serves: second-model, tiny-marian)" in refused(["--model-name", "nope"])
    # The package's name is served, but at another version: not what -m asked to test.
    other = _renamed(second, tmp_path / "v3", "second-model", "3")
    line = refused(["-m", str(other)])
    assert "serves second-model at version 2, not the version of" in line and "--model-name second-model" in line
    assert "not both" in refused(["-m", str(first), "--model-name", "tiny-marian"])
    assert "no manifest.json" in refused(["-m", str(tmp_path)])
    assert not (tmp_path / "r" / "adhoc").exists()  # nothing ran
