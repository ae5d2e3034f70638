"""Shopify's catalog in kefu's (issue 36, item 1), against the fake Shopify (``shopify_fake``):
``manage.py sync_products`` page by page, a removed product removed, a failed sync changing
nothing; the webhooks ``products/update``, ``products/delete`` and ``inventory_levels/update``
with good, wrong and missing signatures; a replayed delivery ignored; a stock change in the next
answer over the shopper's socket."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from store.catalog import import_catalog
from store.models import Product, ProductText, ShopifyWebhook
from store.services import product_view

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as test_shopify_adapter.py imports the fake
from shopify_fake import FakeShopify, running_fake_shopify

URL = "/api/store/shopify/webhooks"
SECRET = "shpss_fake_app_secret_0123456789"
ACTIVE = [
    "burton-custom-freestyle-151",
    "example-t-shirt",
    "filler-mug-1",
    "filler-mug-2",
    "filler-mug-3",
    "filler-mug-4",
]


@pytest.fixture
def shop(settings: Any) -> Iterator[FakeShopify]:
    with running_fake_shopify() as fake:
        settings.KEFU_SHOPIFY_SHOP = fake.base_url
        settings.KEFU_SHOPIFY_ACCESS_TOKEN = fake.token
        settings.KEFU_SHOPIFY_LOCALES = "en,zh-CN"
        settings.KEFU_SHOPIFY_WEBHOOK_SECRET = SECRET
        yield fake


def sync() -> str:
    out = StringIO()
    call_command("sync_products", stdout=out, stderr=StringIO())
    return out.getvalue()


def deliver(shop: FakeShopify, topic: str, payload: dict[str, Any], **kw: Any) -> tuple[int, dict[str, Any]]:
    """POST one delivery as Shopify makes it; ``signature``/``webhook_id`` override its headers
    (``signature=""``: no signature header at all)."""
    signature = kw.pop("signature", None)
    body, headers = shop.webhook(topic, payload, SECRET, **kw)
    if signature == "":
        del headers["X-Shopify-Hmac-Sha256"]
    elif signature is not None:
        headers["X-Shopify-Hmac-Sha256"] = signature
    response = Client().post(URL, data=body, content_type="application/json", headers=headers)
    return response.status_code, response.json()


def skus() -> list[str]:
    return sorted(Product.objects.values_list("sku", flat=True))


@pytest.mark.django_db
def test_full_sync_reads_every_page_and_writes_each_language(shop, tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text('{"sku": "OLD-1", "title": "Old Lamp", "price": 5, "currency": "USD"}\n', encoding="utf-8")
    import_catalog(path)
    out = sync()
    assert "6 products read in 2 pages: 8 created, 0 updated, 0 unchanged, 1 removed, 0 bad" in out
    pages = shop.sent("products")
    assert [p["first"] for p in pages] == [4, 4] and pages[0]["after"] is None and pages[1]["after"]
    assert skus() == ACTIVE  # the draft is not for sale; the file's product is not the shop's
    shirt = product_view("example-t-shirt", "en")
    assert shirt is not None and (shirt.title, shirt.price, shirt.currency) == (
        "Example T-Shirt",
        Decimal("19.99"),
        "USD",
    )
    assert shirt.description == "An example T-Shirt"
    assert shirt.url == "https://kefu-fake.myshopify.com/products/example-t-shirt"
    assert [(v.sku, v.label(), v.stock) for v in shirt.variants] == [
        ("example-shirt-s", "Small", 75),
        ("example-shirt-m", "Medium", 50),
    ]
    zh = product_view("example-t-shirt", "zh")
    assert zh is not None and (zh.locale, zh.title, zh.description) == ("zh-CN", "示例T恤", "一件示例T恤")
    board = product_view("burton-custom-freestyle-151", "en")
    assert board is not None and board.variants == () and board.stock == 6 and board.price == Decimal("599.00")
    assert ProductText.objects.filter(locale="zh-CN").count() == 2  # the translated ones only
    # Again: nothing changed, nothing written.
    assert "0 created, 0 updated, 8 unchanged, 0 removed" in sync()


@pytest.mark.django_db
def test_full_sync_removes_what_the_shop_deleted_and_a_failed_sync_changes_nothing(shop):
    sync()
    shop.delete_product("filler-mug-2")
    shop.set_stock("example-shirt-s", 3)
    # The second page fails: the sync says why and the catalog stays as it was.
    shop.misbehave("http_500", on="products", after=1)
    with pytest.raises(
        CommandError, match=r"sync failed, the catalog is unchanged: Shopify failed on KefuProducts \(HTTP 500\)"
    ):
        sync()
    assert skus() == ACTIVE
    shirt = product_view("example-t-shirt", "en")
    assert shirt is not None and shirt.variants[0].stock == 75
    out = sync()
    assert "5 products read in 2 pages" in out and "1 removed" in out
    assert "filler-mug-2" not in skus()
    shirt = product_view("example-t-shirt", "en")
    assert shirt is not None and shirt.variants[0].stock == 3


@pytest.mark.django_db
def test_sync_without_a_shop_says_so(settings):
    settings.KEFU_SHOPIFY_SHOP = ""
    with pytest.raises(CommandError, match="KEFU_SHOPIFY_SHOP is not set"):
        sync()


@pytest.mark.django_db
def test_products_update_with_good_wrong_and_missing_signatures(shop, caplog):
    sync()
    payload = shop.update_product("example-t-shirt", title="Example Tee", price_of={"example-shirt-m": "24.00"})
    caplog.set_level(logging.WARNING, logger="store.webhooks")
    assert deliver(shop, "products/update", payload, signature="bm90IHRoZSBzaWduYXR1cmU=") == (
        401,
        {"error": "bad signature"},
    )
    assert deliver(shop, "products/update", payload, signature="")[0] == 401
    assert [r.getMessage() for r in caplog.records if r.name == "store.webhooks"] == [
        "shopify webhook refused: wrong signature (topic 'products/update', shop 'kefu-fake.myshopify.com', from 127.0.0.1)",
        "shopify webhook refused: no signature (topic 'products/update', shop 'kefu-fake.myshopify.com', from 127.0.0.1)",
    ]
    shirt = product_view("example-t-shirt", "en")
    assert shirt is not None and shirt.title == "Example T-Shirt" and not ShopifyWebhook.objects.exists()
    assert deliver(shop, "products/update", payload) == (200, {"outcome": "applied"})
    shirt = product_view("example-t-shirt", "en")
    assert shirt is not None and shirt.title == "Example Tee"
    assert [(v.sku, v.price) for v in shirt.variants] == [
        ("example-shirt-s", Decimal("19.99")),
        ("example-shirt-m", Decimal("24.00")),
    ]
    # Drafted in Shopify: no longer for sale, so no longer in the catalog.
    payload = shop.update_product("example-t-shirt", status="DRAFT")
    assert deliver(shop, "products/update", payload) == (200, {"outcome": "applied"})
    assert "example-t-shirt" not in skus()


@pytest.mark.django_db
def test_products_delete_with_good_and_wrong_signatures(shop):
    sync()
    payload = shop.delete_product("filler-mug-3")
    assert payload == {"id": 632910395}
    asked = len(shop.requests)
    assert deliver(shop, "products/delete", payload, signature="x" * 44)[0] == 401
    assert "filler-mug-3" in skus()
    assert deliver(shop, "products/delete", payload) == (200, {"outcome": "applied"})
    assert "filler-mug-3" not in skus()
    assert len(shop.requests) == asked  # a deletion needs no read-back


@pytest.mark.django_db
def test_inventory_level_update_with_good_and_wrong_signatures(shop):
    sync()
    payload = shop.set_stock("BCF-151", 0)  # 4 -> 0 at the first location; 2 left at the second
    assert payload["inventory_item_id"] == 271878346596884015 and payload["available"] == 0
    assert deliver(shop, "inventory_levels/update", payload, signature="") == (401, {"error": "bad signature"})
    board = product_view("burton-custom-freestyle-151", "en")
    assert board is not None and board.stock == 6
    assert deliver(shop, "inventory_levels/update", payload) == (200, {"outcome": "applied"})
    board = product_view("burton-custom-freestyle-151", "en")
    assert board is not None and board.stock == 2
    assert shop.sent("inventoryItem") == [{"id": "gid://shopify/InventoryItem/271878346596884015"}]


@pytest.mark.django_db
def test_a_replayed_delivery_is_ignored(shop):
    sync()
    payload = shop.set_stock("example-shirt-m", 9)
    assert deliver(shop, "inventory_levels/update", payload, webhook_id="b54557e4-bdd9-4b37-8a5f-bf7d70bcd043") == (
        200,
        {"outcome": "applied"},
    )
    shop.set_stock("example-shirt-m", 1)  # changed since: a replay must not be what applies it
    asked = len(shop.requests)
    assert deliver(shop, "inventory_levels/update", payload, webhook_id="b54557e4-bdd9-4b37-8a5f-bf7d70bcd043") == (
        200,
        {"outcome": "replay"},
    )
    assert len(shop.requests) == asked
    shirt = product_view("example-t-shirt", "en")
    assert shirt is not None and [v.stock for v in shirt.variants] == [75, 9]
    assert list(ShopifyWebhook.objects.values_list("webhook_id", "topic")) == [
        ("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043", "inventory_levels/update")
    ]


@pytest.mark.django_db
def test_shopify_unreachable_answers_502_and_the_retry_applies(shop):
    sync()
    payload = shop.set_stock("MUG-1", 7)
    shop.misbehave("http_500", on="inventoryItem")
    body_status, body = deliver(shop, "inventory_levels/update", payload, webhook_id="retry-1")
    assert body_status == 502 and "HTTP 500" in body["error"]
    assert not ShopifyWebhook.objects.exists()
    assert deliver(shop, "inventory_levels/update", payload, webhook_id="retry-1") == (200, {"outcome": "applied"})
    mug = product_view("filler-mug-1", "en")
    assert mug is not None and mug.stock == 7


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_stock_change_reaches_the_next_answer_over_the_socket(shop, make_client, faq):
    from routing.products.index import catalog

    await database_sync_to_async(sync)()
    await database_sync_to_async(catalog.reload)()
    try:
        shopper = await make_client()
        await shopper.hello()
        await shopper.say("Is the Burton Custom Freestyle 151 in stock?")
        end = (await shopper.until("stream.end"))[-1]
        assert end["route"] == "product" and end["text"].startswith(
            "Yes, the Burton Custom Freestyle 151 is in stock (6)."
        )
        payload = shop.set_stock("BCF-151", 1)
        status, _ = await database_sync_to_async(deliver)(shop, "inventory_levels/update", payload)
        assert status == 200
        # Every process's index sees it as after an import: the catalog's fingerprint moved.
        assert await database_sync_to_async(catalog.reload_if_changed)() == {"burton-custom-freestyle-151"}
        await shopper.say("Is the Burton Custom Freestyle 151 in stock?")
        end = (await shopper.until("stream.end"))[-1]
        assert end["route"] == "product" and end["text"].startswith(
            "Yes, the Burton Custom Freestyle 151 is in stock (3)."
        )
        assert end["model"] is None and len(shop.sent("product")) == 1  # the webhook's read-back only
    finally:
        catalog.snapshot = type(catalog.snapshot)()


def test_skus_the_catalog_cannot_key_by_get_the_variant_id():
    from shopify_fake import initial_products

    from store.adapters.shopify_catalog import records_from_node

    node = dict(initial_products()[0])
    node["handle"] = "h" * 70
    node["variants"] = {
        "nodes": [
            {"id": "gid://shopify/ProductVariant/1", "sku": "AB 12", "price": "3.00", "selectedOptions": []},
            {"id": "gid://shopify/ProductVariant/2", "sku": "AB-12", "price": "2.50", "selectedOptions": []},
            {"id": "gid://shopify/ProductVariant/3", "sku": "AB-12", "price": "4.00", "selectedOptions": []},
        ]
    }
    (record,) = records_from_node(node, currency="USD", locales=("en",))
    assert record["sku"] == "h" * 45 + "-788032119674292922" and len(record["sku"]) == 64
    assert [v["sku"] for v in record["variants"]] == ["h" * 40 + "-1", "AB-12", "h" * 40 + "-3"]
    assert record["price"] == "2.50"
    assert records_from_node({**node, "status": "ARCHIVED"}, currency="USD", locales=("en",)) == []
