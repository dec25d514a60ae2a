"""What ``mtgate serve`` logs: levels that mean something and lines a person can read.

A normal life (start, a request, a new model version, SIGTERM and drain) logs nothing at WARNING or above: WARNING is
for what needs a look. The first line is short (the settings that differ from their defaults; all of them at DEBUG),
and a model load says how many threads it runs, not ``threads=None``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from serving.commands.serve import settings_line
from serving.engine.backends.onnxruntime import OnnxRuntimeBackend
from serving.engine.backends.openvino import OpenVinoBackend
from serving.server.settings import ServingSettings
from tests.utils.server import start_server

LEVEL = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def _records(log: list[str]) -> list[tuple[str, str, str]]:
    """(level, logger, message) of each line in the text format."""
    return [(m.group(1), m.group(2), m.group(3)) for line in log if (m := LEVEL.match(line.rstrip("\n")))]


def test_a_normal_life_logs_nothing_at_warning_and_starts_with_a_short_line(tiny_onnx_package: Path,
                                                                             tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / "tiny").mkdir(parents=True)
    shutil.copytree(tiny_onnx_package, repository / "tiny" / "1")
    server = start_server(None, "--model-repository", str(repository))
    try:
        answer = httpx.post(server.url + "/v1/translate", json={"text": "A dog runs."}, timeout=30)
        assert answer.status_code == 200, answer.text
        shutil.copytree(tiny_onnx_package, repository / "tiny" / ".incoming")
        os.rename(repository / "tiny" / ".incoming", repository / "tiny" / "2")
        assert httpx.post(server.url + "/v2/repository/models/tiny/load", timeout=60).status_code == 200
    finally:
        code = server.stop()
    time.sleep(0.2)  # the reader thread has the last lines
    assert code == 0, "".join(server.log)
    records = _records(server.log)
    messages = {message: level for level, _, message in records}
    loud = [f"{level} {name}: {message}" for level, name, message in records if level not in ("DEBUG", "INFO")]
    assert loud == [], "\n".join(loud)
    first = server.log[0]
    assert first.split(": ", 1)[1].startswith("settings: model_repository="), first
    assert len(first) < 300, first
    assert "--threads" not in first and "threads=1" in first  # start_server passes --threads 1: it differs
    for expected in ("mtgate serving on http://", "model tiny version 2 loaded and warm in ", "received SIGTERM: draining",
                     "drained in "):
        assert any(m.startswith(expected) for m in messages), f"no INFO line {expected!r}:\n{''.join(server.log)}"


def test_the_settings_line_names_only_what_differs_from_the_defaults() -> None:
    defaults = settings_line(ServingSettings(model_dirs=[Path("models/a")]))
    assert defaults == ("settings: model_dirs=['models/a']; every other setting at its default; "
                        "api key not required")
    changed = settings_line(ServingSettings(model_dirs=[Path("models/a")], port=9000, max_batch_size=8,
                                            api_key="secret"))
    assert changed == "settings: model_dirs=['models/a']; max_batch_size=8, port=9000; api key required" or (
        changed == "settings: model_dirs=['models/a']; port=9000, max_batch_size=8; api key required")
    assert "secret" not in changed


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_model_load_says_how_many_threads_it_runs(runtime: str, tiny_package: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    folder, suffix, backend = {"onnxruntime": ("onnx", "onnx", OnnxRuntimeBackend),
                               "openvino": ("openvino", "xml", OpenVinoBackend)}[runtime]
    paths = (tiny_package / folder / f"encoder.{suffix}", tiny_package / folder / f"decoder.{suffix}")
    with caplog.at_level(logging.INFO, logger=f"serving.engine.backends.{runtime}"):
        backend(*paths)
        backend(*paths, threads=1)
    default, given = [r.getMessage() for r in caplog.records if "loaded" in r.getMessage()]
    assert "None" not in default and re.search(r"\(threads=\d+, [\w ]+'s default", default), default
    assert given.endswith("(threads=1)"), given
