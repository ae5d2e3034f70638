"""The console's inbox views and its smaller screens (issue 31) in a real browser (Debian's
Chromium driven by Playwright) on a live kefu: the tabs Waiting, Mine, All open and Closed with
their counts; on a 1024×768 tablet the list and the open conversation are both usable (the log
and the reply box in view, the top bar on one line); on a 390×844 phone the list and the
conversation take turns (← Conversations goes back). Persona: ``alice`` (an agent) holding one
conversation, with two waiting and one closed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_browser import ROOT, browser, create_agent, watch  # noqa: F401 (browser: a fixture)

SEED = """
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from chat.models import Conversation, Message
alice = User.objects.get(username="alice")
now = timezone.now()
def conv(text, **kw):
    c = Conversation.objects.create(token_hash="x" * 64, last_seq=1, **kw)
    Message.objects.create(conversation=c, seq=1, role="shopper", text=text)
conv("my parcel is lost", status="waiting_agent", waiting_since=now - timedelta(minutes=5), locale="en",
     time_zone="Europe/Berlin", handoff_packet={"rule": "asked_for_person", "reason": "shopper asked for a person",
     "route": "handoff", "shopper_request": {"seq": 1, "text": "my parcel is lost"},
     "summary": "1 shopper message(s), 0 bot answer(s).", "bot_told": []})
conv("我要退款", status="waiting_agent", waiting_since=now, locale="zh", time_zone="Asia/Shanghai")
conv("which size is right?", status="agent", agent=alice, agent_name="Alice", contact_email="kim@example.com")
conv("thanks, all good", status="closed")
"""


def sign_in(page, base: str) -> None:
    from playwright.sync_api import expect

    page.goto(base + "/console/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    expect(page.locator("#conn")).to_have_attribute("data-state", "online", timeout=20000)


def in_view(box, width: int, height: int) -> bool:
    return (
        box is not None
        and box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= width + 1
        and (box["y"] + box["height"] <= height + 1)
    )


def test_inbox_views_on_a_tablet_and_a_phone(live_kefu, browser):  # noqa: F811
    from playwright.sync_api import expect

    kefu = live_kefu()
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED], cwd=ROOT, env=kefu.env, check=True)
    errors: list[str] = []

    # A tablet, 1024×768.
    tablet = browser.new_context(viewport={"width": 1024, "height": 768}).new_page()
    watch(tablet, errors)
    sign_in(tablet, kefu.base)
    tabs = tablet.locator(".tabs__tab")
    expect(tabs).to_have_text([re.compile(r"Waiting\s*2"), re.compile(r"Mine\s*1"), re.compile(r"All open\s*3"),
                               re.compile(r"Closed\s*1")])  # fmt: skip
    topbar = tablet.locator("#topbar").bounding_box()
    assert topbar is not None and topbar["height"] <= 56, topbar  # one line

    tablet.click("#tab-mine")
    expect(tablet.locator("#list-mine .queue__item")).to_have_text([re.compile("which size is right")])
    expect(tablet.locator("#list-waiting")).to_be_hidden()
    tablet.click("#tab-closed")  # its first page is asked for now
    expect(tablet.locator("#list-closed .queue__item")).to_have_text([re.compile("thanks, all good")])
    tablet.click("#tab-waiting")
    waiting = tablet.locator("#list-waiting .queue__item")
    expect(waiting).to_have_count(2)
    expect(tablet.locator("#list-agent")).to_be_hidden()

    waiting.first.locator("button").click()
    expect(tablet.locator("#log .msg--shopper .msg__body")).to_have_text(["my parcel is lost"], timeout=20000)
    expect(tablet.locator("#packet-why")).to_contain_text("shopper asked for a person")
    tablet.click("#btn-take")
    expect(tablet.locator("#detail-status")).to_have_text("With an agent: you", timeout=20000)
    expect(tabs.nth(1)).to_have_text(re.compile(r"Mine\s*2"), timeout=20000)  # live, Alice's own
    # Both usable: the list beside the conversation, its log and its reply box in view.
    for selector in ("#queue", "#log", "#reply", "#btn-send", "#packet"):
        assert in_view(tablet.locator(selector).bounding_box(), 1024, 768), selector
    log = tablet.locator("#log").bounding_box()
    assert log is not None and log["height"] >= 250, log
    packet = tablet.locator("#packet")  # not clipped mid-line
    assert packet.evaluate("p => p.scrollHeight <= p.clientHeight + 1")
    tablet.fill("#reply", "Let me check with the carrier.")
    tablet.press("#reply", "Enter")
    expect(tablet.locator("#log .msg--agent .msg__body")).to_have_text(["Let me check with the carrier."])

    # A phone, 390×844: the list, then the conversation in its place, then back.
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True).new_page()
    watch(phone, errors)
    sign_in(phone, kefu.base)
    expect(phone.locator("#detail")).to_be_hidden()
    phone.click("#tab-mine")
    mine = phone.locator("#list-mine .queue__item", has_text="which size is right")
    mine.locator("button").tap()
    expect(phone.locator("#log .msg--shopper .msg__body")).to_have_text(["which size is right?"], timeout=20000)
    expect(phone.locator("#queue")).to_be_hidden()
    for selector in ("#btn-list", "#log", "#reply"):
        box = phone.locator(selector).bounding_box()
        assert box is not None and box["width"] > 0 and box["x"] + box["width"] <= 391, (selector, box)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the screen
    phone.locator("#btn-list").tap()
    expect(phone.locator("#queue")).to_be_visible()
    expect(phone.locator("#detail")).to_be_hidden()
    assert errors == []
