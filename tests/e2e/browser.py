"""A real Chromium for the dashboard tests: Debian's /usr/bin/chromium driven by Playwright.

Playwright's own browser downloads are never used. Without Chromium the tests skip, unless
TASKHUB_REQUIRE_BROWSER=1 (CI) makes that a failure. Each page records its console errors
and uncaught exceptions, so a Content-Security-Policy violation or a script error fails the
test that caused it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def require_chromium() -> None:
    """Skip (or fail, when CI requires the browser) if Chromium or Playwright is missing."""
    problem = None
    if not CHROMIUM.is_file():
        problem = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.async_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is not installed"
    if problem is None:
        return
    if os.environ.get("TASKHUB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"TASKHUB_REQUIRE_BROWSER=1 but {problem}")
    pytest.skip(problem)


def screenshot_dir(tmp_path: Path) -> Path:
    """TASKHUB_SCREENSHOTS names where screenshots go (docs/img for the README)."""
    directory = Path(os.environ.get("TASKHUB_SCREENSHOTS") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class PageErrors:
    """Console errors and uncaught exceptions of one page, for a final assertion."""

    def __init__(self, page: Any) -> None:
        self.messages: list[str] = []
        self.armed = True
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self._add(f"uncaught: {exc}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            url = (message.location or {}).get("url", "")
            self._add(f"console: {message.text} ({url})")

    def _add(self, text: str) -> None:
        if self.armed:
            self.messages.append(text)

    def stop(self) -> list[str]:
        """Stop recording (a stopped hub makes the browser log refused connections)."""
        self.armed = False
        return self.messages


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """A headless Chromium browser, closed afterwards."""
    from playwright.async_api import async_playwright

    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=args
        )
        try:
            yield browser
        finally:
            await browser.close()
