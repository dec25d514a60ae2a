"""mtgate serving: model packages, tokenizers, runtimes, decoding, the Translator and the HTTP server."""

__version__ = "0.1.0"
