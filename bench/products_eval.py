"""The ``product`` route on written product questions (issue 35): right product, variant and fact.

Loads a catalog file (default: the demo catalog, ``store/demo/products.jsonl``) into a temporary
SQLite database, builds the catalog index and asks ``routing.decide.product_flow.product_decision``
(the route's real code, no server) questions written here from question templates in English and
Chinese: prices, stock (whole product and a named option), options, attributes, misspelt and
shortened names, names written as one word ("Ember tablelamp"), look-alike products ("which
one?", or the one an option names) and questions the catalog must not answer (unknown products,
category and generic words). Single messages only: follow-ups over several turns are tested over
the socket (tests/chat/test_products.py).

"Right": for a question about one product, the answer is route ``product`` and states the asked
fact of the right product and variant (its price, its stock figure or "out of stock", its option
values, its attribute); for a look-alike question, "which one?" naming exactly the products that
fit; for a question about no catalog product, no ``product`` answer. "Wrong price" / "wrong stock":
a ``product`` answer stating a price or a stock figure that is not the asked variant's.

    .venv/bin/python bench/products_eval.py [--catalog store/demo/products.jsonl] [--show-wrong]

The expected facts are read from the catalog file itself, never from kefu's index. The question
set is the demo catalog's; ``--questions FILE`` (JSONL of ``{"text", "locale", "expect":
{"skus": [...], "variant": SKU|null, "kind": "price"|"stock"|"options"|"attribute"|"none",
"attribute": KEY|null}}``) runs a set written apart for another catalog.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Names a shopper writes for each demo product: (English forms, Chinese forms). Misspelt and
# shortened forms included; each must name only its product.
NAMES = {
    "LL-EMBER-TL": (["Ember Table Lamp", "ember table lamp", "Embr table lamp", "Ember table-lamp"], ["余烬台灯"]),
    "LL-EMBER-FL": (["Ember Floor Lamp", "ember floor lamp", "Ember flor lamp", "Ember floorlamp"], ["余烬落地灯"]),
    "LL-MOON-PD": (["Paper Moon Pendant", "paper moon pendant", "Paper Moon lamp", "paper mon pendant"], ["纸月吊灯"]),
    "LL-LOOM-WT": (
        ["Loom Wool Throw", "loom wool throw", "wool throw", "Loom wol throw"],
        ["织机羊毛盖毯", "羊毛盖毯"],
    ),
    "LL-LOOM-CT": (
        ["Loom Cotton Throw", "loom cotton throw", "cotton throw", "Loom coton throw"],
        ["织机棉质盖毯", "棉质盖毯"],
    ),
    "LL-INDIGO-CU": (
        ["Indigo Stripe Cushion", "indigo stripe cushion", "Indigo cushion", "Indgo stripe cushion"],
        ["靛蓝条纹靠垫"],
    ),
    "LL-TIDE-VS": (["Tidewater Vase", "tidewater vase", "Tidewatr vase", "Tide vase"], ["潮汐花瓶"]),
    "LL-TIDE-BW": (["Tidewater Bowl", "tidewater bowl", "Tidewatter bowl", "Tide bowl"], ["潮汐碗"]),
    "LL-MORN-MS2": (
        ["Morning Mug Set of 2", "morning mug set", "Morning mug set of two", "Mornin mug set"],
        ["晨光马克杯两只装"],
    ),
    "LL-MORN-MG": (
        ["Morning Mug", "single Morning Mug", "morning mug on its own", "Mornng mug"],
        ["晨光马克杯", "单只晨光马克杯"],
    ),
}
LOOKALIKES = [
    (["LL-EMBER-TL", "LL-EMBER-FL"], ["Ember lamp", "Ember"], ["余烬灯"]),
    (["LL-LOOM-WT", "LL-LOOM-CT"], ["Loom throw", "Loom blanket"], ["织机盖毯"]),
    (["LL-TIDE-VS", "LL-TIDE-BW"], ["Tidewater", "Tidewater piece"], ["潮汐"]),
    (["LL-EMBER-TL", "LL-EMBER-FL"], ["Ember light", "Ember brass lamp"], ["余烬"]),
]
EN = {
    "price": ["How much is the {n}?", "What does the {n} cost?", "price of the {n}?", "how much for the {n}"],
    "stock": ["Is the {n} in stock?", "do you have the {n} available?", "is the {n} sold out?"],
    "stock_option": ["Is the {n} in stock in {o}?", "do you have the {n} in {o}?", "any {n} left in {o}?"],
    "price_option": ["How much is the {n} in {o}?"],
    "options": ["What options does the {n} come in?", "which {d}s does the {n} come in?"],
}
ZH = {
    "price": ["{n}多少钱？", "{n}的价格是多少？", "{n}怎么卖，多少钱"],
    "stock": ["{n}有货吗？", "{n}还有库存吗"],
    "stock_option": ["{n}{o}的有货吗？", "{n}有{o}的现货吗"],
    "price_option": ["{n}{o}的多少钱？"],
    "options": ["{n}有哪些款式？"],
}
ATTRIBUTE_EN = {
    "dimmable": "Is the {n} dimmable?",
    "bulb": "Which bulb does the {n} take?",
    "material": "What is the {n} made of?",
    "dimensions": "How big is the {n}?",
    "care": "How do I wash the {n}?",
    "bathroom_safe": "Can the {n} be used in a bathroom?",
    "insert_included": "Does the {n} come with an insert?",
    "watertight": "Is the {n} watertight for fresh flowers?",
    "dishwasher_safe": "Can the {n} go in the dishwasher?",
    "microwave_safe": "Is the {n} microwave safe?",
    "capacity": "What is the capacity of the {n}?",
    "weight": "How heavy is the {n}?",
}
ATTRIBUTE_ZH = {
    "dimmable": "{n}可以调光吗？",
    "material": "{n}是什么材质的？",
    "care": "{n}怎么清洗？",
    "dishwasher_safe": "{n}能用洗碗机洗吗？",
    "microwave_safe": "{n}能放微波炉吗？",
    "watertight": "{n}能装水插鲜花吗？",
}
NONE_EN = [
    "How much is the Zephyr chair?",
    "Is the Halo floor lamp in stock?",
    "how much is the lamp?",
    "is this item in stock?",
    "how much is the product I ordered?",
    "Do you have the Aurora throw in blue?",
    "where is my order?",
    "Does the lamp model 1234 come in a darker version?",
    "how much is shipping to Canada?",
    "I ordered this morning, how much is express shipping?",
    "do you sell gift cards?",
    "is the mug dishwasher safe?",
    "What does a vase cost?",
    "do you have cushions in stock?",
    "how much is the Nimbus pendant?",
]
NONE_ZH = ["那个椅子多少钱？", "这个商品有货吗？", "我的订单到哪了？", "台灯多少钱", "花瓶有货吗", "极光毯子有蓝色的吗"]
# Added with the joined-word and option rules (issue 35, review): names written as one word, a
# look-alike told apart by an option only one of them has, generic words written as one.
# (text, locale, skus, kind, variant); kind "none" for no product.
EXTRA = [
    ("how much is the Ember tablelamp?", "en", ["LL-EMBER-TL"], "price", None),
    ("is the embrfloorlamp in stock?", "en", ["LL-EMBER-FL"], "stock", None),
    ("price of the tidewatervase?", "en", ["LL-TIDE-VS"], "price", None),
    ("do you have the woolthrow in stock?", "en", ["LL-LOOM-WT"], "stock", None),
    ("how much is the papermoon pendant?", "en", ["LL-MOON-PD"], "price", None),
    ("how much is the embrlamp?", "en", ["LL-EMBER-TL", "LL-EMBER-FL"], "which", None),
    ("Is the Tidewaterpiece in stock?", "en", ["LL-TIDE-VS", "LL-TIDE-BW"], "which", None),
    ("Do you have the Loom throw in charcoal?", "en", ["LL-LOOM-CT"], "stock", "LL-LOOM-CT-CHR"),
    ("how much is the loom blanket in natural?", "en", ["LL-LOOM-CT"], "price", "LL-LOOM-CT-NAT"),
    ("织机盖毯炭灰色的有货吗？", "zh", ["LL-LOOM-CT"], "stock", "LL-LOOM-CT-CHR"),
    ("织机盖毯本色的多少钱？", "zh", ["LL-LOOM-CT"], "price", "LL-LOOM-CT-NAT"),
    ("is this itemorder in stock?", "en", [], "none", None),
    ("how much is the productitem?", "en", [], "none", None),
]


def load_catalog(path: Path) -> dict[str, dict[str, dict]]:
    """``{sku: {locale: record}}`` from the catalog file (JSONL)."""
    out: dict[str, dict[str, dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out.setdefault(r["sku"], {})[r.get("locale", "en")] = r
    return out


def demo_questions(cat: dict[str, dict[str, dict]]) -> list[dict]:
    """The demo set: 300 questions, deterministic (templates x names x options, cycled)."""
    qs: list[dict] = []

    def add(
        text: str, locale: str, skus: list[str], kind: str, variant: str | None = None, attribute: str | None = None
    ):
        qs.append(
            {
                "text": text,
                "locale": locale,
                "expect": {"skus": skus, "variant": variant, "kind": kind, "attribute": attribute},
            }
        )

    for sku, (en_names, zh_names) in NAMES.items():
        en, zh = cat[sku]["en"], cat[sku]["zh"]
        for i, n in enumerate(en_names):
            add(EN["price"][i % 4].format(n=n), "en", [sku], "price")
            add(EN["stock"][i % 3].format(n=n), "en", [sku], "stock")
        for j, v in enumerate(en["variants"]):
            o = ", ".join(v["options"].values()) if len(v["options"]) == 1 else " ".join(v["options"].values())
            add(EN["stock_option"][j % 3].format(n=en_names[j % len(en_names)], o=o), "en", [sku], "stock", v["sku"])
            if j < 2:
                add(EN["price_option"][0].format(n=en_names[0], o=o), "en", [sku], "price", v["sku"])
        dim = next(iter(en["variants"][0]["options"]))
        add(EN["options"][0].format(n=en_names[1]), "en", [sku], "options")
        add(EN["options"][1].format(n=en_names[0], d=dim), "en", [sku], "options")
        for key in en["attributes"]:
            if key in ATTRIBUTE_EN:
                add(ATTRIBUTE_EN[key].format(n=en_names[0]), "en", [sku], "attribute", attribute=key)
        for i, n in enumerate(zh_names):
            add(ZH["price"][i % 3].format(n=n), "zh", [sku], "price")
            add(ZH["stock"][i % 2].format(n=n), "zh", [sku], "stock")
        for j, v in enumerate(zh["variants"][:2]):
            o = "".join(v["options"].values())
            add(ZH["stock_option"][j % 2].format(n=zh_names[0], o=o), "zh", [sku], "stock", v["sku"])
        add(
            ZH["price_option"][0].format(n=zh_names[0], o="".join(zh["variants"][-1]["options"].values())),
            "zh",
            [sku],
            "price",
            zh["variants"][-1]["sku"],
        )
        add(ZH["options"][0].format(n=zh_names[0]), "zh", [sku], "options")
        for key in zh["attributes"]:
            if key in ATTRIBUTE_ZH:
                add(ATTRIBUTE_ZH[key].format(n=zh_names[0]), "zh", [sku], "attribute", attribute=key)
    for skus, en_names, zh_names in LOOKALIKES:
        for n in en_names:
            add(f"How much is the {n}?", "en", skus, "which")
            add(f"Is the {n} in stock?", "en", skus, "which")
        for n in zh_names:
            add(f"{n}多少钱？", "zh", skus, "which")
            add(f"{n}有货吗？", "zh", skus, "which")
    for t in NONE_EN:
        add(t, "en", [], "none")
    for t in NONE_ZH:
        add(t, "zh", [], "none")
    for text, locale, skus, kind, variant in EXTRA:
        add(text, locale, skus, kind, variant)
    # 300 in all: every look-alike, no-product and added question, and product questions dropped
    # evenly.
    extra = {t for t, *_ in EXTRA}
    keep = [q for q in qs if q["expect"]["kind"] in ("which", "none") or q["text"] in extra]
    rest = [q for q in qs if q not in keep]
    room = 300 - len(keep)
    step = len(rest) / room
    return keep + [rest[int(i * step)] for i in range(room)]


MONEY = re.compile(r"[$€£¥]([\d,]+\.\d\d)|([\d,]+\.\d\d) [A-Z]{3}")
COUNT = re.compile(r"\((\d+)\)|（(\d+) 件）|现有 (\d+) 件")


def judge(q: dict, text: str | None, route: str | None, cat: dict) -> tuple[bool, bool, bool]:
    """``(right, wrong_price, wrong_stock)`` for one answer."""
    e = q["expect"]
    if e["kind"] == "none":
        return route != "product", False, False
    if route != "product" or text is None:
        return False, False, False
    rec = cat[e["skus"][0]].get(q["locale"]) or cat[e["skus"][0]]["en"]
    if e["kind"] == "which":
        titles = [(cat[s].get(q["locale"]) or cat[s]["en"])["title"] for s in e["skus"]]
        ok = all(t in text for t in titles) and ("Which one" in text or "哪一款" in text)
        return ok, False, False
    variants = rec.get("variants") or []
    chosen = [v for v in variants if v["sku"] == e["variant"]] if e["variant"] else variants
    prices = {Decimal(str(v.get("price", rec["price"]))).quantize(Decimal("0.01")) for v in chosen} or {
        Decimal(str(rec["price"])).quantize(Decimal("0.01"))
    }
    stated = {Decimal((a or b).replace(",", "")) for a, b in MONEY.findall(text)}
    wrong_price = bool(stated - prices)
    counts = {int(next(g for g in m if g)) for m in COUNT.findall(text)}
    stocks = {v["stock"] for v in chosen if v["stock"] > 0}
    if not variants and rec.get("stock"):
        stocks = {int(rec["stock"])}  # a product without variants keeps its own count
    wrong_stock = bool(counts - stocks)
    says_out = "out of stock" in text or "缺货" in text
    if e["kind"] == "stock" and e["variant"] and len(chosen) == 1 and says_out != (chosen[0]["stock"] == 0):
        wrong_stock = True
    title_ok = rec["title"] in text
    if e["kind"] == "price":
        ok = title_ok and stated == prices and not wrong_price
    elif e["kind"] == "stock":
        ok = title_ok and not wrong_stock and (counts == stocks or (says_out and not stocks))
    elif e["kind"] == "options":
        values = {str(o) for v in variants for o in v["options"].values()}
        ok = title_ok and all(v in text for v in values)
    else:
        value = rec["attributes"].get(e["attribute"])
        if isinstance(value, bool):
            ok = title_ok and (text.startswith(("Yes", "是的")) == value)
        else:
            ok = title_ok and str(value) in text
    return ok and not wrong_price and not wrong_stock, wrong_price, wrong_stock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--catalog", default=str(ROOT / "store" / "demo" / "products.jsonl"))
    ap.add_argument("--questions", help="a question set written for --catalog (JSONL); default: the demo set")
    ap.add_argument("--show-wrong", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kefu-products-eval-")
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/db.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["KEFU_PRODUCTS_POLL_S"] = "3600"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from routing.decide.product_flow import product_decision
    from routing.products.index import catalog
    from routing.types import Question
    from store.catalog import import_catalog

    path = Path(args.catalog)
    result = import_catalog(path)
    assert not result.errors, result.errors
    catalog.reload()
    cat = load_catalog(path)
    if args.questions:
        qs = [
            json.loads(line) for line in Path(args.questions).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    else:
        qs = demo_questions(cat)

    async def run() -> list[tuple[dict, str | None, str | None]]:
        out = []
        for q in qs:
            d = await product_decision(Question(None, None, 1, q["text"], q["locale"]), q["locale"])
            out.append((q, d.text if d else None, d.route if d else None))
        return out

    import time

    cpu0 = time.process_time()
    answered = asyncio.run(run())
    cpu_ms = (time.process_time() - cpu0) * 1000 / max(len(qs), 1)
    right = wp = ws = 0
    by_kind: dict[str, list[int]] = {}
    for q, text, route in answered:
        ok, bad_price, bad_stock = judge(q, text, route, cat)
        right += ok
        wp += bad_price
        ws += bad_stock
        k = by_kind.setdefault(f"{q['locale']}:{q['expect']['kind']}", [0, 0])
        k[0] += ok
        k[1] += 1
        if args.show_wrong and not ok:
            print(f"WRONG {q['locale']} {q['text']!r} expect={q['expect']} -> {route}: {text!r}")
    for k, (ok, n) in sorted(by_kind.items()):
        print(f"  {k:16} {ok}/{n}")
    n = len(answered)
    print(
        f"{n} questions ({path.name}): right {right}/{n} = {100 * right / n:.1f}%, wrong prices {wp}, "
        f"wrong stock {ws}; {cpu_ms:.2f} ms CPU a question (finding, reading, templating)"
    )


if __name__ == "__main__":
    main()
