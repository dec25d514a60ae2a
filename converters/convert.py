"""The conversion template method: checkpoint -> verified model package.

``convert`` does the same for every framework: pick the reader (``converters/readers.py``) -> ``load()`` ->
``spec.validate()`` -> emit ONNX -> derive OpenVINO IR -> int8 variants -> parity against the numpy reference
(``converters/parity.py``) -> write the package atomically through ``serving.package``, which owns the format.

Package layout::

    manifest.json
    tokenizer/...                            reader-specific tokenizer files
    onnx/encoder.onnx, onnx/decoder.onnx     always: the fp32 graphs are the package's parity reference
    onnx/encoder.int8.onnx, ...              onnxruntime int8
    openvino/encoder.xml/.bin, ...           OpenVINO fp32 (and encoder.int8.xml/.bin ... for int8)
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from converters.base import ConversionError, LoadedModel
from converters.readers import load_source
from converters.shortlist import ShortlistRequest, add_shortlist
from serving import __version__
from serving.package import (
    DEFAULT_REFERENCE,
    PRECISIONS,
    RUNTIMES,
    Artifact,
    Manifest,
    TokenizerEntry,
    write_package_atomically,
)

__all__ = ["ConversionError", "ParityError", "convert", "load_source"]

logger = logging.getLogger(__name__)


class ParityError(ConversionError):
    """An fp32 artifact does not match the reference: the graphs are wrong, nothing is written."""


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    timings[stage] = round(time.perf_counter() - started, 3)
    logger.info("%s: %.2fs", stage, timings[stage])


def _check_choices(values: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    chosen = list(dict.fromkeys(values))
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise ValueError(f"{what} {', '.join(unknown) or '(none)'} (supported {what}: {', '.join(allowed)})")
    return chosen


def convert(
    source_dir: Path,
    output_dir: Path,
    runtimes: Sequence[str] = RUNTIMES,
    precisions: Sequence[str] = ("fp32",),
    verify: bool = True,
    name: str | None = None,
    version: str | None = None,
    reader_options: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    quality: dict[str, Any] | None = None,
    overwrite: bool = False,
    fmt: str | None = None,
    shortlist: ShortlistRequest | None = None,
) -> Manifest:
    """Convert a checkpoint directory into a model package at ``output_dir``.

    Arguments:
        source_dir: a checkpoint directory of any format ``converters/readers.py`` knows.
        output_dir: the package directory; written atomically, untouched on any error.
        runtimes: subset of ``serving.package.RUNTIMES``.
        precisions: subset of ``("fp32", "int8")``.
        verify: run the parity checks (and fail on an fp32 mismatch).
        name: package name (default: the reader's, usually the source directory name).
        version: package version (default ``"1"``).
        reader_options: reader-specific options (``hparams_set``, ``vocab``, ``target_space_id`` for T2T).
        progress: called with a short message as each stage starts.
        quality: scores measured on this model (e.g. batch-score summaries), recorded as the manifest's ``quality``.
        overwrite: replace an existing ``output_dir`` (the old package stays until the new one is complete);
            without it an existing ``output_dir`` is refused before any work.
        fmt: the reader's format name (``converters.readers.FORMATS``); None: recognized from the directory.
        shortlist: also build a vocabulary shortlist from parallel data (``converters.shortlist``), and measure it.

    Returns:
        The written manifest.

    Raises:
        ValueError: unknown runtime or precision.
        FileExistsError: ``output_dir`` exists and ``overwrite`` is False.
        ConversionError: the checkpoint cannot be converted (every reason listed).
        ParityError: an fp32 artifact does not match the reference.
    """
    runtimes = _check_choices(runtimes, RUNTIMES, "runtimes")
    precisions = _check_choices(precisions, PRECISIONS, "precisions")
    if output_dir.exists() and not overwrite:
        raise FileExistsError(f"{output_dir}: already exists (pass --overwrite to replace it)")
    say = progress or (lambda message: None)
    timings: dict[str, float] = {}
    say(f"reading {source_dir}")
    with _timed(timings, "load"):
        loaded = load_source(source_dir, reader_options, fmt)

    def fill(tmp: Path) -> Manifest:
        for rel, src in loaded.tokenizer_files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / rel)
        for rel, data in loaded.tokenizer_data.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        artifacts = _emit_artifacts(loaded, tmp, runtimes, precisions, say, timings)
        options = {k: str(v) if isinstance(v, Path) else v for k, v in (reader_options or {}).items()}
        source = loaded.source | ({"reader_options": options} if options else {})
        manifest = Manifest(
            name=name or loaded.name,
            version=version or "1",
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            mtgate_version=__version__,
            source=source,
            architecture=loaded.spec.config,
            special_ids=loaded.spec.special_ids,
            decoding=loaded.spec.decoding,
            tokenizer=TokenizerEntry.from_dict(loaded.tokenizer),
            reference=dict(DEFAULT_REFERENCE),
            artifacts=tuple(artifacts),
            quality=quality,
        )
        if verify:
            say("checking parity")
            with _timed(timings, "parity"):
                manifest = dataclasses.replace(manifest, parity=_parity(tmp, manifest, loaded))
        if shortlist is not None:
            with _timed(timings, "shortlist"):
                manifest = add_shortlist(tmp, manifest, loaded.spec, shortlist, say)
        return dataclasses.replace(manifest, conversion={"seconds": dict(timings)})

    manifest = write_package_atomically(output_dir, fill, overwrite=overwrite)
    logger.info("wrote %s in %.1fs", output_dir, sum(timings.values()))
    return manifest


def _emit_artifacts(loaded: LoadedModel, tmp: Path, runtimes: Sequence[str], precisions: Sequence[str],
                    say: Callable[[str], None], timings: dict[str, float]) -> list[Artifact]:
    """Write the graphs of every requested runtime and precision into ``tmp``; the fp32 ONNX graphs always."""
    say("emitting ONNX")
    with _timed(timings, "onnx"):
        from converters.onnx_emitter import emit_decoder, emit_onnx

        encoder, decoder = emit_onnx(loaded.spec, tmp / "onnx")
    artifacts: list[Artifact] = []

    def add(runtime: str, precision: str, enc: Path, dec: Path) -> None:
        artifacts.append(Artifact(runtime, precision, enc.relative_to(tmp).as_posix(), dec.relative_to(tmp).as_posix()))

    if "onnxruntime" in runtimes and "fp32" in precisions:
        add("onnxruntime", "fp32", encoder, decoder)
    if "onnxruntime" in runtimes and "int8" in precisions:
        say("quantizing ONNX to int8")
        with _timed(timings, "onnxruntime_int8"):
            from converters.quantize import quantize_onnx_int8

            add("onnxruntime", "int8", quantize_onnx_int8(encoder, tmp / "onnx" / "encoder.int8.onnx"),
                quantize_onnx_int8(decoder, tmp / "onnx" / "decoder.int8.onnx"))
    if "openvino" in runtimes:
        # OpenVINO runs the growing-cache decoder (standard ops only), emitted beside the package and not kept.
        with tempfile.TemporaryDirectory(prefix="mtgate-openvino-") as scratch:
            growing = emit_decoder(loaded.spec, Path(scratch) / "decoder.onnx", cache="growing")
            _emit_openvino(encoder, growing, tmp, precisions, add, say, timings)
    return artifacts


def _emit_openvino(encoder: Path, decoder: Path, tmp: Path, precisions: Sequence[str],
                   add: Callable[[str, str, Path, Path], None], say: Callable[[str], None],
                   timings: dict[str, float]) -> None:
    """The OpenVINO IR of each requested precision, derived from the ONNX ``encoder`` and (growing) ``decoder``."""
    if "fp32" in precisions:
        say("deriving OpenVINO IR")
        with _timed(timings, "openvino"):
            from converters.openvino import onnx_to_openvino

            add("openvino", "fp32", onnx_to_openvino(encoder, tmp / "openvino" / "encoder.xml"),
                onnx_to_openvino(decoder, tmp / "openvino" / "decoder.xml"))
    if "int8" in precisions:
        say("compressing OpenVINO weights to int8")
        with _timed(timings, "openvino_int8"):
            from converters.openvino import compress_int8

            add("openvino", "int8", compress_int8(encoder, tmp / "openvino" / "encoder.int8.xml"),
                compress_int8(decoder, tmp / "openvino" / "decoder.int8.xml"))


def _parity(tmp: Path, manifest: Manifest, loaded: LoadedModel) -> dict[str, Any]:
    """fp32 artifacts vs the numpy reference of the source weights; int8 artifacts vs the fp32 ONNX graphs."""
    from converters.parity import REFERENCE_GRAPHS, Reference, compare_artifacts, start_run
    from converters.reference import ReferenceModel

    run = start_run(tmp, manifest)
    inputs = run.inputs
    results: dict[str, Any] = {
        "reference": "numpy float64 forward pass of the source weights (converters/reference.py); greedy and int8 "
                     "agreement against the fp32 ONNX graphs on onnxruntime",
        "inputs": {"sentences": int(inputs.source_ids.shape[0]), "from_tokenizer": inputs.from_tokenizer,
                   "teacher_forced_sentences": int(inputs.tf_source_ids.shape[0]),
                   "decoder_steps": int(inputs.target_ids.shape[1]), "greedy_max_steps": run.rules.max_steps},
    }
    graphs_key = "onnxruntime/fp32" if any(a.key == "onnxruntime/fp32" for a in manifest.artifacts) \
        else "reference_graphs"
    failures: list[str] = []
    for row in compare_artifacts(tmp, manifest, run, [Reference("source", ReferenceModel(loaded.spec))]):
        key = graphs_key if row.artifact == REFERENCE_GRAPHS else row.artifact
        results[key] = row.result
        if row.result["passed"]:
            continue
        if "next_token_agreement" in row.result:  # int8: reported, not fatal
            logger.warning("%s: next-token agreement with fp32 %.3f is below %.2f", key,
                           row.result["next_token_agreement"], row.result["agreement_floor"])
        else:
            failures.append(f"{row.artifact}: {_worst(row.result)}")
    if failures:
        raise ParityError("parity check failed (fp32 artifacts differ from the source model):\n  "
                          + "\n  ".join(failures))
    return results


def _worst(row: dict[str, Any]) -> str:
    name = max((k for k in row if k.endswith("_max_abs")), key=lambda k: row[k])
    return f"{name.removesuffix('_max_abs')} max abs diff {row[name]:.3g} > {row['tolerance']:g}"
