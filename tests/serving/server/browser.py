"""Headless Chromium (Debian's /usr/bin/chromium driven by playwright) for the page and /docs tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = "/usr/bin/chromium"
_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@contextmanager
def browser_page(*, offline: bool = False, width: int = 1000) -> Iterator[tuple[Any, list[str]]]:
    """A fresh page and the list of URLs it tried to reach off this machine. With ``offline`` every request that
    is not to a loopback address is aborted (and listed), as on a machine without a network."""
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not installed")
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []

    def route(handle: Any) -> None:
        host = urlsplit(handle.request.url).hostname or ""
        if host in ("127.0.0.1", "localhost", "::1") or handle.request.url.startswith(("data:", "blob:")):
            handle.continue_()
        else:
            blocked.append(handle.request.url)
            handle.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": 900})
            if offline:
                context.route("**/*", route)
            yield context.new_page(), blocked
        finally:
            browser.close()
