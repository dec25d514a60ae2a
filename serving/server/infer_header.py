"""The JSON header of an Open Inference Protocol infer request: :class:`InferRequestHeader`, one strict pydantic
model that validates it (``serving.server.oip.parse_infer_request``) and documents it (``/v2``'s OpenAPI request
body, :func:`infer_request_schema`).

The model checks the header's structure: the one BYTES input ``INPUT_TEXT`` (its shape, where its sentences are),
the outputs asked for, the request id, ``binary_data_output``. What the sentences hold (strings, nested as the shape
says, as many as it says; or the binary tensor) is read by ``serving.server.oip``; the decoding parameters and the
deadline are checked by the service (``serving.engine.options.DecodeOptions``, one check for every transport): the
model takes any value for them and the document states their types and ranges, as ``/v1``'s does. Every problem is
one clear phrase (:func:`problems`), as tritonclient users read it in the error's text.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic_core import ErrorDetails

INPUT_NAME = "INPUT_TEXT"
OutputName = Literal["OUTPUT_TEXT", "INPUT_TOKENS", "OUTPUT_TOKENS", "SCORE"]
"""The outputs (``serving.server.oip.OUTPUT_DATATYPES`` gives their datatypes)."""


class _Strict(BaseModel):
    # JSON's types as they are (true is no integer, "1" no number); keys the protocol may add are ignored
    model_config = ConfigDict(strict=True, extra="ignore")


def _service_checks(schema: dict[str, Any], description: str | None = None) -> Any:
    """A parameter the service checks (400 naming it and its range): any value here, its type and range documented."""
    return Field(default=None, description=description, json_schema_extra=schema)


class InferParameters(_Strict):
    """The request's parameters; others pass through (null stands for "not given", as the service reads them)."""

    model_config = ConfigDict(extra="allow")

    beam_size: Any = _service_checks({"type": ["integer", "null"], "minimum": 1})
    max_length: Any = _service_checks({"type": ["integer", "null"], "minimum": 1})
    min_length: Any = _service_checks({"type": ["integer", "null"], "minimum": 1})
    num_hypotheses: Any = _service_checks({"type": ["integer", "null"], "minimum": 1, "maximum": 1},
                                          "1 (n-best lists: POST /v1/translate)")
    repetition_penalty: Any = _service_checks({"type": ["number", "null"], "exclusiveMinimum": 0})
    no_repeat_ngram_size: Any = _service_checks({"type": ["integer", "null"], "minimum": 1})
    disable_unk: Any = _service_checks({"type": ["boolean", "null"]})
    do_sample: Any = _service_checks({"type": ["boolean", "null"]})
    temperature: Any = _service_checks({"type": ["number", "null"], "exclusiveMinimum": 0})
    top_k: Any = _service_checks({"type": ["integer", "null"], "minimum": 1})
    top_p: Any = _service_checks({"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1})
    seed: Any = _service_checks({"type": ["integer", "null"], "minimum": 0, "maximum": 2**64 - 1})
    target_prefix: Any = _service_checks({"type": ["string", "null"]}, "the start of every translation")
    timeout: Any = _service_checks({"type": ["integer", "null"], "minimum": 0},
                                   "deadline in microseconds (0: the server's default)")
    truncate: Any = _service_checks({"type": ["boolean", "null"]}, "cut a sentence longer than the model's "
                                    "positions instead of refusing it (413)")
    binary_data_output: bool = Field(default=False, description="every output in binary unless 'outputs' says")


class TensorParameters(_Strict):
    binary_data_size: Annotated[int, Field(ge=0)] | None = None


class InputTensor(_Strict):
    """The one input: the sentences in data, or (binary extension) their size in parameters.binary_data_size."""

    # what the validator below checks, for the document
    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["data"]}, {
        "required": ["parameters"], "properties": {"parameters": {"required": ["binary_data_size"]}}}]})

    name: Literal["INPUT_TEXT"]
    datatype: Literal["BYTES"]
    shape: list[Annotated[int, Field(ge=0)]] = Field(
        max_length=8, description="its element count must equal the number of sentences")
    # strings, or lists nested as the shape says (serving.server.oip flattens and checks them)
    data: list[Annotated[Any, WithJsonSchema({"type": ["string", "array"]})]] | None = Field(
        default=None, description="the sentences, flat or nested as the shape says (an empty one: an empty "
        "translation)",
        json_schema_extra={"minItems": 1})  # none at all is the service's 400 ("no text to translate")
    parameters: TensorParameters | None = None

    @model_validator(mode="after")
    def _sentences_given(self) -> InputTensor:
        if self.data is None and (self.parameters is None or self.parameters.binary_data_size is None):
            raise ValueError(f"input {INPUT_NAME!r} has neither 'data' nor parameters.binary_data_size")
        return self


class OutputParameters(_Strict):
    binary_data: bool = Field(default=False, description="this output in binary (default: binary_data_output)")


class OutputTensor(_Strict):
    name: OutputName
    parameters: OutputParameters | None = None

    def binary(self, default: bool) -> bool:
        """Whether to answer this output in binary (``default``: the request's ``binary_data_output``)."""
        given = self.parameters
        return given.binary_data if given is not None and "binary_data" in given.model_fields_set else default


class InferRequestHeader(_Strict):
    """An inference request with one BYTES input INPUT_TEXT whose shape matches its data."""

    id: str | None = None
    parameters: InferParameters | None = None
    inputs: list[InputTensor] = Field(min_length=1, max_length=1)
    outputs: list[OutputTensor] | None = None


def infer_request_schema() -> dict[str, Any]:
    """:class:`InferRequestHeader`'s JSON Schema as one self-contained document (no ``$ref``: it goes into an
    OpenAPI request body as it is), ``X | None`` written as a type that admits null."""
    schema = InferRequestHeader.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            node = {**copy.deepcopy(definitions[node["$ref"].rsplit("/", 1)[-1]]),
                    **{k: v for k, v in node.items() if k != "$ref"}}
        node = {key: inline(value) for key, value in node.items()}
        options = node.get("anyOf")
        if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
            [kind] = [o for o in options if o != {"type": "null"}]
            if isinstance(kind.get("type"), str):
                node = {**{k: v for k, v in node.items() if k != "anyOf"}, **kind, "type": [kind["type"], "null"]}
        return node

    result: dict[str, Any] = inline(schema)
    return result


_OUTPUTS = ", ".join(get_args(OutputName))
_TAKES = f"this model takes one BYTES input {INPUT_NAME!r}"
_SHAPE = f"input {INPUT_NAME!r} needs a 'shape' list of non-negative integers, got {{value!r}}"
_MESSAGES: dict[tuple[str, ...], str] = {
    ("id",): "'id' must be a string",
    ("parameters",): "'parameters' must be an object",
    ("parameters", "binary_data_output"): "parameter 'binary_data_output' must be true or false",
    ("inputs",): f"request needs a non-empty 'inputs' list with one BYTES input {INPUT_NAME!r}",
    ("inputs", "*"): "{where} must be an object",
    ("inputs", "*", "name"): f"unexpected input {{value!r}}; {_TAKES}",
    ("inputs", "*", "datatype"): f"input {INPUT_NAME!r} must have datatype BYTES, got {{value!r}}",
    ("inputs", "*", "shape"): _SHAPE,
    ("inputs", "*", "data"): f"input {INPUT_NAME!r} data must be a list (of strings, or nested as its shape)",
    ("inputs", "*", "parameters"): "'{where}' must be an object",
    ("inputs", "*", "parameters", "binary_data_size"): f"binary_data_size of {INPUT_NAME!r} must be a non-negative "
                                                       "integer",
    ("outputs",): "'outputs' must be a list",
    ("outputs", "*"): "{where} must be an object",
    ("outputs", "*", "name"): f"unknown output {{value!r}}; this model has {_OUTPUTS}",
    ("outputs", "*", "parameters"): "'{where}' must be an object",
    ("outputs", "*", "parameters", "binary_data"): "{where} must be true or false",
}


def problems(errors: list[ErrorDetails], document: dict[str, Any]) -> list[str]:
    """Each validation error of ``document`` as the phrase a client reads (the field named by its path)."""
    out: list[str] = []
    for error in errors:
        loc = error["loc"]
        pattern = tuple("*" if isinstance(part, int) else part for part in loc)
        if pattern[:3] == ("inputs", "*", "shape") and len(loc) > 3:  # a bad dimension: name the whole shape
            loc, pattern = loc[:3], pattern[:3]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
        value = _at(document, loc)
        if error["type"] == "value_error":  # the model's own check says it all
            message = str(error.get("ctx", {}).get("error", error["msg"]))
        elif error["type"] == "too_long" and pattern == ("inputs", "*", "shape"):
            message = f"input {INPUT_NAME!r} shape has {len(value)} dimensions; at most 8 are accepted"
        elif error["type"] == "too_long" and pattern == ("inputs",):
            strange = [name for i in value if (name := i.get("name") if isinstance(i, dict) else None) != INPUT_NAME]
            message = f"unexpected input {strange[0]!r}; {_TAKES}" if strange else f"input {INPUT_NAME!r} given twice"
        elif pattern in _MESSAGES:
            message = _MESSAGES[pattern].format(where=where, value=value)
        else:
            message = f"{where}: {error['msg']}"
        if message not in out:
            out.append(message)
    return out


def _at(document: Any, loc: tuple[int | str, ...]) -> Any:
    """The value at ``loc`` in the document (None where it is missing: a missing field reads as null)."""
    for part in loc:
        if isinstance(part, int) and isinstance(document, list) and part < len(document):
            document = document[part]
        elif isinstance(part, str) and isinstance(document, dict):
            document = document.get(part)
        else:
            return None
    return document
