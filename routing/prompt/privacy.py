"""Personal data masked before any upstream call, with reversible placeholders.

The model sees ``[PHONE_1]`` where the shopper wrote their number; the shopper sees their own
number again in the streamed answer (:class:`StreamUnmasker`); a tool the model calls with a
placeholder gets the real value from :meth:`Vault.value_of`, never from the model. The same value
gets the same placeholder throughout one prompt (the history, the summary and the new message),
so the model can still tell "the number you gave earlier" from a new one.

What is found (:func:`find_personal_data`), in this order, the first kind winning an overlap:

- ``EMAIL``: an address (``local@domain.tld``);
- ``CARD``: 13-19 digits, optionally split by spaces or dashes, that pass the Luhn check
  (ISO/IEC 7812-1);
- ``ID``: a Chinese resident identity number: 17 digits and a check character that passes the
  ISO 7064 MOD 11-2 check of GB 11643-1999;
- ``PHONE``: what Google's libphonenumber (the ``phonenumbers`` package) finds as a valid number
  for any region of ``KEFU_PHONE_REGIONS``, any 11 digits shaped like a mainland China mobile
  number (``1[3-9]`` and nine more; libphonenumber knows only the allocated prefixes), and any
  ``+`` followed by 7-15 digits (an international number, valid or not);
- ``ADDRESS``: a street address ("221B Baker Street", "南京路100号"), the patterns of the answer
  cache's policy (``cache_layer.policy``).

Names are not masked: a model needs them to address the shopper, and no detector tells a name
from a product reliably; the answer cache refuses answers that name someone instead.
The store's own texts (FAQ answers in the grounding) are not masked either: the store's phone
number is what the model should give.

``KEFU_MASK_PERSONAL_DATA`` (on) switches it. The cost per message is measured in
``bench/masking_cost.py``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

import phonenumbers
from django.conf import settings

from cache_layer.policy import EMAIL, luhn_ok, street_address_spans

__all__ = ["Span", "StreamUnmasker", "Vault", "find_personal_data", "mask_messages", "masking_on"]

_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_CN_MOBILE = re.compile(r"(?<!\d)1[3-9]\d{9}(?!\d)")
_INTERNATIONAL = re.compile(r"\+\s?\d(?:[\s.()-]{0,2}\d){6,14}(?!\d)")
_CN_ID = re.compile(r"(?<![\dA-Za-z])\d{17}[\dXx](?![\dA-Za-z])")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_ZH_LEAD = re.compile(r"(?:请|帮我)?(?:送到|寄到|发到|送至|寄至|发往|地址是|地址为|地址：|地址:|住在)")
#: A placeholder as kefu writes it; at most this many characters ("[ADDRESS_999]").
PLACEHOLDER = re.compile(r"\[(EMAIL|CARD|ID|PHONE|ADDRESS)_(\d{1,3})\]")
PLACEHOLDER_MAX = 13


@dataclass(frozen=True)
class Span:
    """``text[start:end]`` is personal data of ``kind`` (``EMAIL``, ``CARD``, ``ID``, ``PHONE``,
    ``ADDRESS``)."""

    start: int
    end: int
    kind: str


def masking_on() -> bool:
    """``KEFU_MASK_PERSONAL_DATA``: mask before upstream calls (default on)."""
    return bool(getattr(settings, "KEFU_MASK_PERSONAL_DATA", True))


def _cn_id_ok(value: str) -> bool:
    total = sum(int(c) * w for c, w in zip(value[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == value[17].upper()


def find_personal_data(text: str) -> list[Span]:
    """The personal data in ``text`` as non-overlapping spans, in order (module docstring).
    Offsets are into ``text`` itself (full-width digits are read as digits, offsets kept).
    Remembered for the last 4,096 texts: a conversation's earlier turns are masked again with
    every remote answer."""
    return list(_find(text, tuple(settings.KEFU_PHONE_REGIONS)))


@functools.lru_cache(maxsize=4096)
def _find(text: str, regions: tuple[str, ...]) -> tuple[Span, ...]:
    t = unicodedata.normalize("NFKC", text) if not text.isascii() else text
    if len(t) != len(text):  # NFKC changed the length (rare ligatures): read the text as given
        t = text
    found: list[Span] = []

    def free(start: int, end: int) -> bool:
        return all(end <= s.start or start >= s.end for s in found)

    def add(start: int, end: int, kind: str) -> None:
        if free(start, end):
            found.append(Span(start, end, kind))

    for m in EMAIL.finditer(t):
        add(m.start(), m.end(), "EMAIL")
    for m in _CARD.finditer(t):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_ok(digits):
            add(m.start(), m.end(), "CARD")
    for m in _CN_ID.finditer(t):
        if _cn_id_ok(m.group()):
            add(m.start(), m.end(), "ID")
    if sum(ch.isdigit() for ch in t) >= 7:  # no phone number has fewer (libphonenumber is ~0.7 ms a region)
        for m in _INTERNATIONAL.finditer(t):  # first: its "+" and country code belong to the number
            add(m.start(), m.end(), "PHONE")
        for start, end in _phone_spans(t, regions):
            add(start, end, "PHONE")
        for m in _CN_MOBILE.finditer(t):
            add(m.start(), m.end(), "PHONE")
    for start, end in street_address_spans(t):
        lead = _ZH_LEAD.match(t, start)  # "送到南京路100号": the verb stays, the address goes
        add(lead.end() if lead and lead.end() < end else start, end, "ADDRESS")
    return tuple(sorted(found, key=lambda s: s.start))


def mask_messages(messages: list[dict[str, str]], vault: Vault) -> list[dict[str, str]]:
    """``messages`` (OpenAI chat format) with the personal data of every non-system message
    masked in ``vault`` (system messages are kefu's and the store's own text)."""
    return [m if m.get("role") == "system" else {**m, "content": vault.mask(m.get("content") or "")} for m in messages]


def _phone_spans(t: str, regions: tuple[str, ...]) -> Iterable[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    for region in regions:
        for match in phonenumbers.PhoneNumberMatcher(t, region):
            span = (match.start, match.end)
            if span not in seen:
                seen.add(span)
                yield span


@dataclass
class Vault:
    """The placeholders of one prompt: ``mask`` replaces personal data with ``[KIND_n]`` (the
    same value, the same placeholder), ``unmask`` puts the values back, ``value_of`` gives one
    placeholder's value (for a tool call). Values are compared as written, spaces included."""

    tokens: dict[str, str] = field(default_factory=dict)  # placeholder -> value
    _by_value: dict[tuple[str, str], str] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def mask(self, text: str) -> str:
        """``text`` with each span of :func:`find_personal_data` replaced by its placeholder."""
        spans = find_personal_data(text)
        if not spans:
            return text
        out, at = [], 0
        for span in spans:
            value = text[span.start : span.end]
            key = (span.kind, value)
            token = self._by_value.get(key)
            if token is None:
                self._counts[span.kind] = self._counts.get(span.kind, 0) + 1
                token = f"[{span.kind}_{self._counts[span.kind]}]"
                self._by_value[key] = token
                self.tokens[token] = value
            out += [text[at : span.start], token]
            at = span.end
        out.append(text[at:])
        return "".join(out)

    def unmask(self, text: str) -> str:
        """``text`` with every placeholder of this vault replaced by its value (others kept)."""
        if not self.tokens or "[" not in text:
            return text
        return PLACEHOLDER.sub(lambda m: self.tokens.get(m.group(0), m.group(0)), text)

    def value_of(self, token: str) -> str | None:
        """The value behind ``token`` (``"[PHONE_1]"``), or None when this vault has no such one."""
        return self.tokens.get(token.strip())

    def __bool__(self) -> bool:
        return bool(self.tokens)


class StreamUnmasker:
    """Unmasks a streamed answer piece by piece: a placeholder split across pieces (``"[PHO"``,
    ``"NE_1] today"``) is held back until it is whole, at most :data:`PLACEHOLDER_MAX` code points;
    everything else passes at once. Call :meth:`end` after the last piece for what was held."""

    def __init__(self, vault: Vault) -> None:
        self.vault = vault
        self._held = ""

    def feed(self, piece: str) -> str:
        text = self._held + piece
        self._held = ""
        cut = text.rfind("[")
        if cut != -1 and "]" not in text[cut:] and len(text) - cut < PLACEHOLDER_MAX:
            text, self._held = text[:cut], text[cut:]
        return self.vault.unmask(text)

    def end(self) -> str:
        held, self._held = self._held, ""
        return self.vault.unmask(held)
