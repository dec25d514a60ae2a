"""JSON Schema's types for pydantic fields (strict where lax pydantic would take what the document refuses), the
"has a non-space character" pattern, and scores as JSON carries them."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator

# A character Python's str.strip() keeps (the service refuses a text with none: "is empty"). JSON Schema's \S is
# ECMA-262's, which differs (it counts U+FEFF as space and U+001C..U+001F, U+0085 as text), so the class is
# spelled out; tests/serving/server/test_api_fuzz.py checks it against str.isspace over every code point.
NOT_SPACE = "[^\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


def _json_integer(value: Any) -> Any:
    """What JSON Schema calls an integer: 4 and 4.0, not true or "4" (which lax pydantic would take as 1 and 4)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]


def _json_number(value: Any) -> Any:
    """What JSON Schema calls a number: 4 and 0.5, not true or "0.5" (which lax pydantic would take)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


JsonNumber = Annotated[float, BeforeValidator(_json_number)]

def json_boolean(value: Any) -> Any:
    """What JSON Schema calls a boolean: true and false, not 0, 1 or "true" (which lax pydantic would take)."""
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


JsonBool = Annotated[bool, BeforeValidator(json_boolean)]



def finite_score(score: float | None) -> float | None:
    """A score JSON can carry (NaN and infinities become None)."""
    return score if score is not None and math.isfinite(score) else None
