"""What a browser test of `tracemem ui` needs: the system's Chromium driven by Selenium, and the viewer
started as a real `tracemem ui` process. Shared by tests/test_ui_browser.py and docs/screenshot.py.

Nothing here downloads a browser: Selenium is given the Debian chromium and chromedriver paths
(`apt-get install chromium chromium-driver`), and Selenium Manager is told to stay offline.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

CHROMIUM = os.environ.get("TRACEMEM_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TRACEMEM_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1500,1000"]
TRACEMEM = str(Path(sys.executable).with_name("tracemem"))


def missing_browser() -> Optional[str]:
    """Why a browser test cannot run here (None when it can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.exists(path) and os.access(path, os.X_OK)):
            return f"no {path}: install it with `apt-get install {package}` (.ci/run does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]'"
    return None


@contextmanager
def chromium(width: int = 1500, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium under Selenium, with a throwaway profile, closed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never fetch a browser or driver
    profile = tempfile.mkdtemp(prefix="tracemem-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextmanager
def serve_ui(db: str, *extra: str, cwd: Optional[str] = None) -> Iterator[str]:
    """`tracemem ui --db DB --port 0` as a real process (in `cwd`); yields its URL (ends with '/')."""
    proc = subprocess.Popen([TRACEMEM, "ui", "--db", db, "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if not found:
            proc.kill()
            raise RuntimeError(f"tracemem ui did not start: {line}{proc.stderr.read()}")  # type: ignore[union-attr]
        yield found.group(0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
