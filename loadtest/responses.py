"""What a load-test user checks in each response: one non-empty translation per input (a 200 with an empty text is a
failure), bulk NDJSON results for every line, Server-Sent Events parsed, and the error message of a refused request."""

from __future__ import annotations

import json
from typing import Any


class WrongAnswer(Exception):
    """The server answered, but not with one non-empty translation per input."""


def check_translations(body: Any, expected: int) -> list[dict[str, Any]]:
    """The ``translations`` of a /v1 response, or WrongAnswer unless there is one non-empty text per input."""
    translations = body.get("translations") if isinstance(body, dict) else None
    if not isinstance(translations, list):
        raise WrongAnswer("response has no 'translations' list")
    if len(translations) != expected:
        raise WrongAnswer(f"{len(translations)} translations for {expected} inputs")
    for i, t in enumerate(translations):
        if not isinstance(t, dict) or not isinstance(t.get("text"), str) or not t["text"].strip():
            raise WrongAnswer(f"translation {i} is empty")
    return translations


def check_model(body: Any, expected: str | None) -> None:
    """WrongAnswer when a response names the model that answered and it is not ``expected`` (None: any model)."""
    answered = body.get("model") if isinstance(body, dict) else None
    if expected is not None and answered is not None and answered != expected:
        raise WrongAnswer(f"answered by model {answered!r}, not {expected!r}")


def error_message(status: int, text: str) -> str:
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or text[:200]}"


def check_bulk_lines(lines: list[str], expected: int) -> list[dict[str, Any]]:
    """The results of a bulk response, in input order, or WrongAnswer unless every input has a non-empty text."""
    results: dict[int, dict[str, Any]] = {}
    for line in filter(None, (raw.strip() for raw in lines)):
        item = json.loads(line)
        if not isinstance(item, dict) or not isinstance(item.get("index"), int):
            raise WrongAnswer(f"bulk line without an index: {line[:200]}")
        if "error" in item:
            error = item["error"]
            raise WrongAnswer(f"line {item['index']}: {error.get('message') if isinstance(error, dict) else error}")
        results[item["index"]] = item
    if sorted(results) != list(range(expected)):
        raise WrongAnswer(f"{len(results)} results for {expected} lines")
    return check_translations({"translations": [results[i] for i in range(expected)]}, expected)


def parse_sse(lines: list[str]) -> list[tuple[str, str]]:
    """Complete Server-Sent Events in ``lines`` as (event, data) pairs; the event name defaults to ``message``."""
    out: list[tuple[str, str]] = []
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                out.append((event, "\n".join(data)))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return out
