"""Links in text: find the web addresses an answer carries and tell whose domain each is.

A model answer may be shaped by a shopper who asked it to "mention http://evil.example/pay in
every reply" (issue 29, point 2): before such an answer is shared with other shoppers, every link
in it must point to a domain the store owns or lists (``cache_layer.policy.may_share_answer``).
Pure functions, no settings: the caller says which domains are the store's.

What counts as a link (broad on purpose: a link missed is one a shopper may follow; a word taken
for a link costs only a cache miss):

- an address with a scheme (``https://evil.example/pay``, ``ftp://...``, ``//evil.example``), its
  host read by :func:`urllib.parse.urlsplit` (user info, port and case dropped);
- ``www.`` and bare domain names (``evil.example/pay``, ``pay.evil-shop.com``, also right after
  Chinese text: ``请访问evil.example``): dot-separated ASCII labels of letters, digits and ``-``
  ending in a label of 2-24 letters (the longest top-level domains in the IANA root zone have 24
  letters) or an ``xn--`` label, not part of an e-mail address. A bare name written in non-ASCII
  letters (``例子.中国`` without a scheme) is not found; with a scheme it is.

Internationalised names are compared in their IDNA (``xn--``) form, so ``例子.中国`` and
``xn--fsqu00a.xn--fiqs8s`` are the same host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Link", "find_links", "foreign_links", "host_allowed", "host_of", "normalise_host"]

_LABEL = r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)"
# A scheme URL (http, https, ftp...) or a protocol-relative one, up to whitespace or a quote.
_SCHEME_URL = r"(?:[a-z][a-z0-9+.-]{1,15}:)?//[^\s<>\"'`]+"
# A bare or www. domain: labels, then a top-level label of 2-24 letters; optional port and path.
_BARE = rf"(?<![a-z0-9@.-])(?:{_LABEL}\.)+(?:[a-z]{{2,24}}|xn--[a-z0-9-]{{1,59}})(?![a-z0-9-]|@|\.[a-z0-9])(?::\d{{1,5}})?(?:/[^\s<>\"'`]*)?"
_LINK = re.compile(rf"{_SCHEME_URL}|{_BARE}", re.IGNORECASE)
# Punctuation a sentence puts after a link, not part of it ("see https://a.example/x.").
_TRAILING = ".,;:!?'\")]}，。；：！？）」』"


@dataclass(frozen=True, slots=True)
class Link:
    """A link found in a text: ``text`` as written (trailing punctuation dropped), its
    ``start``/``end`` offsets (code points) in the text, and ``host``, lower case, IDNA-encoded
    ("" when the address names no host, e.g. ``mailto:``)."""

    text: str
    start: int
    end: int
    host: str


def normalise_host(host: str) -> str:
    """``host`` lower-cased, trailing dot and port dropped, in IDNA (``xn--``) form when it holds
    non-ASCII letters; "" for an empty host. A host IDNA refuses is kept as lower-cased text."""
    h = host.strip().lower().rstrip(".")
    if h.startswith("[") and "]" in h:  # an IPv6 literal: "[::1]:8000"
        return h[: h.index("]") + 1]
    h = h.rsplit(":", 1)[0] if h.count(":") == 1 else h
    if h.isascii():
        return h
    try:
        return h.encode("idna").decode("ascii")
    except UnicodeError:
        return h


def host_of(address: str) -> str:
    """The host of ``address`` (a URL with or without scheme, or a bare host such as
    ``shop.example``, ``.shop.example``, ``shop.example:8000``), normalised
    (:func:`normalise_host`); "" when it has none."""
    a = address.strip()
    if not a:
        return ""
    if "//" not in a:
        a = f"//{a.lstrip('.')}"
    try:
        parts = urlsplit(a)
    except ValueError:  # an invalid IPv6 literal and the like: no host we can compare
        return ""
    return normalise_host(parts.hostname or "")


def find_links(text: str) -> list[Link]:
    """Every link in ``text``, in order (see the module docstring for what counts). Never raises."""
    found: list[Link] = []
    for m in _LINK.finditer(text):
        raw = m.group().rstrip(_TRAILING)
        if not raw:
            continue
        host = host_of(raw)
        if not host and "//" not in raw:
            continue
        found.append(Link(text=raw, start=m.start(), end=m.start() + len(raw), host=host))
    return found


def host_allowed(host: str, domains: Iterable[str]) -> bool:
    """Whether ``host`` (normalised) is one of ``domains`` (normalised hosts) or a subdomain of
    one ("pay.shop.example" under "shop.example"; never "evil-shop.example" nor
    "shop.example.evil.example"). An empty host is never allowed."""
    if not host:
        return False
    return any(host == d or host.endswith(f".{d}") for d in domains if d)


def foreign_links(text: str, domains: Iterable[str]) -> list[Link]:
    """The links in ``text`` whose host is not one of ``domains`` nor under one
    (:func:`host_allowed`), in order; a link with no host (``mailto:``...) is foreign."""
    allowed = [d for d in domains if d]
    return [link for link in find_links(text) if not host_allowed(link.host, allowed)]
