"""A model repository's versions, in Triton's layout and with Triton's version policy: which versions a model
directory holds (``<name>/<version>/``, ``<version>`` a positive integer, a package inside), which of them to serve
(``latest:N``, ``all``, ``specific:V[,V...]``; from the settings or from a load's config override), and when a
version's files changed. Applied by ``serving.server.repository``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from serving.engine.errors import InvalidInput, NotSupported
from serving.server.client_json import parse_client_json

MANIFEST = "manifest.json"

@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model to serve: ``latest`` N, ``all``, or ``specific`` ones."""

    kind: str
    latest: int = 1
    specific: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        """``latest:N``, ``all`` or ``specific:V[,V...]``.

        Raises:
            ValueError: anything else, with what is accepted.
        """
        kind, _, value = text.strip().partition(":")
        try:
            if kind == "all" and not value:
                return cls("all")
            if kind == "latest" and int(value) >= 1:
                return cls("latest", latest=int(value))
            if kind == "specific" and value:
                numbers = frozenset(int(v) for v in value.split(","))
                if min(numbers) >= 1:
                    return cls("specific", specific=numbers)
        except ValueError:
            pass
        raise ValueError(f"version policy {text!r}: expected latest:N (N >= 1), all, or specific:V[,V...]")

    @classmethod
    def from_config(cls, document: object) -> VersionPolicy:
        """The ``version_policy`` of a Triton model configuration in JSON: ``{"latest": {"num_versions": N}}``,
        ``{"all": {}}`` or ``{"specific": {"versions": [V, ...]}}`` (numbers or, as protobuf writes int64, strings).

        Raises:
            ValueError: anything else, with what is accepted.
        """
        expected = ('version_policy: expected {"latest": {"num_versions": N}}, {"all": {}} or '
                    '{"specific": {"versions": [V, ...]}}')
        if not isinstance(document, dict) or len(document) != 1:
            raise ValueError(f"{expected}, got {document!r}")
        [(kind, value)] = document.items()
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise ValueError(f"{expected}, got {document!r}")
        if kind == "latest":
            numbers = [value.get("num_versions", 1)]
        elif kind == "specific":
            versions = value.get("versions")
            numbers = versions if isinstance(versions, list) else [None]
        elif kind == "all":
            return cls("all")
        else:
            raise ValueError(f"{expected}, got {document!r}")
        if not numbers or not all(isinstance(n, int | str) and str(n).isdigit() and int(n) >= 1 for n in numbers):
            raise ValueError(f"{expected} (N, V >= 1), got {document!r}")
        if kind == "latest":
            return cls("latest", latest=int(numbers[0]))
        return cls("specific", specific=frozenset(int(n) for n in numbers))

    def __str__(self) -> str:
        """As ``--repository-version-policy`` writes it."""
        if self.kind == "latest":
            return f"latest:{self.latest}"
        if self.kind == "specific":
            return "specific:" + ",".join(str(n) for n in sorted(self.specific))
        return "all"

    def choose(self, numbers: list[int]) -> list[int]:
        """The versions to serve among ``numbers``, ascending."""
        ordered = sorted(numbers)
        if self.kind == "latest":
            return ordered[-self.latest:]
        if self.kind == "specific":
            return [n for n in ordered if n in self.specific]
        return ordered


Files = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Version:
    """The version of a model the repository holds."""

    name: str
    number: int
    path: Path


def model_dirs(root: Path) -> list[Path]:
    """The repository's model directories, by name.

    Raises:
        OSError: the repository cannot be listed.
    """
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def version_numbers(model_dir: Path) -> list[int]:
    """The versions in a model directory: directories named by a positive integer that hold a package's manifest.

    Raises:
        OSError: the directory cannot be listed.
    """
    return [int(p.name) for p in model_dir.iterdir()
            if p.is_dir() and p.name.isdigit() and int(p.name) > 0 and (p / MANIFEST).is_file()]


def served_versions(root: Path, policy: VersionPolicy) -> dict[str, list[Version]]:
    """Each model of the repository with the versions the policy serves, ascending (models with none, or that cannot
    be listed, are left out)."""
    found: dict[str, list[Version]] = {}
    with contextlib.suppress(OSError):
        for model_dir in model_dirs(root):
            with contextlib.suppress(OSError):
                chosen = policy.choose(version_numbers(model_dir))
                if chosen:
                    found[model_dir.name] = [Version(model_dir.name, n, model_dir / str(n)) for n in chosen]
    return found


def fingerprint(path: Path) -> Files:
    """Every entry under ``path`` with its modification time and size (symlinks not followed): a version that failed
    to load is tried again by a poll once this changes, as Triton's poll reloads a model whose files changed."""
    entries = []
    for directory, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            with contextlib.suppress(OSError):
                stat = os.lstat(os.path.join(directory, name))
                entries.append((os.path.relpath(os.path.join(directory, name), path), stat.st_mtime_ns, stat.st_size))
    return tuple(sorted(entries))


def config_policy(name: str, parameters: Mapping[str, object]) -> VersionPolicy | None:
    """The version policy a load's parameters ask for (None: the server's): Triton's ``config`` parameter, a model
    configuration in JSON of which mtgate applies ``version_policy`` (``name`` may repeat the model's).

    Raises:
        NotSupported: model files sent with the load (``file:...`` parameters).
        InvalidInput: a config that is not a JSON object, names another model, sets what mtgate cannot override per
            model (the message names the fields), or a version policy Triton would not accept.
    """
    files = sorted(key for key in parameters if key.startswith("file:"))
    if files:
        raise NotSupported(f"load {name!r}: model files sent with the request ({', '.join(files)}) are not "
                           f"supported; place the package in the repository as <repository>/{name}/<version>/")
    config = parameters.get("config")
    if config is None:
        return None
    if not isinstance(config, str):
        raise InvalidInput("load parameter 'config' must be a string: a model configuration in JSON")
    document = parse_client_json(config, "load parameter 'config'")
    if not isinstance(document, dict):
        raise InvalidInput("load parameter 'config' must be a JSON object (a model configuration)")
    others = sorted(set(document) - {"name", "version_policy"})
    if others:
        raise InvalidInput(f"load {name!r}: a config override may set version_policy only; {', '.join(others)} "
                           "cannot be overridden per model (they are mtgate serve's settings)")
    if document.get("name") not in (None, "", name):
        raise InvalidInput(f"load {name!r}: the config names another model ({document['name']!r})")
    if document.get("version_policy") is None:
        return None
    try:
        return VersionPolicy.from_config(document["version_policy"])
    except ValueError as e:
        raise InvalidInput(f"load {name!r}: {e}") from None
