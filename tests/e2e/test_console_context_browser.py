"""Labels, the customer's context and canned replies in a real browser (Debian's Chromium driven
by Playwright) on a live kefu on PostgreSQL (issue 32 items 3-5; docs/console.md): the customer's earlier
conversation is listed (never the other shopper of the same name) and opens; a label set on the
open conversation filters the inbox; a personal canned reply made in the console is inserted,
filled, by typing ``/shortcut`` and Tab, then sent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pytest
from test_console_browser import browser, create_agent, watch  # noqa: F401 (browser: a fixture)

ROOT = Path(__file__).resolve().parents[2]

# Two shoppers called Li Wei (different customers, different e-mails); the first has an earlier,
# closed conversation. Labels as the store defined them. Prints the ids: now, earlier, other.
SEED = """
import uuid
from chat import services
from chat.models import Conversation, Label
def chat(text, **customer):
    conv = services.conversation_start(locale="en")[0].pk
    services.message_receive(conversation_id=conv, client_id=uuid.uuid4().hex, text=text)
    Conversation.objects.filter(pk=conv).update(**customer)
    return conv
li = dict(customer_id="c-1", customer_name="Li Wei", customer_email="li@a.example")
earlier = chat("My charger broke", **li)
Conversation.objects.filter(pk=earlier).update(status="closed")
other = chat("Not the same person", customer_id="c-2", customer_name="Li Wei", customer_email="wei@b.example")
now = chat("Where is my order KF-3001?", **li)
Label.objects.create(name="Refund", color="#d97706")
Label.objects.create(name="VIP", color="#2563eb")
print(now, earlier, other)
"""


@pytest.mark.timeout(600)
def test_earlier_conversation_label_filter_and_a_slash_shortcut(live_kefu, pg_database, browser):  # noqa: F811
    from playwright.sync_api import expect

    # PostgreSQL: the rows' labels are aggregated in SQL (STRING_AGG there, GROUP_CONCAT on SQLite).
    kefu = live_kefu(env={"DATABASE_URL": pg_database})
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    seeded = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED],
        cwd=ROOT,
        env=kefu.env,
        text=True,
        check=True,
        capture_output=True,
    )
    now, earlier, other = seeded.stdout.strip().splitlines()[-1].split()
    errors: list[str] = []
    page = browser.new_context().new_page()
    watch(page, errors)
    page.goto(kefu.base + "/console/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    expect(page.locator("#conn")).to_have_text("Online", timeout=20000)

    # The customer's earlier conversation, and not the other Li Wei's; it opens in the console.
    page.locator(f'#list-bot li[data-id="{now}"] .queue__btn').click()
    listed = page.locator("#earlier-list .earlier__open")
    expect(listed).to_have_count(1, timeout=20000)
    expect(listed.first).to_have_attribute("data-conversation", earlier)
    expect(listed.first.locator(".earlier__text")).to_have_text("My charger broke")
    listed.first.click()
    expect(page.locator("#detail-title")).to_have_text(f"Conversation {earlier[:8]}", timeout=20000)
    expect(page.locator("#log .msg--shopper .msg__body")).to_have_text(["My charger broke"], timeout=20000)

    # A label on the open conversation; the inbox filtered by it lists that conversation only.
    page.locator(f'#list-bot li[data-id="{now}"] .queue__btn').click()
    expect(page.locator("#detail-title")).to_have_text(f"Conversation {now[:8]}", timeout=20000)
    page.select_option("#ctx-label-add", label="Refund")
    expect(page.locator("#ctx-label-chips .label-chip")).to_have_text(["Refund×"], timeout=60000)
    expect(page.locator(f'#list-bot li[data-id="{now}"] .label-chip')).to_have_text(["Refund"], timeout=60000)
    page.select_option("#label-filter", label="Refund")
    filtered = page.locator("#labelview-list li")
    expect(filtered).to_have_count(1, timeout=20000)
    expect(filtered.first).to_have_attribute("data-id", now)
    expect(page.locator(f'#list-bot li[data-id="{other}"]')).to_be_hidden()
    page.select_option("#label-filter", label="VIP")
    expect(page.locator("#labelview-empty")).to_be_visible(timeout=20000)
    page.select_option("#label-filter", value="")
    expect(page.locator(f'#list-bot li[data-id="{other}"]')).to_be_visible()

    # A personal canned reply made in the console, inserted by /shortcut and Tab, filled.
    page.click("#btn-canned-manage")
    page.fill("#canned-title", "Shipping")
    page.fill("#canned-shortcut", "ship")
    page.fill("#canned-text", "Thanks {name}, order {order_number} ships today.")
    page.fill("#canned-text-zh", "{name}，订单 {order_number} 今天发货。")
    page.click("#canned-save")
    expect(page.locator("#canned-manage-list li")).to_contain_text(["/ship"], timeout=20000)
    page.click("#canned-dialog-close")
    page.click("#btn-take")
    expect(page.locator("#reply")).to_be_enabled(timeout=20000)
    page.locator("#reply").click()
    page.keyboard.type("/sh")
    expect(page.locator("#canned-suggest li")).to_have_count(1, timeout=20000)
    page.keyboard.press("Tab")
    expect(page.locator("#reply")).to_have_value("Thanks Li Wei, order KF-3001 ships today.")
    page.keyboard.press("Enter")
    expect(page.locator("#log .msg--agent .msg__body").last).to_have_text(
        "Thanks Li Wei, order KF-3001 ships today.", timeout=20000
    )
    assert errors == [], errors
