"""A real browser (Debian's Chromium driven by Playwright) on the demo storefront: the shopper
types a question into the widget and watches the answer stream in."""

from __future__ import annotations

import json
import re

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


@pytest.fixture
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        yield b
        b.close()


def test_question_typed_in_widget_gets_streamed_faq_answer(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "favicon" not in m.text else None)
    frames: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "can I pay with paypal?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    bot = page.locator("kefu-chat >> .kefu-msg--bot").last
    expect(bot.locator(".kefu-bubble")).to_have_text("We accept Visa, Mastercard, PayPal and Apple Pay.", timeout=20000)
    shopper = page.locator("kefu-chat >> .kefu-msg--shopper").last
    expect(shopper).not_to_have_class(re.compile("is-pending"))
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "conversation"
    assert kinds.index("stream.start") < kinds.index("stream.delta") < kinds.index("stream.end")
    assert errors == []


def test_html_in_an_answer_is_shown_as_text_and_lists_render(live_kefu, browser, tmp_path):
    from playwright.sync_api import expect

    faq = tmp_path / "faq.jsonl"
    faq.write_text(
        json.dumps(
            {
                "intent": "html",
                "question": "show me the care steps for linen",
                "variants": ["how do I wash linen", "linen care", "washing linen"],
                "answer": "<b>Care</b>:\n1. Wash cold\n2. Dry flat",
            }
        )
        + "\n"
    )
    kefu = live_kefu(faq_path=faq)
    page = browser.new_page()
    page.goto(kefu.base + "/?lang=zh")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "how do I wash linen?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    bubble = page.locator("kefu-chat >> .kefu-msg--bot .kefu-bubble").last
    expect(bubble).to_contain_text("<b>Care</b>", timeout=20000)  # shown literally, not bold
    assert bubble.locator("b").count() == 0
    expect(bubble.locator("ol > li")).to_have_count(2)
    # The page language chose the widget's language.
    assert page.locator("kefu-chat >> #kefu-input").get_attribute("placeholder") == "请输入消息…"


def test_reload_resumes_the_conversation_without_duplicates(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    page = browser.new_page()
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "what is your return policy?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
    conv = page.evaluate("window.kefu.state().conversation")
    page.reload()
    page.click("kefu-chat >> .kefu-launcher")
    expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
    expect(page.locator("kefu-chat >> .kefu-msg--shopper")).to_have_count(1)
    assert page.evaluate("window.kefu.state().conversation") == conv
