"""The model package: a directory with ``manifest.json``, tokenizer files and runtime artifacts.

This package owns the format; ``converters`` writes packages through it and ``serving`` reads them with it:

- :mod:`serving.package.manifest`: :class:`Manifest` and its sections (architecture, special ids, decoding
  defaults, tokenizer, artifacts), written back with :meth:`Manifest.to_dict`.
- :mod:`serving.package.parse`: :func:`parse_manifest`, which validates a manifest once and raises one error
  listing every problem.
- :mod:`serving.package.store`: :func:`open_package` (manifest validated, every path inside the package, every
  opened file in the checksum list, checksums verified), :func:`write_package_atomically`; what the checksums do not
  cover (:func:`unlisted_files`, :func:`escaping_links`) and a copy of what they do (:func:`copy_listed`).
- :mod:`serving.package.graph`: the two graphs' input/output names and ``MASK_VALUE``.
- :mod:`serving.package.missing`: :func:`hub_hint`, what a not-found message adds for a path that looks like a
  Hugging Face hub id (mtgate downloads nothing; how to make a package of it).
- :mod:`serving.package.precision`: :func:`choose_precision`, which artifact ``--precision auto`` (every command's
  default) loads, from what the manifest records of int8's cost.
"""

from serving.package.graph import ENCODER_OUTPUTS, MASK_VALUE, cross_names, past_names, present_names, stacked
from serving.package.manifest import (
    DEFAULT_REFERENCE,
    DEFAULT_RUNTIME,
    FORMAT,
    MANIFEST,
    PRECISIONS,
    RUNTIMES,
    Architecture,
    Artifact,
    DecodingDefaults,
    Manifest,
    PackageError,
    Runtime,
    SpecialIds,
    TokenizerEntry,
)
from serving.package.missing import hub_hint
from serving.package.parse import find_artifact, parse_manifest
from serving.package.precision import AUTO, PRECISION_CHOICES, PrecisionChoice, choose_precision
from serving.package.store import (
    Package,
    copy_listed,
    escaping_links,
    file_checksums,
    load_manifest,
    open_package,
    read_manifest,
    sha256_of,
    staging_dir,
    unlisted_files,
    verify_checksums,
    write_manifest,
    write_package_atomically,
)

__all__ = [
    "AUTO", "PRECISION_CHOICES", "PrecisionChoice", "choose_precision",
    "DEFAULT_REFERENCE", "DEFAULT_RUNTIME", "ENCODER_OUTPUTS", "FORMAT", "MANIFEST", "MASK_VALUE", "PRECISIONS", "RUNTIMES", "Architecture", "Artifact", "DecodingDefaults",
    "Manifest", "Package", "PackageError", "Runtime", "SpecialIds", "TokenizerEntry", "copy_listed", "cross_names", "escaping_links", "file_checksums",
    "find_artifact", "hub_hint", "load_manifest", "open_package", "parse_manifest", "past_names", "present_names", "read_manifest",
    "sha256_of", "stacked", "staging_dir", "unlisted_files", "verify_checksums", "write_manifest", "write_package_atomically",
]
