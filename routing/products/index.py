"""The catalog index: finding the products a shopper's message names, in English and Chinese.

One ``CatalogIndex`` per process holds what names each catalog product (``store.services.
catalog_names``: titles in every language, tags, SKUs, option values), turned into match keys:

- words of spaced scripts (case-folded, NFKC, a plural ``s`` dropped) and, for Chinese, character
  bigrams (``lib.search_terms`` indexes Chinese the same way), so "余烬台灯" is found in
  "余烬台灯有货吗";
- a title's *naming* words: its words that are no product's tag or category and no generic word
  ("order", "item", "product", "东西", "商品"...); a category word ("lamp", "台灯") alone never
  names a product;
- misspelt or shortened naming words (same first letter): a close spelling (difflib ratio >= 0.8
  from four letters, 0.85 for three: "embr", "tidewatr", "wol") or a prefix of four letters or
  more and at least 0.4 of the word ("tide" for "tidewater");
- two words written as one ("floorlamp", "embrlamp", "tidewatervase"): a word the catalog does
  not know that splits into two parts of three letters or more, each a catalog word (a naming,
  category or tag word; one as written, the other maybe misspelt), is read as those two words.
  Generic words are no catalog words: they are split off a catalog word ("tidewaterpiece") and
  count for nothing, but never make a split of their own ("itemorder"); split words name a
  product only as the separate words would.

:meth:`CatalogIndex.find` scores each product (a naming word 1, a misspelt or shortened one 0.9,
a category word of its title 0.5, one of its tags only 0.25, a SKU 10) and returns the products
named: the best one, or every product less than 0.45 below the best when several fit ("which one
do you mean?"). Of several that fit, an option value only some of them have narrows them to those
("the Loom throw in grey": only the wool throw comes in grey), then the one whose whole title the
message holds wins ("Morning Mug" against "Morning Mug Set of 2"). A title's first naming word
alone names it in Chinese or in a message of at most four other words than its option values
("the Ember?", "loom blanket in natural?").

The index is loaded at start-up and kept fresh by a poller (``KEFU_PRODUCTS_POLL_S``, like the
FAQ registry's): a product added or renamed by an import in any process is found within that
bound. Prices and stock are never kept here: an answer reads them from the catalog as it is
made (``routing.products.route``).
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import close_old_connections

from store.services import catalog_fingerprint, catalog_names
from store.types import ProductNames

log = logging.getLogger(__name__)

__all__ = ["CatalogIndex", "Found", "ProductKeys", "catalog", "terms"]

# Words that never name a product, whatever the catalog holds (issue 35: "order", "item",
# "product", "东西", "商品"), and the small words of titles ("Set of 2": its "of" and "2").
GENERIC = frozenset(
    [
        "order",
        "orders",
        "item",
        "items",
        "product",
        "products",
        "thing",
        "things",
        "stuff",
        "one",
        "ones",
        "it",
        "this",
        "that",
        "these",
        "those",
        "the",
        "a",
        "an",
        "of",
        "and",
        "or",
        "with",
        "for",
        "in",
        "on",
        "to",
        "by",
        "my",
        "your",
        "our",
        "is",
        "are",
        "do",
        "does",
        "you",
        "have",
        "has",
        "pc",
        "pcs",
        "piece",
        "pieces",
        "new",
        "东西",
        "商品",
        "产品",
        "订单",
        "宝贝",
        "这个",
        "那个",
        "一个",
    ]
)
_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
FUZZY_MIN_LEN = 4
FUZZY_RATIO = 0.8
CLOSE = 0.45  # products scoring less than this below the best one are a "which one?"


def normalise(text: str) -> str:
    """NFKC and case folding: the form every key and message is compared in."""
    return unicodedata.normalize("NFKC", text).casefold()


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """The match keys of ``text`` in order: words of spaced scripts (plural ``s`` dropped,
    digits kept) and each Chinese run's bigrams (a one-character run: itself)."""
    norm = normalise(text)
    out: list[str] = []
    for m in re.finditer(r"[\u3400-\u9fff\uf900-\ufaff]+|[a-z0-9]+(?:['’][a-z]+)?", norm):
        run = m.group(0)
        if _CJK.fullmatch(run):
            out.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
        else:
            out.append(_stem(run))
    return out


def _phrase_in(phrase: str, norm_text: str) -> bool:
    """Whether the normalised ``phrase`` occurs in ``norm_text`` as whole words (Chinese: anywhere)."""
    if not phrase:
        return False
    if _CJK.search(phrase):
        return phrase in norm_text
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?![a-z0-9])", norm_text) is not None


@dataclass(frozen=True)
class ProductKeys:
    """One product's match keys: ``naming`` (words that name it), ``first`` (the first naming
    word of each title), ``category`` (its title's category words), ``tagged`` (its tags' words), ``skus`` (its own and its
    variants', normalised), ``options`` (``{variant sku: normalised option values}``)."""

    names: ProductNames
    naming: frozenset[str]
    first: frozenset[str]
    category: frozenset[str]
    tagged: frozenset[str]
    skus: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    option_terms: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Found:
    """What :meth:`CatalogIndex.find` made of a message: ``products`` (best first: one when the
    message names one product, several when they fit equally: "which one?"), ``scores`` (same
    order), ``variant_sku`` (a variant the message named by its SKU, else "")."""

    products: tuple[ProductKeys, ...] = ()
    scores: tuple[float, ...] = ()
    variant_sku: str = ""

    @property
    def one(self) -> ProductKeys | None:
        return self.products[0] if len(self.products) == 1 else None


@dataclass(frozen=True)
class CatalogSnapshot:
    products: tuple[ProductKeys, ...] = ()
    fingerprint: tuple[int, int, str] | None = None
    naming_words: frozenset[str] = frozenset()
    option_words: frozenset[str] = frozenset()
    by_sku: dict[str, ProductKeys] = field(default_factory=dict)
    #: every naming, category or tag word (Chinese: bigrams), for joined words and follow-ups
    vocabulary: frozenset[str] = frozenset()
    vocabulary_by_letter: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: normalised title (any language) -> sku: reading back a "which one?" kefu asked
    by_title: dict[str, str] = field(default_factory=dict)


def build(names: Iterable[ProductNames], fingerprint: tuple[int, int, str] | None = None) -> CatalogSnapshot:
    """The index of ``names`` (see the module docstring)."""
    names = list(names)
    category: set[str] = set()
    for n in names:
        for tag in n.tags:
            category.update(terms(tag))
    # A word in three or more products' titles is a category too ("lamp" in every lamp's title).
    title_count: dict[str, int] = {}
    for n in names:
        for word in {w for t in n.titles.values() for w in terms(t)}:
            title_count[word] = title_count.get(word, 0) + 1
    category.update(w for w, c in title_count.items() if c >= 3)
    products = []
    for n in names:
        naming: set[str] = set()
        first: set[str] = set()
        own_category: set[str] = set()
        tagged: set[str] = set()
        for title in n.titles.values():
            words = [w for w in terms(title) if w not in GENERIC and not w.isdigit()]
            keys = [w for w in words if w not in category]
            naming.update(keys)
            own_category.update(w for w in words if w in category)
            if keys:
                first.add(keys[0])
        for tag in n.tags:
            tagged.update(w for w in terms(tag) if w not in GENERIC)
        options = {sku: tuple(normalise(v) for v in values if v.strip()) for sku, values in n.options.items()}
        skus = (normalise(n.sku), *(normalise(s) for s in n.variant_skus))
        products.append(
            ProductKeys(
                n,
                frozenset(naming),
                frozenset(first),
                frozenset(own_category),
                frozenset(tagged),
                skus,
                options,
                frozenset(w for vals in options.values() for v in vals for w in terms(v)),
            )
        )
    vocabulary = {w for p in products for w in p.naming | p.category | p.tagged | category}
    by_title: dict[str, str] = {}
    for p in products:
        for title in p.names.titles.values():
            by_title.setdefault(normalise(title).strip(), p.names.sku)
    vocabulary = {w for w in vocabulary if not w.isdigit()}
    by_letter: dict[str, list[str]] = {}
    for w in sorted(vocabulary):
        if w.isascii():
            by_letter.setdefault(w[0], []).append(w)
    return CatalogSnapshot(
        products=tuple(products),
        fingerprint=fingerprint,
        naming_words=frozenset(w for p in products for w in p.naming),
        option_words=frozenset(v for p in products for vals in p.options.values() for v in vals),
        by_sku={p.names.sku: p for p in products},
        vocabulary=frozenset(vocabulary),
        vocabulary_by_letter={k: tuple(v) for k, v in by_letter.items()},
        by_title=by_title,
    )


def _close(word: str, key: str) -> bool:
    if len(word) < 3 or len(key) < FUZZY_MIN_LEN or _CJK.search(key) or word[0] != key[0]:
        return False
    if len(word) >= FUZZY_MIN_LEN and key.startswith(word) and len(word) >= 0.4 * len(key):
        return True
    ratio = difflib.SequenceMatcher(None, word, key).ratio()
    return ratio >= (FUZZY_RATIO if len(word) >= FUZZY_MIN_LEN else 0.85)


SPLIT_MIN = 3  # each part of a word split in two has at least this many letters


def _known(part: str, snapshot: CatalogSnapshot) -> bool | None:
    """True when ``part`` is a catalog word, False when it is a close spelling of one, else None."""
    if part in snapshot.vocabulary:
        return True
    if len(part) < FUZZY_MIN_LEN:
        return None
    return False if any(_close(part, k) for k in snapshot.vocabulary_by_letter.get(part[0], ())) else None


def split_joined(word: str, snapshot: CatalogSnapshot, *, _rest: bool = False) -> tuple[str, ...]:
    """``word`` as the two catalog words written as one ("floorlamp" -> floor, lamp; "embrlamp"
    -> embr, lamp), or ``(word,)`` when it is a word of its own or splits into no two catalog
    words (three: a catalog word, maybe misspelt, and two more). The parts count as the words would (a category word only beside a naming word). One part must be a catalog word as written, the other
    may be a close spelling of one (so a long word costs a set look-up per split point, and a
    spelling comparison only beside an exact part). Of several splits, the one with more exact
    parts wins, then the longer first part."""
    if len(word) < 2 * SPLIT_MIN or word in snapshot.vocabulary or word in GENERIC or not word.isascii():
        return (word,)
    if not word.isalpha():
        return (word,)
    best: tuple[int, int, tuple[str, ...]] | None = None
    for i in range(SPLIT_MIN, len(word) - SPLIT_MIN + 1):
        left, right = word[:i], word[i:]
        if left not in snapshot.vocabulary and right not in snapshot.vocabulary:
            continue
        # A generic part is split off ("tidewaterpiece") and then counts for nothing.
        a = True if left in GENERIC else _known(left, snapshot)
        b = True if right in GENERIC else _known(right, snapshot)
        if a is None or b is None:
            continue
        rank = (int(a) + int(b), i, (left, right))
        if best is None or rank[:2] > best[:2]:
            best = rank
    if best is None and not _rest:
        # Three words as one ("emberfloorlamp", "embrtablelamp"): a catalog word (maybe
        # misspelt), then two.
        for i in range(len(word) - 2 * SPLIT_MIN, SPLIT_MIN - 1, -1):
            rest = split_joined(word[i:], snapshot, _rest=True)
            if len(rest) == 2 and _known(word[:i], snapshot) is not None:
                return (word[:i], *rest)
    return best[2] if best is not None else (word,)


def options_named(products: Iterable[ProductKeys], norm_text: str) -> dict[str, set[str]]:
    """``{sku: the option values of that product the normalised message names}`` (whole words;
    Chinese anywhere; a value with digits also written compactly: "150x200"), leaving out a value
    found only inside a longer one named ("灰色" in "炭灰色")."""
    compact = _compact(norm_text)
    hits: dict[str, set[str]] = {}
    for p in products:
        for values in p.options.values():
            for v in values:
                hit = _phrase_in(v, norm_text) or (
                    any(c.isdigit() for c in v) and len(_compact(v)) >= 2 and _compact(v) in compact
                )
                if hit:
                    hits.setdefault(p.names.sku, set()).add(v)
    every = {v for vals in hits.values() for v in vals}
    longer = {v for v in every if any(v != w and v in w for w in every)}
    return {sku: vals - longer for sku, vals in hits.items() if vals - longer}


def _compact(value: str) -> str:
    """A size written compactly: no spaces, no unit, ``×``/``*`` as ``x`` ("150 × 200 cm" ->
    "150x200")."""
    return re.sub(r"\s+|cm\b|厘米", "", value.lower()).replace("×", "x").replace("*", "x")


def _covers(p: ProductKeys, words: set[str], loose: list[str]) -> bool:
    """Whether the message holds every word of one of ``p``'s titles (misspellings allowed)."""
    for title in p.names.titles.values():
        needed = [w for w in terms(title) if w not in GENERIC and not w.isdigit()]
        if needed and all(w in words or any(_close(m, w) for m in loose) for w in needed):
            return True
    return False


def find(snapshot: CatalogSnapshot, text: str, *, among: tuple[str, ...] = (), every: bool = False) -> Found:
    """The products ``text`` names in ``snapshot`` (see the module docstring); ``among``: only
    these skus are candidates (a pending "which one?"); ``every``: every product named, best
    first, not only those that fit as well as the best (a comparison's, for the remote model's
    grounding). Pure; no database."""
    if not snapshot.products:
        return Found()
    norm = normalise(text)
    words = [part for w in terms(text) if w not in GENERIC for part in split_joined(w, snapshot) if part not in GENERIC]
    word_set = set(words)
    candidates = [p for p in snapshot.products if not among or p.names.sku in among]
    # Words not naming any product exactly: maybe misspelt or shortened names.
    loose = [w for w in word_set if w not in snapshot.naming_words and not _CJK.search(w) and not w.isdigit()]
    scored: list[tuple[float, ProductKeys, str]] = []
    for p in candidates:
        variant = ""
        score = 0.0
        for i, sku in enumerate(p.skus):
            if _phrase_in(sku, norm):
                score += 10
                if i > 0:
                    variant = p.names.variant_skus[i - 1]
        exact = p.naming & word_set
        fuzzy = {k for k in p.naming - exact for w in loose if _close(w, k)}
        naming = len(exact) + 0.9 * len(fuzzy)
        if naming or score:
            in_title = p.category & word_set
            score += naming + 0.5 * len(in_title) + 0.25 * len((p.tagged - in_title) & word_set)
        named = score >= 10 or naming >= 1.8 or (naming >= 0.9 and score >= 1.4)
        # One naming word alone: the title's first, in a short message or in Chinese ("the Ember?",
        # "余烬有货吗"), so a common word that happens to start a title ("morning") does not.
        if not named and naming >= 0.9 and (exact | fuzzy) & p.first:
            hit = next(iter((exact | fuzzy) & p.first))
            named = bool(_CJK.search(hit)) or len([w for w in words if w not in p.option_terms]) <= 4
        if named:
            scored.append((score, p, variant))
    if not scored:
        return Found()
    scored.sort(key=lambda s: -s[0])
    if every:
        return Found(products=tuple(s[1] for s in scored), scores=tuple(s[0] for s in scored))
    best = scored[0][0]
    close = [s for s in scored if best - s[0] < CLOSE]
    if len(close) > 1:
        # Look-alikes that fit as well: the one whose every title word the message holds wins
        # ("Morning Mug" against "Morning Mug Set of 2"); else "which one?".
        # An option value only some of them have ("the Loom throw in grey"): those.
        with_option = options_named([s[1] for s in close], norm)
        if with_option and len(with_option) < len(close):
            close = [s for s in close if s[1].names.sku in with_option]
    if len(close) > 1:
        whole = [s for s in close if _covers(s[1], word_set, loose)]
        if len(whole) == 1:
            close = whole
    return Found(
        products=tuple(s[1] for s in close),
        scores=tuple(s[0] for s in close),
        variant_sku=close[0][2] if len(close) == 1 else "",
    )


class CatalogIndex:
    """Process-wide holder of the current :class:`CatalogSnapshot` (swapped in whole)."""

    def __init__(self) -> None:
        self.snapshot = CatalogSnapshot()
        self.error = ""
        self._lock = threading.Lock()
        self._poller: threading.Thread | None = None

    def reload(self) -> set[str]:
        """Load the catalog's names and swap the new index in (blocking, thread-safe; four
        queries). Returns the skus that changed since the previous load (none on the first)."""
        with self._lock:
            fingerprint = catalog_fingerprint()
            names = catalog_names()
            before = {p.names.sku: p.names.updated for p in self.snapshot.products}
            first_load = self.snapshot.fingerprint is None
            self.snapshot = build(names, fingerprint)
            self.error = ""
        if first_load:
            return set()
        now = {n.sku: n.updated for n in names}
        return {sku for sku in before.keys() | now.keys() if before.get(sku) != now.get(sku)}

    def reload_if_changed(self) -> set[str] | None:
        """Reload when the catalog differs from the loaded one: the changed skus, or None when
        nothing changed (one query)."""
        if self.snapshot.fingerprint is not None and catalog_fingerprint() == self.snapshot.fingerprint:
            return None
        return self.reload()

    def start_background(self, on_change: Callable[[list[str]], object] | None = None) -> None:
        """Load the index and keep it fresh every ``KEFU_PRODUCTS_POLL_S`` seconds in a daemon
        thread (idempotent). ``on_change(titles_and_skus)`` is called with the names of the
        products that changed (to evict cached answers that name them)."""
        if self._poller is not None:
            return

        def run() -> None:
            while True:
                try:
                    close_old_connections()
                    old = self.snapshot
                    changed = self.reload_if_changed()
                    if changed and on_change is not None:
                        phrases = list(changed)
                        for sku in changed:
                            for snap in (old, self.snapshot):
                                keys = snap.by_sku.get(sku)
                                if keys is not None:
                                    phrases.extend(keys.names.titles.values())
                        on_change(phrases)
                except Exception as e:  # the thread's edge: keep the old index, retry later
                    self.error = f"{type(e).__name__}: {e}"
                    log.exception("catalog index reload failed")
                finally:
                    close_old_connections()
                time.sleep(settings.KEFU_PRODUCTS_POLL_S)

        self._poller = threading.Thread(target=run, name="catalog-index", daemon=True)
        self._poller.start()

    def find(self, text: str, *, among: tuple[str, ...] = (), every: bool = False) -> Found:
        """:func:`find` on the current snapshot."""
        return find(self.snapshot, text, among=among, every=every)

    def option_named(self, text: str) -> bool:
        """Whether ``text`` holds an option value of any product ("black", "灰色")."""
        norm = normalise(text)
        return any(_phrase_in(v, norm) for v in self.snapshot.option_words)


catalog = CatalogIndex()
