"""The page at ``/`` (headless Chromium, a real ``mtgate serve`` of the tiny package): an error does not look like a
result or like the grey status line, and the model panel shows fields, not JSON."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving.server.browser import browser_page
from tests.utils.server import ServerProcess, start_server

RED = "rgb(176, 0, 32)"
COLOR = "(id) => getComputedStyle(document.getElementById(id)).color"


@pytest.fixture(scope="module")
def server(tiny_onnx_package: Path) -> Iterator[ServerProcess]:
    proc = start_server(tiny_onnx_package)
    yield proc
    assert proc.stop() == 0, "".join(proc.log)


def test_errors_are_red_and_results_are_not(server: ServerProcess) -> None:
    with browser_page() as (page, _):
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        page.set_checked("#stream", False)
        page.fill("#source", "A dog runs.")
        page.click("#translate")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=30_000)
        done = (page.evaluate(COLOR, "status"), page.evaluate(COLOR, "output"))
        page.fill("#source", " ".join(["word"] * 400))  # longer than the model's positions: 413
        page.click("#translate")
        page.wait_for_function("document.getElementById('status').textContent === 'failed'", timeout=30_000)
        failed = (page.evaluate(COLOR, "status"), page.evaluate(COLOR, "output"))
        message = page.inner_text("#output")
        page.fill("#beam", "99")  # refused on the page itself
        page.click("#translate")
        refused = page.evaluate(COLOR, "status")
    assert RED not in done and failed == (RED, RED) and refused == RED, (done, failed, refused)
    assert "truncate cuts it instead" in message and message.endswith("(413)")


def test_the_model_panel_shows_fields_not_json(server: ServerProcess) -> None:
    with browser_page() as (page, _):
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelectorAll('#details table.fields').length > 0")
        text = page.inner_text("#details")
        rows = page.eval_on_selector_all("#details table.fields tr", "rows => rows.map(r => r.innerText)")
    assert not any(c in text for c in '{}"'), text
    assert any(row.startswith("beam_size") for row in rows) and any(row.startswith("forced_eos") for row in rows)
