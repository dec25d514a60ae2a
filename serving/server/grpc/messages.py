"""The messages of the KServe v2 / Triton ``GRPCInferenceService`` (``serving.server.grpc.servicer``), as compiled in the
``tritonclient`` wheel: each method's request and response types, a request's bytes parsed (``INVALID_ARGUMENT`` for
bytes that are not one), the :class:`~serving.server.oip.InferRequest` of a ``ModelInferRequest``, the
``ModelInferResponse`` of its translations, and what a stream answers besides (``serving.server.grpc.stream``): a
failed request, a partial text, the flag of a request's last response.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from serving.engine.errors import InvalidInput
from serving.engine.request import Translation
from serving.server.oip import (
    INPUT_NAME,
    OUTPUT_DATATYPES,
    InferRequest,
    decode_bytes_tensor,
    encode_binary,
    output_values,
)

SERVICE_NAME = "inference.GRPCInferenceService"
METHODS = {m.name: m for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}


def message_type(descriptor: Any) -> Any:
    """The generated class of a message of the service (every one is in ``service_pb2``)."""
    return getattr(service_pb2, descriptor.name)


def parse_message(kind: Any, raw: bytes) -> Any:
    """``raw`` as a ``kind`` message.

    Raises:
        InvalidInput: the bytes are not one (INVALID_ARGUMENT, where gRPC's own deserializer answers UNKNOWN).
    """
    try:
        return kind.FromString(raw)
    except DecodeError:
        raise InvalidInput(f"the request is not a valid {kind.DESCRIPTOR.full_name} message "
                           f"({len(raw)} bytes that do not parse as protobuf)") from None


FINAL_RESPONSE = "triton_final_response"
"""The parameter that flags a stream's last response to a request, as Triton sets it on every stream response."""


def stream_error(request: Any, message: str) -> Any:
    """A stream's answer to a failed request: Triton's ``error_message``, with the request's id and model (when
    the request could be parsed); it is the request's last response."""
    known = request is not None
    return service_pb2.ModelStreamInferResponse(error_message=message, infer_response=service_pb2.ModelInferResponse(
        id=request.id if known else "", model_name=request.model_name if known else "",
        model_version=request.model_version if known else "", parameters=_final(True)))


def stream_response(response: Any, *, final: bool) -> Any:
    """``response`` (a ``ModelInferResponse``) as a stream's answer, flagged as the request's last one or not."""
    response.parameters[FINAL_RESPONSE].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=response)


def infer_response(name: str, version: str, parsed: InferRequest, translations: list[Translation]) -> Any:
    """The ``ModelInferResponse`` of a request's translations: the outputs it asked for, in binary, in its shape."""
    values = output_values(translations)
    names = [name for name, _ in parsed.outputs]
    return service_pb2.ModelInferResponse(
        model_name=name, model_version=version, id=parsed.id or "",
        outputs=[service_pb2.ModelInferResponse.InferOutputTensor(
            name=name, datatype=OUTPUT_DATATYPES[name], shape=parsed.shape) for name in names],
        raw_output_contents=[encode_binary(OUTPUT_DATATYPES[name], values[name]) for name in names],
    )


def partial_response(name: str, version: str, parsed: InferRequest, deltas: list[str]) -> Any:
    """A stream's partial answer to a request: ``OUTPUT_TEXT`` in the request's shape, each element the text its
    sentence's translation continues with (empty: nothing new); not the request's last response."""
    tensor = service_pb2.ModelInferResponse.InferOutputTensor(name="OUTPUT_TEXT", datatype="BYTES", shape=parsed.shape)
    response = service_pb2.ModelInferResponse(model_name=name, model_version=version, id=parsed.id or "",
                                              outputs=[tensor], raw_output_contents=[encode_binary("BYTES", deltas)])
    return stream_response(response, final=False)


def empty_final_response(name: str, version: str, parsed: InferRequest) -> Any:
    """The empty response that ends a request's responses, for a client that asked for it (Triton's
    ``triton_enable_empty_final_response``): its id and model, no outputs."""
    return stream_response(service_pb2.ModelInferResponse(model_name=name, model_version=version, id=parsed.id or ""),
                           final=True)


def _final(final: bool) -> dict[str, Any]:
    return {FINAL_RESPONSE: service_pb2.InferParameter(bool_param=final)}


def parameter_value(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def parse_infer_request(request: Any) -> InferRequest:
    """The sentences of a ``ModelInferRequest`` (``raw_input_contents`` or ``contents.bytes_contents``), its shape,
    parameters and requested outputs (none: all of them).

    Raises:
        InvalidInput: anything malformed, with what is wrong.
    """
    if len(request.inputs) != 1 or request.inputs[0].name != INPUT_NAME:
        names = [tensor.name for tensor in request.inputs]
        raise InvalidInput(f"this model takes one BYTES input {INPUT_NAME!r}, got {names}")
    tensor = request.inputs[0]
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"input {INPUT_NAME!r} must have datatype BYTES, got {tensor.datatype!r}")
    shape = list(tensor.shape)
    if not shape or any(d < 0 for d in shape):
        raise InvalidInput(f"input {INPUT_NAME!r} needs a shape of non-negative dimensions, got {shape}")
    count = 1
    for dimension in shape:
        count *= dimension
    if request.raw_input_contents:
        if tensor.HasField("contents"):
            raise InvalidInput(f"input {INPUT_NAME!r} is in both raw_input_contents and contents; send it once")
        if len(request.raw_input_contents) != 1:
            raise InvalidInput(f"{len(request.raw_input_contents)} raw_input_contents for one input")
        texts = decode_bytes_tensor(request.raw_input_contents[0], count)
    else:
        elements = list(tensor.contents.bytes_contents)
        if len(elements) != count:
            raise InvalidInput(f"input {INPUT_NAME!r} has {len(elements)} elements but its shape {shape} needs {count}")
        try:
            texts = [element.decode("utf-8") for element in elements]
        except UnicodeDecodeError:
            raise InvalidInput(f"an element of {INPUT_NAME!r} is not valid UTF-8") from None
    outputs = [output.name for output in request.outputs] or list(OUTPUT_DATATYPES)
    unknown = [name for name in outputs if name not in OUTPUT_DATATYPES]
    if unknown:
        raise InvalidInput(f"unknown output(s) {unknown}; this model has {list(OUTPUT_DATATYPES)}")
    parameters = {key: parameter_value(value) for key, value in request.parameters.items()}
    return InferRequest(id=request.id or None, texts=texts, shape=shape, outputs=[(n, True) for n in outputs],
                        parameters=parameters)
