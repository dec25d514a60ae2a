"""The model Triton's Python backend runs for a package exported by ``mtgate export-triton`` (the ``model.py`` it
writes imports this class from the engine bundled beside it): a dynamic batch of requests in, the engine's
translations out, a bad request answered with its error without failing the others."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from serving.commands.export_triton import OUTPUTS, PACKAGE_DIR
from serving.server.oip import INPUT_NAME, check_one_hypothesis, output_values

if TYPE_CHECKING:
    from serving.engine.errors import ServingError
    from serving.engine.request import DecodeOptions, Prepared, Translation

logger = logging.getLogger(__name__)


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
