"""The page at ``/`` and the API docs at ``/docs`` in headless Chromium, against a real ``mtgate serve`` of the tiny
package; ``/docs`` with every request off this machine blocked (it must not need a CDN)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serving.server.browser import browser_page
from tests.utils.marian_factory import corpus
from tests.utils.server import ServerProcess, start_server

SENTENCES = corpus("en")


@pytest.fixture(scope="module")
def server(tiny_package: Path) -> Iterator[ServerProcess]:
    proc = start_server(tiny_package)
    yield proc
    assert proc.stop() == 0, "".join(proc.log)


def test_docs_render_offline_and_list_every_operation(server: ServerProcess) -> None:
    spec = httpx.get(server.url + "/openapi.json").json()
    operations = {(method.upper(), path) for path, item in spec["paths"].items() for method in item}
    with browser_page(offline=True) as (page, blocked):
        page.goto(server.url + "/docs")
        page.wait_for_selector(".opblock-summary", timeout=30_000)
        shown = page.eval_on_selector_all(
            ".opblock-summary",
            "nodes => nodes.map(n => [n.querySelector('.opblock-summary-method').textContent,"
            " n.querySelector('.opblock-summary-path').getAttribute('data-path')])",
        )
        title = page.inner_text(".info .title")
    assert blocked == [], f"/docs reached off the machine: {blocked}"
    assert "mtgate" in title
    assert {(method, path) for method, path in shown} == operations
    assert ("POST", "/v1/translate") in operations and ("POST", "/v2/models/{name}/infer") in operations


def _translate_on_page(page: Any, url: str, text: str, stream: bool) -> str:
    page.goto(url + "/")
    page.wait_for_function("document.querySelectorAll('#model option').length > 0")
    page.fill("#source", text)
    page.set_checked("#stream", stream)
    page.click("#translate")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=30_000)
    return str(page.eval_on_selector("#output", "n => n.textContent"))


@pytest.mark.parametrize("stream", [True, False])
def test_blank_lines_keep_output_lines_in_line_with_input_lines(server: ServerProcess, stream: bool) -> None:
    first, second, third = SENTENCES[5:8]
    expected = [t["text"] for t in httpx.post(server.url + "/v1/translate", json={"text": [first, second, third]},
                                             timeout=30).json()["translations"]]
    source = f"{first}\n\n{second}\n   \n\n{third}"
    with browser_page() as (page, _):
        output = _translate_on_page(page, server.url, source, stream)
    assert output.split("\n") == [expected[0], "", expected[1], "", "", expected[2]]


@pytest.mark.parametrize("width", [1000, 420])
def test_model_details_stay_inside_their_column(server: ServerProcess, width: int) -> None:
    with browser_page(width=width) as (page, _):
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelectorAll('#details table.fields').length > 0")  # decoding defaults
        overflow = page.evaluate(
            """() => {
                const table = document.getElementById('details');
                const cells = [...table.querySelectorAll('td')].filter(td => td.scrollWidth > td.clientWidth + 1);
                return {cells: cells.map(td => td.textContent.slice(0, 40)),
                        table: Math.max(0, table.scrollWidth - table.parentElement.clientWidth),
                        page: Math.max(0, document.documentElement.scrollWidth - document.documentElement.clientWidth)};
            }"""
        )
        decoding = page.inner_text("#details")
    assert overflow == {"cells": [], "table": 0, "page": 0}, overflow
    assert "decoding" in decoding and "beam_size" in decoding


def test_beam_box_takes_its_cap_from_the_server(server: ServerProcess) -> None:
    cap = httpx.get(server.url + "/v1/models").json()["limits"]["max_beam_size"]
    with browser_page() as (page, _):
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        assert page.get_attribute("#beam", "max") == str(cap)
        page.fill("#beam", str(cap + 1))
        page.click("#translate")
        assert page.inner_text("#status") == f"beam must be from 1 to {cap} (the server's max_beam_size)"
        assert page.inner_text("#output") == ""
