"""A model repository in Triton's layout (``mtgate serve --model-repository DIR``): ``DIR/<name>/<version>/`` holds
a model package, ``<version>`` a positive integer. Which versions are served is the version policy, as Triton's:
``latest:N`` (the N highest; the default is ``latest:1``), ``all``, or ``specific:1,3``. A request that names no
version gets the highest served one; ``/v2`` and gRPC requests may name any served version.

A new version is loaded and warmed up beside the ones serving; only then does it take new requests, and a version
that leaves serves what it admitted before it is stopped (no request fails during the switch) and its engine
released.
Versions are found by rescanning: every ``--repository-poll-secs`` seconds, or for one model on an explicit load
(``POST /v2/repository/models/{name}/load``, gRPC ``RepositoryModelLoad``). An unload stops a model until it is
loaded again. A version that fails to load is logged and the serving one stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from serving.errors import ModelNotFound, ServingError
from serving.versions import VersionPolicy

if TYPE_CHECKING:
    from serving.metrics import ServingMetrics
    from serving.runner import ModelRunner
    from serving.service import TranslationService
    from serving.settings import ServingSettings

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Version:
    """The version of a model the repository holds."""

    name: str
    number: int
    path: Path


def served_versions(root: Path, policy: VersionPolicy) -> dict[str, list[Version]]:
    """Each model of the repository with the versions the policy serves, ascending (models with none are left out;
    a version is a directory named by a positive integer that holds a package's manifest)."""
    found: dict[str, list[Version]] = {}
    if not root.is_dir():
        return found
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        numbers = [int(p.name) for p in model_dir.iterdir()
                   if p.is_dir() and p.name.isdigit() and int(p.name) > 0 and (p / MANIFEST).is_file()]
        chosen = policy.choose(numbers)
        if chosen:
            found[model_dir.name] = [Version(model_dir.name, n, model_dir / str(n)) for n in chosen]
    return found


class ModelRepository:
    """The models of ``settings.model_repository``, kept at their latest versions in a :class:`TranslationService`."""

    def __init__(self, settings: ServingSettings, metrics: ServingMetrics) -> None:
        assert settings.model_repository is not None
        self.root = settings.model_repository
        self.policy = VersionPolicy.parse(settings.repository_version_policy)
        self.settings = settings
        self.metrics = metrics
        self.service: TranslationService | None = None
        self._lock = asyncio.Lock()  # one switch at a time
        self._retiring: set[asyncio.Task[None]] = set()

    def runners(self) -> tuple[list[ModelRunner], dict[str, dict[str, ModelRunner]]]:
        """The runners to start the service with: each model's highest version, and the older ones by model."""
        newest, older = [], {}
        for name, versions in served_versions(self.root, self.policy).items():
            newest.append(self._runner(versions[-1]))
            if len(versions) > 1:
                older[name] = {str(v.number): self._runner(v) for v in versions[:-1]}
        return newest, older

    def _runner(self, version: Version) -> ModelRunner:
        from serving.runner import ModelRunner

        return ModelRunner(self.settings, self.metrics, package_dir=version.path, name=version.name,
                           version=str(version.number))

    async def poll(self, every_s: float) -> None:
        """Rescan every ``every_s`` seconds, for ever (cancel to stop)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sync()
            except Exception:  # a poll must not end the server
                logger.exception("repository poll of %s failed", self.root)

    async def sync(self) -> None:
        """Serve the versions the policy chooses, loading what is new and retiring versions no longer chosen (a
        model whose directory is gone keeps serving until it is unloaded)."""
        service = self.service
        assert service is not None
        async with self._lock:
            for name, versions in served_versions(self.root, self.policy).items():
                await self._switch(service, name, versions, raise_errors=False)

    async def load(self, name: str) -> None:
        """Load ``name`` at its latest version (an explicit load).

        Raises:
            ModelNotFound: the repository has no numbered package for ``name``.
            ServingError: the version failed to load (the serving one stays).
        """
        service = self.service
        assert service is not None
        async with self._lock:
            versions = served_versions(self.root, self.policy).get(name)
            if versions is None:
                raise ModelNotFound(f"the repository {self.root} has no model {name!r} (expected "
                                    f"{self.root}/{name}/<version>/{MANIFEST})")
            await self._switch(service, name, versions, raise_errors=True)

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (its admitted requests finish first)."""
        service = self.service
        assert service is not None
        async with self._lock:
            if name not in service.models:
                raise ModelNotFound(f"model {name!r} is not loaded")
            for runner in service.remove(name):
                logger.info("model %s version %s unloaded", name, runner.version_name)
                self._retire(runner)

    async def _switch(self, service: TranslationService, name: str, versions: list[Version],
                      raise_errors: bool) -> None:
        """Load the chosen versions not served yet, then serve exactly the chosen ones that loaded (in one step,
        between two requests), and retire the others."""
        serving = service.versions_of(name)
        loaded: dict[str, ModelRunner] = {}
        for version in versions:
            key = str(version.number)
            if key in serving:
                loaded[key] = serving[key]
                continue
            runner = self._runner(version)
            started = time.monotonic()
            runner.start()
            try:
                await runner.load()
            except Exception as e:
                await runner.stop()
                logger.error("model %s version %d from %s failed to load (%s)", name, version.number, version.path, e)
                if raise_errors:
                    raise ServingError(f"model {name!r} version {version.number} from {version.path} failed to "
                                       f"load: {e}") from e
                continue
            logger.info("model %s version %d loaded and warm in %.1f s", name, version.number,
                           time.monotonic() - started)
            loaded[key] = runner
        if not loaded or loaded.keys() == serving.keys():
            return
        retired = service.serve_versions(name, loaded)
        logger.info("model %s serving version(s) %s%s", name, ", ".join(sorted(loaded, key=int)),
                       f"; version(s) {', '.join(r.version_name for r in retired)} retire" if retired else "")
        for runner in retired:
            self._retire(runner)

    def _retire(self, runner: ModelRunner) -> None:
        task = asyncio.get_running_loop().create_task(self._drain_and_stop(runner), name=f"retire-{runner.name}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain_and_stop(self, runner: ModelRunner) -> None:
        """Wait until the runner's admitted requests are done (at most the request deadline), then stop it."""
        deadline = time.monotonic() + self.settings.request_timeout_s + 5
        while runner.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await runner.stop()
        runner.release()
        logger.info("model %s version %s stopped", runner.name, runner.version_name)

    async def close(self) -> None:
        for task in list(self._retiring):
            with contextlib.suppress(asyncio.CancelledError):
                await task
