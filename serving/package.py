"""The model package: a directory with manifest.json, tokenizer files and runtime artifacts.

``converters`` writes packages with :func:`write_package_atomically`; ``serving`` reads them with
:func:`load_manifest`, which refuses an unknown format and (by default) any file whose sha256 does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "mtgate-model/3"
MANIFEST = "manifest.json"
RUNTIMES = ("onnxruntime", "openvino")
PRECISIONS = ("fp32", "int8")


class PackageError(Exception):
    """The directory is not a usable model package (the message says why, naming the file)."""


@dataclass(frozen=True)
class Artifact:
    runtime: str
    precision: str
    encoder: str
    decoder: str


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under root except the manifest, keyed by POSIX relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_of(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def read_manifest(package_dir: Path) -> dict[str, Any]:
    """Read and check the format of manifest.json (no checksum verification)."""
    path = package_dir / MANIFEST
    if not package_dir.is_dir():
        raise PackageError(f"{package_dir}: not a directory")
    if not path.is_file():
        raise PackageError(f"{package_dir}: no {MANIFEST}; not an mtgate model package")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(f"{path}: unreadable manifest ({e})") from e
    if not isinstance(manifest, dict):
        raise PackageError(f"{path}: manifest is not a JSON object")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise PackageError(f"{path}: unsupported package format {fmt!r} (this mtgate reads {FORMAT!r}; "
                           "convert the checkpoint again with `mtgate convert`)")
    return manifest


def verify_checksums(package_dir: Path, manifest: dict[str, Any], only: list[str] | None = None) -> list[str]:
    """Return one problem per missing or modified file (all listed files, or only those in ``only``)."""
    problems: list[str] = []
    files: dict[str, str] = manifest.get("files", {})
    for rel in only if only is not None else sorted(files):
        expected = files.get(rel)
        path = package_dir / rel
        if expected is None:
            problems.append(f"{rel}: not listed in the manifest")
        elif not path.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_of(path) != expected:
            problems.append(f"{rel}: sha256 mismatch (file modified or corrupt)")
    return problems


def load_manifest(package_dir: Path, verify: bool = True) -> dict[str, Any]:
    """Read the manifest and, by default, verify every file's checksum.

    Raises:
        PackageError: not a package, unknown format, or a file missing or modified.
    """
    manifest = read_manifest(package_dir)
    if verify:
        problems = verify_checksums(package_dir, manifest)
        if problems:
            raise PackageError(f"{package_dir}: " + "; ".join(problems))
    return manifest


def artifacts(manifest: dict[str, Any]) -> list[Artifact]:
    return [
        Artifact(a["runtime"], a["precision"], a["files"]["encoder"], a["files"]["decoder"])
        for a in manifest.get("artifacts", [])
    ]


def find_artifact(manifest: dict[str, Any], runtime: str, precision: str) -> Artifact:
    for artifact in artifacts(manifest):
        if artifact.runtime == runtime and artifact.precision == precision:
            return artifact
    have = ", ".join(f"{a.runtime}/{a.precision}" for a in artifacts(manifest)) or "none"
    raise PackageError(f"package has no {runtime}/{precision} artifact (available: {have})")


def write_manifest(package_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json atomically, with fresh checksums of every other file."""
    manifest = dict(manifest, format=FORMAT, files=file_checksums(package_dir))
    tmp = package_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, package_dir / MANIFEST)


@contextmanager
def staging_dir(output_dir: Path) -> Iterator[Path]:
    """Yield an empty temp dir beside output_dir; on success it replaces output_dir, on error it is removed.

    Serving never sees half a package: the final rename is atomic on one filesystem.
    """
    output_dir = output_dir.absolute()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old.{os.getpid()}")
        os.replace(output_dir, old)
    os.replace(tmp, output_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_package_atomically(output_dir: Path, fill: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Call ``fill(tmp_dir)`` to write files and return the manifest body, then checksum and commit atomically."""
    with staging_dir(output_dir) as tmp:
        manifest = fill(tmp)
        write_manifest(tmp, manifest)
    return read_manifest(output_dir)
