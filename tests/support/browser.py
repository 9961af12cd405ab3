"""Debian's Chromium for the browser test modules that share one browser across their tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def module_chromium() -> Iterator[Any]:
    """One Chromium for a module. Playwright's sync API keeps an event loop running in this
    thread, so the per-test database flush needs DJANGO_ALLOW_ASYNC_UNSAFE (tests only; the
    live server's environment drops it): set while the browser runs, restored after."""
    from playwright.sync_api import sync_playwright

    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            # A document whose CSP header a test adds (enforce_csp) counts as coming from outside
            # this machine, and Chromium would then refuse its websocket to 127.0.0.1.
            args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=args)
            yield browser
            browser.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before
