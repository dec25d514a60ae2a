"""A minimal stand-in for Triton's ``triton_python_backend_utils`` (the module Triton's Python backend stub provides).

Only the part of the API a ``TritonPythonModel`` uses to read requests and build responses, with the documented
semantics of triton-inference-server/python_backend (README "Usage" and "Error Handling"):

- ``Tensor(name, numpy_array)`` with ``name()`` and ``as_numpy()``; a BYTES tensor is a numpy ``object`` array of
  ``bytes``, batch dimension first.
- ``InferenceRequest(model_name, inputs, requested_output_names, parameters)`` with ``inputs()``,
  ``requested_output_names()``, ``model_name()`` and ``parameters()`` (a JSON string of the request parameters).
- ``get_input_tensor_by_name(request, name)`` -> ``Tensor`` or ``None``.
- ``InferenceResponse(output_tensors, error=None)`` with ``output_tensors()``, ``has_error()`` and ``error()``.
- ``TritonError(message)`` with ``message()``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(name, str):
            raise TypeError("Tensor name must be a str")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"Tensor {name!r}: expected a numpy array, got {type(array).__name__}")
        if array.dtype == np.object_ and not all(isinstance(v, bytes | np.bytes_) for v in array.reshape(-1)):
            raise TypeError(f"Tensor {name!r}: a BYTES (object) tensor must hold bytes")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceRequest:
    def __init__(
        self,
        model_name: str,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str] = (),
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._parameters = json.dumps(parameters or {})

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def model_name(self) -> str:
        return self._model_name

    def requested_output_names(self) -> list[str]:
        return self._requested

    def parameters(self) -> str:
        return self._parameters


class InferenceResponse:
    def __init__(self, output_tensors: Sequence[Tensor], error: TritonError | None = None) -> None:
        if error is not None and not isinstance(error, TritonError):
            raise TypeError("error must be a TritonError")
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TypeError("output_tensors must be Tensor objects")
        self._outputs = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)
