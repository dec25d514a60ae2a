"""Schemathesis against the app's own OpenAPI document, with every check: responses must be what the document says
(statuses, content types, schemas, headers), schema-invalid requests refused and valid ones accepted.

The server is the real app on a real uvicorn in front of the real tiny Marian engine (its tokenizer refuses text
that is not valid Unicode); examples are bounded so that this runs in well under a minute. The exceptions to the
checks are in ``schemathesis.toml`` beside this file, each with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from serving.engine.translator import Translator
from tests.fakes import EchoTranslator

EXAMPLES = 10
CONFIG = Path(__file__).with_name("schemathesis.toml")

# The bulk route takes NDJSON: send generated strings as they are.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")


def _bounded(test: Any) -> Any:
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(test)


def test_every_route_answers_as_its_document_says(live: Any, tiny_package: Path) -> None:
    translator = Translator.load(tiny_package, threads=1)
    # Short outputs keep the generated beams and lengths quick on the tiny model.
    with live(translator, request_timeout_s=10, max_output_tokens=8, max_queue_delay_us=1000) as url:
        spec = httpx.get(url + "/openapi.json").json()
        schema = schemathesis.openapi.from_dict(spec, config=schemathesis.Config.from_path(CONFIG))
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == sum(len(item) for item in spec["paths"].values()) >= 14
        statuses: dict[str, set[int]] = {}
        for operation in operations:
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

                @given(case=operation.as_strategy(generation_mode=mode))
                @_bounded
                def check(case: Any) -> None:
                    response = case.call_and_validate(base_url=url, timeout=30)
                    statuses.setdefault(case.operation.label, set()).add(response.status_code)

                try:
                    check()
                except Unsatisfiable:  # nothing to get wrong: no parameters and no body (GET /v2/health/live)
                    assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
        # The documented example of the infer route, as tritonclient sends it, with every check: the happy path is
        # covered whatever the generated cases are (Hypothesis draws some values from the constants in the source
        # code, so they change with any change to the code).
        path = "/v2/models/{name}/infer"
        [infer] = [operation for operation in operations if operation.label == f"POST {path}"]
        example = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["example"]
        case = infer.Case(path_parameters={"name": translator.info.name}, body=example, media_type="application/json")
        statuses[infer.label].add(case.call_and_validate(base_url=url, timeout=30).status_code)
        assert httpx.post(url + "/v1/translate", json={"text": "still serving"}).status_code == 200
    assert 200 in statuses["POST /v1/translate"] and 200 in statuses["POST /v2/models/{name}/infer"]
    assert 200 in statuses["POST /v1/score"]
    assert {400, 422} & statuses["POST /v1/translate"]


def test_v1_routes_never_answer_5xx(live: Any) -> None:
    with live(EchoTranslator(max_input_tokens=16), request_timeout_s=5) as url:
        spec = httpx.get(url + "/openapi.json").json()
        schema = schemathesis.openapi.from_dict(spec).include(path_regex="^/v1/")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.path for op in operations} >= {"/v1/translate", "/v1/translate/stream", "/v1/translate/bulk",
                                                   "/v1/score"}
        seen: dict[str, set[int]] = {}
        with httpx.Client(base_url=url, timeout=10) as client:
            for operation in operations:

                @given(case=operation.as_strategy())
                @_bounded
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


def test_the_documented_not_space_pattern_is_python_s() -> None:
    """The schema's "has a non-space character" pattern agrees with str.strip(), which the service uses."""
    import re

    from serving.server.http.json_types import NOT_SPACE

    pattern = re.compile(NOT_SPACE)
    disagree = [hex(c) for c in range(0x110000) if (pattern.match(chr(c)) is None) != chr(c).isspace()]
    assert disagree == []


@pytest.mark.parametrize("path", ["/v1/translate", "/v1/translate/stream", "/v1/score", "/v2/models/{name}/infer"])
def test_documented_statuses_cover_what_the_routes_answer(client: Any, path: str) -> None:
    spec = client.get("/openapi.json").json()
    documented = {int(code) for code in spec["paths"][path]["post"]["responses"]}
    assert documented >= {200, 400, 401, 404, 408, 413, 503, 504}
