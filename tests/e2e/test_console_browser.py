"""Two real browser pages at once (Debian's Chromium driven by Playwright) on a live kefu: a
shopper on the storefront's widget and an agent in the console. The shopper asks for a person,
the agent sees the conversation appear, takes it over, they talk both ways, the agent hands it
back and the bot answers again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sockets import status_frame

ROOT = Path(__file__).resolve().parents[2]
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


def create_agent(kefu, username: str, name: str, password: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "create_agent", username, "--name", name, "--password-stdin"],
        cwd=ROOT,
        env=kefu.env,
        input=password + "\n",
        text=True,
        check=True,
        capture_output=True,
    )


def watch(page, errors: list[str], frames: list[dict] | None = None) -> None:
    page.on(
        "console",
        lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" and "favicon" not in m.text else None,
    )
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    if frames is not None:
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))


def test_shopper_and_agent_talk_live_then_the_bot_answers_again(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []

    # The agent signs in (own browser context: own cookies).
    agent = browser.new_context().new_page()
    watch(agent, errors)
    agent.goto(kefu.base + "/console/")
    expect(agent).to_have_url(re.compile(r"/console/login/"))
    agent.fill("#id_username", "alice")
    agent.fill("#id_password", "correct horse battery")
    agent.click("button[type=submit]")
    expect(agent).to_have_url(kefu.base + "/console/")
    expect(agent.locator("#conn")).to_have_text("Online", timeout=20000)

    # The shopper asks for a person in the widget.
    shopper = browser.new_context().new_page()
    shopper_frames: list[dict] = []
    watch(shopper, errors, shopper_frames)
    shopper.goto(kefu.base + "/")
    shopper.click("kefu-chat >> .kefu-launcher")
    shopper.fill("kefu-chat >> #kefu-input", "can I talk to a human please")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    expect(shopper.locator("kefu-chat >> .kefu-msg--bot").last).to_contain_text("person", timeout=20000)
    # Alice is online: the shopper is told where they stand, and the team's dot is green.
    expect(shopper.locator("kefu-chat >> .kefu-notice").last).to_have_text(
        "Waiting for a person from our team: you're number 1 in the queue (we'll reply here or by e-mail).",
        timeout=20000,
    )
    # No take-over yet to tell a wait by: unknown, said so (issue 34).
    expect(shopper.locator("kefu-chat >> .kefu-subtitle")).to_have_text(
        "You're number 1 in the queue · we'll reply here or by e-mail"
    )
    expect(shopper.locator("kefu-chat >> .kefu-root")).to_have_attribute("data-team", "online")
    expect(shopper.locator("kefu-chat >> .kefu-contact")).to_be_hidden()

    # It appears in the agent's waiting list without a reload, with the notification.
    waiting = agent.locator("#list-waiting .queue__item")
    expect(waiting).to_have_count(1, timeout=20000)
    expect(agent.locator("#notify")).to_contain_text("can I talk to a human please")
    waiting.first.locator("button").click()
    expect(agent.locator("#log .msg--shopper .msg__body")).to_have_text(["can I talk to a human please"], timeout=20000)
    expect(agent.locator("#packet-why")).to_contain_text("asked_for_person")

    # Take over: the shopper is told who joined.
    agent.click("#btn-take")
    expect(agent.locator("#detail-status")).to_have_text("With an agent: you", timeout=20000)
    expect(agent.locator("#list-agent .queue__item")).to_have_count(1)
    expect(shopper.locator("kefu-chat >> .kefu-notice").last).to_have_text(
        "Alice joined the conversation", timeout=20000
    )

    # Shopper -> agent; the agent sees the shopper typing first.
    shopper.fill("kefu-chat >> #kefu-input", "my vase arrived with a crack")
    expect(agent.locator("#typing")).to_be_visible(timeout=20000)
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    expect(agent.locator("#log .msg--shopper .msg__body").last).to_have_text(
        "my vase arrived with a crack", timeout=20000
    )
    expect(agent.locator("#typing")).to_be_hidden()

    # Agent -> shopper (a canned reply would be inserted the same way; here typed). The shopper
    # sees the agent typing, by name, until the message arrives.
    agent.fill("#reply", "Sorry about that! I'm sending a replacement today.")
    indicator = shopper.locator("kefu-chat >> .kefu-thinking")
    expect(indicator).to_be_visible(timeout=20000)
    expect(indicator).to_have_attribute("data-who", "agent")
    expect(indicator.locator(".kefu-label")).to_have_text("Alice")
    agent.press("#reply", "Enter")
    agent_msg = shopper.locator("kefu-chat >> .kefu-msg--agent").last
    expect(agent_msg).to_contain_text("Sorry about that! I'm sending a replacement today.", timeout=20000)
    expect(indicator).to_be_hidden()
    expect(agent.locator("#log .msg--agent")).to_have_count(1)

    # Hand back: the bot answers the next question, and the agent watches it stream in.
    agent.click("#btn-back")
    expect(shopper.locator("kefu-chat >> .kefu-notice").last).to_have_text(
        "You are chatting with our assistant again", timeout=20000
    )
    shopper.fill("kefu-chat >> #kefu-input", "can I pay with paypal?")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    answer = "We accept Visa, Mastercard, PayPal and Apple Pay."
    expect(shopper.locator("kefu-chat >> .kefu-msg--bot").last.locator(".kefu-bubble")).to_have_text(
        answer, timeout=20000
    )
    expect(agent.locator("#log .msg--bot").last.locator(".msg__body")).to_have_text(answer, timeout=20000)

    # The agent closes it: the widget asks the shopper how satisfied they are, and a click is stored.
    agent.click("#btn-close")
    csat = shopper.locator("kefu-chat >> .kefu-csat")
    expect(csat).to_contain_text("How satisfied are you with the help you got?", timeout=20000)
    expect(csat.locator("button")).to_have_count(5)
    csat.locator("button[aria-label='4: Satisfied']").click()
    expect(csat).to_have_text("Thank you for telling us!", timeout=20000)
    assert {"type": "csat.saved", "score": 4} in shopper_frames

    statuses = [f for f in shopper_frames if f["type"] == "status"]
    assert statuses == [
        status_frame("waiting_agent", online=1, position=1),
        status_frame("agent", agent="Alice", online=1),
        status_frame("bot", online=1),
        status_frame("closed", online=1),
    ]
    assert errors == []


def test_no_one_online_the_widget_takes_an_email_that_the_agent_then_sees(live_kefu, browser):
    import sqlite3

    from playwright.sync_api import expect

    kefu = live_kefu()
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []
    shopper = browser.new_context().new_page()
    frames: list[dict] = []
    watch(shopper, errors, frames)
    shopper.goto(kefu.base + "/")
    shopper.click("kefu-chat >> .kefu-launcher")
    shopper.fill("kefu-chat >> #kefu-input", "can I talk to a human please")
    shopper.press("kefu-chat >> #kefu-input", "Enter")

    # One truth: the header, the stored notice and the form all say no one is online.
    expect(shopper.locator("kefu-chat >> .kefu-subtitle")).to_have_text(
        "No one from our team is online right now", timeout=20000
    )
    expect(shopper.locator("kefu-chat >> .kefu-root")).to_have_attribute("data-team", "offline")
    expect(shopper.locator("kefu-chat >> .kefu-msg--system").last).to_contain_text("No one from our team is online")
    expect(shopper.locator("kefu-chat >> .kefu-notice")).to_have_count(0)  # no "connecting you" line
    form = shopper.locator("kefu-chat >> .kefu-contact")
    expect(form).to_be_visible()

    shopper.fill("kefu-chat >> #kefu-contact-email", "ada@")
    shopper.click("kefu-chat >> .kefu-contact__save")
    expect(shopper.locator("kefu-chat >> .kefu-contact__error")).to_have_text("Please enter a valid e-mail address.")
    shopper.fill("kefu-chat >> #kefu-contact-email", "ada@example.com")
    shopper.press("kefu-chat >> #kefu-contact-email", "Enter")
    expect(shopper.locator("kefu-chat >> .kefu-notice").last).to_have_text(
        "Thanks! We'll reply to ada@example.com.", timeout=20000
    )
    expect(form).to_be_hidden()
    assert {"type": "contact.saved", "email": "ada@example.com"} in frames

    path = kefu.env["DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT status, contact_email FROM chat_conversation").fetchall()
    assert rows == [("waiting_agent", "ada@example.com")]

    # The agent signs in and sees the address in the queue.
    agent = browser.new_context().new_page()
    watch(agent, errors)
    agent.goto(kefu.base + "/console/")
    agent.fill("#id_username", "alice")
    agent.fill("#id_password", "correct horse battery")
    agent.click("button[type=submit]")
    expect(agent.locator("#list-waiting .queue__item .queue__contact")).to_have_text("✉ ada@example.com", timeout=20000)
    assert errors == []


def test_the_agent_sees_a_verified_shoppers_orders_and_cancels_one(live_kefu, browser):
    """The orders panel beside the conversation (docs/console.md, Orders): a verified shopper's
    demo orders, Cancel enabled only once the agent holds the conversation, a confirm() first,
    the result under the order, and the shopper told in the chat."""
    import time
    import uuid

    import jwt
    from playwright.sync_api import expect
    from websockets.sync.client import connect

    secret = "store-backend-secret-0123456789abcdef"
    kefu = live_kefu(env={"KEFU_IDENTITY_SECRET": secret, "KEFU_STORE_ADAPTER": "demo"})
    subprocess.run(
        [sys.executable, "manage.py", "load_demo_orders"], cwd=ROOT, env=kefu.env, check=True, capture_output=True
    )
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    now = int(time.time())
    token = jwt.encode(
        {"sub": "demo-mei", "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}, secret, algorithm="HS256"
    )
    errors: list[str] = []
    with connect(kefu.ws, origin=kefu.base) as ws:

        def until(kind: str, **match: str) -> dict:
            while True:
                f = json.loads(ws.recv(timeout=20))
                if f["type"] == kind and all(f.get(k) == v for k, v in match.items()):
                    return f

        ws.send(json.dumps({"type": "hello", "identity": token}))
        until("conversation")
        ws.send(json.dumps({"type": "message", "client_id": "c1", "text": "can I pay with paypal?"}))
        until("stream.end")

        agent = browser.new_context().new_page()
        watch(agent, errors)
        agent.goto(kefu.base + "/console/")
        agent.fill("#id_username", "alice")
        agent.fill("#id_password", "correct horse battery")
        agent.click("button[type=submit]")
        row = agent.locator("#list-bot .queue__item")
        expect(row).to_have_count(1, timeout=20000)
        row.first.locator("button").click()

        orders = agent.locator("#orders .order")
        expect(orders.locator(".order__number")).to_have_text(["KF-1002", "KF-1001", "KF-1003"], timeout=20000)
        expect(agent.locator("#orders-source")).to_have_text("(verified customer)")
        expect(orders.nth(1).locator(".order__track a")).to_have_text("JD014600006281230981")
        cancel = orders.first.get_by_role("button", name="Cancel", exact=True)
        expect(cancel).to_be_disabled()  # not before the agent holds the conversation
        expect(orders.nth(1).get_by_role("button", name="Cancel", exact=True)).to_be_disabled()  # shipped

        agent.click("#btn-take")
        expect(agent.locator("#detail-status")).to_have_text("With an agent: you", timeout=20000)
        expect(cancel).to_be_enabled()
        asked: list[str] = []
        agent.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        cancel.click()
        expect(orders.first.locator(".order__result")).to_have_text("Cancelled. The shopper was told.", timeout=20000)
        expect(orders.first.locator(".order__status")).to_have_text("Cancelled")
        expect(cancel).to_be_disabled()
        expect(agent.locator("#log .msg--system .msg__body").last).to_have_text(
            "Order KF-1002 was cancelled by our team.", timeout=20000
        )
        assert asked and asked[0].startswith("Cancel order KF-1002 for the shopper?")
        told = until("message", role="system")
        assert told["text"] == "Order KF-1002 was cancelled by our team."
    assert errors == []
