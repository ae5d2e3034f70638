"""Shopify's catalog as kefu's catalog records: products, variants, stock and translations read
through the Admin GraphQL API, at the version the orders adapter pins (``shopify.API_VERSION``).

What is read (the ``_Q_*`` documents, field by field from the 2025-07 reference):

* ``shop { currencyCode }`` (https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Shop):
  the currency of every variant's ``price`` (a ``Money`` scalar in the shop's currency).
* ``products(first: PAGE_SIZE, after: $after, query: "status:active", sortKey: ID)``
  (https://shopify.dev/docs/api/admin-graphql/2025-07/queries/products), page after page by
  ``pageInfo { hasNextPage endCursor }``; a draft or archived product is not for sale and not in
  kefu's catalog. ``PAGE_SIZE`` (4) products with their first ``MAX_VARIANTS`` (100) variants
  each: about 4 x (2 + 100 x 2) ≈ 810 requested cost points a page, under Shopify's 1,000-point
  limit for one query (https://shopify.dev/docs/api/usage/limits).
* ``product(id:)`` (https://shopify.dev/docs/api/admin-graphql/2025-07/queries/product): one
  product, for a ``products/update`` or ``inventory_levels/update`` webhook.
* ``inventoryItem(id:) { variant { product { id } } }``
  (https://shopify.dev/docs/api/admin-graphql/2025-07/queries/inventoryItem): the product whose
  stock an ``inventory_levels/update`` webhook changed.

Each ``Product`` node (the ``KefuProduct`` fragment) gives ``id handle title description status
onlineStoreUrl tags featuredMedia { preview { image { url } } } variants(first: 100) { nodes { id
sku price inventoryQuantity selectedOptions { name value } } }`` and, for each extra language,
``translations(locale:) { key value }`` (https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Product,
https://shopify.dev/docs/apps/build/markets/manage-translated-content: keys ``title`` and
``body_html``).

Mapping (:func:`records_from_node`; see docs/products.md, "Shopify"): the product's ``sku`` is its
``handle`` (letters, digits and ``-``, what its page's address holds; cut to 64 characters with
its numeric id when longer); a variant's is its ``sku``, or ``<handle>-<numeric variant id>``
when the shop gave none, one kefu cannot key by, or one another variant of the product has. A product whose only variant is
Shopify's ``Title: Default Title`` has no variants in kefu: its price and stock are that
variant's. Otherwise the product's price is its lowest variant price and each variant keeps its
own. Stock is ``inventoryQuantity``: units available at all locations together. The first of
``locales`` is the shop's own language (the product's fields); each other one gets a record only
when its ``title`` is translated (``body_html`` translated or the original description), and the
option values stay the shop's. Addresses: ``onlineStoreUrl`` (null when the product is not on the
online store: then none) and the featured image's ``url``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from django.utils.html import strip_tags

from store.adapters.shopify import ShopifyAdapter
from store.types import StoreError

__all__ = [
    "MAX_VARIANTS",
    "PAGE_SIZE",
    "fetch_catalog",
    "fetch_product",
    "product_of_inventory_item",
    "records_from_node",
]

#: Products asked per page of a full sync (see the query-cost note above).
PAGE_SIZE = 4
#: Variants read per product (Shopify's classic limit per product is 100).
MAX_VARIANTS = 100

JSON = dict[str, Any]
_LOCALE = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$")
_SKU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,63}$")  # store.catalog's sku
_DEFAULT_TITLE = [{"name": "Title", "value": "Default Title"}]
_GID_PRODUCT = "gid://shopify/Product/"
_GID_INVENTORY_ITEM = "gid://shopify/InventoryItem/"


def _alias(locale: str) -> str:
    return "t_" + locale.replace("-", "_")


def _fragment(locales: tuple[str, ...]) -> str:
    translations = "\n  ".join(f'{_alias(loc)}: translations(locale: "{loc}") {{ key value }}' for loc in locales[1:])
    return f"""
fragment KefuProduct on Product {{
  id
  handle
  title
  description
  status
  onlineStoreUrl
  tags
  featuredMedia {{ preview {{ image {{ url }} }} }}
  variants(first: {MAX_VARIANTS}) {{
    nodes {{ id sku price inventoryQuantity selectedOptions {{ name value }} }}
  }}
  {translations}
}}
"""


def _q_products(locales: tuple[str, ...]) -> str:
    return """
query KefuProducts($first: Int!, $after: String) {
  shop { currencyCode }
  products(first: $first, after: $after, query: "status:active", sortKey: ID) {
    pageInfo { hasNextPage endCursor }
    nodes { ...KefuProduct }
  }
}
""" + _fragment(locales)


def _q_product(locales: tuple[str, ...]) -> str:
    return """
query KefuProduct($id: ID!) {
  shop { currencyCode }
  product(id: $id) { ...KefuProduct }
}
""" + _fragment(locales)


_Q_INVENTORY_ITEM = """
query KefuInventoryItem($id: ID!) {
  inventoryItem(id: $id) { id variant { id product { id } } }
}
"""


def check_locales(locales: tuple[str, ...]) -> tuple[str, ...]:
    """``locales`` if each is a language code Shopify uses (``en``, ``zh-CN``); raises
    ``StoreError("not_configured")`` otherwise (they are written into the query text)."""
    if not locales or not all(_LOCALE.match(loc) for loc in locales):
        raise StoreError("not_configured", f"KEFU_SHOPIFY_LOCALES must be language codes such as en,zh-CN: {locales!r}")
    return locales


def _numeric(gid: str) -> str:
    return gid.rsplit("/", 1)[-1].split("?", 1)[0]


def fetch_catalog(adapter: ShopifyAdapter, locales: tuple[str, ...]) -> Iterator[tuple[str, list[JSON]]]:
    """Every active product of the shop, page by page: ``(currency, product nodes)`` per page.
    Raises ``StoreError("upstream")`` as the adapter does (a page that fails ends the sync)."""
    document = _q_products(check_locales(locales))
    after: str | None = None
    while True:
        data = adapter.query("KefuProducts", document, {"first": PAGE_SIZE, "after": after})
        currency = str((data.get("shop") or {}).get("currencyCode") or "")
        connection = data.get("products") or {}
        nodes = [n for n in connection.get("nodes") or [] if isinstance(n, dict)]
        yield currency, nodes
        page = connection.get("pageInfo") or {}
        if not page.get("hasNextPage"):
            return
        cursor = page.get("endCursor")
        if not isinstance(cursor, str) or not cursor or cursor == after:
            raise StoreError("upstream", "Shopify said more products follow but gave no new cursor")
        after = cursor


def fetch_product(adapter: ShopifyAdapter, gid: str, locales: tuple[str, ...]) -> tuple[str, JSON | None]:
    """``(currency, the Product node)`` of ``gid`` (``"gid://shopify/Product/1"``); the node is
    None when Shopify has no such product."""
    data = adapter.query("KefuProduct", _q_product(check_locales(locales)), {"id": gid})
    node = data.get("product")
    return str((data.get("shop") or {}).get("currencyCode") or ""), node if isinstance(node, dict) else None


def product_of_inventory_item(adapter: ShopifyAdapter, inventory_item_id: int | str) -> str | None:
    """The gid of the product whose variant stocks ``inventory_item_id`` (a webhook's numeric
    id, or a gid); None when Shopify has no such item or it belongs to no variant."""
    gid = str(inventory_item_id)
    if not gid.startswith(_GID_INVENTORY_ITEM):
        gid = _GID_INVENTORY_ITEM + gid
    data = adapter.query("KefuInventoryItem", _Q_INVENTORY_ITEM, {"id": gid})
    item = data.get("inventoryItem")
    variant = item.get("variant") if isinstance(item, Mapping) else None
    product = variant.get("product") if isinstance(variant, Mapping) else None
    pid = product.get("id") if isinstance(product, Mapping) else None
    return pid if isinstance(pid, str) and pid.startswith(_GID_PRODUCT) else None


def _product_sku(node: Mapping[str, Any]) -> str:
    """The product's ``handle``; one longer than a catalog sku allows is cut and given the
    product's numeric id (still unique)."""
    handle = str(node.get("handle") or "")
    if len(handle) <= 64:
        return handle
    suffix = "-" + _numeric(str(node.get("id") or ""))
    return handle[: 64 - len(suffix)].rstrip("-") + suffix


def _variant_sku(handle: str, node: Mapping[str, Any], taken: set[str]) -> str:
    """The variant's ``sku``, or ``<handle>-<numeric variant id>`` when the shop gave none, one
    the catalog cannot key by (spaces, other signs, over 64 characters), or one an earlier
    variant of the product has (Shopify does not require SKUs to be unique)."""
    sku = str(node.get("sku") or "").strip()
    if not _SKU.match(sku) or sku in taken:
        sku = f"{handle[:40]}-{_numeric(str(node.get('id') or ''))}"
    taken.add(sku)
    return sku


def records_from_node(node: Mapping[str, Any], *, currency: str, locales: tuple[str, ...]) -> list[JSON]:
    """A Shopify ``Product`` node as raw catalog records (``store.catalog.validate``'s input),
    one per language of ``locales`` it has (see the module docstring). A node that is not
    ``ACTIVE`` gives ``[]``."""
    if str(node.get("status") or "").upper() != "ACTIVE":
        return []
    handle = _product_sku(node)
    variants = [v for v in (node.get("variants") or {}).get("nodes") or [] if isinstance(v, dict)]
    taken: set[str] = set()
    prices = [str(v.get("price")) for v in variants if v.get("price") not in (None, "")]
    lowest = min(prices, key=float) if prices else None
    base: JSON = {
        "sku": handle,
        "price": lowest,
        "currency": currency,
        "url": node.get("onlineStoreUrl") or "",
        "tags": [t for t in node.get("tags") or [] if isinstance(t, str)],
    }
    media = node.get("featuredMedia") or {}
    image = ((media.get("preview") or {}).get("image") or {}).get("url") if isinstance(media, Mapping) else None
    base["image"] = image or ""
    if len(variants) == 1 and variants[0].get("selectedOptions") == _DEFAULT_TITLE:
        base["stock"] = variants[0].get("inventoryQuantity")
    else:
        base["variants"] = [
            {
                "sku": _variant_sku(handle, v, taken),
                "options": {
                    str(o.get("name")): str(o.get("value"))
                    for o in v.get("selectedOptions") or []
                    if isinstance(o, dict)
                },
                "price": v.get("price"),
                "stock": v.get("inventoryQuantity"),
            }
            for v in variants
        ]
    description = str(node.get("description") or "")
    records = [{**base, "locale": locales[0], "title": node.get("title"), "description": description}]
    for loc in locales[1:]:
        texts = {
            str(t.get("key")): str(t.get("value") or "") for t in node.get(_alias(loc)) or [] if isinstance(t, dict)
        }
        if texts.get("title", "").strip():
            body = strip_tags(texts["body_html"]).strip() if texts.get("body_html") else description
            records.append({**base, "locale": loc, "title": texts["title"], "description": body})
    return records
