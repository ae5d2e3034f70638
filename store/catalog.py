"""The store's product catalog: importing it from a file and reading it (through ``store.services``).

File format (``import_products``, docs/products.md): JSONL (one object a line) or CSV (a header
row), UTF-8, a record per product and language: ``sku``, ``title``, ``price``, ``currency``
(required), ``description``, ``url``, ``locale`` (default ``en``), ``tags`` (a list of strings),
``image``, ``attributes`` (an object: ``{"material": "oak"}``), ``variants`` (``[{"sku",
"options": {"size": "M"}, "price"?, "stock"}]``) and ``stock`` (a product without variants). In
CSV, ``tags``, ``attributes`` and ``variants`` are JSON (``tags`` may also be comma-separated).
Unknown fields are ignored.

Records are keyed by (``sku``, ``locale``): importing again updates them. ``price``,
``currency``, ``stock`` and ``variants`` belong to the ``sku`` and are shared by its languages
(the last record read sets them); each language keeps its own title, texts, tags, attributes and
option names. A record that lists variants replaces the product's variants with that list. A bad
record is reported with its line number and the others are still loaded.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import Count, Max, Q

from .models import Product, ProductText, ProductVariant
from .types import CatalogError, ProductNames, ProductVariantView, ProductView

LOCALE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z0-9]{2,8})?$")
SKU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,63}$")
CURRENCY = re.compile(r"^[A-Z]{3}$")
MAX_TEXT = 20_000
MAX_VARIANTS = 200


class BadProductRecord(ValueError):
    """A record that cannot be imported; ``line`` is its 1-based line number in the file."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass
class VariantRecord:
    sku: str
    options: dict[str, str]
    price: Decimal | None
    stock: int


@dataclass
class ProductRecord:
    """One valid record of a catalog file (see the module docstring)."""

    line: int
    sku: str
    locale: str
    title: str
    price: Decimal
    currency: str
    description: str = ""
    url: str = ""
    image: str = ""
    tags: list[str] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    variants: list[VariantRecord] | None = None
    stock: int | None = None


@dataclass
class CatalogImportResult:
    """What an import did: records ``created``, ``updated`` and ``unchanged``; product texts
    ``pruned``; ``errors`` (one per bad record); ``changed``: the skus whose data changed (cached
    answers about them are stale)."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    pruned: int = 0
    errors: list[BadProductRecord] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)
    prune_skipped: bool = False


def _json_field(raw: dict[str, Any], name: str, line: int) -> Any:
    value = raw.get(name)
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            raise BadProductRecord(line, f"'{name}' is not valid JSON") from None
    return value


def _text(raw: dict[str, Any], name: str, line: int, *, required: bool = False, limit: int = MAX_TEXT) -> str:
    value = raw.get(name)
    if value is None or value == "":
        if required:
            raise BadProductRecord(line, f"'{name}' is missing or blank")
        return ""
    if not isinstance(value, str):
        raise BadProductRecord(line, f"'{name}' must be a string, not {type(value).__name__}")
    if required and not value.strip():
        raise BadProductRecord(line, f"'{name}' is missing or blank")
    if len(value) > limit:
        raise BadProductRecord(line, f"'{name}' is longer than {limit} characters")
    return value.strip()


def _money(value: object, name: str, line: int) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadProductRecord(line, f"'{name}' must be a number such as 129 or \"129.00\"")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise BadProductRecord(line, f"'{name}' {value!r} is not a number") from None
    if not amount.is_finite() or amount < 0 or amount >= Decimal("1e10"):
        raise BadProductRecord(line, f"'{name}' {value!r} must be a price of 0 or more")
    return amount.quantize(Decimal("0.01"))


def _count(value: object, name: str, line: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadProductRecord(line, f"'{name}' must be a whole number of 0 or more")
    return value


def _variants(value: object, line: int) -> list[VariantRecord]:
    if not isinstance(value, list):
        raise BadProductRecord(line, "'variants' must be a list of {sku, options, price?, stock}")
    if len(value) > MAX_VARIANTS:
        raise BadProductRecord(line, f"'variants' has more than {MAX_VARIANTS} variants")
    out: list[VariantRecord] = []
    seen: set[str] = set()
    for i, v in enumerate(value, 1):
        if not isinstance(v, dict):
            raise BadProductRecord(line, f"variant {i} must be an object with 'sku', 'options' and 'stock'")
        sku = v.get("sku")
        if not isinstance(sku, str) or not SKU.match(sku.strip()):
            raise BadProductRecord(line, f"variant {i}: 'sku' must be letters, digits, '.', '_', '-' or '/'")
        sku = sku.strip()
        if sku in seen:
            raise BadProductRecord(line, f"variant {i}: sku {sku!r} is listed twice")
        seen.add(sku)
        options = v.get("options") or {}
        if not isinstance(options, dict) or not all(
            isinstance(k, str) and isinstance(o, (str, int, float)) and not isinstance(o, bool)
            for k, o in options.items()
        ):
            raise BadProductRecord(line, f"variant {i}: 'options' must be an object of names to values")
        if "stock" not in v:
            raise BadProductRecord(line, f"variant {i}: 'stock' is missing")
        price = _money(v["price"], f"variant {i} price", line) if v.get("price") not in (None, "") else None
        out.append(
            VariantRecord(
                sku=sku,
                options={str(k).strip(): str(o).strip() for k, o in options.items()},
                price=price,
                stock=_count(v["stock"], f"variant {i} stock", line),
            )
        )
    return out


def validate(raw: object, line: int) -> ProductRecord:
    """One raw record (a dict) as a ``ProductRecord``; raises ``BadProductRecord`` naming what is
    wrong (see the module docstring for the fields)."""
    if not isinstance(raw, dict):
        raise BadProductRecord(line, "a record must be an object with 'sku', 'title', 'price' and 'currency'")
    sku = _text(raw, "sku", line, required=True, limit=64)
    if not SKU.match(sku):
        raise BadProductRecord(line, f"'sku' {sku!r} must be letters, digits, '.', '_', '-' or '/' (at most 64)")
    title = _text(raw, "title", line, required=True, limit=300)
    if raw.get("price") in (None, ""):
        raise BadProductRecord(line, "'price' is missing")
    price = _money(raw.get("price"), "price", line)
    currency = _text(raw, "currency", line, required=True, limit=3).upper()
    if not CURRENCY.match(currency):
        raise BadProductRecord(line, f"'currency' {currency!r} is not an ISO 4217 code such as 'USD'")
    locale = raw.get("locale") or "en"
    if not isinstance(locale, str) or not LOCALE.match(locale):
        raise BadProductRecord(line, f"'locale' {locale!r} is not a language code such as 'en' or 'zh'")
    tags = _json_field(raw, "tags", line) or []
    if isinstance(tags, str):
        tags = [t for t in tags.split(",")]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise BadProductRecord(line, "'tags' must be a list of strings")
    attributes = _json_field(raw, "attributes", line) or {}
    if not isinstance(attributes, dict) or not all(isinstance(k, str) and k.strip() for k in attributes):
        raise BadProductRecord(line, '\'attributes\' must be an object such as {"material": "oak"}')
    for k, v in attributes.items():
        ok = isinstance(v, (str, int, float, bool)) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
        if not ok:
            raise BadProductRecord(line, f"attribute {k!r} must be text, a number, true/false or a list of text")
    variants_raw = _json_field(raw, "variants", line)
    variants = _variants(variants_raw, line) if variants_raw not in (None, "", []) else None
    stock = _count(raw["stock"], "stock", line) if raw.get("stock") not in (None, "") else None
    url, image = _text(raw, "url", line, limit=500), _text(raw, "image", line, limit=500)
    for name, value in (("url", url), ("image", image)):
        if value and not re.match(r"^(https?://|/)", value):
            raise BadProductRecord(line, f"'{name}' must be an http(s) address or a path starting with '/'")
    return ProductRecord(
        line=line,
        sku=sku,
        locale=locale.replace("_", "-"),
        title=title,
        price=price,
        currency=currency,
        description=_text(raw, "description", line),
        url=url,
        image=image,
        tags=[t.strip() for t in tags if t.strip()],
        attributes={k.strip(): v for k, v in attributes.items()},
        variants=variants,
        stock=stock,
    )


def read_records(path: Path) -> Iterator[tuple[int, object]]:
    """Yield ``(line, raw record)`` from a ``.csv`` file (header row) or a JSONL file (one object
    a line, blank lines skipped). A line that is not UTF-8 or not JSON yields a
    ``BadProductRecord`` as its record. Raises ``CatalogError`` (``invalid``) for a file that
    cannot be read, or a CSV file that is not UTF-8 (naming the line)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CatalogError("invalid", f"{path}: cannot be read ({e.strerror or e})") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if path.suffix.lower() != ".csv":
        for n, raw_line in enumerate(data.split(b"\n"), 1):
            try:
                line = raw_line.decode("utf-8").rstrip("\r")
            except UnicodeDecodeError as e:
                yield n, BadProductRecord(n, f"not UTF-8 text ({e.reason} at byte {e.start} of the line)")
                continue
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except ValueError as e:
                yield n, BadProductRecord(n, f"not valid JSON ({getattr(e, 'msg', e)})")
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_no = data[: e.start].count(b"\n") + 1
        raise CatalogError("invalid", f"{path}: not UTF-8 text on line {line_no}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    start = 2
    for row in reader:
        yield start, {k: v for k, v in row.items() if k is not None}
        start = reader.line_num + 1


def _texts_state(t: ProductText) -> tuple[object, ...]:
    return (t.title, t.description, t.url, t.image, t.tags, t.attributes, t.options)


def _write(record: ProductRecord, result: CatalogImportResult) -> None:
    """Create or update ``record``'s product, text and variants (inside the caller's savepoint)."""
    product = Product.objects.filter(sku=record.sku).first()
    changed = False
    if product is None:
        product = Product.objects.create(
            sku=record.sku, price=record.price, currency=record.currency, stock=record.stock
        )
        changed = True
    elif (product.price, product.currency, product.stock) != (record.price, record.currency, record.stock):
        product.price, product.currency, product.stock = record.price, record.currency, record.stock
        changed = True
    options: dict[str, dict[str, str]] = {}
    if record.variants is not None:
        taken = dict(
            ProductVariant.objects.filter(sku__in=[v.sku for v in record.variants])
            .exclude(product=product)
            .values_list("sku", "product__sku")
        )
        if taken:
            sku, other = next(iter(taken.items()))
            raise BadProductRecord(record.line, f"variant sku {sku!r} already belongs to product {other!r}")
        existing = {v.sku: v for v in ProductVariant.objects.filter(product=product)}
        for position, v in enumerate(record.variants):
            options[v.sku] = v.options
            row = existing.pop(v.sku, None)
            if row is None:
                ProductVariant.objects.create(
                    product=product, sku=v.sku, options=v.options, price=v.price, stock=v.stock, position=position
                )
                changed = True
                continue
            # The shared option names follow English (or the first language a variant came in).
            shared = v.options if record.locale.startswith("en") or not row.options else row.options
            if (row.options, row.price, row.stock, row.position) != (shared, v.price, v.stock, position):
                row.options, row.price, row.stock, row.position = shared, v.price, v.stock, position
                row.save(update_fields=["options", "price", "stock", "position"])
                changed = True
        if existing:
            ProductVariant.objects.filter(pk__in=[r.pk for r in existing.values()]).delete()
            changed = True
    text = ProductText.objects.filter(product=product, locale=record.locale).first()
    wanted = (
        record.title,
        record.description,
        record.url,
        record.image,
        record.tags,
        record.attributes,
        options if record.variants is not None else (text.options if text is not None else {}),
    )
    if text is None:
        ProductText.objects.create(
            product=product,
            locale=record.locale,
            title=wanted[0],
            description=wanted[1],
            url=wanted[2],
            image=wanted[3],
            tags=wanted[4],
            attributes=wanted[5],
            options=wanted[6],
        )
        result.created += 1
        changed = True
    elif _texts_state(text) != wanted:
        (text.title, text.description, text.url, text.image, text.tags, text.attributes, text.options) = wanted
        text.save()
        result.updated += 1
        changed = True
    else:
        result.unchanged += 1
    if changed:
        product.save()  # touches updated_at: the router's catalog index polls it
        result.changed.add(record.sku)


def import_catalog(path: Path, *, prune: bool = False) -> CatalogImportResult:
    """Load the catalog file at ``path`` (see the module docstring). Each record is written in
    its own savepoint: a bad one is reported in ``errors`` with its line, and the others are
    kept. ``prune``: afterwards, delete the products (and languages of products) the file does
    not hold; skipped when any record was bad (``prune_skipped``), so that a typo never deletes
    a product. Raises ``CatalogError`` for a file that cannot be read at all."""
    result = CatalogImportResult()
    seen: set[tuple[str, str]] = set()
    for line, raw in read_records(path):
        try:
            if isinstance(raw, BadProductRecord):
                raise raw
            record = validate(raw, line)
            with transaction.atomic():
                _write(record, result)
            seen.add((record.sku, record.locale))
        except BadProductRecord as e:
            result.errors.append(e)
    if prune and result.errors:
        result.prune_skipped = True
    elif prune:
        with transaction.atomic():
            stale = [t for t in ProductText.objects.select_related("product") if (t.product.sku, t.locale) not in seen]
            for t in stale:
                result.changed.add(t.product.sku)
            ProductText.objects.filter(pk__in=[t.pk for t in stale]).delete()
            result.pruned = len(stale)
            Product.objects.annotate(n=Count("texts")).filter(n=0).delete()
            # A product that lost a language only: its update time moves, for the poller.
            for p in Product.objects.filter(sku__in={t.product.sku for t in stale}):
                p.save()
    return result


def write_product(records: list[ProductRecord], *, shopify_id: str, result: CatalogImportResult) -> None:
    """Make the catalog's product ``shopify_id`` exactly ``records`` (its languages; all of one
    ``sku``), inside the caller's transaction: a product whose ``handle`` changed keeps its row
    under the new ``sku``, languages not among ``records`` are deleted, and so are the variants
    when the records list none. Raises ``BadProductRecord`` (nothing written by it then, when the
    caller holds a savepoint)."""
    sku = records[0].sku
    renamed = Product.objects.filter(shopify_id=shopify_id).exclude(sku=sku).first()
    if renamed is not None:
        if Product.objects.filter(sku=sku).exists():
            raise BadProductRecord(records[0].line, f"sku {sku!r} already belongs to another product")
        result.changed.add(renamed.sku)
        renamed.sku = sku
        renamed.save()
    for record in records:
        _write(record, result)
    product = Product.objects.get(sku=sku)
    changed = product.shopify_id != shopify_id
    product.shopify_id = shopify_id
    if records[0].variants is None and ProductVariant.objects.filter(product=product).delete()[0]:
        changed = True
    stale = ProductText.objects.filter(product=product).exclude(locale__in=[r.locale for r in records])
    pruned = stale.delete()[0]
    result.pruned += pruned
    if changed or pruned:
        product.save()  # touches updated_at: the router's catalog index polls it
        result.changed.add(sku)


def delete_products(*, keep_shopify_ids: set[str] | None = None, shopify_id: str = "") -> set[str]:
    """Delete the product ``shopify_id``, or (``keep_shopify_ids`` given) every product whose
    Shopify id is not among them, file-imported ones included (a full sync makes the catalog the
    shop's). The deleted skus."""
    if keep_shopify_ids is not None:
        doomed = Product.objects.exclude(shopify_id__in=keep_shopify_ids)
    else:
        doomed = Product.objects.filter(shopify_id=shopify_id) if shopify_id else Product.objects.none()
    skus = set(doomed.values_list("sku", flat=True))
    doomed.delete()
    return skus


def catalog_fingerprint() -> tuple[int, int, str]:
    """``(products, texts, latest update)``: changes whenever an import changed anything (one query
    each for the two counts' aggregate)."""
    agg = Product.objects.aggregate(n=Count("id", distinct=True), t=Count("texts"), latest=Max("updated_at"))
    return int(agg["n"] or 0), int(agg["t"] or 0), str(agg["latest"] or "")


def catalog_names() -> list[ProductNames]:
    """Every product's names (titles, tags, variant skus and option values in every language),
    for the router's catalog index. Three queries."""
    products = list(Product.objects.prefetch_related("texts", "variants"))
    out = []
    for p in products:
        texts = list(p.texts.all())
        variants = list(p.variants.all())
        options: dict[str, tuple[str, ...]] = {}
        for v in variants:
            values = [str(o) for o in v.options.values()]
            for t in texts:
                values.extend(str(o) for o in (t.options.get(v.sku) or {}).values())
            options[v.sku] = tuple(dict.fromkeys(values))
        out.append(
            ProductNames(
                sku=p.sku,
                titles={t.locale: t.title for t in texts},
                tags=tuple(dict.fromkeys(tag for t in texts for tag in t.tags)),
                variant_skus=tuple(v.sku for v in variants),
                options=options,
                updated=p.updated_at.isoformat(),
                attribute_keys=tuple(dict.fromkeys(k for t in texts for k in t.attributes)),
            )
        )
    return out


def product_view(sku: str, locale: str) -> ProductView | None:
    """The product ``sku`` in ``locale`` (its texts in that language, else English, else any), read
    fresh: price and stock as the latest import left them. None when the catalog has no such
    product. Two queries."""
    texts = list(ProductText.objects.filter(product__sku=sku).select_related("product"))
    if not texts:
        return None
    by_locale = {t.locale: t for t in texts}
    lang = locale.split("-")[0]
    text = (
        by_locale.get(locale)
        or next((t for t in texts if t.locale.split("-")[0] == lang), None)
        or by_locale.get("en")
        or texts[0]
    )
    product = text.product
    variants = tuple(
        ProductVariantView(
            sku=v.sku,
            options={str(k): str(o) for k, o in (text.options.get(v.sku) or v.options).items()},
            price=v.price if v.price is not None else product.price,
            stock=v.stock,
        )
        for v in ProductVariant.objects.filter(product=product)
    )
    return ProductView(
        sku=product.sku,
        locale=text.locale,
        title=text.title,
        description=text.description,
        url=text.url,
        image=text.image,
        tags=tuple(text.tags),
        attributes=dict(text.attributes),
        price=product.price,
        currency=product.currency,
        stock=product.stock,
        variants=variants,
    )


def product_search(text: str, locale: str, *, limit: int = 8) -> list[ProductView]:
    """Products whose SKU (or a variant's) starts with ``text`` or whose title in any language
    holds it (case-insensitive), for an agent looking a product up (issue 36): exact SKU first,
    then by title, each in ``locale`` (:func:`product_view`). [] for a blank ``text``. Two queries
    plus two a product shown (at most ``limit``)."""
    q = " ".join(text.split())[:100]
    if not q:
        return []
    skus = list(
        Product.objects.filter(
            Q(sku__iexact=q) | Q(sku__istartswith=q) | Q(variants__sku__istartswith=q) | Q(texts__title__icontains=q)
        )
        .distinct()
        .order_by("sku")
        .values_list("sku", flat=True)[: limit * 2]
    )
    skus.sort(key=lambda s: (s.lower() != q.lower(), not s.lower().startswith(q.lower()), s))
    views = (product_view(s, locale) for s in skus[:limit])
    return [v for v in views if v is not None]


def catalog_empty() -> bool:
    """Whether the catalog holds no product (one query)."""
    return not Product.objects.exists()
