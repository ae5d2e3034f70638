"""The slot guard: terms that change an answer must agree before a cached answer is shared.

Coarse intents are not answers: one customer-service intent ("delivery options") covers
international, express and standard delivery, and "change my address" covers the billing and the
shipping one. Measured on the team's hand-made look-alikes, 3 of 32 semantic hits served another
question's answer, each time two questions of one coarse topic that differ in one such term. So a
hit also needs both questions to name the same values of every answer-changing slot — kind of
delivery, kind of address, payment method, account kind, time — or neither to name any
(:func:`slots_agree`). Numbers and negation are the similarity guard's (``similarity.hard_guard``).

The vocabulary is data (``cache_layer/data/slots.json``, English patterns as whole-word regular
expressions, Chinese as substrings). A store extends it, e.g. with its product categories, with
``KEFU_CACHE_SLOTS_PATH``: a file of the same shape, merged over it (a slot's values are added,
a value's patterns replaced). Overlapping matches are resolved longest first ("American Express"
is a card, not express delivery; "gift card" is not a bank card).

Pure apart from reading the files once (``functools.cache``; :func:`forget` after a change).
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parent / "data" / "slots.json"


@dataclass(frozen=True)
class _Pattern:
    slot: str
    value: str
    regex: re.Pattern[str] | None  # English: whole words, case-insensitive
    literal: str  # Chinese: a substring ("" for a regex)


class SlotFileError(ValueError):
    """A slots file that is not the documented shape; the message names the file and the entry."""


def _extension_path() -> str:
    try:
        from django.conf import settings

        return str(getattr(settings, "KEFU_CACHE_SLOTS_PATH", "") or "")
    except Exception:  # no Django settings (a bench script): the shipped vocabulary only
        return ""


def _read(path: Path) -> dict[str, dict[str, dict[str, list[str]]]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SlotFileError(f"{path}: not a readable JSON file: {e}") from None
    slots = data.get("slots") if isinstance(data, dict) else None
    if not isinstance(slots, dict):
        raise SlotFileError(f'{path}: needs an object "slots": {{slot: {{value: {{"en": [...], "zh": [...]}}}}}}')
    for slot, values in slots.items():
        if not isinstance(values, dict):
            raise SlotFileError(f"{path}: slot {slot!r} must map values to patterns")
        for value, langs in values.items():
            if not isinstance(langs, dict) or not all(
                isinstance(langs.get(lang, []), list) and all(isinstance(p, str) for p in langs.get(lang, []))
                for lang in ("en", "zh")
            ):
                raise SlotFileError(f'{path}: {slot}.{value} must be {{"en": [regex, ...], "zh": [text, ...]}}')
    return slots


@functools.cache
def anchor_slots() -> frozenset[str]:
    """The slots that tie a question to a store topic (``"anchors"`` of the shipped file and of
    the store's extension): kind of delivery, address, payment method, account, product and
    material by default. Action, aspect, variant and time words are everyday language ("How long
    will cooked eggs last?") and anchor nothing on their own."""
    names = set(_names(SHIPPED, "anchors"))
    extra = _extension_path()
    if extra:
        names |= set(_names(Path(extra), "anchors"))
    return frozenset(names)


def _names(path: Path, key: str) -> list[str]:
    """The list of slot names under ``key`` in the file at ``path`` (``[]`` when absent).
    Raises :class:`SlotFileError` for anything but a list of strings."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SlotFileError(f"{path}: not a readable JSON file: {e}") from None
    names = data.get(key, []) if isinstance(data, dict) else []
    if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
        raise SlotFileError(f'{path}: "{key}" must be a list of slot names')
    return names


@functools.cache
def same_slots_only() -> frozenset[str]:
    """The slots only the same-slots rule checks (``"same_slots_only"`` of the files): action,
    aspect and variant by default. A paraphrase matched by meaning alone must ask the same action
    ("open" / "close" an account) and aspect (price / duration) about the same variant (size /
    colour); the same-intent and lexical rules have their own evidence, and these everyday words
    would cost them real paraphrases ("cancel my order" / "call off my purchase")."""
    names = set(_names(SHIPPED, "same_slots_only"))
    extra = _extension_path()
    if extra:
        names |= set(_names(Path(extra), "same_slots_only"))
    return frozenset(names)


def anchored(text: str) -> bool:
    """Whether ``text`` names a value of an anchor slot (:func:`anchor_slots`)."""
    anchors = anchor_slots()
    return any(slot in anchors for slot, _ in slot_values(text))


@functools.cache
def vocabulary() -> tuple[_Pattern, ...]:
    """Every pattern of the shipped vocabulary and the store's extension (``KEFU_CACHE_SLOTS_PATH``).
    Raises :class:`SlotFileError` for a malformed file, naming it and the bad entry."""
    merged = _read(SHIPPED)
    extra = _extension_path()
    if extra:
        for slot, values in _read(Path(extra)).items():
            merged.setdefault(slot, {}).update(values)
    out: list[_Pattern] = []
    for slot, values in merged.items():
        for value, langs in values.items():
            for pattern in langs.get("en", []):
                try:
                    rx = re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE)
                except re.error as e:
                    where = f" (KEFU_CACHE_SLOTS_PATH={extra})" if extra else ""
                    raise SlotFileError(f"{slot}.{value}: bad regular expression {pattern!r}{where}: {e}") from None
                out.append(_Pattern(slot, value, rx, ""))
            for text in langs.get("zh", []):
                if text:
                    out.append(_Pattern(slot, value, None, unicodedata.normalize("NFKC", text).lower()))
    return tuple(out)


def forget() -> None:
    """Read the vocabulary files again at next use (after ``KEFU_CACHE_SLOTS_PATH`` changed)."""
    vocabulary.cache_clear()
    slot_words.cache_clear()
    anchor_slots.cache_clear()
    same_slots_only.cache_clear()
    slot_values.cache_clear()


@functools.lru_cache(maxsize=8192)
def slot_values(text: str) -> frozenset[tuple[str, str]]:
    """The ``(slot, value)`` pairs ``text`` names, e.g. ``"Can I get express delivery to Canada?"``
    -> ``{("delivery", "express")}``; overlapping matches resolved longest first. Memoised."""
    return frozenset((slot, value) for _, _, slot, value in _matches(text))


@functools.lru_cache(maxsize=8192)
def slot_words(text: str) -> frozenset[str]:
    """The lower-case words of ``text`` inside its slot matches (``"the walnut floor lamp"`` ->
    ``{"walnut", "lamp"}``): what the slots already account for."""
    t = unicodedata.normalize("NFKC", text).lower()
    return frozenset(w for start, end, _, _ in _matches(text) for w in re.findall(r"[a-z]+", t[start:end]))


def _matches(text: str) -> list[tuple[int, int, str, str]]:
    """``(start, end, slot, value)`` of every slot match in ``text`` (NFKC, lower case), the
    longest first where matches overlap."""
    t = unicodedata.normalize("NFKC", text).lower()
    found: list[tuple[int, int, str, str]] = []
    for p in vocabulary():
        if p.regex is not None:
            found.extend((m.start(), m.end(), p.slot, p.value) for m in p.regex.finditer(t) if m.end() > m.start())
        else:
            start = t.find(p.literal)
            while start >= 0:
                found.append((start, start + len(p.literal), p.slot, p.value))
                start = t.find(p.literal, start + 1)
    taken: list[tuple[int, int, str, str]] = []
    for start, end, slot, value in sorted(found, key=lambda f: (f[0] - f[1], f[0])):
        if all(end <= s or start >= e for s, e, _, _ in taken):
            taken.append((start, end, slot, value))
    return taken


def slots_agree(question_a: str, question_b: str, *, every_slot: bool = False) -> tuple[bool, str]:
    """Whether two questions name the same slot values (``(True, "ok")``), else ``(False,
    "slot_differs: delivery express / delivery standard")`` naming what only each side has
    (``-`` for nothing). ``every_slot``: the :func:`same_slots_only` slots count too (the
    same-slots rule); else they are left out (the hard guard). Symmetric."""
    a, b = slot_values(question_a), slot_values(question_b)
    if not every_slot:
        skip = same_slots_only()
        a = frozenset(p for p in a if p[0] not in skip)
        b = frozenset(p for p in b if p[0] not in skip)
    if a == b:
        return True, "ok"

    def words(pairs: Any) -> str:
        return " ".join(f"{s} {v}" for s, v in sorted(pairs)) or "-"

    return False, f"slot_differs: {words(a - b)} / {words(b - a)}"
