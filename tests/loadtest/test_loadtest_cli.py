"""``mtgate loadtest`` and ``mtgate validate``: bad input is one line on stderr and exit 2, before any run."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.server import check_host, free_port
from serving.commands.main import main

TARGETS = Path(__file__).resolve().parents[2] / "loadtest" / "targets" / "smoke.yaml"


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_only_loopback_hosts_unless_allowed() -> None:
    assert check_host("http://127.0.0.1:8000/", False) == "http://127.0.0.1:8000"
    assert check_host("http://localhost:1", False) == "http://localhost:1"
    assert check_host("http://[::1]:8000", False) == "http://[::1]:8000"
    with pytest.raises(ValueError, match="pass --allow-remote"):
        check_host("http://example.com:8000", False)
    assert check_host("https://example.com", True) == "https://example.com"
    with pytest.raises(ValueError, match="not an http"):
        check_host("127.0.0.1:8000", True)


def test_start_server_defaults_to_the_demo_model(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import serving.server.settings

    monkeypatch.setattr(serving.server.settings, "DEFAULT_MODEL_DIR", tmp_path / "models" / "demo-en-de")
    err = _error(capsys, ["loadtest", "--start-server", "--targets", str(TARGETS)])
    assert "the bundled demo model is not built" in err and "make demo" in err


def test_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _error(capsys, ["loadtest", "--host", "http://10.1.2.3:8000", "--targets", str(TARGETS),
                          "--report", str(tmp_path / "r")])
    assert "is not 127.0.0.1 or localhost; pass --allow-remote" in err
    assert "one of the arguments --server --start-server is required" in _error(capsys, ["loadtest", "--targets",
                                                                                         str(TARGETS)])
    assert "no such file" in _error(capsys, ["loadtest", "--host", "http://127.0.0.1:1",
                                             "--targets", str(tmp_path / "nope.yaml")])
    assert "no scenario nope" in _error(capsys, ["loadtest", "--host", "http://127.0.0.1:1", "--targets",
                                                 str(TARGETS), "--scenario", "nope"])
    port = free_port()  # nothing listens there
    assert f"cannot reach http://127.0.0.1:{port}" in _error(
        capsys, ["loadtest", "--host", f"http://127.0.0.1:{port}", "--targets", str(TARGETS),
                 "--report", str(tmp_path / "r")])
    assert "empty.txt: no sentences" in _error(
        capsys, ["loadtest", "--host", f"http://127.0.0.1:{port}", "--targets", str(TARGETS),
                 "--corpus", str(_empty(tmp_path))])
    assert not (tmp_path / "r").exists()


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.txt"
    path.write_text("\n\n", encoding="utf-8")
    return path


def test_validate_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    err = _error(capsys, ["validate", "-m", str(tmp_path), "--testset", str(src), str(ref)])
    assert "has 2 lines but" in err
    ref.write_text("a\nb\n", encoding="utf-8")
    err = _error(capsys, ["validate", "-m", str(tmp_path / "nope"), "--testset", str(src), str(ref)])
    assert "not a directory" in err
    err = _error(capsys, ["validate", "-m", str(tmp_path), "--testset", str(src), str(ref)])
    assert "no manifest.json" in err
    err = _error(capsys, ["validate", "-m", str(tmp_path), "--testset", str(src), str(ref),
                          "--targets", str(TARGETS), "--scenario", "nope"])
    assert "no scenario nope" in err


def _argparse_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """argparse's own refusals (serving.commands.main prints them): exit 2, the error on the last line, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_adhoc_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: every error below comes before any connection
    host = ["loadtest", "--host", f"http://127.0.0.1:{port}"]
    assert "--scenario needs --targets" in _error(capsys, [*host, "--scenario", "single"])
    err = _error(capsys, [*host, "--targets", str(TARGETS), "--user-class", "StreamUser"])
    assert "--user-class describe the ad-hoc scenario; with --targets, set them in the file" in err
    assert "-t/--run-time: duration '2x'" in _error(capsys, [*host, "-t", "2x"])
    assert "at most 3600 s" in _error(capsys, [*host, "-t", "2h"])
    assert "no such directory" in _error(capsys, [*host, "--csv", str(tmp_path / "missing" / "run")])
    assert "is a directory" in _error(capsys, [*host, "--html", str(tmp_path)])
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert "exists and is not a directory" in _error(capsys, [*host, "--report", str(tmp_path / "file")])
    assert f"cannot reach http://127.0.0.1:{port}" in _error(capsys, [*host, "-u", "2", "-t", "1s"])
    assert "must be at least 1" in _argparse_error(capsys, [*host, "-u", "0"])
    assert "invalid choice" in _argparse_error(capsys, [*host, "--user-class", "NoSuchUser"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


def _options(command: str) -> list[tuple[list[str], str | None]]:
    import argparse

    from serving.commands.main import build_parser

    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return [(a.option_strings, a.help) for a in sub._actions if a.option_strings]


@pytest.mark.parametrize("command", ["loadtest", "validate"])
def test_every_option_has_help_and_the_old_spellings_are_hidden(command: str) -> None:
    import argparse

    options = _options(command)
    shown = [names for names, text in options if text != argparse.SUPPRESS]
    assert all(text for names, text in options), [names for names, text in options if not text]
    hidden = {name for names, text in options if text == argparse.SUPPRESS for name in names}
    flat = {name for names in shown for name in names}
    if command == "validate":
        assert {"-m", "--model", "--runtime", "--baseline", "--baseline-runtime", "--baseline-precision",
                "--max-batch-size"} <= flat
        assert hidden >= {"--candidate", "--backend", "--baseline-backend", "--batch-size"}
    else:
        assert {"-m", "-u", "--users", "-r", "--spawn-rate", "-t", "--run-time", "--csv", "--html",
                "--user-class", "--server"} <= flat
        assert hidden >= {"--host"}  # Locust's name for the server's URL


def test_validate_takes_the_old_spellings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_text("a\n", encoding="utf-8")
    for argv in (["-m", str(tmp_path)], ["--model", str(tmp_path), "--runtime", "openvino"]):
        assert "no manifest.json" in _error(capsys, ["validate", *argv, "--testset", str(src), str(src)])
    for old in (["--candidate", str(tmp_path)], ["--model", str(tmp_path), "--backend", "openvino"]):
        assert main(["validate", *old, "--testset", str(src), str(src)]) == 2
        warning, error = capsys.readouterr().err.splitlines()  # the old spelling's one warning line, then the error
        assert warning.startswith(f"mtgate validate: warning: {old[-2]} is deprecated, use ") and "no manifest.json" in error


def test_validate_refuses_an_artifact_the_package_lacks_before_any_work(
        tiny_onnx_package: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A baseline (or candidate) without the asked precision is a usage error (exit 2), not a REJECT (exit 1)."""
    src = tmp_path / "src.txt"
    src.write_text("A dog runs.\n", encoding="utf-8")
    common = ["--testset", str(src), str(src), "--report", str(tmp_path / "r"), "--skip-parity"]
    pkg = str(tiny_onnx_package)
    err = _error(capsys, ["validate", "-m", pkg, "--baseline", pkg, "--baseline-precision", "int8", *common])
    assert (f"baseline {pkg}: package has no onnxruntime/int8 artifact (available: onnxruntime/fp32); choose one "
            "with --baseline-runtime/--baseline-precision") in err
    err = _error(capsys, ["validate", "-m", pkg, "--precision", "int8", *common])
    assert f"candidate {pkg}: package has no onnxruntime/int8 artifact" in err and "--runtime/--precision" in err
    err = _error(capsys, ["validate", "-m", pkg, "--baseline", pkg, "--runtime", "openvino", *common])
    assert f"candidate {pkg}: package has no openvino/fp32 artifact" in err
    err = _error(capsys, ["validate", "-m", pkg, "--baseline-precision", "fp32", *common])
    assert "--baseline-precision describe the baseline: give --baseline PKG too" in err
    assert "--scenario needs --targets" in _error(capsys, ["validate", "-m", pkg, "--scenario", "single", *common])
    assert not (tmp_path / "r").exists()  # nothing written


def test_sweep_refuses_an_artifact_a_package_lacks(tiny_onnx_package: Path, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    import json

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(json.dumps({"models": [str(tiny_onnx_package)], "space": {"precision": ["fp32", "int8"]},
                                 "scenarios": [{"name": "s", "users": {"TranslateUser": 1}}]}), encoding="utf-8")
    err = _error(capsys, ["sweep", str(sweep), "--dry-run"])
    assert f"space: {tiny_onnx_package} has no onnxruntime/int8 artifact (it has: onnxruntime/fp32)" in err
