"""``mtgate export-triton PKG -o REPO`` (or ``-m PKG``): serve a model package from NVIDIA Triton's Python backend.

It writes one model into the Triton model repository ``REPO`` (other models there are left alone)::

    REPO/<name>/config.pbtxt           backend "python", dynamic batching, the same tensors as mtgate's /v2 infer route
    REPO/<name>/<version>/model.py     Triton's entry point: re-exports TritonPythonModel from the bundled engine
    REPO/<name>/<version>/package/     the model package: its manifest and the files of its checksum list, each
                                       verified before and after copying (other files are left out, with a warning)
    REPO/<name>/<version>/mtgate/      the engine code this package was validated with (serving/)
    REPO/<name>/<version>/requirements.txt   what Triton's Python environment needs (numpy, the runtime, tokenizer)

Tensors (as ``GET /v2/models/<name>`` reports them on ``mtgate serve``): input ``INPUT_TEXT`` BYTES ``[-1, 1]``; outputs
``OUTPUT_TEXT`` BYTES, ``INPUT_TOKENS`` and ``OUTPUT_TOKENS`` INT32, ``SCORE`` FP32, all of the input's shape. Request
parameters ``beam_size`` and ``max_length`` are honoured. So a tritonclient user, ``mtgate loadtest`` with the
``TritonUser`` and ``batch-score --server`` work unchanged against either server.

The model directory is written beside ``REPO/<name>`` and renamed into place, so a Triton polling the repository never
loads half a model. A package with a symlink that leads outside it (listed or not) is refused: the export would carry
another file's contents.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from serving.commands.options import add_package, add_runtime, package_of
from serving.package import (
    DEFAULT_RUNTIME,
    Manifest,
    PackageError,
    choose_precision,
    copy_listed,
    escaping_links,
    open_package,
    staging_dir,
    verify_checksums,
)
from serving.server.oip import CONFIG_TYPES, INPUT_NAME, OUTPUT_DATATYPES, check_one_hypothesis, output_values
from serving.server.settings import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE_DELAY_US

if TYPE_CHECKING:
    from serving.engine.errors import ServingError
    from serving.engine.request import DecodeOptions, Translation

logger = logging.getLogger(__name__)

# The tensors are the Open Inference Protocol contract of serving.server.oip; their Triton config type and numpy dtype:
_NUMPY_TYPES: dict[str, Any] = {"BYTES": np.object_, "INT32": np.int32, "FP32": np.float32}
OUTPUTS: dict[str, tuple[str, Any]] = {
    name: (CONFIG_TYPES[datatype], _NUMPY_TYPES[datatype]) for name, datatype in OUTPUT_DATATYPES.items()
}
PACKAGE_DIR = "package"
ENGINE_DIR = "mtgate"
_ENGINE_PACKAGES = ("serving",)  # serving imports nothing of converters, batch or loadtest (tests/test_import_contract.py)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

MODEL_PY = '''\
"""Triton Python backend entry point for an mtgate model package (written by `mtgate export-triton`).

The engine code is bundled beside this file (mtgate/), so the model translates exactly as it did when validated;
Triton's Python environment needs only the packages in requirements.txt.
"""

import importlib.machinery
import importlib.util
import os
import sys

_ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mtgate")
if "serving" not in sys.modules:
    # The bundled package by path, ahead of any finder an installed mtgate put on sys.meta_path (an editable
    # install's finder answers for `serving` before sys.path is searched); its submodules follow its __path__.
    _spec = importlib.machinery.PathFinder.find_spec("serving", [_ENGINE])
    _serving = importlib.util.module_from_spec(_spec)
    sys.modules["serving"] = _serving
    _spec.loader.exec_module(_serving)

from serving.commands.export_triton import TritonPythonModel  # noqa: E402,F401
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options, in ``serving/commands/options.py``'s vocabulary (the old ``--backend`` is a hidden alias of --runtime)."""
    add_package(parser, "PKG", "model package directory (from 'mtgate convert')")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="REPO",
                        help="Triton model repository to write the model into (created if missing)")
    parser.add_argument("--model-name", metavar="NAME", help="Triton model name (default: the package's name)")
    parser.add_argument("--model-version", type=int, default=1, help="numeric version directory (default 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace REPO's model of that name if it exists, every version of it (atomically: the "
                             "old model stays until the new one is complete)")
    add_runtime(parser, threads_help="intra-op threads per model instance (default: the runtime's choice)")
    parser.add_argument("--instances", type=int, default=1, metavar="N",
                        help="model instances (KIND_CPU); instances x threads should not exceed the cores (default 1)")
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE, metavar="N",
                        help=f"most sentences Triton's dynamic batcher puts in one execute() (default "
                             f"{DEFAULT_MAX_BATCH_SIZE})")
    parser.add_argument("--max-queue-delay-us", type=int, default=DEFAULT_MAX_QUEUE_DELAY_US, metavar="US",
                        help="how long a request may wait for a fuller batch, in microseconds (default "
                             f"{DEFAULT_MAX_QUEUE_DELAY_US})")
    parser.add_argument("--max-queue-size", type=int, default=0, metavar="N",
                        help="queued requests beyond which Triton rejects new ones (default 0: unbounded, Triton's "
                             "default; its queue counts requests, mtgate serve's counts sentences)")


def run(args: argparse.Namespace) -> int:
    from serving.commands.options import UsageError

    # Numbers are checked here rather than by argparse types, so that a bad one is a single line.
    for flag, value, least in (("--model-version", args.model_version, 1), ("--instances", args.instances, 1),
                               ("--max-batch-size", args.max_batch_size, 1),
                               ("--max-queue-delay-us", args.max_queue_delay_us, 0),
                               ("--max-queue-size", args.max_queue_size, 0),
                               ("--threads", args.threads if args.threads is not None else 1, 1)):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    try:
        package = package_of(args, "mtgate export-triton PKG -o REPO (or -m PKG)")
    except ValueError as e:
        raise UsageError(str(e)) from None
    created = not args.output.exists()
    try:  # an output that cannot be written is an input error, found before anything is copied
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the model repository {args.output}: {e.strerror or e}; give another -o") from None
    try:
        settings = TritonModelSettings(
            runtime=args.runtime, precision=args.precision, threads=args.threads, instances=args.instances,
            max_batch_size=args.max_batch_size, max_queue_delay_us=args.max_queue_delay_us,
            max_queue_size=args.max_queue_size,
        )
        model_dir = export_triton(package, args.output, model_name=args.model_name, version=args.model_version,
                                  settings=settings, overwrite=args.overwrite)
    except (PackageError, ValueError, FileExistsError, OSError) as e:
        if created:  # leave nothing behind: the repository this command made is removed again
            shutil.rmtree(args.output, ignore_errors=True)
        if not isinstance(e, OSError) or isinstance(e, FileExistsError):
            raise UsageError(str(e)) from None
        sys.stderr.write(f"mtgate export-triton: failed: cannot write {e.filename or args.output}: "
                         f"{e.strerror or e}; nothing was changed in {args.output}\n")
        return 1
    sys.stdout.write(f"wrote Triton model {model_dir.name!r} to {model_dir}\n")
    return 0


@dataclass(frozen=True)
class TritonModelSettings:
    """How the exported model runs on Triton (what ``config.pbtxt`` says besides its name).

    Attributes:
        runtime: runtime the Python backend loads the package with.
        precision: artifact precision (``auto``: the package's choice, ``serving.package.choose_precision``,
            written into the config as the precision it chose).
        threads: intra-op threads per instance (None: the runtime's default).
        instances: model instances on CPU.
        max_batch_size: the model's ``max_batch_size`` (sentences per dynamic batch).
        max_queue_delay_us: the dynamic batcher's ``max_queue_delay_microseconds``.
        max_queue_size: the dynamic batcher's ``default_queue_policy.max_queue_size`` (0: unbounded).
    """

    runtime: str = DEFAULT_RUNTIME
    precision: str = "fp32"
    threads: int | None = None
    instances: int = 1
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_queue_delay_us: int = DEFAULT_MAX_QUEUE_DELAY_US
    max_queue_size: int = 0


def export_triton(package: Path, repository: Path, *, model_name: str | None = None, version: int = 1,
                  settings: TritonModelSettings | None = None, overwrite: bool = False) -> Path:
    """Write ``repository/<model_name>`` (atomically; an existing model of that name is replaced with ``overwrite``,
    else refused before any work, as ``mtgate convert`` refuses an existing package).

    Arguments:
        package: the model package (every checksum is verified).
        repository: the Triton model repository (created if missing).
        model_name: Triton model name (default: the package's manifest name).
        version: the numeric version directory.
        settings: how the model runs (default: ``TritonModelSettings()``).
        overwrite: replace a model of that name (every version of it).

    Returns:
        The model directory written.

    Raises:
        PackageError: not a package, a file missing or modified, a symlink leading outside the package, or no such
            artifact.
        ValueError: an unusable model name.
        FileExistsError: a model of that name exists and ``overwrite`` is False.
    """
    settings = settings or TritonModelSettings()
    runtime = settings.runtime
    manifest = open_package(package).manifest
    choice = choose_precision(manifest, runtime, settings.precision)
    manifest.artifact(runtime, precision := choice.precision)
    escaping = escaping_links(package)
    if escaping:
        rel, target = next(iter(escaping.items()))
        more = f" (and {len(escaping) - 1} more)" if len(escaping) > 1 else ""
        raise PackageError(f"{package}: {rel} is a symlink to {target}, outside the package{more}; export-triton "
                           "copies only the package's own files: replace the link by the file, or remove it")
    name = model_name or manifest.name or package.name
    if not _NAME.match(name):
        raise ValueError(
            f"model name {name!r} is not usable as a Triton model directory (letters, digits, '_', '.', '-'); "
            "pass --model-name"
        )
    if repository.exists() and not repository.is_dir():
        raise ValueError(f"{repository}: not a directory")
    if (repository / name).exists() and not overwrite:
        raise FileExistsError(f"{repository / name}: already exists (pass --overwrite to replace the model, every "
                              "version of it)")
    config = model_config(name, replace(settings, precision=precision))
    with staging_dir(repository / name, overwrite=overwrite) as tmp:
        (tmp / "config.pbtxt").write_text(config, encoding="utf-8")
        version_dir = tmp / str(version)
        version_dir.mkdir()
        (version_dir / "model.py").write_text(MODEL_PY, encoding="utf-8")
        left_out = copy_listed(package, version_dir / PACKAGE_DIR, manifest)
        if left_out:
            logger.warning("%s: left out %d file(s) not in the checksum list: %s", package, len(left_out),
                           ", ".join(left_out[:5]) + (" ..." if len(left_out) > 5 else ""))
        problems = verify_checksums(version_dir / PACKAGE_DIR, manifest)
        if problems:
            raise PackageError(f"{package}: changed while copying: " + "; ".join(problems))
        _copy_engine(version_dir / ENGINE_DIR)
        (version_dir / "requirements.txt").write_text(_requirements(manifest, runtime), encoding="utf-8")
    logger.info("exported %s (%s/%s: %s) to %s", name, runtime, precision, choice.reason, repository / name)
    return repository / name


def model_config(name: str, settings: TritonModelSettings) -> str:
    """config.pbtxt (Triton's ModelConfig in protobuf text format) for the Python backend model."""
    threads, max_queue_size = settings.threads, settings.max_queue_size
    # With max_batch_size > 0 Triton adds the batch dimension itself: dims [1] is our [-1, 1].
    outputs = ",\n".join(
        f'  {{\n    name: "{out}"\n    data_type: {dtype}\n    dims: [ 1 ]\n  }}' for out, (dtype, _) in OUTPUTS.items()
    )
    queue_policy = f"\n  default_queue_policy {{ max_queue_size: {max_queue_size} }}" if max_queue_size else ""
    parameters = {"runtime": settings.runtime, "precision": settings.precision, "threads": "" if threads is None else str(threads),
                  "package": PACKAGE_DIR}
    params = "\n".join(
        f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}' for key, value in parameters.items()
    )
    return f"""# Written by `mtgate export-triton`: an mtgate model package on Triton's Python backend.
name: "{name}"
backend: "python"
max_batch_size: {settings.max_batch_size}
dynamic_batching {{
  max_queue_delay_microseconds: {settings.max_queue_delay_us}{queue_policy}
}}
input [
  {{
    name: "{INPUT_NAME}"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }}
]
output [
{outputs}
]
instance_group [
  {{
    count: {settings.instances}
    kind: KIND_CPU
  }}
]
{params}
"""


def _copy_engine(target: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in _ENGINE_PACKAGES:
        source = Path(__import__(package).__file__ or "").parent
        shutil.copytree(source, target / package, ignore=ignore)


def _requirements(manifest: Manifest, runtime: str) -> str:
    names = ["numpy", runtime]
    if manifest.tokenizer.kind == "sentencepiece":
        names.append("sentencepiece")
    lines = ["# pip install -r requirements.txt into Triton's Python backend environment (versions mtgate ran with)"]
    for dist in names:
        try:
            lines.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(dist)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the model Triton runs


class TritonPythonModel:
    """Triton's Python backend model: a :class:`serving.engine.translator.Translator` over the bundled package.

    ``execute`` receives every request of one dynamic batch; requests with the same decoding options are translated
    in one engine call (the engine sorts by length and sub-batches itself). A bad request gets an error response
    without failing the others.
    """

    def initialize(self, args: dict[str, str]) -> None:
        """Load the package named by the config's ``package`` parameter (relative to the version directory)."""
        import triton_python_backend_utils as pb_utils

        from serving.engine.translator import Translator

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        params = {key: str(value.get("string_value", "")) for key, value in (config.get("parameters") or {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        package = version_dir / params.get("package", PACKAGE_DIR)
        threads = int(params["threads"]) if params.get("threads") else None
        self.translator = Translator.load(
            package, runtime=params.get("runtime", "onnxruntime"), precision=params.get("precision", "fp32"),
            threads=threads,
        )
        logger.info("loaded %s for Triton model %s", package, args.get("model_name", config.get("name")))

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        """One response per request, in order."""
        from serving.engine.errors import ServingError
        from serving.engine.request import Prepared

        responses: list[Any] = [None] * len(requests)
        groups: dict[Any, list[tuple[int, Prepared, tuple[int, ...]]]] = {}
        for i, request in enumerate(requests):
            try:
                texts, shape = self._texts(request)
                options = self._options(request)
                prepared = self.translator.prepare(texts, options)  # a text too long fails only its request
            except ServingError as e:
                responses[i] = self._error(e)
                continue
            groups.setdefault(options, []).append((i, prepared, shape))
        for members in groups.values():
            try:
                translations = self.translator.run(Prepared.join([prepared for _, prepared, _ in members]))
            except ServingError as e:
                for i, _, _ in members:
                    responses[i] = self._error(e)
                continue
            start = 0
            for i, prepared, shape in members:
                part = translations[start : start + len(prepared)]
                start += len(prepared)
                responses[i] = self._pb.InferenceResponse(output_tensors=self._outputs(part, shape))
        return responses

    def finalize(self) -> None:
        """Release the runtime sessions."""
        self.translator = None  # type: ignore[assignment]

    def _texts(self, request: Any) -> tuple[list[str], tuple[int, ...]]:
        from serving.engine.errors import InvalidInput

        tensor = self._pb.get_input_tensor_by_name(request, INPUT_NAME)
        if tensor is None:
            raise InvalidInput(f"missing input {INPUT_NAME!r}")
        array = np.asarray(tensor.as_numpy())
        texts = []
        for i, value in enumerate(array.reshape(-1)):
            try:
                texts.append(value.decode("utf-8") if isinstance(value, bytes | np.bytes_) else str(value))
            except UnicodeDecodeError:
                raise InvalidInput(f"{INPUT_NAME!r} element {i} is not valid UTF-8") from None
        return texts, tuple(int(d) for d in array.shape)

    def _options(self, request: Any) -> DecodeOptions:
        from serving.engine.errors import InvalidInput
        from serving.engine.request import DecodeOptions

        parameters = getattr(request, "parameters", None)
        raw = parameters() if callable(parameters) else "{}"
        try:
            params = json.loads(raw or "{}")
        except ValueError:
            raise InvalidInput("request parameters are not valid JSON") from None
        if not isinstance(params, dict):
            raise InvalidInput("request parameters must be a JSON object")
        check_one_hypothesis(params.get("num_hypotheses"))
        return DecodeOptions.from_parameters(params)

    def _error(self, error: ServingError) -> Any:
        return self._pb.InferenceResponse(output_tensors=[], error=self._pb.TritonError(error.message))

    def _outputs(self, translations: Sequence[Translation], shape: tuple[int, ...]) -> list[Any]:
        values = output_values(translations)
        values["OUTPUT_TEXT"] = [text.encode("utf-8") for text in values["OUTPUT_TEXT"]]
        return [self._pb.Tensor(name, np.array(values[name], dtype=dtype).reshape(shape))
                for name, (_, dtype) in OUTPUTS.items()]
