"""A package on disk: opening it (manifest validated, every path inside the directory, checksums) and writing one.

``serving`` opens packages with :func:`open_package`; ``converters`` writes them with :func:`write_package_atomically`
(files in a staging directory beside the target, fsynced, checksummed, renamed into place: a reader never sees half
a package). :func:`read_manifest` and :func:`load_manifest` return the manifest as a plain dict, for callers that
have not moved to :class:`Manifest` yet.

A package is published world-readable, as an installed model is (directories 0755, files 0644, whatever the umask
of the user who wrote it): a server or a container running as another user reads it. A package this user cannot
read is refused in one line that says so (:class:`PackageError`), never with a ``PermissionError`` traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.package.files import atomic_write_text, fsync_dir
from serving.package.manifest import FORMAT, MANIFEST, Artifact, Manifest, PackageError
from serving.package.missing import hub_hint
from serving.package.parse import parse_manifest
from serving.package.precision import choose_precision


@dataclass(frozen=True)
class Package:
    """An opened package: its directory and its validated manifest (every path it names is inside ``root``)."""

    root: Path
    manifest: Manifest

    def path(self, rel: str) -> Path:
        """The file ``rel`` (a path the manifest names) in the package directory."""
        return self.root / rel

    def artifact(self, runtime: str, precision: str) -> Artifact:
        """The ``runtime``/``precision`` artifact (PackageError when the package has none); precision ``auto``: the
        one :func:`~serving.package.precision.choose_precision` picks (its ``precision`` says which)."""
        return self.manifest.artifact(runtime, choose_precision(self.manifest, runtime, precision).precision)


def open_package(package_dir: str | Path, *, verify: bool = True) -> Package:
    """Open a package: read and validate the manifest, check that every path it names stays inside the directory
    and, by default (``verify``), every listed file's sha256.

    Raises:
        PackageError: not a package, an unknown format, an invalid manifest, a path outside the package, a file the
            loader opens missing from the checksum list, or a file missing or modified (one line, every problem).
    """
    return _open(Path(package_dir), verify)[1]


def read_manifest(package_dir: Path) -> dict[str, Any]:
    """The validated manifest as a dict (checksums not verified); see :func:`open_package`."""
    return _open(Path(package_dir), verify=False)[0]


def load_manifest(package_dir: Path, verify: bool = True) -> dict[str, Any]:
    """The validated manifest as a dict, every file's checksum verified by default; see :func:`open_package`."""
    return _open(Path(package_dir), verify=verify)[0]


def _open(package_dir: Path, verify: bool) -> tuple[dict[str, Any], Package]:
    try:
        return _read(package_dir, verify)
    except PermissionError as e:
        where = Path(e.filename) if e.filename else package_dir
        raise PackageError(_denied(package_dir, [str(where)])) from e


def _read(package_dir: Path, verify: bool) -> tuple[dict[str, Any], Package]:
    path = package_dir / MANIFEST
    if not package_dir.is_dir():
        raise PackageError(f"{package_dir}: not a directory{hub_hint(package_dir)}")
    if not path.is_file():
        raise PackageError(f"{package_dir}: no {MANIFEST}; not an mtgate model package")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except PermissionError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(f"{path}: unreadable manifest ({e})") from e
    manifest = parse_manifest(data, str(path))
    problems = _outside(package_dir, manifest)
    if not problems and (unreadable := _unreadable(package_dir, manifest)):
        raise PackageError(_denied(package_dir, unreadable))
    if not problems and verify:
        problems = verify_checksums(package_dir, manifest)
    if problems:
        raise PackageError(f"{package_dir}: " + "; ".join(problems))
    return data, Package(package_dir, manifest)


def _unreadable(package_dir: Path, manifest: Manifest) -> list[str]:
    """Files the manifest names or lists that exist but this user may not read (a missing file is the checksums')."""
    return [rel for rel in dict.fromkeys([*manifest.opened_files(), *manifest.files])
            if (package_dir / rel).exists() and not os.access(package_dir / rel, os.R_OK)]


def _denied(package_dir: Path, paths: list[str]) -> str:
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (f"{package_dir}: permission denied: {shown} not readable by this user (uid {os.geteuid()}); make the "
            f"package readable (chmod -R a+rX {package_dir}) or convert it again (mtgate convert writes packages "
            "world-readable)")


def _outside(package_dir: Path, manifest: Manifest) -> list[str]:
    """Named or listed files that resolve outside the package (symlinks), and ONNX external data not listed."""
    root = package_dir.resolve()
    problems: list[str] = []
    for rel in dict.fromkeys([*manifest.opened_files(), *manifest.files]):
        if not (package_dir / rel).resolve().is_relative_to(root):
            problems.append(f"{rel}: resolves outside the package (a symlink?)")
    for rel in manifest.opened_files():
        data = f"{rel}.data"  # converters.onnx_emitter's external weights of a large graph
        if rel.endswith(".onnx") and data not in manifest.files and (package_dir / data).exists():
            problems.append(f"{data}: not in the checksum list ('files')")
    return problems


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_VERIFIED: dict[tuple[str, int, int, int, int], str] = {}
"""sha256 of files this process has hashed, by (real path, device, inode, size, mtime in ns): ``mtgate serve`` opens
each package before it binds its port and again when the engine loads it, and the second pass costs nothing. Any
write to a file changes its mtime (or its inode, for a rename over it), so a changed file is hashed again."""


def _verified_sha256(path: Path) -> str:
    st = path.stat()
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    digest = _VERIFIED.get(key)
    if digest is None:
        digest = _VERIFIED[key] = sha256_of(path)
    return digest


def file_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under root except the manifest, keyed by POSIX relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_of(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def verify_checksums(package_dir: Path, manifest: Manifest | Mapping[str, Any],
                     only: list[str] | None = None) -> list[str]:
    """One problem per missing or modified file (all listed files, or only those in ``only``)."""
    files: Mapping[str, str] = manifest.files if isinstance(manifest, Manifest) else manifest.get("files", {})
    problems: list[str] = []
    for rel in only if only is not None else sorted(files):
        expected = files.get(rel)
        path = package_dir / rel
        if expected is None:
            problems.append(f"{rel}: not listed in the manifest")
        elif not path.is_file():
            problems.append(f"{rel}: missing")
        elif _verified_sha256(path) != expected:
            problems.append(f"{rel}: sha256 mismatch (file modified or corrupt)")
    return problems


def _entries(package_dir: Path) -> Iterator[tuple[str, Path]]:
    """Every file and symlink under ``package_dir`` as (POSIX relative path, path), sorted; a symlinked directory
    is an entry, not a tree to enter."""
    for folder, dirs, files in os.walk(package_dir):  # followlinks=False
        dirs.sort()
        base = Path(folder)
        for name in sorted([*files, *(d for d in dirs if (base / d).is_symlink())]):
            yield (base / name).relative_to(package_dir).as_posix(), base / name


def unlisted_files(package_dir: Path, manifest: Manifest) -> list[str]:
    """The files and symlinks under the package that its checksum list does not name (the manifest aside): what
    its checksums do not cover. Nothing opens them (:func:`open_package` refuses an opened file that is unlisted),
    and ``mtgate export-triton`` leaves them out."""
    return [rel for rel, _ in _entries(package_dir) if rel != MANIFEST and rel not in manifest.files]


def escaping_links(package_dir: Path) -> dict[str, str]:
    """The symlinks under the package that lead outside it (or nowhere: a loop), listed or not, with their targets:
    a copy that follows links would carry another file's contents."""
    root = package_dir.resolve()
    found: dict[str, str] = {}
    for rel, path in _entries(package_dir):
        if path.is_symlink():
            try:
                inside = path.resolve().is_relative_to(root)
            except (OSError, RuntimeError):  # a loop (RuntimeError before Python 3.13)
                inside = False
            if not inside:
                found[rel] = os.readlink(path)
    return found


def copy_listed(package_dir: Path, target: Path, manifest: Manifest) -> list[str]:
    """Copy the manifest and the files of its checksum list to ``target`` (a symlink inside the package as the file
    it names; :func:`escaping_links` first, for links out of it). Returns what was left out: :func:`unlisted_files`.
    """
    for rel in [MANIFEST, *sorted(manifest.files)]:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(package_dir / rel, target / rel)
    return unlisted_files(package_dir, manifest)


def write_manifest(package_dir: Path, manifest: Manifest | Mapping[str, Any]) -> Manifest:
    """Write manifest.json atomically, with fresh checksums of every other file; return what was written.

    Raises:
        PackageError: the manifest is not valid (nothing is written).
    """
    files = file_checksums(package_dir)
    if isinstance(manifest, Manifest):
        data = dataclasses.replace(manifest, files=files).to_dict()
    else:
        data = dict(manifest, format=FORMAT, files=files)
    written = parse_manifest(data, str(package_dir / MANIFEST))
    atomic_write_text(package_dir / MANIFEST, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return written


@contextmanager
def staging_dir(output_dir: Path, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield an empty temp dir beside output_dir; on success it replaces output_dir, on error it is removed.

    Every file in it is made world-readable (directories 0755, files 0644) and fsynced before the rename, so serving
    never sees half a package, even after a crash, and any user can read it. The previous ``output_dir`` stays in
    place until the new one is complete.

    Raises:
        FileExistsError: ``output_dir`` exists and ``overwrite`` is False (checked when committing).
    """
    output_dir = output_dir.absolute()
    try:
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    except OSError as e:  # name what was asked for, not the staging directory beside it
        raise OSError(e.errno, f"cannot create it ({e.strerror})", str(output_dir)) from e
    try:
        yield tmp
        if output_dir.exists() and not overwrite:
            raise FileExistsError(f"{output_dir}: already exists")
        _publish_modes(tmp)
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old.{os.getpid()}")
        os.replace(output_dir, old)
    try:
        os.replace(tmp, output_dir)
    except BaseException:
        if old is not None:
            os.replace(old, output_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(output_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _publish_modes(root: Path) -> None:
    """Make the tree readable by everyone and writable by its owner only, as installed files are: directories 0755
    (``mkdtemp`` made the root 0700), files 0644 (0755 if executable; ``mkstemp`` writes 0600). Symlinks are left
    alone (their targets are not ours)."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o755)
        elif path.is_file():
            path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):  # files before the directories that hold them
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(root)


def write_package_atomically(output_dir: Path, fill: Callable[[Path], Manifest], *,
                             overwrite: bool = True) -> Manifest:
    """Call ``fill(tmp_dir)`` to write the files and return the manifest, then checksum and commit atomically.

    Raises:
        PackageError: ``fill`` returned an invalid manifest (nothing is written).
        FileExistsError: ``output_dir`` exists and ``overwrite`` is False.
    """
    with staging_dir(output_dir, overwrite=overwrite) as tmp:
        written = write_manifest(tmp, fill(tmp))
    return written
