"""The HTML report opened in Debian's chromium (headless, through playwright), with every console
error or warning, page error and failed request collected."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def opened(path: Path) -> Iterator[tuple[Any, list[str]]]:
    """The page of ``path`` loaded in a 1280 x 900 window, and the list its problems go to (the
    caller asserts it empty); skips the test where chromium is not installed."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium) at /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda message: problems.append(f"console {message.type}: {message.text}")
                    if message.type in ("error", "warning") else None)
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
            page.goto(path.as_uri(), wait_until="load")
            yield page, problems
        finally:
            browser.close()
