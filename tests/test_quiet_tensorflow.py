"""TensorFlow's start-up log stays off stderr: tensor2tensor checkpoints (``converters.t2t_checkpoint``) import it with
its log off, and ``--tensorboard``'s writer (``batch.tensorboard``, for loadtest, validate, sweep and batch-score)
does not import it at all (tensorboardX writes the events).

Its C++ side logs through absl at import: the instruction-set notice, "All log messages before absl::InitializeLog()"
and, on CPUs where oneDNN is on by default (AVX512_VNNI, AMX), "oneDNN custom operations are on" whatever
``TF_CPP_MIN_LOG_LEVEL`` says. What silences them must be in the environment when tensorflow is imported: the first
tests catch that import and look; the last runs the real thing with a clean environment.
"""

from __future__ import annotations

import importlib.abc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
T2T = ROOT / "tests" / "data" / "t2t" / "transformer_test_ckpt"
VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")


class _CatchTensorflow(importlib.abc.MetaPathFinder):
    """Refuses ``import tensorflow``, noting the environment at that moment."""

    def __init__(self) -> None:
        self.seen: dict[str, str | None] | None = None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "tensorflow":
            self.seen = {v: os.environ.get(v) for v in VARIABLES}
            raise ImportError("caught by the test")
        return None


@pytest.fixture
def catch(monkeypatch: pytest.MonkeyPatch) -> Iterator[_CatchTensorflow]:
    for name in VARIABLES:  # absent (and restored to absent afterwards), so the code's own setting shows
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    finder = _CatchTensorflow()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield finder


def _t2t_reader() -> None:
    from converters.base import ConversionError
    from converters.t2t_checkpoint import list_checkpoint

    with pytest.raises(ConversionError):
        list_checkpoint(T2T / "model.ckpt-1")


def test_tensorflow_is_imported_with_its_log_off(catch: _CatchTensorflow) -> None:
    _t2t_reader()
    assert catch.seen is not None, "tensorflow was not imported"
    assert catch.seen == {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def test_a_user_setting_wins(catch: _CatchTensorflow, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    _t2t_reader()
    assert catch.seen is not None and catch.seen["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_the_tensorboard_writer_imports_no_tensorflow(catch: _CatchTensorflow, tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    from batch.tensorboard import open_run

    with open_run(tmp_path, "loadtest") as run:
        run.scalars({"p95_ms": 12.0})
        run.text("verdict", "**PASS**")
    assert catch.seen is None, "the writer imported tensorflow"


def test_a_summary_and_a_t2t_checkpoint_print_nothing(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    script = f"""
from pathlib import Path
from converters.t2t_checkpoint import list_checkpoint
from batch.tensorboard import open_run
with open_run(Path({str(tmp_path)!r}), "loadtest") as run:
    run.scalars({{"p95_ms": 12.0}})
    run.text("verdict", "**PASS**")
assert list_checkpoint(Path({str(T2T / "model.ckpt-1")!r}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
