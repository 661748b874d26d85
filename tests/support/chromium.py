"""A real headless Chromium for the tests of pages, through Selenium with the distribution's browser and driver.

`chromium` FAILS the test, never skips it, when the browser or its driver is missing:
a page test that did not run is not a page that works.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

CHROMIUM_HINT = "install Chromium and its driver from the distribution: apt-get install -y chromium chromium-driver"


def chromium() -> Any:
    """A headless Chromium (its console kept, for `browser_problems`); the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(f"Chromium or chromedriver is missing; {CHROMIUM_HINT}", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def browser_problems(driver: Any) -> list[dict[str, Any]]:
    """What the page's console said at level warning or worse since the last call."""
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


__all__ = ["CHROMIUM_HINT", "browser_problems", "chromium"]
