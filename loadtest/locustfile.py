"""Locust users for an mtgate server (or any server that speaks the same HTTP API or the Open Inference Protocol).

Users (pick with Locust's positional class names; weights with ``--config-users``):

- ``TranslateUser``: ``POST /v1/translate`` with one sentence.
- ``BatchUser``: ``POST /v1/translate`` with a list of ``--bulk-size`` sentences.
- ``BulkUser``: ``POST /v1/translate/bulk`` with ``--bulk-size`` NDJSON lines (results stream back as NDJSON).
- ``StreamUser``: ``POST /v1/translate/stream`` (Server-Sent Events); two entries per request: type ``TTFE`` is the
  time to the first event, type ``POST`` the time to the end of the stream. Only the ``POST`` entry counts in
  Locust's ``Aggregated`` row (requests, failures, rates).
- ``MixedStreamUser``: as ``StreamUser``, but with probability ``--long-fraction`` (0.25) the text is a paragraph of
  ``--paragraph`` (4-8) consecutive corpus sentences joined with spaces, sent as one text; its entries are named
  ``/v1/translate/stream (long)`` (sent with ``truncate``: a paragraph over the model's positions is cut, not
  refused), the single sentences' ``/v1/translate/stream (short)``.
- ``TritonUser``: ``infer`` through ``tritonclient.http`` (Open Inference Protocol, BYTES input), so the same suite
  measures a Triton deployment; it fires Locust request events itself.

Every request names ``--model-name`` when given (the body's ``model``, bulk's ``?model=``, the Open Inference
Protocol's model), and a /v1 answer from another model is a failure; without it each request goes to the server's
default model (the TritonUser: the first model the server reports).

Sentences are drawn uniformly from ``--corpus`` (default: the bundled Multi30k test set), so requests follow the
corpus's real length distribution. Each user sends its next request when the last one is answered (``--think-time``
adds a pause), or, with ``--arrival-rate R``, paces its requests so that all users together send R per second
whatever the latency (an open-loop approximation: it holds while every user's interval, users / R seconds, is longer
than a request takes; one Locust process, not --master/--worker runs). Every response is checked: one non-empty
translation per input, otherwise the request counts as a failure. ``--tokens-file`` receives the translated-token
counts (the stats CSVs have none).

Run by hand::

    locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 20s --host http://127.0.0.1:8000 TranslateUser
    locust -f loadtest/locustfile.py --headless -u 40 -r 40 -t 30s --host http://127.0.0.1:8000 \
        --arrival-rate 10 TranslateUser
"""

from __future__ import annotations

import csv
import json
import logging
import math
import random
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import gevent
from locust import FastHttpUser, events, task
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from loadtest.corpus import CorpusError, default_corpus, paragraph_range, read_lines
from loadtest.pacing import Pacer
from loadtest.responses import (
    WrongAnswer,
    check_bulk_lines,
    check_model,
    check_translations,
    error_message,
    parse_sse,
)
from loadtest.stats import HISTOGRAM_FIELDS, HISTOGRAMS, TTFE
from loadtest.suite_state import SuiteState, next_wait, state_of
from loadtest.triton_user import TritonUser  # noqa: F401  (Locust finds the user classes in this module by name)
from serving.package.files import atomic_write_text, atomic_writer

logger = logging.getLogger(__name__)

TOKENS_SAMPLE_S = 1.0


def _add_options(parser: LocustArgumentParser) -> None:
    group = parser.add_argument_group("mtgate")
    group.add_argument("--wait-for-start", default="", metavar="FILE",
                       help="once loaded, create FILE and wait for a line on stdin, 'start [MODEL]', before starting "
                            "any user (MODEL: as --model-name; the end of stdin: exit): mtgate loadtest starts every "
                            "scenario's Locust ahead of its turn")
    group.add_argument("--corpus", default="", env_var="MTGATE_CORPUS",
                       help="sentence file, text or .gz, one per line (default: the bundled Multi30k test set)")
    group.add_argument("--bulk-size", type=int, default=16, env_var="MTGATE_BULK_SIZE",
                       help="sentences per BulkUser request (default: 16)")
    group.add_argument("--max-length", type=int, default=0, env_var="MTGATE_MAX_LENGTH",
                       help="max_length sent with every request (default: the server's)")
    group.add_argument("--beam-size", type=int, default=0, env_var="MTGATE_BEAM_SIZE",
                       help="beam_size sent with every request (default: the server's)")
    group.add_argument("--model-name", default="", env_var="MTGATE_MODEL_NAME",
                       help="the model every request names (default: the server's default model; for the "
                            "TritonUser the first model the server reports)")
    group.add_argument("--think-time", type=float, default=0.0, env_var="MTGATE_THINK_TIME",
                       help="seconds each user waits between requests (default: 0, back to back)")
    group.add_argument("--arrival-rate", type=float, default=0.0, env_var="MTGATE_ARRIVAL_RATE",
                       help="requests per second of all users together; each user sends one every users / rate "
                            "seconds, whatever the latency (default: 0, off; not with --think-time)")
    group.add_argument("--tokens-file", default="", env_var="MTGATE_TOKENS_FILE",
                       help="write translated-token counts and their history to this JSON file")
    group.add_argument("--seed", type=int, default=0, env_var="MTGATE_SEED",
                       help="seed for drawing sentences (default: 0)")
    group.add_argument("--long-fraction", type=float, default=0.25, env_var="MTGATE_LONG_FRACTION",
                       help="MixedStreamUser: fraction of requests that are paragraphs (default: 0.25)")
    group.add_argument("--paragraph", default="4-8", env_var="MTGATE_PARAGRAPH", metavar="MIN-MAX",
                       help="MixedStreamUser: consecutive sentences per paragraph (default: 4-8)")
    group.add_argument("--api-key", default="", env_var="MTGATE_LOADTEST_API_KEY",
                       help="bearer token for servers that require one")


def _init(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:  # used as a library without a command line
        return
    try:
        sentences = read_lines(Path(options.corpus) if options.corpus else default_corpus())
    except CorpusError as e:
        sys.stderr.write(f"locustfile: {e}\n")
        sys.exit(2)
    if not math.isfinite(options.arrival_rate) or options.arrival_rate < 0:
        sys.stderr.write(f"locustfile: --arrival-rate must be 0 (off) or a positive number, "
                         f"not {options.arrival_rate}\n")
        sys.exit(2)
    try:
        paragraph = paragraph_range(options.paragraph)
    except ValueError as e:
        sys.stderr.write(f"locustfile: --paragraph: {e}\n")
        sys.exit(2)
    if not 0 <= options.long_fraction <= 1 or len(sentences) < paragraph[1]:
        sys.stderr.write("locustfile: --long-fraction must be between 0 and 1, and the corpus hold a paragraph\n")
        sys.exit(2)
    if options.arrival_rate > 0 and options.think_time > 0:
        sys.stderr.write("locustfile: give --arrival-rate or --think-time, not both\n")
        sys.exit(2)
    environment.mtgate_state = SuiteState(  # type: ignore[attr-defined]
        sentences=sentences,
        rng=random.Random(options.seed),
        bulk_size=max(1, options.bulk_size),
        max_length=options.max_length or None,
        beam_size=options.beam_size or None,
        model_name=options.model_name or None,
        think_time_s=max(0.0, options.think_time),
        arrival_rate=options.arrival_rate,
        tokens_file=Path(options.tokens_file) if options.tokens_file else None,
        headers={"Authorization": f"Bearer {options.api_key}"} if options.api_key else {},
        long_fraction=options.long_fraction,
        paragraph=paragraph,
    )
    if options.wait_for_start and (model := _wait_for_start(Path(options.wait_for_start))):
        state_of(environment).model_name = model
    # gevent caches its loop clock; the imports, corpus loading and gate above ran without the loop, so the clock is
    # stale by that long and Locust's --run-time timer (gevent.spawn_later) would fire that much too early.
    gevent.get_hub().loop.update_now()


def _wait_for_start(loaded: Path) -> str | None:
    """Say that this Locust is loaded, then block (the whole process: nothing has started yet) until the runner's
    line on stdin, ``start [MODEL]``; return MODEL. The end of stdin without that line means the run is off."""
    loaded.touch()
    words = sys.stdin.readline().split()
    if words[:1] != ["start"]:
        sys.exit(0)
    return words[1] if len(words) > 1 else None


def _sample_tokens(state: SuiteState) -> None:
    while True:
        state.history.append((time.time(), state.output_tokens))
        gevent.sleep(TOKENS_SAMPLE_S)


def _on_test_start(environment: Environment, **_: Any) -> None:
    state = state_of(environment)
    state.started = time.time()
    state.sampler = gevent.spawn(_sample_tokens, state)


def _on_test_stop(environment: Environment, **_: Any) -> None:
    state = state_of(environment)
    if state.sampler is not None:
        state.sampler.kill(block=False)
    state.stopped = time.time()
    state.history.append((state.stopped, state.output_tokens))
    if state.tokens_file is not None:
        state.tokens_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(state.tokens_file, json.dumps({
            "started": state.started,
            "stopped": state.stopped,
            "translated": state.translated,
            "input_tokens": state.input_tokens,
            "output_tokens": state.output_tokens,
            "history": state.history,
        }))


def _on_quitting(environment: Environment, **_: Any) -> None:
    """Rewrite ``--csv``'s summary files with the final stats, and write each entry's response-time histogram beside
    them (``PREFIX_response_times.json``, :data:`loadtest.stats.HISTOGRAMS`).

    Locust rewrites them once a second while running and not at exit, so they miss the requests of the last second
    (all of them in a 1-second run). The files are replaced (new inode), so Locust's own still-open handles write
    to the old files, not over these. The histograms are Locust's own (``StatsEntry.response_times``, the fields of
    its ``serialize()`` that percentiles need): runs against replicas side by side merge into exact percentiles.
    """
    prefix = environment.parsed_options.csv_prefix if environment.parsed_options is not None else None
    if not prefix:
        return
    writer = StatsCSV(environment, PERCENTILES_TO_REPORT)
    for suffix, write in (("_stats.csv", writer.requests_csv), ("_failures.csv", writer.failures_csv)):
        with atomic_writer(Path(prefix + suffix), newline="") as f:
            write(csv.writer(f))
    entries = [*environment.stats.entries.values(), environment.stats.total]
    atomic_write_text(Path(prefix + HISTOGRAMS), json.dumps([{key: getattr(entry, key) for key in HISTOGRAM_FIELDS}
                                                              for entry in entries]))


for _hook, _listener in ((events.init_command_line_parser, _add_options), (events.init, _init),
                         (events.test_start, _on_test_start), (events.test_stop, _on_test_stop),
                         (events.quitting, _on_quitting)):
    _hook.add_listener(_listener)  # type: ignore[no-untyped-call]  # Locust's EventHook is untyped


class _RestUser(FastHttpUser):
    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.pacer = Pacer(state_of(environment).rng)

    def on_start(self) -> None:
        if state_of(self.environment).arrival_rate > 0:
            # The first request's random delay (Pacer); a stopping test ends it at once. Locust's wait is untyped.
            self.wait()  # type: ignore[no-untyped-call]

    def wait_time(self) -> float:
        return next_wait(self.environment, self.pacer)

    def _payload(self, text: str | list[str]) -> dict[str, Any]:
        state = state_of(self.environment)
        return {"text": text, **state.target(), **state.decoding()}

    def _translate(self, texts: list[str], name: str) -> None:
        state = state_of(self.environment)
        text: str | list[str] = texts[0] if name == "/v1/translate" else texts
        with self.client.post("/v1/translate", json=self._payload(text), name=name, headers=state.headers,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(error_message(resp.status_code or 0, resp.text or ""))
                return
            try:
                body = resp.json()
                check_model(body, state.model_name)
                state.count(check_translations(body, len(texts)))
            except (WrongAnswer, ValueError) as e:
                resp.failure(f"wrong answer: {e}")


class TranslateUser(_RestUser):
    """One sentence per ``POST /v1/translate``."""

    @task
    def translate(self) -> None:
        self._translate(state_of(self.environment).sample(1), "/v1/translate")


class BatchUser(_RestUser):
    """``--bulk-size`` sentences as one JSON list per ``POST /v1/translate``."""

    @task
    def translate_batch(self) -> None:
        state = state_of(self.environment)
        self._translate(state.sample(state.bulk_size), "/v1/translate (batch)")


class BulkUser(_RestUser):
    """``--bulk-size`` sentences per ``POST /v1/translate/bulk`` (NDJSON in, NDJSON out in completion order)."""

    @task
    def translate_bulk(self) -> None:
        state = state_of(self.environment)
        texts = state.sample(state.bulk_size)
        body = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts))
        query = urlencode({**state.target(), **state.decoding()})
        path = "/v1/translate/bulk" + (f"?{query}" if query else "")
        headers = {**state.headers, "Content-Type": "application/x-ndjson"}
        with self.client.post(path, data=body, name="/v1/translate/bulk", headers=headers,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(error_message(resp.status_code or 0, resp.text or ""))
                return
            try:
                state.count(check_bulk_lines((resp.text or "").splitlines(), len(texts)))
            except (WrongAnswer, ValueError) as e:
                resp.failure(f"wrong answer: {e}")


class _StreamingUser(_RestUser):
    abstract = True

    def _stream(self, sentence: str, name: str, truncate: bool = False) -> None:
        """One text over the stream, logged as ``name``: time to the first event (type TTFE) and to the end
        (``truncate``: a text over the model's positions is cut to them, not refused)."""
        state = state_of(self.environment)
        start = time.perf_counter()
        # identity: the raw reads below must not see a compressed body
        headers = {**state.headers, "Accept": "text/event-stream", "Accept-Encoding": "identity"}
        payload = {**self._payload(sentence), **({"truncate": True} if truncate else {})}
        with self.client.post("/v1/translate/stream", json=payload, name=name, stream=True, headers=headers,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(error_message(resp.status_code or 0, resp.text or ""))
                return
            try:
                # Byte by byte until the first event is complete (a server may send it in several writes), then
                # the rest in large reads: geventhttpclient's read(n) waits for n bytes.
                head = bytearray()
                for byte in resp.iter_content(chunk_size=1, decode_content=False):
                    head += byte
                    if (head.endswith(b"\n\n") or head.endswith(b"\r\n\r\n")) and b"data:" in head:
                        break
                if head:
                    # Logged in its own entry only, not through the request event: the Aggregated row (and every
                    # request count) then holds real requests, not one extra per stream.
                    self.environment.stats.get(name, TTFE).log(round((time.perf_counter() - start) * 1000),
                                                               len(head))
                body = bytes(head) + b"".join(resp.iter_content(chunk_size=1 << 16, decode_content=False))
                size = len(body)
                lines = body.decode("utf-8").replace("\r\n", "\n").split("\n")
                resp.request_meta["response_time"] = (time.perf_counter() - start) * 1000
                resp.request_meta["response_length"] = size
                state.count(self._check_stream(parse_sse([*lines, ""]), state.model_name))
            except (WrongAnswer, ValueError, OSError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                resp.request_meta["response_time"] = (time.perf_counter() - start) * 1000
                resp.failure(f"wrong answer: {e}")

    @staticmethod
    def _check_stream(sse: list[tuple[str, str]], model: str | None) -> list[dict[str, Any]]:
        if not sse:
            raise WrongAnswer("stream ended without an event")
        for event, data in sse:
            if event == "error":
                raise WrongAnswer(f"error event: {data[:200]}")
        # The last event carries the finished translation (the server's "done" event).
        final = json.loads(sse[-1][1])
        if isinstance(final, dict) and "translations" in final:
            check_model(final, model)
            return check_translations(final, 1)
        return check_translations({"translations": [final]}, 1)


class StreamUser(_StreamingUser):
    """``POST /v1/translate/stream``: time to the first event and to the end of the stream, as two entries."""

    @task
    def translate_stream(self) -> None:
        [sentence] = state_of(self.environment).sample(1)
        self._stream(sentence, "/v1/translate/stream")


class MixedStreamUser(_StreamingUser):
    """``POST /v1/translate/stream`` with single sentences and, ``--long-fraction`` of the time, paragraphs as one
    text: each class in its own entries."""

    @task
    def translate_mixed(self) -> None:
        state = state_of(self.environment)
        if state.rng.random() < state.long_fraction:
            self._stream(state.sample_paragraph(), "/v1/translate/stream (long)", truncate=True)
        else:
            self._stream(state.sample(1)[0], "/v1/translate/stream (short)")
