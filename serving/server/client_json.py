"""JSON a client sent, parsed the same way wherever it arrives (an inference request's JSON, a /v2 route's body, a
repository load's ``config``): text that is not JSON, or JSON nested deeper than the parser recurses, is one
``InvalidInput`` naming what was sent (a 400), never an unhandled ``RecursionError`` (a 500)."""

from __future__ import annotations

import json
from typing import Any

from serving.engine.errors import InvalidInput


def parse_client_json(text: bytes | str, what: str) -> Any:
    """``text`` parsed; ``what`` names it in the error (``"the request body"``).

    Raises:
        InvalidInput: not valid JSON (UTF-8 included), or nested too deeply.
    """
    try:
        return json.loads(text)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInput(f"{what} is not valid JSON ({e})") from None
    except RecursionError:
        raise InvalidInput(f"{what} is JSON nested too deeply") from None
