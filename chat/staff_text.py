"""Texts of the router and of chat that reach agents, in the agent's language (issue 31 item 5).

The router and the handoff store their own words once, in English (``Message.route_reason``,
``Conversation.handoff_packet``: what an English-speaking operator greps for in logs and the
database); agents read them in their language, English or Simplified Chinese, translated on the
way out with Django's gettext (``locale/*/LC_MESSAGES/django.po``):

* :func:`reason_text`: a route reason or handoff reason ("shopper asked for a person",
  "remote model failed: timeout", "rule vip") — the fixed phrases and the fixed part of the
  patterned ones; technical reasons ("faq payment_methods p=0.94") stay as they are;
* :func:`packet_for_staff`: a handoff packet with its ``reason``, ``rule_text`` (the rule's
  name) and ``summary`` (rebuilt from the packet's ``facts`` when it has them) translated;
* :func:`scope_language`: the language of an agent's socket, as the staff pages choose it
  (the ``django_language`` cookie, else Accept-Language, else ``LANGUAGE_CODE``).

Everything here works in the active language: wrap calls in ``translation.override(lang)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.utils.translation.trans_real import parse_accept_lang_header

#: Reasons stored as they are, and their translation.
_FIXED: dict[str, Any] = {
    "shopper asked for a person": gettext_lazy("shopper asked for a person"),
    "shopper pressed talk to a person": gettext_lazy("shopper pressed talk to a person"),
    "shopper accepted the offer of a person": gettext_lazy("shopper accepted the offer of a person"),
    "no FAQ answer and no remote model configured": gettext_lazy("no FAQ answer and no remote model configured"),
    "out of scope": gettext_lazy("out of scope"),
    "shopper said the answer missed the question": gettext_lazy("shopper said the answer missed the question"),
    "asked again after a thumbs-down": gettext_lazy("asked again after a thumbs-down"),
    'asked again after "that\'s not what I asked"': gettext_lazy("asked again after “that’s not what I asked”"),
}

#: Reasons made of a fixed part and a value: (pattern, how the translation is made from the match).
_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"remote model failed: (?P<code>.+)"), lambda m: _("remote model failed: %(code)s") % m.groupdict()),
    (re.compile(r"rule (?P<name>\S+)"), lambda m: _("rule %(name)s") % m.groupdict()),
    (re.compile(r"budget: (?P<why>.+)"), lambda m: _("budget: %(why)s") % m.groupdict()),
    (re.compile(r"(?P<name>.+) left the conversation"), lambda m: _("%(name)s left the conversation") % m.groupdict()),
    (
        re.compile(r"remote model, (?P<rest>.+)"),
        lambda m: _("remote model, %(rest)s") % {"rest": m["rest"].replace("store tools", _("store tools"))},
    ),
]

#: The handoff packet's rules (chat.handoff.rule_of), as agents read them.
RULES: dict[str, Any] = {
    "asked_for_person": gettext_lazy("the shopper asked for a person"),
    "no_answer": gettext_lazy("nothing else could answer"),
    "remote_failed": gettext_lazy("every remote model failed"),
    "asked_again": gettext_lazy("asked again after a complaint"),
    "bot_handoff": gettext_lazy("the bot handed over"),
}


def reason_text(reason: str) -> str:
    """``reason`` (a router's or chat's own words, English) in the active language; a reason of
    no known form comes back unchanged. Never raises."""
    if not reason:
        return reason
    fixed = _FIXED.get(reason)
    if fixed is not None:
        return str(fixed)
    for pattern, make in _PATTERNS:
        m = pattern.fullmatch(reason)
        if m is not None:
            return make(m)
    return reason


def summary_text(facts: dict[str, Any]) -> str:
    """The handoff packet's summary in the active language, from its ``facts`` (``{"shopper":
    int, "bot": int, "first": str, "latest": str, "routes": [str]}``, chat.handoff.build_packet)."""
    shopper, bot = int(facts.get("shopper", 0)), int(facts.get("bot", 0))
    # The English words are the stored summary's (chat.handoff.build_packet), letter for letter.
    lines = [_("%(shopper)d shopper message(s), %(bot)d bot answer(s).") % {"shopper": shopper, "bot": bot}]
    if facts.get("first"):
        lines.append(_("First asked: “%(text)s”") % {"text": facts["first"]})
    if facts.get("latest"):
        lines.append(_("Latest: “%(text)s”") % {"text": facts["latest"]})
    if facts.get("routes"):
        lines.append(_("Bot answered via %(routes)s.") % {"routes": ", ".join(facts["routes"])})
    return "\n".join(lines)


def packet_for_staff(packet: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of a handoff packet for an agent, in the active language: ``reason`` translated
    (:func:`reason_text`), ``rule_text`` the rule's name (the code stays in ``rule``), and
    ``summary`` rebuilt from ``facts`` when the packet has them (packets stored before keep
    their English summary). None and ``{}`` come back as they are."""
    if not packet:
        return packet
    out = dict(packet)
    out["reason"] = reason_text(str(packet.get("reason") or ""))
    rule = RULES.get(str(packet.get("rule") or ""))
    if rule is not None:
        out["rule_text"] = str(rule)
    facts = packet.get("facts")
    if isinstance(facts, dict):
        out["summary"] = summary_text(facts)
    return out


def scope_language(scope: dict[str, Any]) -> str:
    """The language of a staff socket's ``scope``, as the staff pages choose it: the
    ``django_language`` cookie (the language switch), else the browser's Accept-Language, else
    ``LANGUAGE_CODE``; always one of ``LANGUAGES``. Never raises."""
    cookie = (scope.get("cookies") or {}).get(settings.LANGUAGE_COOKIE_NAME)
    candidates: list[str] = [cookie] if cookie else []
    for name, value in scope.get("headers") or []:
        if name == b"accept-language":
            header = value.decode("latin-1")
            candidates += [code for code, _q in parse_accept_lang_header(header) if code != "*"]
    for code in candidates:
        try:
            return translation.get_supported_language_variant(code)
        except LookupError:
            continue
    return str(settings.LANGUAGE_CODE)
