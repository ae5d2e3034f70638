"""Shopify's catalog kept in kefu's: the full sync (``manage.py sync_products``) and the webhooks
(``products/update``, ``products/delete``, ``inventory_levels/update``; the view is
``store.webhooks``). Both write the local catalog of ``store.catalog`` the way ``import_products``
does, so the router's catalog index in every process sees the change by its poller (the catalog's
fingerprint moves), and a shopper's answer reads price and stock from the catalog, never from
Shopify (docs/products.md, "Shopify").

A webhook is a notice, not the data: ``products/update`` and ``inventory_levels/update`` make kefu
read the product again (``product(id:)``; for stock, ``inventoryItem(id:)`` first names the
product), so deliveries that arrive late or out of order still leave the product as Shopify has
it now, and one mapping (``store.adapters.shopify_catalog.records_from_node``) serves both paths.
A delivery is applied once: its ``X-Shopify-Webhook-Id`` is stored (``ShopifyWebhook``) in the
transaction that applies it, so a replay or Shopify's retry of an applied delivery is ignored in
every process and after a restart, and a delivery that failed (Shopify unreachable, 5xx answered)
is applied when Shopify retries it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import catalog
from .adapters.shopify import ShopifyAdapter
from .adapters.shopify_catalog import fetch_catalog, fetch_product, product_of_inventory_item, records_from_node
from .models import ShopifyWebhook
from .types import StoreError

log = logging.getLogger(__name__)

__all__ = ["TOPICS", "SyncResult", "apply_webhook", "catalog_adapter", "full_sync", "locales", "seen"]

#: The webhook topics kefu subscribes to (https://shopify.dev/docs/api/webhooks?reference=toml).
TOPICS = ("products/update", "products/delete", "inventory_levels/update")
_GID_PRODUCT = "gid://shopify/Product/"


@dataclass
class SyncResult:
    """What a full sync did: ``products`` read from Shopify (``pages`` of them); catalog
    records ``created``/``updated``/``unchanged`` (one per product and language); ``removed``:
    the skus deleted (gone from the shop, or no longer active); ``errors``: one line per product
    that could not be written (its old row, if any, is kept); ``changed``: skus whose data
    changed."""

    products: int = 0
    pages: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)


def locales() -> tuple[str, ...]:
    """``KEFU_SHOPIFY_LOCALES``: the shop's own language first, then its translations read."""
    return tuple(loc.strip() for loc in settings.KEFU_SHOPIFY_LOCALES.split(",") if loc.strip())


#: Seconds a webhook's read-back may take: Shopify counts a delivery unanswered after 5 s.
WEBHOOK_TIMEOUT_S = 4.0


def catalog_adapter(timeout_s: float | None = None) -> ShopifyAdapter:
    """A Shopify client for the catalog (``KEFU_SHOPIFY_SHOP``, ``KEFU_SHOPIFY_ACCESS_TOKEN``;
    ``timeout_s`` a request, ``KEFU_SHOPIFY_SYNC_TIMEOUT_S`` by default: the sync is not on a
    shopper's path). Raises ``StoreError("not_configured")``."""
    if not settings.KEFU_SHOPIFY_SHOP:
        raise StoreError("not_configured", "KEFU_SHOPIFY_SHOP is not set: which shop's catalog?")
    return ShopifyAdapter(
        shop_url=settings.KEFU_SHOPIFY_SHOP,
        access_token=settings.KEFU_SHOPIFY_ACCESS_TOKEN,
        timeout_s=timeout_s or settings.KEFU_SHOPIFY_SYNC_TIMEOUT_S,
    )


def _records(node: dict[str, Any], currency: str, langs: tuple[str, ...]) -> list[catalog.ProductRecord]:
    """``node``'s valid catalog records; raises ``BadProductRecord`` (line 0) naming the field."""
    return [catalog.validate(raw, 0) for raw in records_from_node(node, currency=currency, locales=langs)]


def _label(node: dict[str, Any]) -> str:
    return f"product {node.get('id')} ({node.get('handle') or 'no handle'})"


def full_sync(adapter: ShopifyAdapter | None = None) -> SyncResult:
    """Read every active product of the shop (all pages), then make the local catalog the shop's
    in one transaction: products written, the ones the shop no longer has (file-imported ones
    included) deleted. A product that cannot be written is reported in ``errors`` and its old
    row kept. Raises ``StoreError`` (``upstream``: Shopify failed on a page; ``not_configured``)
    before anything is written: a failed sync leaves the catalog as it was."""
    langs = locales()
    own = adapter is None
    client = adapter or catalog_adapter()
    result = SyncResult()
    read: list[tuple[str, str, dict[str, Any]]] = []
    try:
        for currency, nodes in fetch_catalog(client, langs):
            result.pages += 1
            read.extend((currency, str(n.get("id") or ""), n) for n in nodes)
    finally:
        if own:
            client.close()
    result.products = len(read)
    imported = catalog.CatalogImportResult()
    keep: set[str] = set()
    with transaction.atomic():
        for currency, gid, node in read:
            try:
                records = _records(node, currency, langs)
                if records:
                    keep.add(gid)
                    with transaction.atomic():
                        catalog.write_product(records, shopify_id=gid, result=imported)
            except catalog.BadProductRecord as e:
                keep.add(gid)  # a product that cannot be written keeps its old row
                result.errors.append(f"{_label(node)}: {e.reason}")
        result.removed = catalog.delete_products(keep_shopify_ids={gid for gid in keep if gid})
    result.created, result.updated, result.unchanged = imported.created, imported.updated, imported.unchanged
    result.changed = imported.changed | result.removed
    return result


def _remember(webhook_id: str, topic: str) -> bool:
    """Store ``webhook_id`` (inside the caller's transaction); False when it was already
    stored. Deletes the ids older than ``KEFU_SHOPIFY_WEBHOOK_KEEP_S``."""
    cutoff = timezone.now() - timedelta(seconds=settings.KEFU_SHOPIFY_WEBHOOK_KEEP_S)
    ShopifyWebhook.objects.filter(received_at__lt=cutoff).delete()
    try:
        with transaction.atomic():
            ShopifyWebhook.objects.create(webhook_id=webhook_id[:64], topic=topic[:64])
    except IntegrityError:
        return False
    return True


def seen(webhook_id: str) -> bool:
    """Whether the delivery ``webhook_id`` was applied already (one query)."""
    return ShopifyWebhook.objects.filter(webhook_id=webhook_id[:64]).exists()


def apply_webhook(topic: str, payload: dict[str, Any], webhook_id: str, adapter: ShopifyAdapter | None = None) -> str:
    """Apply one verified delivery (``payload``: Shopify's JSON body) to the catalog. Returns
    ``applied``, ``replay`` (its id was applied before: nothing done) or ``ignored`` (a topic
    kefu does not follow, or a payload without the id it needs). Raises ``StoreError`` when
    Shopify could not be read (nothing stored: Shopify's retry applies it)."""
    if topic not in TOPICS:
        return "ignored"
    if seen(webhook_id):
        return "replay"
    langs = locales()
    gid = ""
    node: dict[str, Any] | None = None
    currency = ""
    if topic == "products/delete":
        gid = _GID_PRODUCT + str(payload.get("id") or "")
    else:
        own = adapter is None
        client = adapter or catalog_adapter(min(WEBHOOK_TIMEOUT_S, settings.KEFU_SHOPIFY_SYNC_TIMEOUT_S))
        try:
            if topic == "products/update":
                gid = str(payload.get("admin_graphql_api_id") or "") or _GID_PRODUCT + str(payload.get("id") or "")
            else:
                found = product_of_inventory_item(client, payload.get("inventory_item_id") or "")
                gid = found or ""
            if gid and gid != _GID_PRODUCT:
                currency, node = fetch_product(client, gid, langs)
        finally:
            if own:
                client.close()
    if not gid or gid == _GID_PRODUCT:
        return "ignored"
    with transaction.atomic():
        if not _remember(webhook_id, topic):
            return "replay"
        records = _records(node, currency, langs) if node is not None else []
        if records:
            catalog.write_product(records, shopify_id=gid, result=catalog.CatalogImportResult())
        else:  # deleted, drafted or archived: no longer for sale
            catalog.delete_products(shopify_id=gid)
    return "applied"
