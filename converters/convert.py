"""The conversion template method: checkpoint -> verified model package.

``convert`` does the same for every framework: detect the reader -> ``load()`` -> ``spec.validate()`` -> emit ONNX
-> derive OpenVINO IR -> int8 variants -> parity against the numpy reference -> write the package atomically. A new
source framework is one more ``Converter`` in :data:`CONVERTERS`.

Package layout (``serving/package.py`` reads it)::

    manifest.json
    tokenizer/...                            reader-specific tokenizer files
    onnx/encoder.onnx, onnx/decoder.onnx     always: the fp32 graphs are the package's parity reference
    onnx/encoder.int8.onnx, ...              onnxruntime int8
    openvino/encoder.xml/.bin, ...           OpenVINO fp32 (and encoder.int8.xml/.bin ... for int8)
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from converters.base import ConversionError, Converter, LoadedModel
from converters.marian import MarianConverter
from serving.package import PRECISIONS, RUNTIMES, write_package_atomically

logger = logging.getLogger(__name__)

# Readers, tried in order by ``detect``. converters.t2t registers itself lazily (see converter_classes).
CONVERTERS: list[type[Converter]] = [MarianConverter]


class ParityError(ConversionError):
    """An fp32 artifact does not match the reference: the graphs are wrong, nothing is written."""


def converter_classes() -> list[type[Converter]]:
    """Every available reader: :data:`CONVERTERS` plus ``T2TConverter`` when ``converters.t2t`` is installed."""
    classes = list(CONVERTERS)
    try:
        from converters.t2t import T2TConverter
    except ImportError as e:  # the T2T reader is optional (it needs tensorflow for checkpoints)
        logger.debug("tensor2tensor reader unavailable: %s", e)
    else:
        if T2TConverter not in classes:
            classes.append(T2TConverter)
    return classes


def detect_converter(source_dir: Path) -> type[Converter]:
    """The reader for ``source_dir``.

    Raises:
        ConversionError: not a directory, or no reader recognizes it.
    """
    if not source_dir.exists():
        raise ConversionError(f"{source_dir}: no such directory")
    if not source_dir.is_dir():
        raise ConversionError(f"{source_dir}: not a directory")
    classes = converter_classes()
    for cls in classes:
        if cls.detect(source_dir):
            return cls
    kinds = ", ".join(f"{cls.framework}" for cls in classes)
    raise ConversionError(
        f"{source_dir}: not a recognized checkpoint (supported: {kinds}; expected a Hugging Face Marian directory "
        "with config.json of model_type 'marian', or a tensor2tensor checkpoint directory)"
    )


def load_source(source_dir: Path, reader_options: dict[str, Any] | None = None) -> LoadedModel:
    """Detect, load and validate a checkpoint.

    Raises:
        ConversionError: unrecognized directory, unreadable or unsupported checkpoint, or an invalid spec (every
            reason listed).
    """
    cls = detect_converter(source_dir)
    loaded = cls(source_dir, **(reader_options or {})).load()
    try:
        loaded.spec.validate()
    except ValueError as e:
        raise ConversionError(f"{source_dir}: {e}") from e
    return loaded


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    timings[stage] = round(time.perf_counter() - started, 3)
    logger.info("%s: %.2fs", stage, timings[stage])


def _mtgate_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mtgate")
    except PackageNotFoundError:
        return "0+unknown"


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
) -> dict[str, Any]:
    """Convert a checkpoint directory into a model package at ``output_dir``.

    Arguments:
        source_dir: a Hugging Face Marian directory or a tensor2tensor checkpoint directory.
        output_dir: the package directory; replaced atomically, untouched on any error.
        runtimes: subset of ``("onnxruntime", "openvino")``.
        precisions: subset of ``("fp32", "int8")``.
        verify: run the parity checks (and fail on an fp32 mismatch).
        name: package name (default: the reader's, usually the source directory name).
        version: package version (default ``"1"``).
        reader_options: reader-specific options (``hparams_set``, ``vocab``, ``target_space_id`` for T2T).
        progress: called with a short message as each stage starts.
        quality: scores measured on this model (e.g. batch-score summaries), recorded as the manifest's ``quality``.

    Returns:
        The written manifest.

    Raises:
        ValueError: unknown runtime or precision.
        ConversionError: the checkpoint cannot be converted (every reason listed).
        ParityError: an fp32 artifact does not match the reference.
    """
    runtimes = _check_choices(runtimes, RUNTIMES, "runtimes")
    precisions = _check_choices(precisions, PRECISIONS, "precisions")
    say = progress or (lambda message: None)
    timings: dict[str, float] = {}
    say(f"reading {source_dir}")
    with _timed(timings, "load"):
        loaded = load_source(source_dir, reader_options)
    spec = loaded.spec

    def fill(tmp: Path) -> dict[str, Any]:
        for rel, src in loaded.tokenizer_files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / rel)
        say("emitting ONNX")
        with _timed(timings, "onnx"):
            from converters.onnx_emitter import emit_onnx

            encoder, decoder = emit_onnx(spec, tmp / "onnx")
        entries: list[dict[str, Any]] = []

        def add(runtime: str, precision: str, enc: Path, dec: Path) -> None:
            entries.append({"runtime": runtime, "precision": precision,
                            "files": {"encoder": enc.relative_to(tmp).as_posix(),
                                      "decoder": dec.relative_to(tmp).as_posix()}})

        if "onnxruntime" in runtimes and "fp32" in precisions:
            add("onnxruntime", "fp32", encoder, decoder)
        if "openvino" in runtimes and "fp32" in precisions:
            say("deriving OpenVINO IR")
            with _timed(timings, "openvino"):
                from converters.openvino import onnx_to_openvino

                add("openvino", "fp32", onnx_to_openvino(encoder, tmp / "openvino" / "encoder.xml"),
                    onnx_to_openvino(decoder, tmp / "openvino" / "decoder.xml"))
        if "onnxruntime" in runtimes and "int8" in precisions:
            say("quantizing ONNX to int8")
            with _timed(timings, "onnxruntime_int8"):
                from converters.quantize import quantize_onnx_int8

                add("onnxruntime", "int8", quantize_onnx_int8(encoder, tmp / "onnx" / "encoder.int8.onnx"),
                    quantize_onnx_int8(decoder, tmp / "onnx" / "decoder.int8.onnx"))
        if "openvino" in runtimes and "int8" in precisions:
            say("compressing OpenVINO weights to int8")
            with _timed(timings, "openvino_int8"):
                from converters.openvino import compress_int8

                add("openvino", "int8", compress_int8(encoder, tmp / "openvino" / "encoder.int8.xml"),
                    compress_int8(decoder, tmp / "openvino" / "decoder.int8.xml"))

        manifest: dict[str, Any] = {
            "name": name or loaded.name,
            "version": version or "1",
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "mtgate_version": _mtgate_version(),
            "source": loaded.source | ({"reader_options": _jsonable(reader_options)} if reader_options else {}),
            "architecture": spec.config_dict(),
            "special_ids": asdict(spec.special_ids),
            "decoding": _jsonable(asdict(spec.decoding)),
            "tokenizer": loaded.tokenizer,
            "reference": {"encoder": "onnx/encoder.onnx", "decoder": "onnx/decoder.onnx"},
            "artifacts": entries,
            "parity": {},
        }
        if quality is not None:
            manifest["quality"] = quality
        if verify:
            say("checking parity")
            with _timed(timings, "parity"):
                manifest["parity"] = _parity(tmp, manifest, loaded)
        manifest["conversion"] = {"seconds": dict(timings)}
        return manifest

    manifest = write_package_atomically(output_dir, fill)
    logger.info("wrote %s in %.1fs", output_dir, sum(timings.values()))
    return manifest


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _parity(tmp: Path, manifest: dict[str, Any], loaded: LoadedModel) -> dict[str, Any]:
    """fp32 artifacts vs the numpy reference of the source weights; int8 artifacts vs the fp32 ONNX graphs."""
    from converters.reference import ReferenceModel
    from converters.verify import (
        compare_fp32,
        compare_int8,
        decode_rules,
        greedy,
        make_parity_inputs,
        teacher_forced,
    )
    from serving.backends import create_backend

    tokenizer = None
    try:
        from serving.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(tmp, manifest["tokenizer"])
    except Exception as e:  # parity still runs, on fixed ids, without a tokenizer
        logger.warning("parity inputs: tokenizer unavailable (%s); using fixed pseudo-random ids", e)
    inputs = make_parity_inputs(manifest["special_ids"], manifest["architecture"], tokenizer)
    rules = decode_rules(manifest, inputs)
    reference = ReferenceModel(loaded.spec)
    ref_outputs = teacher_forced(reference, inputs)
    onnx_fp32 = create_backend("onnxruntime", tmp / "onnx" / "encoder.onnx", tmp / "onnx" / "decoder.onnx", None)
    results: dict[str, Any] = {
        "reference": "numpy float64 forward pass of the source weights (converters/reference.py); greedy and int8 "
                     "agreement against the fp32 ONNX graphs on onnxruntime",
        "inputs": {"sentences": int(inputs.source_ids.shape[0]), "from_tokenizer": inputs.from_tokenizer,
                   "teacher_forced_sentences": int(inputs.tf_source_ids.shape[0]),
                   "decoder_steps": int(inputs.target_ids.shape[1]), "greedy_max_steps": rules.max_steps},
    }
    onnx_row = compare_fp32(onnx_fp32, reference, inputs, rules, ref_outputs)
    failures: list[str] = []
    if not onnx_row["passed"]:
        failures.append(f"onnx fp32 graphs: {_worst(onnx_row)}")
    if "onnxruntime/fp32" in {f"{a['runtime']}/{a['precision']}" for a in manifest["artifacts"]}:
        results["onnxruntime/fp32"] = onnx_row
    else:
        results["reference_graphs"] = onnx_row
    fp32_outputs = teacher_forced(onnx_fp32, inputs)
    fp32_tokens = greedy(onnx_fp32, inputs.source_ids, rules)
    for artifact in manifest["artifacts"]:
        key = f"{artifact['runtime']}/{artifact['precision']}"
        if key == "onnxruntime/fp32":
            continue
        backend = create_backend(artifact["runtime"], tmp / artifact["files"]["encoder"],
                                 tmp / artifact["files"]["decoder"], None)
        if artifact["precision"] == "fp32":
            row = compare_fp32(backend, reference, inputs, rules, ref_outputs, fp32_tokens)
            if not row["passed"]:
                failures.append(f"{key}: {_worst(row)}")
        else:
            row = compare_int8(backend, onnx_fp32, inputs, rules, fp32_outputs, fp32_tokens)
            if not row["passed"]:
                logger.warning("%s: next-token agreement with fp32 %.3f is below %.2f", key,
                               row["next_token_agreement"], row["agreement_floor"])
        results[key] = row
    if failures:
        raise ParityError("parity check failed (fp32 artifacts differ from the source model):\n  "
                          + "\n  ".join(failures))
    return results


def _worst(row: dict[str, Any]) -> str:
    name = max((k for k in row if k.endswith("_max_abs")), key=lambda k: row[k])
    return f"{name.removesuffix('_max_abs')} max abs diff {row[name]:.3g} > {row['tolerance']:g}"
