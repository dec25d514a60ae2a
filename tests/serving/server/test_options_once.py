"""A request's options are parsed and checked once, where it arrives, into one ``DecodeOptions`` that travels as it
is (the search options derive from it unchecked), and every route admits through one helper
(``RequestLimits.admission``: options, deadline, tag, target prefix)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serving.engine import options as options_module
from serving.engine.errors import InvalidInput
from serving.engine.options import DecodeOptions
from serving.server.limits import Admission, RequestLimits
from serving.server.settings import ServingSettings


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every run of the one options check, with the values it checked."""
    calls: list[dict[str, Any]] = []
    check = options_module.check_options

    def counted(values: Any, label: Any = "{}") -> None:
        calls.append(dict(values))
        check(values, label)

    monkeypatch.setattr(options_module, "check_options", counted)
    yield calls


def test_each_route_checks_a_requests_options_once(serve: Callable[..., Any], checks: list[dict[str, Any]]) -> None:
    with serve() as client:
        checks.clear()  # the warm-up's
        r = client.post("/v1/translate", json={"text": ["a b", "c"], "beam_size": 2, "max_length": 5})
        assert r.status_code == 200, r.text
        assert len(checks) == 1 and checks[0]["beam_size"] == 2
        checks.clear()
        with client.stream("POST", "/v1/translate/stream", json={"text": "a b", "min_length": 1}) as r:
            assert r.status_code == 200 and "event: final" in r.read().decode()
        assert len(checks) == 1 and checks[0]["min_length"] == 1
        checks.clear()
        r = client.post("/v1/translate/bulk?beam_size=3", content=b'"a b"\n"c d"\n"e"\n')
        assert r.status_code == 200 and r.text.count("\n") == 3
        assert len(checks) == 1 and checks[0]["beam_size"] == 3  # once for the request, not per line
        checks.clear()
        body = {"inputs": [{"name": "INPUT_TEXT", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b c"]}],
                "parameters": {"beam_size": 2, "truncate": True}}
        r = client.post("/v2/models/echo/infer", json=body)
        assert r.status_code == 200, r.text
        assert len(checks) == 1 and checks[0]["truncate"] is True
        checks.clear()
        r = client.post("/v1/translate", json={"text": "a", "top_k": 5, "beam_size": 2})
        assert r.status_code == 400 and "beam_size must be 1" in r.json()["error"]["message"]
        assert len(checks) == 1


def test_options_are_checked_when_made_and_never_again(checks: list[dict[str, Any]]) -> None:
    options = DecodeOptions.from_parameters({"beam_size": 4.0, "truncate": True, "other": 1}, "parameter {!r}")
    assert options == DecodeOptions(beam_size=4, truncate=True) and len(checks) == 2  # made twice: checked twice
    checks.clear()
    from serving.package import DecodingDefaults

    options.resolve(DecodingDefaults(), eos_id=0, decoder_start_id=0, unk_id=None)
    assert checks == []
    with pytest.raises(InvalidInput, match="parameter 'beam_size' must be a positive integer, got 0"):
        DecodeOptions.from_parameters({"beam_size": 0}, "parameter {!r}")
    with pytest.raises(InvalidInput, match="--top-p must be a number above 0 and at most 1"):
        DecodeOptions.from_parameters({"top_p": 2.0}, lambda name: "--" + name.replace("_", "-"))


def test_one_admission_helper() -> None:
    limits = RequestLimits(ServingSettings(model_dirs=["unused"], request_timeout_s=30, max_beam_size=8))
    admission = limits.admission({"beam_size": 2, "unrelated": "x"}, 100.0, 5.0, tag="req-1", target_prefix=("Ein",))
    assert admission == Admission(DecodeOptions(beam_size=2), 100.0, 5.0, "req-1", ["Ein"])
    assert admission.deadline == 105.0
    assert limits.admission({}, 100.0, 90.0).deadline == 130.0  # a client may only shorten the server's timeout
    assert limits.admission({}, 100.0).options == DecodeOptions()
    with pytest.raises(InvalidInput, match="timeout must be positive"):
        limits.admission({}, 100.0, 0.0)
    with pytest.raises(InvalidInput, match=r"beam_size must be an integer from 1 to 8 \(max_beam_size\)"):
        limits.admission({"beam_size": 9}, 100.0)
    with pytest.raises(InvalidInput, match="parameter 'top_k' must be a positive integer"):
        limits.admission({"top_k": -1}, 100.0, label="parameter {!r}")
