"""A real browser (Debian's Chromium driven by Playwright): a resumed conversation longer than a
replay page shows its newest page and a "Load earlier messages" control that brings the older
pages, in order, until none is left (issue 29, item 4; docs/protocol.md, replay pages)."""

from __future__ import annotations

import json
from typing import Any

import pytest

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

QUESTIONS = ("what is your return policy?", "can I pay with paypal?", "how long does delivery take?")


@pytest.fixture
def browser(chromium: str) -> Any:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        yield b
        b.close()


def test_load_earlier_messages_brings_the_older_pages_in_order(live_kefu: Any, browser: Any) -> None:
    from playwright.sync_api import expect

    kefu = live_kefu(env={"KEFU_REPLAY_PAGE": "2"})
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "favicon" not in m.text else None)
    sent: list[dict[str, Any]] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))))
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    bots = page.locator("kefu-chat >> .kefu-msg--bot")
    for n, question in enumerate(QUESTIONS, 1):
        page.fill("kefu-chat >> #kefu-input", question)
        page.press("kefu-chat >> #kefu-input", "Enter")
        expect(bots).to_have_count(n, timeout=20000)
    earlier = page.locator("kefu-chat >> .kefu-earlier")
    expect(earlier).to_be_hidden()

    # Reloaded: the replay sends the newest page (the last question and its answer) only.
    page.reload()
    page.click("kefu-chat >> .kefu-launcher")
    shoppers = page.locator("kefu-chat >> .kefu-msg--shopper .kefu-bubble")
    expect(bots).to_have_count(1, timeout=20000)
    expect(shoppers).to_have_text([QUESTIONS[2]])
    expect(earlier).to_be_visible()
    expect(earlier).to_have_text("Load earlier messages")

    earlier.click()
    expect(shoppers).to_have_text([QUESTIONS[1], QUESTIONS[2]], timeout=20000)
    expect(bots).to_have_count(2)
    expect(earlier).to_be_visible()
    earlier.click()
    expect(shoppers).to_have_text(list(QUESTIONS), timeout=20000)
    expect(bots).to_have_count(3)
    expect(earlier).to_be_hidden()
    rows = page.locator("kefu-chat >> .kefu-msg").evaluate_all("els => els.map(e => Number(e.dataset.seq))")
    assert rows == [1, 2, 3, 4, 5, 6]
    assert [f["before"] for f in sent if f["type"] == "older"] == [5, 3]
    assert not [f for f in sent if f["type"] == "resync"]  # the paged replay was not taken for a gap
    assert errors == []


def test_the_control_speaks_chinese_on_a_chinese_page(live_kefu: Any, browser: Any) -> None:
    from playwright.sync_api import expect

    kefu = live_kefu(env={"KEFU_REPLAY_PAGE": "1"})
    page = browser.new_page()
    page.goto(kefu.base + "/?lang=zh")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", QUESTIONS[0])
    page.press("kefu-chat >> #kefu-input", "Enter")
    expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
    page.reload()
    page.click("kefu-chat >> .kefu-launcher")
    earlier = page.locator("kefu-chat >> .kefu-earlier")
    expect(earlier).to_have_text("加载更早的消息", timeout=20000)
