"""batch-score against a server over the Open Inference Protocol (KServe v2), through ``tritonclient.http``.

Works with ``mtgate serve`` and with Triton: the model's metadata names its BYTES input and outputs, so nothing here
depends on one server's names. ``mtgate serve`` models take ``INPUT_TEXT`` and return ``OUTPUT_TEXT``, ``SCORE``,
``INPUT_TOKENS`` and ``OUTPUT_TOKENS``; a model with only a text output still works (no scores or token counts).

One :class:`RemoteChunkWorker` per thread (tritonclient's HTTP client is not thread-safe). Each chunk is sorted by
length and sent in requests of at most ``max_batch_size`` sentences; the server's dynamic batcher does the rest.
A request refused as bad input (HTTP 4xx) is retried sentence by sentence so that only the offending sentences are
rejected; 503 (queue full) and 504 are retried with backoff; anything else aborts the run (a rerun resumes).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from batch.records import Translated
from batch.workers import Outcome, Source

logger = logging.getLogger(__name__)

_TEXT_OUTPUTS = ("OUTPUT_TEXT", "translation", "TRANSLATION", "output", "outputs")
_SCORE_OUTPUTS = ("SCORE", "score")
_INPUT_TOKEN_OUTPUTS = ("INPUT_TOKENS", "input_tokens")
_OUTPUT_TOKEN_OUTPUTS = ("OUTPUT_TOKENS", "output_tokens")
_RETRY_STATUSES = ("503", "504", "429")
_AUTH_STATUSES = ("401", "403")
_MAX_RETRIES = 8


class RemoteError(Exception):
    """The server cannot be used (unreachable, unknown model, unexpected metadata)."""


@dataclass(frozen=True)
class ServerTarget:
    """Where to send requests and what the model's tensors are called.

    Attributes:
        url: ``host:port[/path]`` as tritonclient wants it (no scheme).
        ssl: https.
        model: model name on the server.
        version: model version string ("" for the server's choice).
        input_name: the BYTES input.
        input_rank: 1 for shape ``[N]``, 2 for ``[N, 1]``.
        text_output: the BYTES output with the translation.
        score_output: an FP32 output with the score, if the model has one.
        input_tokens_output: source token counts, if the model reports them.
        output_tokens_output: target token counts, if the model reports them.
        headers: HTTP headers sent with every request (``Authorization`` when an API key is given).
    """

    url: str
    ssl: bool
    model: str
    version: str
    input_name: str
    input_rank: int
    text_output: str
    score_output: str | None = None
    input_tokens_output: str | None = None
    output_tokens_output: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"server": ("https://" if self.ssl else "http://") + self.url, "model": self.model,
                "version": self.version or None}


def split_url(url: str) -> tuple[str, bool]:
    """``http://host:port/base`` -> (``host:port/base``, ssl)."""
    url = url.strip().rstrip("/")
    if url.startswith("https://"):
        return url[len("https://"):], True
    if url.startswith("http://"):
        return url[len("http://"):], False
    if "://" in url:
        raise RemoteError(f"{url}: unsupported scheme (use http:// or https://)")
    return url, False


def _client(url: str, ssl: bool, timeout: float = 600.0) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, ssl=ssl, connection_timeout=30.0, network_timeout=timeout)


def _list_models(url: str, ssl: bool, client: Any, headers: dict[str, str]) -> list[str]:
    """Model names: Triton's repository index, else mtgate's ``GET /v1/models`` (default model first)."""
    try:
        index = client.get_model_repository_index(headers=headers)
        names = [m["name"] for m in index if m.get("state", "READY") == "READY"]
        if names:
            return names
    except Exception:  # noqa: BLE001 - not Triton; try mtgate's own listing
        pass
    scheme = "https" if ssl else "http"
    try:
        request = urllib.request.Request(f"{scheme}://{url}/v1/models", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            body = json.loads(response.read())
    except (urllib.error.URLError, ValueError, OSError) as e:
        raise RemoteError(f"cannot list the models of {scheme}://{url} ({e}); pass --model-name") from e
    models = body.get("models", []) if isinstance(body, dict) else []
    models = sorted(models, key=lambda m: not m.get("default", False))
    return [str(m["name"]) for m in models if "name" in m]


def _pick(names: list[str], preferred: tuple[str, ...]) -> str | None:
    for name in preferred:
        if name in names:
            return name
    return None


def connect(server: str, model_name: str | None = None, version: str = "", api_key: str | None = None) -> ServerTarget:
    """Check the server is up and the model ready; read the model's tensor names from its metadata.

    ``api_key`` is sent as ``Authorization: Bearer`` with every request.

    Raises:
        RemoteError: unreachable server, unknown or unready model, or a model without a BYTES input/output.
    """
    from tritonclient.utils import InferenceServerException

    url, ssl = split_url(server)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = _client(url, ssl)
    try:
        try:
            live = client.is_server_live(headers=headers)
        except Exception as e:  # noqa: BLE001 - connection refused, DNS... (gevent raises several types)
            raise RemoteError(f"cannot reach {server} ({type(e).__name__}: {e})") from e
        if not live:
            raise RemoteError(f"{server} is not live (/v2/health/live)")
        if model_name is None:
            names = _list_models(url, ssl, client, headers)
            if not names:
                raise RemoteError(f"{server} serves no model")
            model_name = names[0]
        try:
            metadata = client.get_model_metadata(model_name, version, headers=headers)
        except InferenceServerException as e:
            raise RemoteError(f"{server}: model {model_name!r}: {e.message()}") from e
        deadline = time.monotonic() + 60.0
        while not client.is_model_ready(model_name, version, headers=headers):
            if time.monotonic() > deadline:
                raise RemoteError(f"{server}: model {model_name!r} is not ready")
            time.sleep(0.5)
    finally:
        client.close()
    inputs = [t for t in metadata.get("inputs", []) if t.get("datatype") == "BYTES"]
    outputs = {t["name"]: t for t in metadata.get("outputs", []) if "name" in t}
    if not inputs:
        raise RemoteError(f"{server}: model {model_name!r} has no BYTES input")
    text_outputs = [n for n, t in outputs.items() if t.get("datatype") == "BYTES"]
    text_output = _pick(text_outputs, _TEXT_OUTPUTS) or (text_outputs[0] if text_outputs else None)
    if text_output is None:
        raise RemoteError(f"{server}: model {model_name!r} has no BYTES output")
    names = list(outputs)
    return ServerTarget(
        url=url,
        ssl=ssl,
        model=model_name,
        version=version,
        input_name=inputs[0]["name"],
        input_rank=2 if len(inputs[0].get("shape", [-1])) >= 2 else 1,
        text_output=text_output,
        score_output=_pick(names, _SCORE_OUTPUTS),
        input_tokens_output=_pick(names, _INPUT_TOKEN_OUTPUTS),
        output_tokens_output=_pick(names, _OUTPUT_TOKEN_OUTPUTS),
        headers=headers,
    )


class RemoteChunkWorker:
    """Translates chunks by sending length-sorted batches to the server (one instance per thread)."""

    def __init__(self, target: ServerTarget, max_batch_size: int, parameters: dict[str, Any] | None = None) -> None:
        """``parameters``: the decoding options sent with every request (``EngineConfig.parameters``: the OIP
        parameter names, e.g. ``beam_size``, ``temperature``, ``target_prefix``)."""
        self.target = target
        self.max_batch_size = max_batch_size
        self.parameters = dict(parameters or {})
        self._client = _client(target.url, target.ssl)

    def translate_chunk(self, chunk: list[Source], progress: Any, references: Any = None) -> list[Outcome]:
        if references is not None:  # batch.cli refuses --score-references with --server
            raise ValueError("reference scoring needs a local model package")
        sources = [s for s in chunk if isinstance(s, str)]  # a server gets text (Job.source_ids is local only)
        assert len(sources) == len(chunk), "token ids cannot go to a server"
        order = sorted(range(len(sources)), key=lambda i: (len(sources[i]), i))
        outcomes: list[Outcome | None] = [None] * len(sources)
        for start in range(0, len(order), self.max_batch_size):
            positions = order[start:start + self.max_batch_size]
            for i, outcome in zip(positions, self._translate([sources[i] for i in positions]), strict=True):
                outcomes[i] = outcome
            progress(len(positions))
        return outcomes  # type: ignore[return-value]

    def _translate(self, texts: list[str]) -> list[Outcome]:
        from tritonclient.utils import InferenceServerException

        try:
            return list(self._infer(texts))
        except InferenceServerException as e:
            if not _is_client_error(e):
                raise
            if len(texts) == 1:
                return [f"server refused the sentence: {e.message()}"]
        out: list[Outcome] = []
        for text in texts:
            try:
                out.extend(self._infer([text]))
            except InferenceServerException as e:
                if not _is_client_error(e):
                    raise
                out.append(f"server refused the sentence: {e.message()}")
        return out

    def _infer(self, texts: list[str]) -> list[Translated]:
        import numpy as np
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        t = self.target
        shape = [len(texts), 1] if t.input_rank == 2 else [len(texts)]
        data = np.array([s.encode("utf-8") for s in texts], dtype=object).reshape(shape)
        tensor = httpclient.InferInput(t.input_name, shape, "BYTES")
        tensor.set_data_from_numpy(data, binary_data=True)
        wanted = [n for n in (t.text_output, t.score_output, t.input_tokens_output, t.output_tokens_output) if n]
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in wanted]
        delay = 0.25
        for attempt in range(_MAX_RETRIES + 1):
            try:
                result = self._client.infer(t.model, [tensor], model_version=t.version, outputs=outputs,
                                            parameters=self.parameters or None, headers=t.headers)
                break
            except InferenceServerException as e:
                if str(e.status()) in _AUTH_STATUSES:
                    raise RemoteError(f"the server refused the request ({e.status()}: {e.message()}); "
                                      "pass --api-key or set $MTGATE_API_KEY") from e
                if str(e.status()) not in _RETRY_STATUSES or attempt == _MAX_RETRIES:
                    raise
                logger.info("server busy (%s); retrying in %.2fs", e.status(), delay)
                time.sleep(delay)
                delay = min(delay * 2, 8.0)
        texts_out = [_text(v) for v in result.as_numpy(t.text_output).reshape(-1)]
        scores = _column(result, t.score_output, float)
        in_tokens = _column(result, t.input_tokens_output, int)
        out_tokens = _column(result, t.output_tokens_output, int)
        if len(texts_out) != len(texts):
            raise RemoteError(f"server answered {len(texts_out)} translations for {len(texts)} sentences")
        return [Translated(texts_out[i], scores[i] if scores else None, in_tokens[i] if in_tokens else None,
                           out_tokens[i] if out_tokens else None) for i in range(len(texts))]

    def close(self) -> None:
        self._client.close()


def _is_client_error(e: Any) -> bool:
    """The server refused these sentences (4xx). Auth failures never get here: ``_infer`` stops the run on them."""
    status = str(e.status() or "")
    return status.startswith("4") and status not in _RETRY_STATUSES


def _text(value: Any) -> str:
    # Binary BYTES outputs come back as bytes, JSON ones as str.
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _column(result: Any, name: str | None, cast: Any) -> list[Any] | None:
    if name is None:
        return None
    array = result.as_numpy(name)
    if array is None:
        return None
    return [cast(v) for v in array.reshape(-1).tolist()]
