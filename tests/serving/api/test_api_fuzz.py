"""Schemathesis against the app's own OpenAPI document: no generated request may get a 5xx from a /v1 route.

Kept small (a few dozen examples per operation) so it runs in seconds; the fake engine sits behind a real uvicorn.
"""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from tests.fakes import EchoTranslator

EXAMPLES = 10

# The bulk route takes NDJSON: send generated strings as they are.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")


def test_v1_routes_never_answer_5xx(live: Any) -> None:
    with live(EchoTranslator(max_input_tokens=16), request_timeout_s=5) as url:
        spec = httpx.get(url + "/openapi.json").json()
        schema = schemathesis.openapi.from_dict(spec).include(path_regex="^/v1/")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.path for op in operations} >= {"/v1/translate", "/v1/translate/stream", "/v1/translate/bulk"}
        seen: dict[str, set[int]] = {}
        with httpx.Client(base_url=url, timeout=10) as client:
            for operation in operations:

                @given(case=operation.as_strategy())
                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                def check(case: Any) -> None:
                    response = case.call(base_url=url, timeout=10)
                    seen.setdefault(case.operation.path, set()).add(response.status_code)
                    assert response.status_code < 500, (
                        f"{case.method} {case.path}: {response.status_code} {response.text}"
                    )
                    if response.status_code >= 400:
                        error = response.json()["error"]
                        assert set(error) == {"code", "message"}, response.text

                check()
            assert client.post("/v1/translate", json={"text": "still serving"}).status_code == 200
    assert any(code == 200 for code in seen["/v1/translate"])
