"""The chat page at / in a real browser: Debian's headless Chromium driven through chromedriver (selenium),
against a live server on 127.0.0.1. It sends messages, watches the reply stream in, the live statistics,
the block-by-block view of diffusion, Stop, and an error from the server shown in the conversation.

Skipped where no Chromium is installed (apt-get install chromium chromium-driver), unless
CLOVER_REQUIRE_BROWSER=1 (CI), where a missing browser fails. CLOVER_SCREENSHOT=PATH saves the page as
it looks after a reply (docs/chat-page.png is made that way).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REQUIRED = os.environ.get("CLOVER_REQUIRE_BROWSER") == "1"


def _need(what, ok):
    if not ok:
        if REQUIRED:
            pytest.fail(f"CLOVER_REQUIRE_BROWSER=1 but {what} is missing")
        pytest.skip(f"{what} is missing")


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def live():
    from test_server import SHIPPED, LiveServer, Settings

    s = LiveServer(Settings(SHIPPED, parallel=2, max_queue=4, threads=1, ctx_len=2048, alias="clover-small"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    _need("selenium", webdriver is not None)
    _need("chromium", CHROMIUM is not None)
    _need("chromedriver", DRIVER is not None)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,760",
              "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(a)
    # (a sanitizer runtime preloaded for the test process must not reach the browser)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    drv = webdriver.Chrome(service=Service(DRIVER, env=env), options=opts)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def _wait(drv, cond, timeout=120):
    return WebDriverWait(drv, timeout, poll_frequency=0.1).until(lambda d: cond(d))


def _assistant(drv):
    return drv.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def _send(drv, text):
    box = drv.find_element(By.ID, "input")
    box.clear()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def _set(drv, id_, value):
    el = drv.find_element(By.ID, id_)
    el.clear()
    el.send_keys(str(value))


def test_chat_page_streams_a_reply(live, browser):
    d = browser
    d.get(live.url + "/")
    _wait(d, lambda d: "clover-small" in d.find_element(By.ID, "model").text, 30)
    assert "diffusion" in d.find_element(By.ID, "model").text  # the shipped model decodes by blocks
    # record what the page shows while it streams: the live line and any masked block positions
    d.execute_script("""
        window.seen = {live: [], masks: 0};
        new MutationObserver(() => {
          window.seen.live.push(document.getElementById('live').textContent);
          window.seen.masks = Math.max(window.seen.masks, document.querySelectorAll('#block .mask').length);
        }).observe(document.body, {subtree: true, childList: true, characterData: true});
    """)
    _set(d, "max_tokens", 48)
    d.find_element(By.ID, "show_steps").click()
    _send(d, "def fibonacci(n):")
    _wait(d, lambda d: len(_assistant(d)) == 1 and "tokens per forward" in
          _assistant(d)[0].find_element(By.CLASS_NAME, "stats").text)
    msg = _assistant(d)[0]
    body = msg.find_element(By.CLASS_NAME, "body").text
    stats = msg.find_element(By.CLASS_NAME, "stats").text
    assert body.strip() and "tok/s" in stats and "first token" in stats
    assert 1 <= int(stats.split()[0]) <= 48
    seen = d.execute_script("return window.seen")
    assert any("tok/s" in s and "tokens per forward" in s for s in seen["live"]), seen["live"][-5:]
    assert seen["masks"] > 0  # the block view showed undecided positions
    assert d.find_element(By.ID, "block").text == ""  # and is cleared at the end
    assert d.find_element(By.ID, "send").is_displayed() and not d.find_element(By.ID, "stop").is_displayed()
    shot = os.environ.get("CLOVER_SCREENSHOT")
    if shot:
        d.save_screenshot(shot)
    # the same reply as the API gives for the same request (temperature 0)
    r = live.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "def fibonacci(n):"}],
                                              max_tokens=48, temperature=0)
    assert body.strip() == r.choices[0].message.content.strip()

    # a second turn carries the conversation; "New chat" clears it
    _send(d, "and in C?")
    _wait(d, lambda d: len(_assistant(d)) == 2 and "tokens per forward" in
          _assistant(d)[1].find_element(By.CLASS_NAME, "stats").text)
    assert len(d.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2
    # the second turn started from the first one's caches (prompt caching), and says how much it kept
    second = _assistant(d)[1].find_element(By.CLASS_NAME, "stats").text
    prompt_tokens, cached = (int(x) for x in re.search(r"prompt (\d+) tokens, (\d+) cached", second).groups())
    assert 0 < cached < prompt_tokens, second
    d.find_element(By.ID, "clear").click()
    assert not d.find_elements(By.CSS_SELECTOR, ".msg")


def test_chat_page_stop_and_errors(live, browser):
    d = browser
    d.get(live.url + "/")
    _wait(d, lambda d: "clover-small" in d.find_element(By.ID, "model").text, 30)
    _set(d, "max_tokens", 1500)  # longer than Stop takes
    _send(d, "Write a long story.")
    _wait(d, lambda d: d.find_element(By.ID, "stop").is_displayed(), 30)
    _wait(d, lambda d: _assistant(d) and _assistant(d)[0].find_element(By.CLASS_NAME, "body").text.strip(), 60)
    d.find_element(By.ID, "stop").click()
    _wait(d, lambda d: _assistant(d)[0].find_element(By.CLASS_NAME, "stats").text == "stopped", 30)
    deadline = time.monotonic() + 10
    while live.engine.active and time.monotonic() < deadline:  # the server stopped generating too
        time.sleep(0.05)
    assert live.engine.active == 0
    # the server's 400 shows in the conversation as its message
    _set(d, "max_tokens", 100000)
    _send(d, "hello")
    _wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.error"), 30)
    assert "context" in d.find_element(By.CSS_SELECTOR, ".msg.error .body").text
