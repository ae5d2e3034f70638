"""The console on a busy day in a real browser (Debian's Chromium driven by Playwright) on a live
kefu (issue 31 item 4): 10,000 conversations waiting and one of 20,000 messages. The console opens
with the first page of the list and the counts, loads the next page on "Show more", opens the long
conversation at its newest messages and loads older ones when the agent scrolls to the top; no
frame it receives is over the 1 MiB limit and the socket stays up. Each step waits for what the
agent sees (a bounded wait, never a fixed sleep); how long it takes is measured in
bench/console_open.py, not here.

Persona: ``alice`` (an agent).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from console_seed import long_text, shopper_text
from test_console_browser import ARGS, create_agent, watch

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024
WAITING = 10_000
LONG = 20_000
PAGE = 50

pytestmark = pytest.mark.timeout(600)  # seeding 30,000 rows and starting Daphne on a loaded machine


@pytest.fixture
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        yield b
        b.close()


def seed(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            f"from tests.console_seed import seed\nseed(waiting={WAITING}, long_messages={LONG})\n",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_console_opens_with_ten_thousand_waiting_and_a_twenty_thousand_message_conversation(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    seeded = seed(kefu.env)
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []
    sizes: list[int] = []
    closes: list[str] = []

    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    watch(page, errors)
    page.on(
        "websocket",
        lambda ws: (
            ws.on(
                "framereceived",
                lambda payload: sizes.append(len(payload.encode() if isinstance(payload, str) else payload)),
            ),
            ws.on("close", lambda _ws: closes.append("closed")),
        ),
    )
    page.goto(kefu.base + "/console/")
    expect(page).to_have_url(re.compile(r"/console/login/"))
    page.fill("#id_username", "alice")
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(kefu.base + "/console/")

    # The first page of the waiting list, longest wait first, with the count of all of them.
    expect(page.locator("#conn")).to_have_text("Online", timeout=30_000)
    expect(page.locator("#count-waiting")).to_have_text(str(WAITING), timeout=30_000)
    waiting = page.locator("#list-waiting .queue__item")
    expect(waiting).to_have_count(PAGE)
    expect(waiting.first.locator(".queue__last")).to_contain_text(shopper_text(0))
    expect(waiting.first).to_have_attribute("data-id", seeded["first_waiting"])

    # Show more: the next page, after the first.
    page.click("#more-waiting")
    expect(waiting).to_have_count(2 * PAGE, timeout=30_000)
    expect(waiting.nth(PAGE).locator(".queue__last")).to_contain_text(shopper_text(PAGE))

    # The long conversation opens at its newest messages.
    page.locator(f"#list-bot .queue__item[data-id='{seeded['long']}'] button").click()
    log = page.locator("#log .msg")
    expect(page.locator("#log .msg__body").last).to_have_text(long_text(LONG), timeout=30_000)
    expect(log).to_have_count(PAGE)
    expect(log.first).to_have_attribute("data-seq", str(LONG - PAGE + 1))

    # Scrolled to the top: the page before it, above; the view stays on what the agent was reading.
    page.locator("#log").evaluate("(el) => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    expect(log).to_have_count(2 * PAGE, timeout=30_000)
    expect(log.first).to_have_attribute("data-seq", str(LONG - 2 * PAGE + 1))
    assert page.locator("#log").evaluate("(el) => el.scrollTop") > 0

    expect(page.locator("#conn")).to_have_text("Online")
    assert closes == [], "the console's socket closed"
    assert sizes and max(sizes) < LIMIT, max(sizes)
    assert errors == []
