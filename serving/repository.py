"""A model repository in Triton's layout (``mtgate serve --model-repository DIR``): ``DIR/<name>/<version>/`` holds
a model package, ``<version>`` a positive integer, and each model is served at its highest version (Triton's
default version policy, ``latest: 1``).

A new version is loaded and warmed up beside the one serving; only then does it take new requests, and the old
one serves what it admitted before it is stopped (no request fails during the switch) and its engine released.
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

if TYPE_CHECKING:
    from serving.metrics import ServingMetrics
    from serving.service import ModelRunner, TranslationService
    from serving.settings import ServingSettings

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Version:
    """The version of a model the repository holds."""

    name: str
    number: int
    path: Path


def latest_versions(root: Path) -> dict[str, Version]:
    """Each model of the repository at its highest version (directories without a numbered package are skipped)."""
    found: dict[str, Version] = {}
    if not root.is_dir():
        return found
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        numbers = [int(p.name) for p in model_dir.iterdir()
                   if p.is_dir() and p.name.isdigit() and int(p.name) > 0 and (p / MANIFEST).is_file()]
        if numbers:
            number = max(numbers)
            found[model_dir.name] = Version(model_dir.name, number, model_dir / str(number))
    return found


class ModelRepository:
    """The models of ``settings.model_repository``, kept at their latest versions in a :class:`TranslationService`."""

    def __init__(self, settings: ServingSettings, metrics: ServingMetrics) -> None:
        assert settings.model_repository is not None
        self.root = settings.model_repository
        self.settings = settings
        self.metrics = metrics
        self.service: TranslationService | None = None
        self._lock = asyncio.Lock()  # one switch at a time
        self._retiring: set[asyncio.Task[None]] = set()

    def runners(self) -> list[ModelRunner]:
        """A runner for each model at its latest version, to start the service with."""
        return [self._runner(version) for version in latest_versions(self.root).values()]

    def _runner(self, version: Version) -> ModelRunner:
        from serving.service import ModelRunner

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

    async def sync(self, only: str | None = None) -> None:
        """Serve each model's latest version (``only``: that model's), loading what is new."""
        service = self.service
        assert service is not None
        async with self._lock:
            for name, version in latest_versions(self.root).items():
                if only is not None and name != only:
                    continue
                serving = service.models.get(name)
                if serving is not None and serving.version_name == str(version.number):
                    continue
                await self._switch(service, version, raise_errors=only is not None)

    async def load(self, name: str) -> None:
        """Load ``name`` at its latest version (an explicit load).

        Raises:
            ModelNotFound: the repository has no numbered package for ``name``.
            ServingError: the version failed to load (the serving one stays).
        """
        if name not in latest_versions(self.root):
            raise ModelNotFound(f"the repository {self.root} has no model {name!r} (expected {self.root}/{name}/<version>"
                                f"/{MANIFEST})")
        await self.sync(only=name)

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (its admitted requests finish first)."""
        service = self.service
        assert service is not None
        async with self._lock:
            runner = service.models.get(name)
            if runner is None:
                raise ModelNotFound(f"model {name!r} is not loaded")
            service.remove(name)
            logger.warning("model %s %s unloaded", name, runner.version_name)
            self._retire(runner)

    async def _switch(self, service: TranslationService, version: Version, raise_errors: bool) -> None:
        runner = self._runner(version)
        started = time.monotonic()
        runner.start()
        try:
            await runner.load()
        except Exception as e:
            await runner.stop()
            logger.error("model %s version %d from %s failed to load (%s); %s", version.name, version.number,
                         version.path, e, "the serving version stays" if version.name in service.models else
                         "not served")
            if raise_errors:
                raise ServingError(f"model {version.name!r} version {version.number} from {version.path} failed to "
                                   f"load: {e}") from e
            return
        old = service.put(runner)
        logger.warning("model %s version %d serving (loaded and warm in %.1f s)%s", version.name, version.number,
                       time.monotonic() - started, f"; version {old.version_name} retires" if old else "")
        if old is not None:
            self._retire(old)

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
