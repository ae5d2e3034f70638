"""The console's search box in a real browser (Debian's Chromium driven by Playwright) on a live
kefu on PostgreSQL (the GIN index path of chat.search): "/" focuses the box, and conversations are
found by an order number, by the e-mail the shopper left and by a two-character Chinese word,
closed ones included; a result opens the conversation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pytest
from test_console_browser import browser, create_agent, watch  # noqa: F401 (browser: a fixture)

ROOT = Path(__file__).resolve().parents[2]

# The shoppers' conversations, written through chat.services as a live chat writes them; the
# first is closed by an agent. Prints the three ids.
SEED = """
import uuid
from django.contrib.auth.models import User
from chat import services
def chat(*texts, email=None):
    conv = services.conversation_start(locale="en")[0].pk
    for t in texts:
        services.message_receive(conversation_id=conv, client_id=uuid.uuid4().hex, text=t)
    if email:
        services.contact_save(conversation_id=conv, email=email)
    return conv
order = chat("Hi, where is my order KF-2048? It has been two weeks")
bob = User.objects.get(username="bob")
services.conversation_take_over(conversation_id=order, agent=bob)
services.conversation_close(conversation_id=order, agent=bob)
mail = chat("please write back to me", email="Lin.Wei@example.com")
zh = chat("你好，我想退货，可以吗？")
chat("where is my order KF-2049", "我想换货", email="someone@example.com")
title = chat("发票抬头可以改吗")
chat("发票 票抬 抬头")  # every bigram of the word, never the word
print(order, mail, zh, title)
"""


# A live server on a fresh PostgreSQL database (migrate), two agents and a seed through
# manage.py: a minute on a quiet 2-core machine, more on a busy one.
@pytest.mark.timeout(600)
def test_search_by_order_number_e_mail_and_two_chinese_characters(live_kefu, pg_database, browser):  # noqa: F811
    from playwright.sync_api import expect

    kefu = live_kefu(env={"DATABASE_URL": pg_database})
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    create_agent(kefu, "bob", "Bob", "another horse battery")
    seeded = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED],
        cwd=ROOT,
        env=kefu.env,
        text=True,
        check=True,
        capture_output=True,
    )
    order, mail, zh, title = seeded.stdout.strip().splitlines()[-1].split()  # after any start-up log lines
    errors: list[str] = []

    page = browser.new_context().new_page()
    watch(page, errors)
    page.goto(kefu.base + "/console/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    expect(page).to_have_url(kefu.base + "/console/")
    expect(page.locator("#conn")).to_have_text("Online", timeout=20000)

    hits = page.locator("#search-list .search__hit")

    def search(text: str) -> None:
        page.keyboard.press("Escape")  # closes the results and leaves the box
        expect(page.locator("#search-q")).not_to_be_focused()
        page.locator("body").press("/")  # "/" outside a text field focuses the box, its text selected
        expect(page.locator("#search-q")).to_be_focused()
        page.keyboard.type(text)
        page.keyboard.press("Enter")

    # By order number: the closed conversation is found, and opens in the console.
    search("KF-2048")
    expect(hits).to_have_count(1, timeout=20000)
    expect(hits.first).to_have_attribute("data-conversation", order)
    expect(hits.first.locator(".search__snippet")).to_have_text("Hi, where is my order KF-2048? It has been two weeks")
    expect(hits.first.locator(".search__meta")).to_contain_text("Closed")
    hits.first.click()
    expect(page.locator("#search-results")).to_be_hidden()
    expect(page.locator("#detail-title")).to_have_text(f"Conversation {order[:8]}", timeout=20000)
    expect(page.locator("#log .msg--shopper .msg__body")).to_have_text(
        ["Hi, where is my order KF-2048? It has been two weeks"], timeout=20000
    )

    # By the e-mail the shopper left (another case than they typed it).
    search("lin.wei@EXAMPLE.com")
    expect(hits).to_have_count(1, timeout=20000)
    expect(hits.first).to_have_attribute("data-conversation", mail)

    # By a two-character Chinese word: 退货 (a return), not 换货 (an exchange) next door.
    page.keyboard.press("Escape")
    expect(page.locator("#search-results")).to_be_hidden()
    search("退货")
    expect(hits).to_have_count(1, timeout=20000)
    expect(hits.first).to_have_attribute("data-conversation", zh)
    expect(hits.first.locator(".search__snippet")).to_have_text("你好，我想退货，可以吗？")
    expect(page.locator("#search-status")).to_have_text("1 conversations, newest first")

    # Several words at once (PostgreSQL asks its index for one and checks the rest), and a
    # four-character Chinese word: its bigrams, then the word itself in the text.
    search("two WEEKS")
    expect(hits).to_have_count(1, timeout=20000)
    expect(hits.first).to_have_attribute("data-conversation", order)
    search("发票抬头")
    expect(hits).to_have_count(1, timeout=20000)
    expect(hits.first).to_have_attribute("data-conversation", title)
    assert errors == [], errors
    assert re.fullmatch(r"[0-9a-f-]{36}", zh)
