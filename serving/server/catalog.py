"""Which models a server serves, by name and version, and how a request finds one: :class:`ModelCatalog`, the part
of :class:`~serving.server.service.TranslationService` that holds the runners (each model's newest version, the
older ones a repository's version policy keeps), switches a model's versions, removes a model, finds a model by name
or version (``ModelNotFound``, ``ModelNotReady``), and lists them (Triton's repository index and statistics).
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.engine.errors import ModelNotFound, ModelNotReady
from serving.server.model_runner import ModelRunner


class ModelCatalog:
    """The served models (``models``: each name's newest version; ``older``: the other versions served) and the
    default model (the first one).

    Raises:
        ValueError: two runners serve the same model name.
    """

    def __init__(self, runners: Sequence[ModelRunner]) -> None:
        self.models: dict[str, ModelRunner] = {}
        for runner in runners:
            if runner.name in self.models:
                raise ValueError(f"two packages serve the model name {runner.name!r}")
            self.models[runner.name] = runner
        # Versions served besides each model's newest (a repository's version policy: latest N, all, specific);
        # reached by naming their version (/v2, gRPC).
        self.older: dict[str, dict[str, ModelRunner]] = {}
        self.default_model = next(iter(self.models))

    def runners(self) -> list[ModelRunner]:
        """Every runner served: each model's newest version, then its older ones."""
        return [*self.models.values(), *(r for versions in self.older.values() for r in versions.values())]

    def versions_of(self, name: str) -> dict[str, ModelRunner]:
        """The served versions of ``name`` (none when it is not served), by version."""
        if name not in self.models:
            return {}
        newest = self.models[name]
        return {**self.older.get(name, {}), newest.version_name: newest}

    def serve_versions(self, name: str, runners: dict[str, ModelRunner]) -> list[ModelRunner]:
        """Serve exactly ``runners`` (loaded and warm, by version; the highest is what requests without a version
        get) as ``name``. Returns the runners no longer served, which new requests do not reach: the caller stops
        each once its admitted requests are done."""
        before = self.versions_of(name)
        ordered = sorted(runners, key=int)
        self.models[name] = runners[ordered[-1]]
        self.older[name] = {v: runners[v] for v in ordered[:-1]}
        kept = {id(r) for r in runners.values()}
        return [r for r in before.values() if id(r) not in kept]

    def remove(self, name: str) -> list[ModelRunner]:
        """Stop routing requests to ``name``; returns its runners (the caller stops each once its requests are
        done)."""
        runners = list(self.versions_of(name).values())
        del self.models[name]
        self.older.pop(name, None)
        if self.default_model == name and self.models:
            self.default_model = next(iter(self.models))
        return runners

    def get(self, name: str | None) -> ModelRunner:
        """The model called ``name`` (the default model when None).

        Raises:
            ModelNotFound: no such model.
        """
        runner = self.models.get(self.default_model if name is None else name)
        if runner is None:
            have = ", ".join(sorted(self.models))
            raise ModelNotFound(f"unknown model {name!r} (this server serves: {have})")
        return runner

    def version(self, name: str, version: str | None) -> ModelRunner:
        """The model ``name`` at ``version`` (None or "": whichever it serves), as the Open Inference Protocol names
        them (HTTP ``/v2`` and gRPC).

        Raises:
            ModelNotFound: no such model, or not that version (the message lists what is served).
        """
        runner = self.models.get(name)
        if runner is not None and version and runner.translator is not None and version != str(runner.info.version):
            runner = self.older.get(name, {}).get(version)
        if runner is None:
            what = f"{name!r}" + (f" version {version!r}" if version else "")
            raise ModelNotFound(f"Request for unknown model: {what} (served: {', '.join(sorted(self.models))})")
        return runner

    def ready_model(self, name: str | ModelRunner | None) -> ModelRunner:
        """The model called ``name``, if it is loaded and warm.

        Draining is not checked here: the HTTP middleware refuses new requests once a drain begins, and a request
        it let in before then (even one still reading its body) runs to completion.

        Raises:
            ModelNotFound: no such model.
            ModelNotReady: still loading.
        """
        runner = name if isinstance(name, ModelRunner) else self.get(name)
        if not runner.ready:
            raise ModelNotReady(f"model {runner.name!r} is not ready yet (loading and warming up)")
        return runner

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, object]:
        """Triton's statistics extension (``{"model_stats": [...]}``, one entry per served version): of every model,
        of ``name``'s versions, or of ``name`` at ``version``.

        Raises:
            ModelNotFound: no such model or version.
        """
        if name is None:
            runners = self.runners()
        elif version:
            runners = [self.version(name, version)]
        else:
            self.version(name, None)  # ModelNotFound
            runners = sorted(self.versions_of(name).values(), key=lambda r: r.version_name.zfill(20))
        entries = [r.statistics.to_json(r.name, r.version_name) for r in runners]
        return {"model_stats": entries}

    def model_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Each model with its version and state (``READY``, ``LOADING``, ``UNAVAILABLE`` with the reason), as
        Triton's repository index lists them."""
        index = []
        for runner in sorted(self.runners(), key=lambda r: (r.name, r.version_name.zfill(20))):
            state = "READY" if runner.ready else "UNAVAILABLE" if runner.load_error else "LOADING"
            if ready_only and state != "READY":
                continue
            entry = {"name": runner.name, "version": runner.version_name, "state": state}
            if runner.load_error:
                entry["reason"] = runner.load_error
            index.append(entry)
        return index
