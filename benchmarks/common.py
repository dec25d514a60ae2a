"""What every benchmark script shares: its errors, progress lines, the machine it measured on, the report's header
and its files (JSON and Markdown, replaced atomically after each measurement), the run's name, duration options and
the package it measures. Each script keeps only what it measures."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.targets import parse_duration
from serving.commands.options import UsageError
from serving.package.files import atomic_write_text

__all__ = ["BenchmarkError", "ReportFiles", "UsageError", "machine", "read_package", "run_header", "run_name", "say",
           "seconds_option"]


class BenchmarkError(Exception):
    """A measurement could not be carried out (server, Locust); the message says why."""


def read_package(path: Path | None) -> tuple[Path, dict[str, Any]]:
    """The package to serve (``path``, else the bundled demo) and what the report says of it: name, version and
    beam size from its manifest (UsageError: none given and no demo, or not a package)."""
    from serving.package import PackageError, read_manifest
    from serving.server.settings import demo_missing, demo_model

    package = path or demo_model()
    if package is None:
        raise UsageError(demo_missing())
    try:
        manifest = read_manifest(package)
    except PackageError as e:
        raise UsageError(str(e)) from None
    decoding = manifest.get("decoding") or {}
    return package, {"name": manifest.get("name"), "version": manifest.get("version"),
                     "package_beam_size": decoding.get("beam_size")}


def seconds_option(flag: str, text: str) -> float:
    """A duration option (``30``, ``'30s'``, ``'2m'``) in seconds (UsageError naming ``flag``)."""
    try:
        return parse_duration(text)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


def run_name(given: str | None, prefix: str, out_dir: Path) -> str:
    """``--name`` (default ``<prefix>-<UTC date>``), checked: a plain file name whose report is not in ``out_dir``
    yet (UsageError)."""
    name = given or f"{prefix}-{datetime.now(UTC):%Y-%m-%d}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' and '-'")
    files = ReportFiles.of(out_dir, name)
    existing = [p for p in (files.json_path, files.md_path) if p.exists()]
    if existing:
        raise UsageError(f"{existing[0]} exists; pass another --name (or remove it)")
    return name


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict[str, Any]:
    """What the numbers were measured on (the load average says whether something else used the cores)."""
    return {"cpu_count": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average_start": [round(x, 2) for x in os.getloadavg()]}


def say(message: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def run_header(data: dict[str, Any]) -> list[str]:
    """The report lines every served benchmark starts with: the command, when, the machine."""
    m = data["machine"]
    return [f"- command: `{data['command']}`" + ("" if data["complete"] else " (**incomplete run**)"),
            f"- started {data['started']}, finished {data['finished'] or '-'}",
            f"- machine: {m['cpu_count']} CPUs ({m['usable_cpus']} usable), {m['cpu_model'] or 'unknown CPU'}; "
            f"load average at start {m['load_average_start']}, at end {m.get('load_average_end', '-')}"]


@dataclass(frozen=True)
class ReportFiles:
    """Where a run writes its report: ``<out_dir>/<name>.json`` and ``.md``, each replaced atomically after every
    measurement, so that an interrupted run leaves what it measured."""

    json_path: Path
    md_path: Path

    @classmethod
    def of(cls, out_dir: Path, name: str) -> ReportFiles:
        return cls(out_dir / f"{name}.json", out_dir / f"{name}.md")

    def write(self, data: dict[str, Any], markdown: Callable[[dict[str, Any]], str]) -> str:
        """Write ``data`` as JSON and ``markdown(data)``; return the markdown."""
        text = markdown(data)
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.json_path, json.dumps(data, indent=2) + "\n")
        atomic_write_text(self.md_path, text)
        return text

    def finish(self, host: dict[str, Any], data: Callable[[], dict[str, Any]],
               markdown: Callable[[dict[str, Any]], str]) -> None:
        """The complete report: the end load average recorded, written, printed."""
        host["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        sys.stdout.write(self.write(data(), markdown))
        say(f"wrote {self.json_path} and {self.md_path}")
