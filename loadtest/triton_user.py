"""The Locust user that speaks the Open Inference Protocol through ``tritonclient.http`` (``TritonUser``): the same
suite measures a Triton deployment. ``loadtest/locustfile.py`` imports it, so Locust finds it there by name."""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import urlsplit

import numpy as np
from locust import User, task
from locust.env import Environment
from locust.exception import StopUser

from loadtest.pacing import Pacer
from loadtest.responses import WrongAnswer
from loadtest.suite_state import next_wait, state_of


class TritonUser(User):
    """``infer`` through ``tritonclient.http``: one sentence per request, BYTES in, BYTES out.

    Input and output names come from the model metadata, so a Triton deployment of the same model works unchanged.
    """

    token_outputs = ("INPUT_TOKENS", "OUTPUT_TOKENS")  # requested too when the model has them (mtgate does)

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        import tritonclient.http as httpclient  # gevent-based, safe inside Locust

        self._httpclient = httpclient
        parts = urlsplit(self.host or "")
        if not parts.hostname:
            raise ValueError(f"TritonUser needs --host http://HOST:PORT (got {self.host!r})")
        # tritonclient wants host:port[/path] without a scheme; one client per user (it is not thread-safe).
        url = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}{parts.path.rstrip('/')}"
        self.client = httpclient.InferenceServerClient(url, ssl=parts.scheme == "https", network_timeout=120.0)
        self.model = ""
        self.input_name = ""
        self.output_name = ""
        self.counted: list[str] = []
        self.pacer = Pacer(state_of(environment).rng)

    def wait_time(self) -> float:
        return next_wait(self.environment, self.pacer)

    def on_start(self) -> None:
        state = state_of(self.environment)
        start_time, start = time.time(), time.perf_counter()
        try:
            self.model = state.model_name or self._first_model()
            meta = self.client.get_model_metadata(self.model, headers=state.headers)
            self.input_name = next(i["name"] for i in meta["inputs"] if i["datatype"] == "BYTES")
            self.output_name = next(o["name"] for o in meta["outputs"] if o["datatype"] == "BYTES")
            self.counted = [o["name"] for o in meta["outputs"] if o["name"] in self.token_outputs]
        except Exception as e:  # counted as a failed request; this user cannot run without the metadata
            self.environment.events.request.fire(
                request_type="V2", name="/v2/models/{model} (metadata)",
                response_time=(time.perf_counter() - start) * 1000, response_length=0,
                exception=e if not isinstance(e, StopIteration) else WrongAnswer("model has no BYTES input/output"),
                context={}, start_time=start_time)
            raise StopUser() from e
        if state.arrival_rate > 0:
            # The first request's random delay (Pacer); a stopping test ends it at once. Locust's wait is untyped.
            self.wait()  # type: ignore[no-untyped-call]

    def on_stop(self) -> None:
        self.client.close()

    def _first_model(self) -> str:
        headers = state_of(self.environment).headers
        try:  # Triton: the model repository extension
            index = self.client.get_model_repository_index(headers=headers)
            names = [str(m["name"]) for m in index if m.get("state", "READY") == "READY"]
        except self._httpclient.InferenceServerException:  # mtgate: its /v1 model list
            request = urllib.request.Request(f"{(self.host or '').rstrip('/')}/v1/models", headers=headers)
            with urllib.request.urlopen(request, timeout=30) as resp:
                models = json.loads(resp.read())["models"]
            names = [str(m["name"]) for m in sorted(models, key=lambda m: not m.get("default"))]
        if not names:
            raise WrongAnswer("the server reports no ready model; pass --model-name")
        return names[0]

    @task
    def infer(self) -> None:
        state = state_of(self.environment)
        [sentence] = state.sample(1)
        name = f"/v2/models/{self.model}/infer"
        start_time, start = time.time(), time.perf_counter()
        exception: Exception | None = None
        length = 0
        try:
            inp = self._httpclient.InferInput(self.input_name, [1, 1], "BYTES")
            inp.set_data_from_numpy(np.array([[sentence.encode("utf-8")]], dtype=object))
            outputs = [self._httpclient.InferRequestedOutput(n) for n in (self.output_name, *self.counted)]
            result = self.client.infer(self.model, [inp], outputs=outputs, headers=state.headers,
                                       parameters=state.decoding() or None)
            texts = result.as_numpy(self.output_name)
            length = sum(int(o.get("parameters", {}).get("binary_data_size", 0))
                         for o in result.get_response().get("outputs", []))
            if texts is None or texts.size != 1:
                raise WrongAnswer(f"expected 1 output, got {None if texts is None else texts.size}")
            value = texts.reshape(-1)[0]
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            if not text.strip():
                raise WrongAnswer("translation 0 is empty")
            counts = {name.lower(): int(result.as_numpy(name).reshape(-1)[0]) for name in self.counted}
            state.count([{"text": text, **counts}])
        except Exception as e:  # every client error is a failed request, as Locust's own clients count them
            exception = e
        self.environment.events.request.fire(
            request_type="V2", name=name, response_time=(time.perf_counter() - start) * 1000,
            response_length=length, exception=exception, context={}, start_time=start_time)
