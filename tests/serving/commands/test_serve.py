"""`mtgate serve` refuses bad arguments and bad packages with one clear line and exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serving.commands.main import main

ROOT = Path(__file__).resolve().parents[3]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["serve", *argv])
    err = capsys.readouterr().err
    return code, err


def test_missing_package(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_cli(capsys, "-m", str(tmp_path / "nope"))
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err


def test_not_a_package(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_cli(capsys, "-m", str(tmp_path))
    assert code == 2 and "not an mtgate model package" in err


def test_unknown_package_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other/9"}))
    code, err = run_cli(capsys, "-m", str(tmp_path))
    assert code == 2 and "unsupported package format" in err


def test_invalid_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, err = run_cli(capsys, "-m", str(tmp_path), "--port", "99999")
    assert code == 2 and "port" in err and "invalid settings" in err
    monkeypatch.setenv("MTGATE_MAX_SENTENCES_PER_REQUEST", "5000")
    code, err = run_cli(capsys, "-m", str(tmp_path))
    assert code == 2 and "max_queue_size" in err
    monkeypatch.delenv("MTGATE_MAX_SENTENCES_PER_REQUEST")
    monkeypatch.setenv("MTGATE_LOG_LEVEL", "chatty")
    code, err = run_cli(capsys, "-m", str(tmp_path))
    assert code == 2 and "unknown log level" in err


def test_more_than_one_worker(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_cli(capsys, "-m", str(tmp_path), "--workers", "2")
    assert code == 2 and "--workers" in err


def test_default_model_missing_is_explained(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import serving.server.settings

    monkeypatch.setattr(serving.server.settings, "DEFAULT_MODEL_DIR", tmp_path / "models" / "demo-en-de")
    code, err = run_cli(capsys)
    assert code == 2 and "bundled demo model is not built" in err and "make demo" in err and "-m PKG" in err


def test_corrupt_package_fails_at_load_with_exit_2(tiny_package: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(tiny_package, tmp_path / "broken")
    onnx = next((broken / "onnx").glob("decoder*.onnx"))
    onnx.write_bytes(onnx.read_bytes()[:-10] + b"corrupted!")
    result = subprocess.run(
        [sys.executable, "-m", "serving.commands.main", "serve", "-m", str(broken), "--port", "0", "--threads", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Checked before the port is taken and before anything is logged: the one line is all of stderr.
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("mtgate serve: error: ") and "sha256 mismatch" in line and onnx.name in line


def test_global_log_level_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.commands.main import build_parser
    from serving.commands.serve import build_settings
    from serving.server.settings import DEFAULT_MODEL_DIR

    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip("needs the demo package (make demo)")
    monkeypatch.setenv("MTGATE_LOG_LEVEL", "DEBUG")
    parser = build_parser(only="serve")
    assert build_settings(parser.parse_args(["serve"])).log_level == "DEBUG"
    given = parser.parse_args(["--log-level", "WARNING", "serve"])
    assert build_settings(given).log_level == "WARNING"


def test_old_option_and_environment_names_still_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from serving.commands.main import build_parser
    from serving.server.settings import ServingSettings

    (tmp_path / "pkg").mkdir()
    package = str(tmp_path / "pkg")
    parser = build_parser(only="serve")
    old = parser.parse_args(["serve", "-m", package, "--max-batch-sentences", "3", "--max-batch-delay-ms", "2.5",
                             "--queue-capacity", "300", "--backend", "openvino"])
    new = parser.parse_args(["serve", "-m", package, "--max-batch-size", "3", "--max-queue-delay-us", "2500",
                             "--max-queue-size", "300", "--runtime", "openvino"])
    assert vars(old) == vars(new)
    monkeypatch.setenv("MTGATE_MAX_BATCH_SENTENCES", "7")
    monkeypatch.setenv("MTGATE_MAX_BATCH_DELAY_MS", "20")
    monkeypatch.setenv("MTGATE_QUEUE_CAPACITY", "256")
    settings = ServingSettings()
    assert (settings.max_batch_size, settings.max_queue_delay_us, settings.max_queue_size) == (7, 20_000, 256)
    monkeypatch.setenv("MTGATE_MAX_QUEUE_DELAY_US", "100")  # the new name wins over the old one
    monkeypatch.setenv("MTGATE_MAX_BATCH_SIZE", "9")
    assert (ServingSettings().max_batch_size, ServingSettings().max_queue_delay_us) == (9, 100)
    assert ServingSettings(max_batch_size=2, max_queue_delay_us=0).max_batch_size == 2
    monkeypatch.setenv("MTGATE_MAX_BATCH_DELAY_MS", "soon")
    monkeypatch.delenv("MTGATE_MAX_QUEUE_DELAY_US")
    with pytest.raises(Exception, match="max_queue_delay_us"):
        ServingSettings()


def test_the_runtime_setting_reads_the_old_backend_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.server.settings import ServingSettings, old_environment_warnings

    for name in ("MTGATE_RUNTIME", "MTGATE_BACKEND", "MTGATE_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    assert (ServingSettings().runtime, ServingSettings().precision) == ("onnxruntime", "auto")
    monkeypatch.setenv("MTGATE_BACKEND", "openvino")
    assert ServingSettings().runtime == "openvino"
    assert old_environment_warnings() == [
        "MTGATE_BACKEND is deprecated, use MTGATE_RUNTIME (the old name goes in the next release)"]
    monkeypatch.setenv("MTGATE_RUNTIME", "onnxruntime")  # the new name wins over the old one
    assert ServingSettings().runtime == "onnxruntime"
    assert ServingSettings(runtime="openvino").runtime == "openvino"


def test_busy_port_is_one_line_and_exit_2_before_anything_loads(tiny_package: Path) -> None:
    import socket
    import time

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "serving.commands.main", "serve", "-m", str(tiny_package), "--port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
        took = time.monotonic() - started
    # The whole of stderr is the one line: nothing was logged, so nothing was loaded.
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"mtgate serve: error: cannot listen on 127.0.0.1:{port}: Address already in use "
                             "(another server is listening there: stop it or choose another --port)\n")
    assert took < 30


def test_log_level_after_serve_overrides_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from serving.commands.main import build_parser
    from serving.commands.serve import build_settings

    (tmp_path / "manifest.json").write_text("{}")
    monkeypatch.setattr("serving.commands.serve.open_package", lambda package: type("P", (), {"artifact": lambda self, *args: None})())
    monkeypatch.setenv("MTGATE_LOG_LEVEL", "ERROR")
    parser = build_parser(only="serve")
    assert build_settings(parser.parse_args(["serve", "-m", str(tmp_path)])).log_level == "ERROR"
    for argv in (["serve", "-m", str(tmp_path), "--log-level", "debug"], ["--log-level", "DEBUG", "serve", "-m",
                                                                          str(tmp_path)]):
        assert build_settings(parser.parse_args(argv)).log_level == "DEBUG", argv
