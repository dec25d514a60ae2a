"""The engine: the Translator and everything a translation needs (request and options types, tokenizers,
backends, encoding, decoding, rows and caches, continuous batching's engine side, reference scoring, documents,
the vocabulary shortlist). It knows nothing of HTTP, settings or servers."""
