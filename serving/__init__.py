"""mtgate serving: model packages, tokenizers, runtimes, decoding, the Translator and the HTTP server."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mtgate")  # the one version source: pyproject.toml, through the installed metadata
except PackageNotFoundError:  # not installed (a Triton model repository's bundled copy, a bare checkout)
    __version__ = "0+unknown"
