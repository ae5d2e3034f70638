"""Product answers made from the catalog's own data by templates (English and Chinese; any other
language gets English): what a question asks (:func:`asked`), which variants it names
(:func:`variants_named`) and the answer (:func:`product_text`, :func:`which_one_text`).

Nothing here invents a fact: an attribute the catalog lacks is not answered (the caller lets
the question go on to the FAQ or the model), a product without stock figures gets no stock answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from store.types import ProductVariantView, ProductView

__all__ = [
    "KINDS",
    "asked",
    "money",
    "product_text",
    "rest_words",
    "variants_named",
    "which_one_text",
    "which_one_titles",
]

KINDS = ("price", "stock", "options", "attributes", "overview")

_PRICE = re.compile(
    r"\bhow much\b|\bprices?\b|\bpriced\b|\bcosts?\b|\bexpensive\b|\bcheap|多少钱|价格|价钱|售价|几块|多少元|贵不贵|多贵",
    re.IGNORECASE,
)
_STOCK = re.compile(
    r"\bin[- ]stock\b|\bstock\b|\bavailab|\bsold out\b|\bleft\b|\brestock|\bback in\b|\bhave (?:it|any|one|the)\b"
    r"|\bcan i (?:buy|get|order)\b|\bdo you (?:have|carry)\b|\bget (?:it|one) now\b"
    r"|有货|有没有货|有.{0,8}吗|库存|现货|缺货|卖完|售罄|卖光|还有吗|还有没有|有吗|有没有|到货|补货|能买",
    re.IGNORECASE,
)
_OPTIONS = re.compile(
    r"\bcolou?rs?\b|\bsizes?\b|\boptions?\b|\bvariants?\b|\bcomes? in\b|\bfinish(?:es)?\b|\bglazes?\b"
    r"|\bversions?\b|\bwhich ones\b|颜色|尺码|规格|款式|型号|几种|哪几种|哪些",
    re.IGNORECASE,
)
_OVERVIEW = re.compile(r"\btell me (?:more )?about\b|\bdetails?\b|\binfo\b|\bdescribe\b|介绍|详情|详细", re.IGNORECASE)

# Attribute keys kefu knows how to ask for, with the words that ask for them and their labels.
ATTRIBUTE_WORDS: dict[str, str] = {
    "material": r"\bmaterials?\b|\bmade (?:of|from|out of)\b|\bfabric\b|\bwhat is it made\b|材质|材料|面料|什么做的|什么材",
    "dimensions": r"\bdimensions?\b|\bhow (?:big|tall|wide|large|long|high)\b|\bmeasure|\bheight\b|\bwidth\b|尺寸|多大|多高|多宽|多长",
    "dimmable": r"\bdimm|调光|调亮|调暗",
    "bulb": r"\bbulbs?\b|\bwatt|\bsocket\b|灯泡|灯头|瓦数",
    "care": r"\bwash|\bclean|\bcare\b|\bdry[- ]clean|洗涤|清洗|清洁|保养|怎么洗|能洗",
    "bathroom_safe": r"\bbathrooms?\b|\bdamp\b|\bhumid|浴室|卫生间|潮湿",
    "insert_included": r"\binsert\b|\bfilling\b|\bstuffing\b|\bpillow inside\b|内芯|枕芯",
    "watertight": r"\bwatertight\b|\bleak|\bhold water\b|\bfresh flowers\b|漏水|防水|装水|插花|鲜花",
    "dishwasher_safe": r"\bdishwasher|洗碗机",
    "microwave_safe": r"\bmicrowave|微波",
    "capacity": r"\bcapacity\b|\bhow much (?:does it |do they )?hold\b|\bml\b|容量|多少毫升|能装多少(?!钱)",
    "weight": r"\bweigh|\bheavy\b|重量|多重|几斤|多少公斤",
}
_ATTRIBUTE_RE = {k: re.compile(v, re.IGNORECASE) for k, v in ATTRIBUTE_WORDS.items()}
LABELS = {
    "en": {
        "material": "material",
        "dimensions": "size",
        "bulb": "bulb",
        "care": "care",
        "bathroom_safe": "use in a bathroom",
        "capacity": "capacity",
        "weight": "weight",
    },
    "zh": {
        "material": "材质",
        "dimensions": "尺寸",
        "bulb": "灯泡",
        "care": "保养方法",
        "bathroom_safe": "能否用于浴室",
        "capacity": "容量",
        "weight": "重量",
    },
}
# Yes/no attributes: (English "is ...", Chinese yes, Chinese no).
YES_NO = {
    "dimmable": ("dimmable", "可以调光", "不能调光"),
    "watertight": ("watertight", "可以装水，不会漏水", "不适合装水"),
    "dishwasher_safe": ("dishwasher safe", "可以用洗碗机清洗", "不能用洗碗机清洗"),
    "microwave_safe": ("microwave safe", "可以放进微波炉", "不能放进微波炉"),
    "insert_included": ("sold with its insert", "附带内芯", "不附带内芯"),
    "bathroom_safe": ("safe in a bathroom", "可以用于浴室", "不能用于浴室"),
}
OPTION_NAMES_ZH = {"size": "尺寸", "colour": "颜色", "color": "颜色", "finish": "表面", "glaze": "釉色"}
SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CNY": "¥"}
MAX_LISTED = 6


@dataclass(frozen=True)
class Asked:
    """What a message asks about a product: ``kinds`` (of :data:`KINDS`, in asking order) and
    ``attributes`` (attribute keys asked for)."""

    kinds: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()


def asked(text: str, attribute_keys: tuple[str, ...] = ()) -> Asked:
    """What ``text`` asks: prices, stock, options, attributes (known ones, or any of
    ``attribute_keys`` named in the text). ``overview`` when it asks for details without a fact."""
    kinds: list[str] = []
    attrs = [k for k, rx in _ATTRIBUTE_RE.items() if rx.search(text)]
    lowered = text.lower()
    for key in attribute_keys:
        words = key.replace("_", " ").lower()
        if key not in attrs and len(words) >= 3 and re.search(rf"\b{re.escape(words)}", lowered):
            attrs.append(key)
    if attrs:
        kinds.append("attributes")
    if _PRICE.search(text) and "capacity" not in attrs:
        kinds.append("price")
    if _STOCK.search(text):
        kinds.append("stock")
    if _OPTIONS.search(text):
        kinds.append("options")
    if not kinds and _OVERVIEW.search(text):
        kinds.append("overview")
    return Asked(tuple(kinds), tuple(attrs))


# The small words of a question that asks about "it" ("how much is it?", "is it still in stock?",
# "那个灰色的多少钱？"): what is left of a follow-up once its asking phrases are taken out.
SMALL_WORDS = frozenset(
    [
        "it",
        "its",
        "it's",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "the",
        "a",
        "an",
        "this",
        "that",
        "these",
        "those",
        "one",
        "ones",
        "they",
        "them",
        "their",
        "do",
        "does",
        "did",
        "you",
        "your",
        "have",
        "has",
        "had",
        "got",
        "get",
        "any",
        "still",
        "how",
        "much",
        "many",
        "what",
        "what's",
        "which",
        "about",
        "and",
        "or",
        "in",
        "on",
        "for",
        "of",
        "at",
        "with",
        "too",
        "also",
        "then",
        "now",
        "please",
        "pls",
        "currently",
        "right",
        "there",
        "here",
        "i",
        "i'm",
        "me",
        "my",
        "we",
        "can",
        "could",
        "would",
        "will",
        "buy",
        "come",
        "comes",
        "ok",
        "okay",
        "so",
        "again",
        "same",
        "more",
        "tell",
        "as",
        "well",
        "but",
        "just",
        "only",
        "want",
        "like",
        "need",
        "if",
        "there's",
        "by",
        "yet",
        "else",
        "other",
        "another",
        "same",
    ]
)
SMALL_CHARS = frozenset("它这那个款件只的吗呢了还呀啊吧么嘛是有请问也和就都现在一下要买想能可以我你您们嗯哦呃")
_ASKING = [_PRICE, _STOCK, _OPTIONS, _OVERVIEW, *_ATTRIBUTE_RE.values()]


def rest_words(norm_text: str, said: tuple[str, ...] = ()) -> list[str]:
    """What the normalised message says besides asking for a fact, small words and the phrases
    ``said`` (option values: "grey", "灰色"): its other words of spaced scripts and its other
    Chinese characters. Empty for "how much is it?", "is it in grey?", "那个灰色的多少钱？"."""
    text = norm_text
    for phrase in sorted(said, key=len, reverse=True):
        if phrase:
            text = text.replace(phrase, " ")
    for rx in _ASKING:
        text = rx.sub(" ", text)
    rest = [w for w in re.findall(r"[a-z0-9]+(?:['’][a-z]+)?", text) if w not in SMALL_WORDS]
    rest += [c for c in re.findall(r"[\u3400-\u9fff\uf900-\ufaff]", text) if c not in SMALL_CHARS]
    return rest


def _compact(value: str) -> str:
    return re.sub(r"\s+|cm\b|厘米", "", value.lower()).replace("×", "x").replace("*", "x")


def variants_named(
    variant_skus: tuple[str, ...], norm_text: str, option_values: dict[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """The variant skus (of ``variant_skus``, a product's) the normalised message ``norm_text``
    narrows to, by option values in any language (``option_values``: ``{variant sku: normalised
    values}``) or by SKU; () when it names none or a combination no variant has. A value with
    digits also matches written compactly ("150x200" for "150 × 200 cm")."""
    by_sku = [s for s in variant_skus if re.search(rf"(?<![a-z0-9]){re.escape(s.lower())}(?![a-z0-9])", norm_text)]
    if by_sku:
        return tuple(by_sku)
    compact = _compact(norm_text)
    named: set[str] = set()
    for values in option_values.values():
        for v in values:
            if v.isascii():
                hit = re.search(rf"(?<![a-z0-9]){re.escape(v)}(?![a-z0-9])", norm_text) is not None
            else:
                hit = v in norm_text
            if not hit and any(c.isdigit() for c in v) and len(_compact(v)) >= 2:
                hit = _compact(v) in compact
            if hit:
                named.add(v)
    if not named:
        return ()
    # A value and its translation name the same option: a variant fits when each named value is
    # one of its own values, counting every language's values as its own.
    return tuple(s for s in variant_skus if named <= set(option_values.get(s, ())))


def money(amount: Decimal, currency: str) -> str:
    """``$129.00``, ``€48.00``, or ``129.00 CHF`` for a currency without a symbol here."""
    symbol = SYMBOLS.get(currency)
    return f"{symbol}{amount:,.2f}" if symbol else f"{amount:,.2f} {currency}"


def _zh(locale: str) -> bool:
    return locale.split("-")[0] == "zh"


def _title(view: ProductView, zh: bool) -> str:
    return f"「{view.title}」" if zh else f"the {view.title}"


def _stock_line(v: ProductVariantView, zh: bool) -> str:
    if zh:
        return f"有货（{v.stock} 件）" if v.stock > 0 else "暂时缺货"
    return f"in stock ({v.stock})" if v.stock > 0 else "out of stock"


def _listed(rows: list[str]) -> str:
    shown = rows[:MAX_LISTED]
    more = len(rows) - len(shown)
    lines = [f"{i}. {r}" for i, r in enumerate(shown, 1)]
    if more > 0:
        lines.append(f"(+{more})")
    return "\n".join(lines)


def _price_part(view: ProductView, variants: tuple[ProductVariantView, ...], zh: bool) -> str:
    title = _title(view, zh)
    prices = {v.price for v in variants} or {view.price}
    if len(prices) == 1:
        price = money(next(iter(prices)), view.currency)
        label = f"（{variants[0].label()}）" if zh and len(variants) == 1 and len(view.variants) > 1 else ""
        if not zh and len(variants) == 1 and len(view.variants) > 1:
            return f"The {view.title} in {variants[0].label()} costs {price}."
        return f"{title}{label}售价 {price}。" if zh else f"{title[0].upper()}{title[1:]} costs {price}."
    rows = [f"{v.label()}: {money(v.price, view.currency)}" for v in variants]
    head = f"{title}的价格：" if zh else f"The {view.title} costs:"
    return f"{head}\n{_listed(rows)}"


def _stock_part(view: ProductView, variants: tuple[ProductVariantView, ...], zh: bool) -> str | None:
    title = _title(view, zh)
    if not view.variants:
        if view.stock is None:
            return None
        if zh:
            return f"{title}有货（{view.stock} 件）。" if view.stock > 0 else f"抱歉，{title}暂时缺货。"
        return (
            f"Yes, the {view.title} is in stock ({view.stock})."
            if view.stock > 0
            else (f"Sorry, the {view.title} is out of stock at the moment.")
        )
    if len(variants) == 1:
        v = variants[0]
        if zh:
            return (
                f"{title}（{v.label()}）有货，现有 {v.stock} 件。"
                if v.stock > 0
                else (f"抱歉，{title}（{v.label()}）暂时缺货。")
            )
        return (
            f"Yes, the {view.title} in {v.label()} is in stock ({v.stock})."
            if v.stock > 0
            else (f"Sorry, the {view.title} in {v.label()} is out of stock at the moment.")
        )
    rows = [f"{v.label()}: {_stock_line(v, zh)}" for v in variants]
    head = f"{title}的库存：" if zh else f"Stock of the {view.title}:"
    return f"{head}\n{_listed(rows)}"


def _options_part(view: ProductView, zh: bool) -> str | None:
    if not view.variants:
        return None
    dims: dict[str, list[str]] = {}
    for v in view.variants:
        for name, value in v.options.items():
            if value not in dims.setdefault(name, []):
                dims[name].append(value)
    if not dims:
        return None
    if zh:
        parts = "；".join(f"{OPTION_NAMES_ZH.get(name, name)}：{'、'.join(values)}" for name, values in dims.items())
        return f"{_title(view, zh)}有这些选择：{parts}。"
    parts = "; ".join(f"{name} {', '.join(values)}" for name, values in dims.items())
    return f"The {view.title} comes in {parts}."


def _attribute_part(view: ProductView, key: str, zh: bool) -> str | None:
    value = view.attributes.get(key)
    if value is None or value == "":
        return None
    title = _title(view, zh)
    if isinstance(value, bool):
        en, zh_yes, zh_no = YES_NO.get(key, (key.replace("_", " "), key, key))
        if zh:
            return f"是的，{title}{zh_yes}。" if value else f"不，{title}{zh_no}。"
        return f"Yes, the {view.title} is {en}." if value else f"No, the {view.title} is not {en}."
    text = (
        "、".join(value)
        if zh and isinstance(value, list)
        else (", ".join(value) if isinstance(value, list) else str(value))
    )
    label = LABELS["zh" if zh else "en"].get(key, key.replace("_", " "))
    return f"{title}的{label}：{text}" if zh else f"The {view.title}, {label}: {text}"


def product_text(view: ProductView, asked_: Asked, variant_skus: tuple[str, ...], locale: str) -> str | None:
    """The answer to ``asked_`` about ``view`` (narrowed to ``variant_skus`` when the message named
    options), with the product's link; None when the catalog holds none of the facts asked."""
    zh = _zh(locale)
    variants = tuple(v for v in view.variants if v.sku in variant_skus) if variant_skus else view.variants
    parts: list[str] = []
    kinds = asked_.kinds
    if "overview" in kinds:
        kinds = ("price", "stock")
    for kind in kinds:
        part: str | None = None
        if kind == "price":
            part = _price_part(view, variants, zh)
        elif kind == "stock":
            part = _stock_part(view, variants, zh)
        elif kind == "options":
            part = _options_part(view, zh) if not variant_skus or "stock" not in kinds else None
        elif kind == "attributes":
            found = [p for key in asked_.attributes if (p := _attribute_part(view, key, zh))]
            part = "\n".join(found) if found else None
        if part:
            parts.append(part)
    if not parts:
        return None
    if view.url:
        parts.append(f"商品页面：{view.url}" if zh else f"Product page: {view.url}")
    return "\n".join(parts)


_WHICH_EN = re.compile(r"Which one do you mean: the (.+)\?")
_WHICH_ZH = "您问的是哪一款："


def which_one_titles(text: str) -> list[str] | None:
    """The titles a "which one?" of :func:`which_one_text` named, in the order shown; None for
    any other text (a bot answer read back from the conversation)."""
    text = text.strip()
    if text.startswith(_WHICH_ZH):
        titles = re.findall(r"「([^」]+)」", text)
        return titles if len(titles) >= 2 else None
    m = _WHICH_EN.fullmatch(text)
    if m is None:
        return None
    titles = re.split(r", the | or the ", m.group(1))
    return titles if len(titles) >= 2 else None


def which_one_text(titles: list[str], locale: str) -> str:
    """ "Which one do you mean: the A or the B?" naming every title (en, zh)."""
    if _zh(locale):
        return f"您问的是哪一款：{'、'.join(f'「{t}」' for t in titles[:-1])}还是「{titles[-1]}」？"
    named = [f"the {t}" for t in titles]
    return f"Which one do you mean: {', '.join(named[:-1])} or {named[-1]}?"
