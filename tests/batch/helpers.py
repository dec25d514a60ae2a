"""Running the real ``batch-score`` console script in a subprocess, and checking what it leaves behind.

``run_cli`` runs ``batch-score`` (the installed console script, else ``python -m batch.cli``) with an environment
without TensorFlow's log settings, so that what batch-score itself sets is what is tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# TensorFlow's log settings (what batch-score sets itself is what is tested) and a Ray address from outside
_TF_LOG_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MAX_VLOG_LEVEL", "RAY_ADDRESS")
CLI_TIMEOUT = 240


def batch_score_command() -> list[str]:
    exe = Path(sys.executable).with_name("batch-score")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "batch.cli"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _TF_LOG_VARIABLES}


def run_cli(*args: str | Path, cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``batch-score ARGS`` in a subprocess; stdout and stderr captured as text (``env``: added variables)."""
    return subprocess.run([*batch_score_command(), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**clean_env(), **(env or {})}, timeout=CLI_TIMEOUT, check=False)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Exit ``code``, exactly one line on stderr, no traceback, every needle in that line; returns the line."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert err and "\n" not in err, proc.stderr
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def leftovers(directory: Path) -> list[str]:
    """Temporary files anywhere under ``directory`` (``*.tmp``, ``*.probe``, hidden files)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.name.endswith((".tmp", ".probe")) or p.name.startswith("."))


def write_tfrecord(path: Path, sources: list[str], references: list[str] | None = None) -> Path:
    """A TFRecord of ``tf.train.Example``s {inputs[, targets]} written by tensorflow."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, source in enumerate(sources):
            example = tf.train.Example()
            example.features.feature["inputs"].bytes_list.value.append(source.encode("utf-8"))
            if references is not None:
                example.features.feature["targets"].bytes_list.value.append(references[i].encode("utf-8"))
            writer.write(example.SerializeToString())
    return path
