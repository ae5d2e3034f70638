"""``manage.py import_products``: the catalog file format of ../shared/CONTRACT.md ("Products")."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from store.models import Product, ProductText, ProductVariant
from store.services import catalog_names, product_view

pytestmark = pytest.mark.django_db

THROW_EN = {
    "sku": "T-1",
    "title": "Loom Wool Throw",
    "description": "Merino.",
    "price": 145,
    "currency": "USD",
    "url": "https://shop.example/throw",
    "tags": ["throw"],
    "attributes": {"material": "merino wool"},
    "variants": [
        {"sku": "T-1-GRY", "options": {"colour": "grey"}, "stock": 2},
        {"sku": "T-1-OAT", "options": {"colour": "oat"}, "price": "150.00", "stock": 0},
    ],
}
THROW_ZH = {
    **THROW_EN,
    "locale": "zh",
    "title": "织机羊毛盖毯",
    "attributes": {"material": "美利奴羊毛"},
    "variants": [
        {"sku": "T-1-GRY", "options": {"colour": "灰色"}, "stock": 2},
        {"sku": "T-1-OAT", "options": {"colour": "燕麦色"}, "price": "150.00", "stock": 0},
    ],
}
MUG = {"sku": "M-1", "title": "Morning Mug", "description": "", "price": "21", "currency": "usd", "url": "", "stock": 9}


def jsonl(tmp_path: Path, *records: object, name: str = "c.jsonl") -> Path:
    path = tmp_path / name
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(path: Path, *args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("import_products", str(path), *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_bad_line_is_named_and_the_rest_loaded(tmp_path):
    path = jsonl(
        tmp_path,
        THROW_EN,
        {**MUG, "price": "cheap"},
        "{not json",
        {**MUG, "sku": "M-2", "variants": [{"sku": "M-2-A", "options": {}}]},
        MUG,
    )
    code, out, err = run(path)
    assert code == 1
    assert "line 2: 'price' 'cheap' is not a number" in err
    assert "line 3: not valid JSON" in err
    assert "line 4: variant 1: 'stock' is missing" in err
    assert "2 created, 0 updated, 0 unchanged, 3 bad" in out
    assert sorted(Product.objects.values_list("sku", flat=True)) == ["M-1", "T-1"]
    mug = product_view("M-1", "en")
    assert mug is not None and mug.price == Decimal("21.00") and mug.currency == "USD" and mug.stock == 9


def test_reimport_updates_by_sku_and_locale_and_stock_is_shared_by_languages(tmp_path):
    assert run(jsonl(tmp_path, THROW_EN, THROW_ZH))[0] == 0
    assert ProductText.objects.count() == 2 and ProductVariant.objects.count() == 2
    zh = product_view("T-1", "zh")
    assert zh is not None and zh.title == "织机羊毛盖毯"
    assert [(v.label(), v.stock, v.price) for v in zh.variants] == [
        ("灰色", 2, Decimal("145.00")),
        ("燕麦色", 0, Decimal("150.00")),
    ]
    restock = {**THROW_EN, "title": "Loom Wool Throw II", "variants": [{**THROW_EN["variants"][1], "stock": 12}]}
    code, out, _ = run(jsonl(tmp_path, restock, name="restock.jsonl"))
    assert code == 0 and "0 created, 1 updated" in out
    # Both languages see the English record's new stock, and the variant it dropped is gone.
    for locale, title, label in (("en", "Loom Wool Throw II", "oat"), ("zh", "织机羊毛盖毯", "燕麦色")):
        view = product_view("T-1", locale)
        assert view is not None and view.title == title
        assert [(v.sku, v.label(), v.stock) for v in view.variants] == [("T-1-OAT", label, 12)]
    assert ProductText.objects.count() == 2


def test_csv_with_json_columns(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text(
        "sku,title,description,price,currency,url,locale,tags,attributes,variants\n"
        'C-1,Indigo Cushion,Cotton,48,EUR,,en,"cushion, pillow","{""material"": ""cotton""}",'
        '"[{""sku"": ""C-1-50"", ""options"": {""size"": ""50 cm""}, ""stock"": 3}]"\n'
        "C-2,,x,1,EUR,,en,,,\n",
        encoding="utf-8",
    )
    code, out, err = run(path)
    assert code == 1 and "line 3: 'title' is missing or blank" in err
    view = product_view("C-1", "en")
    assert view is not None and view.tags == ("cushion", "pillow") and view.attributes == {"material": "cotton"}
    assert [(v.label(), v.stock) for v in view.variants] == [("50 cm", 3)]
    assert [n.sku for n in catalog_names()] == ["C-1"]


def test_prune_removes_what_the_file_lacks_but_never_after_a_bad_record(tmp_path):
    run(jsonl(tmp_path, THROW_EN, THROW_ZH, MUG))
    code, _, err = run(jsonl(tmp_path, THROW_EN, {"sku": "X"}, name="bad.jsonl"), "--prune")
    assert code == 1 and "--prune skipped" in err
    assert Product.objects.count() == 2
    code, out, _ = run(jsonl(tmp_path, THROW_EN, name="only.jsonl"), "--prune")
    assert code == 0 and "2 pruned" in out
    assert list(Product.objects.values_list("sku", flat=True)) == ["T-1"]
    assert list(ProductText.objects.values_list("locale", flat=True)) == ["en"]


def test_variant_sku_of_another_product_is_a_bad_record(tmp_path):
    other = {**MUG, "sku": "M-9", "variants": [{"sku": "T-1-GRY", "options": {}, "stock": 1}]}
    code, _, err = run(jsonl(tmp_path, THROW_EN, other))
    assert code == 1 and "line 2: variant sku 'T-1-GRY' already belongs to product 'T-1'" in err


def test_unreadable_file_is_a_command_error(tmp_path):
    with pytest.raises(CommandError, match="cannot be read"):
        run(tmp_path / "missing.jsonl")


def test_if_empty_leaves_a_catalog_alone(tmp_path):
    run(jsonl(tmp_path, MUG))
    code, out, _ = run(jsonl(tmp_path, THROW_EN, name="t.jsonl"), "--if-empty")
    assert code == 0 and "nothing imported" in out
    assert list(Product.objects.values_list("sku", flat=True)) == ["M-1"]


def test_demo_catalog_loads_cleanly():
    code, out, _ = run(Path(__file__).resolve().parents[2] / "store" / "demo" / "products.jsonl")
    assert code == 0 and "0 bad" in out
    assert Product.objects.count() == 10 and ProductText.objects.filter(locale="zh").count() == 10


def test_index_reload_names_changed_products_and_their_cached_answers_go(tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from cache_layer.models import CachedAnswer
    from cache_layer.services import evict_naming
    from routing.products.index import CatalogIndex

    index = CatalogIndex()
    run(jsonl(tmp_path, THROW_EN, MUG))
    assert index.reload() == set()  # a first load changes nothing
    assert index.reload_if_changed() is None
    run(jsonl(tmp_path, {**THROW_EN, "price": 150}, MUG, name="new.jsonl"))
    assert index.reload_if_changed() == {"T-1"}
    later = timezone.now() + timedelta(days=1)
    for n, answer in enumerate(["The Loom Wool Throw is lovely.", "We ship in 2 days."]):
        CachedAnswer.objects.create(
            scope="s", key_hash=str(n), key_text="q", question="q", answer=answer, route="llm.simple", expires_at=later
        )
    assert evict_naming(["T-1", "Loom Wool Throw", " "]) == 1
    assert list(CachedAnswer.objects.values_list("answer", flat=True)) == ["We ship in 2 days."]
