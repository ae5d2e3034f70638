"""Product cards in a real browser (Debian's Chromium driven by Playwright) on one live kefu
(issue 36 item 2): a product answer shows the product's card in the widget (image, title, price,
stock, link), a catalog title holding markup is shown as text, and an agent looks a product up
in the console, inserts its card into a reply and the shopper sees it.

Personas: a shopper on the demo page's widget; ``alice``, an agent in the console."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_browser import ROOT, browser, create_agent, watch  # noqa: F401  (browser: a fixture)

HOSTILE_TITLE = 'Zinnia <img src=x onerror="document.title=1"> Vase'


def import_catalog(kefu, path: Path) -> None:
    base = kefu.base  # the store's own site here: kefu serves the demo storefront
    records = [
        {
            "sku": "EMB-T",
            "title": "Ember Table Lamp",
            "description": "A brass table lamp.",
            "price": 129,
            "currency": "USD",
            "url": f"{base}/products/ember-table",
            "image": f"{base}/static/kefu/favicon.svg",
            "tags": ["lamp"],
            "attributes": {"dimmable": True},
            "stock": 14,
        },
        {
            "sku": "VASE-X",
            "title": HOSTILE_TITLE,
            "price": 30,
            "currency": "USD",
            "url": "//evil.example/pay",
            "image": "https://evil.example/x.png",
            "attributes": {"watertight": True},
            "stock": 0,
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    subprocess.run(
        [sys.executable, "manage.py", "import_products", str(path)],
        cwd=ROOT,
        env=kefu.env,
        check=True,
        capture_output=True,
    )


def test_product_cards_in_the_widget_and_an_agents_inserted_card(live_kefu, browser, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    kefu = live_kefu(env={"KEFU_PRODUCTS_POLL_S": "0.3"})
    import_catalog(kefu, tmp_path / "catalog.jsonl")
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []

    shopper = browser.new_context().new_page()
    watch(shopper, errors)
    shopper.goto(kefu.base + "/")
    shopper.click("kefu-chat >> .kefu-launcher")
    shopper.fill("kefu-chat >> #kefu-input", "Is the Ember Table Lamp in stock?")
    shopper.press("kefu-chat >> #kefu-input", "Enter")

    # The answer's card: image, title, price, stock and the product's link, beside the text.
    card = shopper.locator("kefu-chat >> .kefu-msg--bot .kefu-card")
    expect(card).to_have_count(1, timeout=30000)
    expect(card.locator(".kefu-card-title")).to_have_text("Ember Table Lamp")
    expect(card.locator(".kefu-card-price")).to_have_text("$129.00")
    expect(card.locator(".kefu-card-stock")).to_have_text("In stock (14)")
    expect(card.locator(".kefu-card-link")).to_have_attribute("href", f"{kefu.base}/products/ember-table")
    expect(card.locator(".kefu-card-img")).to_have_attribute("src", f"{kefu.base}/static/kefu/favicon.svg")
    expect(shopper.locator("kefu-chat >> .kefu-msg--bot .kefu-bubble").first).to_contain_text("Yes, the Ember Table")

    # Markup in the catalog stays text: no element made of it, no foreign image, no link.
    shopper.fill("kefu-chat >> #kefu-input", "is the Zinnia vase watertight?")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    hostile = shopper.locator("kefu-chat >> .kefu-card[data-sku='VASE-X']")
    expect(hostile).to_have_count(1, timeout=30000)
    expect(hostile.locator(".kefu-card-title")).to_have_text(HOSTILE_TITLE)
    expect(hostile.locator(".kefu-card-stock")).to_have_text("Out of stock")
    assert hostile.locator("img").count() == 0 and hostile.locator("a").count() == 0
    assert shopper.title() != "1"

    # An agent takes the conversation, looks the lamp up by SKU and inserts its card.
    agent = browser.new_context().new_page()
    watch(agent, errors)
    agent.goto(kefu.base + "/console/login/")
    agent.fill("#id_username", "alice")
    agent.fill("#id_password", "correct horse battery")
    agent.click("button[type=submit]")
    expect(agent.locator("#conn")).to_have_text("Online", timeout=20000)
    shopper.fill("kefu-chat >> #kefu-input", "can I talk to a human please")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    waiting = agent.locator("#list-waiting .queue__item")
    expect(waiting).to_have_count(1, timeout=30000)
    waiting.first.locator("button").click()
    agent.click("#btn-take")
    expect(agent.locator("#detail-status")).to_have_text("With an agent: you", timeout=20000)
    # The console shows the bot's cards too.
    expect(agent.locator("#log .msg--bot .pcard[data-sku='EMB-T']")).to_have_count(1, timeout=20000)

    agent.click("#products summary")
    agent.fill("#product-q", "emb-t")
    hit = agent.locator("#product-results .product-hit")
    expect(hit).to_have_count(1, timeout=20000)
    expect(hit.locator(".pcard__title")).to_have_text("Ember Table Lamp")
    hit.locator("button").click()
    expect(agent.locator("#reply-cards .reply-card")).to_have_count(1)
    agent.fill("#reply", "This one is in stock:")
    agent.press("#reply", "Enter")

    sent = shopper.locator("kefu-chat >> .kefu-msg--agent")
    expect(sent.locator(".kefu-card .kefu-card-title")).to_have_text("Ember Table Lamp", timeout=20000)
    expect(sent.locator(".kefu-bubble")).to_contain_text("This one is in stock:")
    expect(agent.locator("#log .msg--agent .pcard[data-sku='EMB-T']")).to_have_count(1, timeout=20000)
    expect(agent.locator("#reply-cards .reply-card")).to_have_count(0)
    assert not errors, errors
