"""Triton's model repository extension over the data plane (the index, explicit load and unload), the one place the
HTTP routes (``/v2/repository/...``) and gRPC (``RepositoryIndex``, ``RepositoryModelLoad`` / ``Unload``) go through.

:class:`ModelControl` is a server of ``-m`` packages: its index lists what it serves; load and unload are refused.
:class:`ModelRepository` is ``mtgate serve --model-repository DIR`` in Triton's layout: ``DIR/<name>/<version>/``
holds a model package, ``<version>`` a positive integer. Which versions are served is the version policy, as
Triton's: ``latest:N`` (the N highest; the default is ``latest:1``), ``all``, or ``specific:1,3``. A request that
names no version gets the highest served one; ``/v2`` and gRPC requests may name any served version.

A new version is loaded and warmed up beside the ones serving; only then does it take new requests, and a version
that leaves serves what it admitted before it is stopped (no request fails during the switch) and its engine
released. Versions are found by rescanning, as Triton's model control modes:

- polled (``--repository-poll-secs``): every so many seconds; the directories decide what is served (a model whose
  directory is gone is unloaded) and explicit load and unload are refused (Triton: only in explicit mode);
- explicit (otherwise): for one model on a load (``POST /v2/repository/models/{name}/load``); a load may override
  the model's version policy (Triton's ``config`` parameter); an unload stops a model until it is loaded again.

Each version loads on its own: one the loader refuses (a broken package) is listed ``UNAVAILABLE`` with the reason
in the index, logged once, and retried by the polls only once its files change; the other models and versions load
on, and the serving version of its model stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from serving.engine.errors import ModelControlDisabled, ModelLoadFailed, ModelNotFound, NotSupported, ServingError
from serving.package import PackageError
from serving.server.oip import NO_REPOSITORY, SERVER_EXTENSIONS
from serving.server.versions import (
    MANIFEST,
    Files,
    Version,
    VersionPolicy,
    config_policy,
    fingerprint,
    model_dirs,
    version_numbers,
)

if TYPE_CHECKING:
    from serving.server.metrics import ServingMetrics
    from serving.server.model_runner import ModelRunner
    from serving.server.service import TranslationService
    from serving.server.settings import ServingSettings

logger = logging.getLogger(__name__)

UNLOADED = "unloaded"  # the reason Triton gives for a version that was served and no longer is
POLLED = ("explicit model load / unload is not allowed if polling is enabled: this server polls its repository "
          "(--repository-poll-secs), so its directories decide what is served; serve without --repository-poll-secs "
          "to load and unload explicitly")


class ModelControl:
    """The repository extension of a server of ``-m`` packages: the index of what it serves; no load or unload."""

    def __init__(self, service: TranslationService | None = None) -> None:
        self.service = service

    @property
    def extensions(self) -> list[str]:
        """The protocol extensions the server metadata lists."""
        return list(SERVER_EXTENSIONS)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Each model with its version and state (``READY``, ``LOADING``, ``UNAVAILABLE`` with the reason), as
        Triton's repository index lists them; ``ready_only``: the ready ones."""
        return self._service.model_index(ready_only)

    async def load(self, name: str, parameters: Mapping[str, object] | None = None) -> None:
        """Refused (501): there is no repository to load from."""
        raise NotSupported(NO_REPOSITORY)

    async def unload(self, name: str) -> None:
        """Refused (501): there is no repository to unload to."""
        raise NotSupported(NO_REPOSITORY)

    @property
    def _service(self) -> TranslationService:
        assert self.service is not None, "the service is set before the server starts"
        return self.service


class ModelRepository(ModelControl):
    """The models of ``settings.model_repository``, kept at the versions their policy chooses in a
    :class:`TranslationService`."""

    def __init__(self, settings: ServingSettings, metrics: ServingMetrics) -> None:
        super().__init__()
        assert settings.model_repository is not None
        self.root = settings.model_repository
        self.policy = VersionPolicy.parse(settings.repository_version_policy)
        self.polled = settings.repository_poll_secs is not None
        self.settings = settings
        self.metrics = metrics
        self._policies: dict[str, VersionPolicy] = {}  # a load's version policy override, by model
        # Versions not served that the index lists: LOADING, or UNAVAILABLE with the reason (failed, unloaded).
        self._states: dict[str, dict[int, tuple[str, str]]] = {}
        self._unlisted: dict[str, str] = {}  # models whose directory cannot be listed, and why
        self._refused: dict[tuple[str, int], Files] = {}  # the files of a version when it failed to load
        self._problem = ""  # why the last scan of the repository failed ("": it did not)
        self._lock = asyncio.Lock()  # one switch at a time
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def extensions(self) -> list[str]:
        return [*SERVER_EXTENSIONS, "model_repository", "model_repository(unload_dependents)"]

    def policy_of(self, name: str) -> VersionPolicy:
        return self._policies.get(name, self.policy)

    def scan(self) -> dict[str, list[Version]]:
        """Each model with the versions its policy chooses, ascending (models with none are left out). Failed
        versions whose directory is gone are forgotten.

        Raises:
            OSError: the repository cannot be listed.
        """
        found: dict[str, list[Version]] = {}
        for model_dir in model_dirs(self.root):
            name = model_dir.name
            try:
                numbers = version_numbers(model_dir)
            except OSError as e:
                self._unlisted[name] = f"cannot list {model_dir}: {e.strerror or e}"
                continue
            self._unlisted.pop(name, None)
            states = self._states.get(name, {})
            for gone in [n for n, (state, reason) in states.items() if state == "UNAVAILABLE" and reason != UNLOADED
                         and n not in numbers]:
                del states[gone]
                self._refused.pop((name, gone), None)
            chosen = self.policy_of(name).choose(numbers)
            if chosen:
                found[name] = [Version(name, n, model_dir / str(n)) for n in chosen]
        return found

    def runners(self) -> tuple[list[ModelRunner], dict[str, dict[str, ModelRunner]]]:
        """The runners to start the service with: each model's highest version, and the older ones by model."""
        newest, older = [], {}
        for name, versions in self.scan().items():
            newest.append(self._runner(versions[-1]))
            if len(versions) > 1:
                older[name] = {str(v.number): self._runner(v) for v in versions[:-1]}
        return newest, older

    def _runner(self, version: Version) -> ModelRunner:
        from serving.server.model_runner import ModelRunner

        return ModelRunner(self.settings, self.metrics, package_dir=version.path, name=version.name,
                           version=str(version.number))

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model of the repository (and any still served whose directory is gone),
        each version known with its state: ``READY``, ``LOADING``, or ``UNAVAILABLE`` with the reason (the loader's
        refusal, ``unloaded``); a model no version of which was ever loaded by its name alone."""
        served = self._service.model_index()
        try:
            present = {p.name for p in model_dirs(self.root)}
        except OSError:
            present = set()
        index: list[dict[str, str]] = []
        for name in sorted(present | {entry["name"] for entry in served}):
            entries: dict[int, dict[str, str]] = {}
            for number, (state, reason) in self._states.get(name, {}).items():
                entries[number] = {"name": name, "version": str(number), "state": state,
                                   **({"reason": reason} if reason else {})}
            for entry in served:
                if entry["name"] == name:
                    entries[int(entry["version"])] = entry
            if not entries and not ready_only:
                unlisted = self._unlisted.get(name)
                index.append({"name": name, "state": "UNAVAILABLE", "reason": unlisted} if unlisted else {"name": name})
            index.extend(entries[n] for n in sorted(entries) if not ready_only or entries[n]["state"] == "READY")
        return index

    async def poll(self, every_s: float) -> None:
        """Rescan every ``every_s`` seconds, for ever (cancel to stop)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sync()
            except Exception:  # a poll must not end the server (each version's failure is handled in sync)
                logger.exception("repository poll of %s failed", self.root)

    async def sync(self) -> None:
        """Serve the versions the policy chooses, loading what is new and retiring versions no longer chosen, and
        unload the models whose directory (or every version) is gone."""
        service = self._service
        async with self._lock:
            try:
                found = self.scan()
            except OSError as e:  # nothing changes (not: every model unloaded) until the repository can be read
                problem = f"cannot list the repository {self.root}: {e.strerror or e}"
                if problem != self._problem:
                    logger.error("%s; serving on as before", problem)
                self._problem = problem
                return
            self._problem = ""
            for name, versions in found.items():
                await self._switch(service, name, versions, explicit=False)
            for name in [name for name in service.models if name not in found and name not in self._unlisted]:
                logger.warning("model %s: no version left in %s; unloading it", name, self.root / name)
                self._unload(service, name)

    async def load(self, name: str, parameters: Mapping[str, object] | None = None) -> None:
        """Load ``name`` (an explicit load): the versions its policy chooses that are not served yet are loaded and
        warmed up, then served; versions no longer chosen retire. ``parameters``: Triton's load parameters (a
        ``config`` overrides the version policy until the next load; see :func:`config_policy`).

        Raises:
            ModelControlDisabled: the repository is polled.
            ModelNotFound: the repository has no model ``name``.
            InvalidInput, NotSupported: a config override that cannot be applied, model files (the message says).
            ModelLoadFailed: no version to serve, or a version failed to load (the loader's reason); the versions
                that loaded are served, and what served before stays when none did.
        """
        if self.polled:
            raise ModelControlDisabled(POLLED)
        policy = config_policy(name, parameters or {})
        service = self._service
        async with self._lock:
            try:
                present = {p.name for p in model_dirs(self.root)}
                if name not in present:
                    raise ModelNotFound(f"the repository {self.root} has no model {name!r} (expected "
                                        f"{self.root}/{name}/<version>/{MANIFEST})")
                numbers = version_numbers(self.root / name)
            except OSError as e:
                raise ModelLoadFailed(f"failed to load {name!r}: cannot list {self.root / name}: {e.strerror or e}") from e
            chosen = (policy or self.policy).choose(numbers)
            if not chosen:
                raise ModelLoadFailed(f"failed to load {name!r}: no version under the version policy "
                                      f"{policy or self.policy} in {self.root / name} (versions: {sorted(numbers)}; a "
                                      f"version is <version>/{MANIFEST}, <version> a positive integer)")
            if policy is None:
                self._policies.pop(name, None)
            else:
                self._policies[name] = policy
            versions = [Version(name, n, self.root / name / str(n)) for n in chosen]
            failures = await self._switch(service, name, versions, explicit=True)
        if failures:
            raise ModelLoadFailed("; ".join(failures))

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (its admitted requests finish first); the index lists its versions ``UNAVAILABLE``
        (``unloaded``) until it is loaded again.

        Raises:
            ModelControlDisabled: the repository is polled.
            ModelNotFound: ``name`` is not loaded.
        """
        if self.polled:
            raise ModelControlDisabled(POLLED)
        service = self._service
        async with self._lock:
            if name not in service.models:
                raise ModelNotFound(f"model {name!r} is not loaded")
            self._unload(service, name)

    def _unload(self, service: TranslationService, name: str) -> None:
        for runner in service.remove(name):
            logger.info("model %s version %s unloaded", name, runner.version_name)
            self._retire(runner)

    async def _switch(self, service: TranslationService, name: str, versions: list[Version],
                      explicit: bool) -> list[str]:
        """Load the chosen versions not served yet, then serve exactly the chosen ones that loaded (in one step,
        between two requests), and retire the others. Returns why versions failed to load (a poll skips a version
        that failed before until its files change)."""
        serving = service.versions_of(name)
        loaded: dict[str, ModelRunner] = {}
        failures = []
        for version in versions:
            key = str(version.number)
            if key in serving:
                loaded[key] = serving[key]
                continue
            files = fingerprint(version.path)
            if not explicit and self._refused.get((name, version.number)) == files:
                continue
            runner = await self._load(version)
            if isinstance(runner, str):
                failures.append(runner)
                self._refused[(name, version.number)] = files
                continue
            self._refused.pop((name, version.number), None)
            loaded[key] = runner
        if not loaded or loaded.keys() == serving.keys():
            return failures
        retired = service.serve_versions(name, loaded)
        logger.info("model %s serving version(s) %s%s", name, ", ".join(sorted(loaded, key=int)),
                    f"; version(s) {', '.join(r.version_name for r in retired)} retire" if retired else "")
        for runner in retired:
            self._retire(runner)
        return failures

    async def _load(self, version: Version) -> ModelRunner | str:
        """A runner of ``version``, loaded and warm; or, when the loader refuses it, why (logged once, listed in the
        index)."""
        states = self._states.setdefault(version.name, {})
        states[version.number] = ("LOADING", "")
        started = time.monotonic()
        runner = None
        try:
            runner = self._runner(version)  # reads the manifest: a broken package fails here already
            runner.start()
            await runner.load()
        except Exception as e:  # this version's failure only: the scan goes on with the others
            if runner is not None:
                await runner.stop()
                runner.withdraw()
                runner.release()
            reason = f"failed to load {version.name!r} version {version.number}: {e}"
            states[version.number] = ("UNAVAILABLE", reason)
            logger.error("%s", reason if str(version.path) in reason else f"{reason} (from {version.path})",
                         exc_info=not isinstance(e, ServingError | PackageError))  # a traceback for a bug only
            return reason
        except BaseException:
            states.pop(version.number, None)
            if runner is not None:
                await runner.stop()
            raise
        states.pop(version.number, None)
        logger.info("model %s version %d loaded and warm in %.1f s", version.name, version.number,
                    time.monotonic() - started)
        return runner

    def _retire(self, runner: ModelRunner) -> None:
        runner.withdraw()
        if runner.version_name.isdigit():
            self._states.setdefault(runner.name, {})[int(runner.version_name)] = ("UNAVAILABLE", UNLOADED)
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
