"""Headless Chromium for tests: Debian's ``chromium`` and ``chromedriver``, never a downloaded browser.

The flags are the ones a closed network needs: without the background-networking ones Chromium keeps
trying Google's hosts and its connections are refused; ``--no-sandbox`` because tests run as root.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HEADLESS_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium_driver(folder: Path, *, window: tuple[int, int] = (1280, 1000)) -> WebDriver:
    """A Selenium session in a fresh profile under ``folder`` (the driver's log beside it). The driver and
    the browser are given by path, so Selenium Manager never looks for (or downloads) either."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*HEADLESS_FLAGS, f"--window-size={window[0]},{window[1]}", f"--user-data-dir={folder / 'profile'}"]:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER, log_output=str(folder / "driver.log")))
