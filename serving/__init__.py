"""mtgate serving: model packages, tokenizers, runtimes, decoding, the Translator and the HTTP server.

``serving.__version__`` is the one version source: pyproject.toml's, read from the installed metadata when first
asked for (``importlib.metadata`` costs some 20 ms to import, so ``import serving`` does not pay for it).
"""

from __future__ import annotations

import functools


@functools.cache
def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mtgate")
    except PackageNotFoundError:  # not installed (a Triton model repository's bundled copy, a bare checkout)
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
