"""Team work in the agent console (issue 32) in a real browser (Debian's Chromium driven by
Playwright), two agents in two browser contexts on one live kefu with auto-assignment on and a
limit of one open conversation each: the two oldest waiting conversations go one to Alice, one
to Bob, the third waits; Alice transfers hers to Bob with a note and the alert moves to him, and
her freed slot takes the third; each sees the other "viewing" and "typing"; the "?" overlay lists
the keys, which do nothing while typing in a field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_browser import ROOT, browser, create_agent, watch  # noqa: F401 (browser: a fixture)

WAITING = """
from datetime import timedelta
from django.utils import timezone
from chat.models import Conversation, Message
now = timezone.now()
for i, text in enumerate(["first question", "second question", "third question"]):
    c = Conversation.objects.create(token_hash="x" * 64, status="waiting_agent", last_seq=1,
                                    waiting_since=now + timedelta(seconds=i))
    Message.objects.create(conversation=c, seq=1, role="shopper", text=text)
"""

COUNT = "from chat.models import Conversation; print(Conversation.objects.filter(assignee__isnull=False).count())"


def sign_in(page, kefu, username: str) -> None:
    from playwright.sync_api import expect

    page.goto(kefu.base + "/console/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    expect(page.locator("#conn")).to_have_text("Online", timeout=20000)


def test_two_agents_share_the_queue_transfer_and_see_each_other(live_kefu, browser):  # noqa: F811
    from playwright.sync_api import expect

    kefu = live_kefu(env={"KEFU_AUTO_ASSIGN": "1", "KEFU_ASSIGN_LIMIT": "1", "KEFU_AGENT_SWEEP_S": "0.5"})
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    create_agent(kefu, "bob", "Bob", "correct horse battery")
    errors: list[str] = []
    pages = {}
    for name in ("alice", "bob"):
        context = browser.new_context(base_url=kefu.base, viewport={"width": 1280, "height": 900})
        pages[name] = context.new_page()
        watch(pages[name], errors)
        sign_in(pages[name], kefu, name)
    alice, bob = pages["alice"], pages["bob"]
    expect(alice.locator("#team-list")).to_contain_text("Bob", timeout=20000)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", WAITING], cwd=ROOT, env=kefu.env, check=True)

    def row(page, text):
        return page.locator("#list-waiting .queue__item", has_text=text)

    # Round-robin: the oldest to Alice, the next to Bob; the limit (1) keeps the third Unassigned.
    expect(row(alice, "first question").locator(".queue__assignee")).to_have_text("→ you", timeout=20000)
    expect(row(alice, "second question").locator(".queue__assignee")).to_have_text("→ Bob", timeout=20000)
    expect(row(bob, "second question").locator(".queue__assignee")).to_have_text("→ you", timeout=20000)
    # The same sweep would have assigned the third had the limit not held.
    assigned = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", COUNT],
        cwd=ROOT,
        env=kefu.env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert assigned[-1] == "2"  # the last line (Django's shell may first say what it imported)
    # Each was alerted of their own only.
    expect(alice.locator("#alerts .alert--assigned")).to_have_count(1)
    expect(bob.locator("#alerts .alert--assigned")).to_have_count(1)

    # Alice opens hers and transfers it to Bob with a note: the alert moves to him.
    row(alice, "first question").locator("button").click()
    expect(alice.locator("#detail-assignee")).to_have_text("Assigned to you", timeout=20000)
    alice.click("#assign-menu > summary")
    alice.select_option("#assign-to", label="Bob")
    alice.fill("#assign-note", "VIP, wants a refund")
    alice.click("#btn-assign")
    moved = bob.locator("#alerts .alert--assigned", has_text="VIP, wants a refund")
    expect(moved).to_have_count(1, timeout=20000)
    expect(alice.locator("#notes")).to_contain_text("Alice → Bob: VIP, wants a refund", timeout=20000)
    expect(alice.locator("#detail-assignee")).to_have_text("Assigned to Bob")
    # Alice's slot is free again: the third conversation is hers now; Bob, over his limit, gets none.
    expect(row(alice, "third question").locator(".queue__assignee")).to_have_text("→ you", timeout=20000)

    # Bob opens it from the alert: each sees the other viewing; Bob types a note: "typing".
    moved.locator(".alert__open").click()
    expect(alice.locator("#collision")).to_have_text("Bob is viewing", timeout=20000)
    expect(bob.locator("#collision")).to_have_text("Alice is viewing", timeout=20000)
    bob.locator("#note").press_sequentially("on it", delay=30)
    expect(alice.locator("#collision")).to_have_text("Bob is typing…", timeout=20000)

    # The keys: "?" lists them; typed in a field, a key is text, not a command.
    alice.locator("#note").press_sequentially("j?", delay=30)
    expect(alice.locator("#keys")).to_be_hidden()
    assert alice.locator("#note").input_value() == "j?"
    alice.locator("#note").blur()
    alice.keyboard.press("?")
    keys = alice.locator("#keys")
    expect(keys).to_be_visible()
    for text in (
        "Next conversation",
        "Previous conversation",
        "Take over",
        "Hand back to bot",
        "Close",
        "Assign to me",
        "Search",
        "Send",
    ):
        expect(keys.locator(".keys__list")).to_contain_text(text)
    alice.keyboard.press("Escape")
    expect(keys).to_be_hidden()
    # j opens the next conversation in the list; t takes it over.
    title = alice.locator("#detail-title").text_content()
    alice.keyboard.press("j")
    expect(alice.locator("#detail-title")).not_to_have_text(title or "", timeout=20000)
    alice.keyboard.press("t")
    expect(alice.locator("#detail-status")).to_have_text(re.compile("With an agent: you"), timeout=20000)
    assert [e for e in errors if not re.search(r"AudioContext", e)] == []
