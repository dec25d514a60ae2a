"""Open Inference Protocol (KServe v2): the tensor contract of a translation model and its infer bodies (JSON and
Triton's binary tensor extension); no HTTP, no numpy. The server's ``/v2`` routes (``serving.server.http.v2``) and the
Triton model (``serving.commands.export_triton``) both speak it from here.

A translation model takes one BYTES input ``INPUT_TEXT`` of any shape (each element one UTF-8 sentence; tritonclient
users typically send ``[N, 1]``) and returns outputs of the same shape: ``OUTPUT_TEXT`` (BYTES), ``INPUT_TOKENS`` and
``OUTPUT_TOKENS`` (INT32) and ``SCORE`` (FP32). Request parameters: the decoding options (``beam_size``,
``max_length``, ``min_length``, ``repetition_penalty``, ``no_repeat_ngram_size``, ``disable_unk``, sampling's
``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed``; ``serving.engine.request.DecodeOptions``), ``target_prefix``
(one string for every sentence) and ``timeout`` (microseconds, Triton's schedule-policy extension).

Binary extension (Triton ``extension_binary_data.md``): the body is a JSON header of ``Inference-Header-Content-Length``
bytes followed by each binary tensor in the order the JSON lists them; a BYTES tensor is, per element, a 4-byte
little-endian length and the raw bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from serving.engine.errors import InvalidInput
from serving.server.client_json import parse_client_json
from serving.server.infer_header import INPUT_NAME as INPUT_NAME  # the input's name, part of this contract
from serving.server.infer_header import InferRequestHeader, problems

if TYPE_CHECKING:  # the codec reads translations' fields; it needs nothing of the engine at run time
    from serving.engine.request import Translation

OUTPUT_DATATYPES: dict[str, str] = {
    "OUTPUT_TEXT": "BYTES",
    "INPUT_TOKENS": "INT32",
    "OUTPUT_TOKENS": "INT32",
    "SCORE": "FP32",
}
_MAX_INT32 = 2**31 - 1


def output_values(translations: Sequence[Translation]) -> dict[str, list[Any]]:
    """Each output's elements for ``translations`` (row-major): token counts clipped to INT32, a missing score NaN."""
    return {
        "OUTPUT_TEXT": [t.text for t in translations],
        "INPUT_TOKENS": [min(int(t.input_tokens), _MAX_INT32) for t in translations],
        "OUTPUT_TOKENS": [min(int(t.output_tokens), _MAX_INT32) for t in translations],
        "SCORE": [float("nan") if t.score is None else float(t.score) for t in translations],
    }


def check_one_hypothesis(num_hypotheses: object) -> None:
    """Refuse ``num_hypotheses`` above 1: the outputs hold one translation per sentence.

    Raises:
        InvalidInput: naming the parameter and where n-best lists are.
    """
    if isinstance(num_hypotheses, int | float) and num_hypotheses > 1:
        raise InvalidInput("parameter 'num_hypotheses' above 1 is not for infer: its outputs hold one translation "
                           "per sentence (POST /v1/translate returns n-best lists)")


_INTEGER_PARAMETERS = ("beam_size", "max_length", "num_hypotheses", "min_length", "no_repeat_ngram_size", "top_k",
                       "seed")


@dataclass
class InferRequest:
    """A parsed infer request: the sentences (flattened, row-major), their shape and what to send back."""

    id: str | None
    texts: list[str]
    shape: list[int]
    outputs: list[tuple[str, bool]]  # (output name, answer in binary)
    parameters: dict[str, Any] = field(default_factory=dict)

    def decoding(self) -> dict[str, Any]:
        """The parameters, integer ones checked, for ``TranslationService.options`` (which reads the decoding options
        among them: ``serving.engine.request.OPTION_NAMES``).

        Raises:
            InvalidInput: a parameter that must be an integer is not, or ``num_hypotheses`` above 1 (an infer
                response holds one translation per sentence: n-best is ``/v1/translate``'s).
        """
        values = dict(self.parameters)
        for name in _INTEGER_PARAMETERS:
            values[name] = self.int_parameter(name)
        check_one_hypothesis(values["num_hypotheses"])
        return values

    def target_prefixes(self) -> list[str] | None:
        """The ``target_prefix`` parameter (a string: the start of every sentence's translation), once per text.

        Raises:
            InvalidInput: a target_prefix that is not a string.
        """
        prefix = self.parameters.get("target_prefix")
        if prefix is None:
            return None
        if not isinstance(prefix, str):
            raise InvalidInput(f"parameter 'target_prefix' must be a string, got {prefix!r}")
        return [prefix] * len(self.texts)

    def int_parameter(self, name: str) -> int | None:
        value = self.parameters.get(name)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():  # JSON's 4.0 is the integer 4
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(f"parameter {name!r} must be an integer, got {value!r}")
        return value



def model_metadata(name: str, version: str, platform: str) -> dict[str, Any]:
    """The model metadata document (``GET /v2/models/{name}``)."""
    return {
        "name": name,
        "versions": [version],
        "platform": platform,
        "inputs": [{"name": INPUT_NAME, "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [{"name": n, "datatype": d, "shape": [-1, 1]} for n, d in OUTPUT_DATATYPES.items()],
    }


SERVER_EXTENSIONS: list[str] = ["binary_tensor_data", "schedule_policy", "model_configuration", "statistics"]
"""The protocol extensions the server has (server metadata; perf_analyzer asks for statistics only when listed)."""

NO_REPOSITORY = ("this server was started with -m packages, not --model-repository: there is no model repository "
                 "to load models from or unload them to")
"""Why the repository extension's load and unload are refused without a repository (HTTP 501, gRPC UNIMPLEMENTED)."""

CONFIG_TYPES: dict[str, str] = {"BYTES": "TYPE_STRING", "INT32": "TYPE_INT32", "FP32": "TYPE_FP32"}
"""Each tensor datatype's name in a Triton model configuration (``data_type``)."""


def model_config(
    name: str, platform: str, *, max_batch_size: int, max_queue_delay_us: int, max_queue_size: int
) -> dict[str, Any]:
    """The model's configuration as Triton's ``GET /v2/models/{name}/config`` answers it (its ``ModelConfig`` in
    JSON, field names as in Triton's model_config.proto): the same tensors as :func:`model_metadata`, with the batch
    dimension left to ``max_batch_size`` as Triton does (dims ``[1]`` is the ``[-1, 1]`` of the metadata), the server's
    dynamic batching limits, one CPU instance. What perf_analyzer and Model Analyzer read before they send."""

    def tensor(tensor_name: str, datatype: str) -> dict[str, Any]:
        return {"name": tensor_name, "data_type": CONFIG_TYPES[datatype], "dims": [1]}

    batching: dict[str, Any] = {"max_queue_delay_microseconds": max_queue_delay_us}
    if max_queue_size:
        batching["default_queue_policy"] = {"max_queue_size": max_queue_size}
    return {
        "name": name,
        "platform": platform,
        "backend": "mtgate",
        "max_batch_size": max_batch_size,
        "input": [tensor(INPUT_NAME, "BYTES")],
        "output": [tensor(n, d) for n, d in OUTPUT_DATATYPES.items()],
        "dynamic_batching": batching,
        "instance_group": [{"name": name, "kind": "KIND_CPU", "count": 1}],
    }


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an infer request body.

    Arguments:
        body: the whole (decompressed) request body.
        header_length: the ``Inference-Header-Content-Length`` header, if any (absent: the body is all JSON).

    Raises:
        InvalidInput: with a message that says what is wrong, for anything malformed.
    """
    if header_length is None:
        header, binary = body, b""
    else:
        try:
            n = int(header_length.strip())
        except ValueError:
            raise InvalidInput(f"Inference-Header-Content-Length is not an integer: {header_length!r}") from None
        if n < 0 or n > len(body):
            raise InvalidInput(f"Inference-Header-Content-Length {n} is outside the body's {len(body)} bytes")
        if n == 0:
            raise InvalidInput("raw binary requests (Inference-Header-Content-Length: 0) are not supported")
        header, binary = body[:n], body[n:]
    if not header.strip():
        raise InvalidInput("empty request body; expected an inference request JSON object")
    doc = parse_client_json(header, "the request body")
    if not isinstance(doc, dict):
        raise InvalidInput("request must be a JSON object with an 'inputs' list")
    try:
        typed = InferRequestHeader.model_validate(doc)
    except ValidationError as e:
        raise InvalidInput("; ".join(problems(e.errors(), doc))) from None

    [tensor] = typed.inputs
    shape = list(tensor.shape)
    count = math.prod(shape)
    size = tensor.parameters.binary_data_size if tensor.parameters is not None else None
    if size is not None:
        if size > len(binary):
            raise InvalidInput(f"binary_data_size {size} of {INPUT_NAME!r} exceeds the {len(binary)} binary bytes sent")
        texts = decode_bytes_tensor(binary[:size], count)
    else:
        assert tensor.data is not None  # the header model requires one or the other
        texts = _flatten_strings(tensor.data)
        if len(texts) != count:
            raise InvalidInput(f"input {INPUT_NAME!r} has {len(texts)} elements but its shape {shape} needs {count}")
    if (size or 0) != len(binary):
        raise InvalidInput(f"{len(binary) - (size or 0)} bytes of binary data follow the tensors; sizes do not add up")

    parameters: dict[str, Any] = doc.get("parameters") or {}  # as sent: the service reads the decoding options
    default_binary = typed.parameters.binary_data_output if typed.parameters is not None else False
    outputs: list[tuple[str, bool]] = ([(name, default_binary) for name in OUTPUT_DATATYPES] if typed.outputs is None
               else [(entry.name, entry.binary(default_binary)) for entry in typed.outputs])
    return InferRequest(id=typed.id, texts=texts, shape=shape, outputs=outputs, parameters=parameters)


def decode_bytes_tensor(raw: bytes, count: int) -> list[str]:
    """Split ``count`` length-prefixed elements and decode each as UTF-8.

    Raises:
        InvalidInput: truncated data, extra bytes, or an element that is not UTF-8.
    """
    texts: list[str] = []
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise InvalidInput(f"binary {INPUT_NAME!r} ends before element {i} of {count}")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidInput(
                f"binary {INPUT_NAME!r} element {i} claims {length} bytes; only {len(raw) - offset} left"
            )
        try:
            texts.append(raw[offset : offset + length].decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidInput(f"{INPUT_NAME!r} element {i} is not valid UTF-8") from None
        offset += length
    if offset != len(raw):
        raise InvalidInput(f"binary {INPUT_NAME!r} has {len(raw) - offset} bytes beyond its {count} elements")
    return texts


def encode_bytes_tensor(values: Sequence[str]) -> bytes:
    parts = []
    for value in values:
        data = value.encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def encode_infer_response(
    request: InferRequest, model: str, version: str, translations: Sequence[Translation]
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; binary outputs follow the JSON header in the order it lists them."""
    values = output_values(translations)
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, binary in request.outputs:
        datatype = OUTPUT_DATATYPES[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": request.shape}
        data = values[name]
        if binary:
            raw = encode_binary(datatype, data)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = [None if isinstance(v, float) and not math.isfinite(v) else v for v in data]
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        doc = {"id": request.id, **doc}
    # ensure_ascii: the header length the client slices by is then both characters and bytes.
    header = json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    if not chunks:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(chunks), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


def encode_binary(datatype: str, data: list[Any]) -> bytes:
    """A tensor's raw bytes (little-endian; BYTES elements length-prefixed), as the binary extension and gRPC's
    ``raw_output_contents`` carry it."""
    if datatype == "BYTES":
        return encode_bytes_tensor(data)
    if datatype == "INT32":
        return struct.pack(f"<{len(data)}i", *data)
    return struct.pack(f"<{len(data)}f", *data)


def _flatten_strings(data: Any) -> list[str]:
    out: list[str] = []
    stack = [iter([data])]
    depth = 0
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                depth += 1
                if depth > 9:
                    raise InvalidInput(f"input {INPUT_NAME!r} data is nested too deeply")
                stack.append(iter(item))
                break
            if not isinstance(item, str):
                raise InvalidInput(f"input {INPUT_NAME!r} data must hold strings, got {type(item).__name__}")
            out.append(item)
        else:
            stack.pop()
            depth -= 1
    return out
