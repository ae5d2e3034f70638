"""Alerts in the agent console (issue 31, item 1) in a real browser (Debian's Chromium driven by
Playwright) on a live kefu: a shopper asks for a person and the agent, on another conversation's
page, gets a desktop notification (permission granted in the browser context), the count in the
tab title and a banner that stays until the conversation is opened; then, holding it, a message
the shopper writes while the agent looks elsewhere raises them again. ``window.Notification`` is
wrapped before the page loads so the test reads what the page asked the browser to show."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_browser import browser, create_agent, watch  # noqa: F401 (browser: a fixture)

# Record every notification the page creates, and every permission request (none on load).
RECORD = """
(() => {
  const Real = window.Notification;
  window.__notes = [];
  window.__asked = 0;
  function Wrapped(title, options) {
    window.__notes.push({ title: String(title), body: (options && options.body) || "" });
    return new Real(title, options);
  }
  Object.defineProperty(Wrapped, "permission", { get: () => Real.permission });
  Wrapped.requestPermission = (...a) => { window.__asked += 1; return Real.requestPermission(...a); };
  Wrapped.prototype = Real.prototype;
  window.Notification = Wrapped;
})();
"""


def sign_in(page, kefu) -> None:
    from playwright.sync_api import expect

    page.goto(kefu.base + "/console/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    expect(page.locator("#conn")).to_have_text("Online", timeout=20000)


def test_a_handoff_and_an_unread_message_notify_count_in_the_title_and_raise_a_banner(live_kefu, browser):  # noqa: F811
    from playwright.sync_api import expect

    kefu = live_kefu()
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []
    context = browser.new_context(
        permissions=["notifications"], base_url=kefu.base, viewport={"width": 1280, "height": 800}
    )
    context.add_init_script(RECORD)
    agent = context.new_page()
    watch(agent, errors)
    sign_in(agent, kefu)
    expect(agent).to_have_title("Agent console")
    expect(agent.locator("#btn-notify-ask")).to_be_hidden()  # already granted: nothing to ask
    assert agent.evaluate("window.__asked") == 0

    shopper = browser.new_context(timezone_id="Asia/Shanghai").new_page()
    watch(shopper, errors)
    shopper.goto(kefu.base + "/")
    shopper.click("kefu-chat >> .kefu-launcher")
    shopper.fill("kefu-chat >> #kefu-input", "can I talk to a human please")
    shopper.press("kefu-chat >> #kefu-input", "Enter")

    # The notification, at once, naming the visitor by time zone and language, with the request.
    agent.wait_for_function("() => window.__notes.length >= 1", timeout=20000)
    note = agent.evaluate("window.__notes[0]")
    assert note == {
        "title": "Waiting for a person: Visitor · Asia/Shanghai · en",
        "body": "can I talk to a human please",
    }
    expect(agent).to_have_title("(1) Agent console", timeout=20000)
    banner = agent.locator("#alerts .alert--waiting")
    expect(banner).to_have_count(1)
    expect(banner).to_contain_text("can I talk to a human please")

    # The row has a face: the visitor's name, the shopper's own words (not the bot's notice).
    row = agent.locator("#list-waiting .queue__item").first
    expect(row.locator(".queue__name")).to_have_text("Visitor · Asia/Shanghai · en")
    expect(row.locator(".queue__last")).to_contain_text("can I talk to a human please")

    # The banner outlives the transient notice, and goes once the conversation is opened.
    expect(agent.locator("#notify")).to_be_hidden(timeout=20000)
    expect(banner).to_have_count(1)
    banner.locator(".alert__open").click()
    expect(banner).to_have_count(0)
    agent.click("#btn-take")
    expect(agent.locator("#detail-status")).to_have_text("With an agent: you", timeout=20000)
    expect(agent).to_have_title("Agent console", timeout=20000)
    # At 1280×800 the open conversation gets most of the screen: the message log at least half
    # the viewport's height (about 190 px before), with the handoff packet shown and the reply
    # box still in view.
    expect(agent.locator("#packet")).to_be_visible()
    log = agent.locator("#log").bounding_box()
    reply = agent.locator("#reply").bounding_box()
    detail = agent.locator("#detail").bounding_box()
    assert log is not None and reply is not None and detail is not None
    assert log["height"] >= 400, log
    assert reply["y"] + reply["height"] <= min(800, detail["y"] + detail["height"]), (reply, detail)
    # The top bar is one line in English (it wrapped to three before), and the handoff box shows
    # its lines whole (it clipped its last one).
    topbar = agent.locator("#topbar").bounding_box()
    assert topbar is not None and topbar["height"] <= 56, topbar
    assert agent.locator("#packet").evaluate("p => p.scrollHeight <= p.clientHeight + 1")

    # The agent looks at another conversation; the shopper writes: notification, title count and
    # banner, and the row is marked unread.
    other = browser.new_context(timezone_id="Europe/Berlin").new_page()
    watch(other, errors)
    other.goto(kefu.base + "/")
    other.click("kefu-chat >> .kefu-launcher")
    other.fill("kefu-chat >> #kefu-input", "can I pay with paypal?")
    other.press("kefu-chat >> #kefu-input", "Enter")
    paypal = agent.locator("#list-bot .queue__item", has_text="can I pay with paypal?")
    expect(paypal).to_have_count(1, timeout=20000)
    # A row that came live has its face at once, as after a reload (it showed "Visitor" before).
    expect(paypal.locator(".queue__name")).to_have_text("Visitor · Europe/Berlin · en")
    paypal.locator("button").click()
    expect(agent.locator("#log .msg--shopper .msg__body").first).to_have_text("can I pay with paypal?", timeout=20000)
    shopper.fill("kefu-chat >> #kefu-input", "my vase arrived with a crack")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    agent.wait_for_function("() => window.__notes.length >= 2", timeout=20000)
    assert agent.evaluate("window.__notes[1]") == {
        "title": "New message from Visitor · Asia/Shanghai · en",
        "body": "my vase arrived with a crack",
    }
    expect(agent).to_have_title("(1) Agent console", timeout=20000)
    unread = agent.locator("#alerts .alert--unread")
    expect(unread).to_have_count(1)
    expect(agent.locator("#list-agent .queue__item.is-unread .queue__last")).to_have_text(
        "my vase arrived with a crack"
    )

    # Opened from its banner: read, the count and the banner go.
    unread.locator(".alert__open").click()
    expect(agent.locator("#log .msg--shopper .msg__body").last).to_have_text(
        "my vase arrived with a crack", timeout=20000
    )
    expect(agent).to_have_title("Agent console", timeout=20000)
    expect(agent.locator("#alerts .alert")).to_have_count(0)
    assert agent.evaluate("window.__asked") == 0
    assert [e for e in errors if not re.search(r"AudioContext", e)] == []


def test_without_permission_a_button_asks_never_the_page_load(live_kefu, browser):  # noqa: F811
    from playwright.sync_api import expect

    kefu = live_kefu()
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    context = browser.new_context()
    context.add_init_script(RECORD)
    agent = context.new_page()
    sign_in(agent, kefu)
    assert agent.evaluate("Notification.permission") == "default"
    expect(agent.locator("#btn-notify-ask")).to_be_visible()
    assert agent.evaluate("window.__asked") == 0
    agent.click("#btn-notify-ask")
    agent.wait_for_function("() => window.__asked === 1", timeout=20000)


# Two conversations already waiting, each with the shopper's question, and a bot conversation
# more recent than the browser shopper's (which is then on the bot section's second page).
WAITING = """
import uuid
from django.utils import timezone
from chat.models import Conversation, Message
for i in range(2):
    c = Conversation.objects.create(token_hash="x" * 64, status="waiting_agent", last_seq=1, waiting_since=timezone.now())
    Message.objects.create(conversation=c, seq=1, role="shopper", text=f"question {i}")
c = Conversation.objects.create(token_hash="x" * 64, status="bot", last_seq=1)
Message.objects.create(conversation=c, seq=1, role="shopper", text="just looking")
"""


def test_past_the_loaded_page_a_new_waiting_conversation_still_notifies_and_counts(live_kefu, browser):  # noqa: F811
    import subprocess

    from playwright.sync_api import expect
    from test_console_browser import ROOT

    # One row per page: the console lists one of the two waiting conversations and not the
    # shopper's, so when the shopper asks for a person it learns only the new counts
    # (queue.counts, docs/console.md#paging).
    kefu = live_kefu(env={"KEFU_CONSOLE_PAGE": "1"})
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    shopper = browser.new_context().new_page()
    shopper.goto(kefu.base + "/")
    shopper.click("kefu-chat >> .kefu-launcher")
    shopper.fill("kefu-chat >> #kefu-input", "can I pay with paypal?")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    expect(shopper.locator("kefu-chat >> .kefu-msg--bot").last).to_contain_text("PayPal", timeout=20000)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", WAITING], cwd=ROOT, env=kefu.env, check=True)
    context = browser.new_context(permissions=["notifications"])
    context.add_init_script(RECORD)
    agent = context.new_page()
    sign_in(agent, kefu)
    expect(agent).to_have_title("(2) Agent console")
    expect(agent.locator("#list-waiting .queue__item")).to_have_count(1)
    expect(agent.locator("#list-bot .queue__item")).to_have_text([re.compile("just looking")])

    shopper.fill("kefu-chat >> #kefu-input", "can I talk to a human please")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    agent.wait_for_function("() => window.__notes.length >= 1", timeout=20000)
    assert agent.evaluate("window.__notes") == [{"title": "3 conversations waiting for a person", "body": ""}]
    expect(agent).to_have_title("(3) Agent console")
    expect(agent.locator("#list-waiting .queue__item")).to_have_count(1)
