"""The bot's own words for what needs no model: requests for a person (whose detection lives in
``routing.decide.handoff_intent``) and small talk."""

from __future__ import annotations

import re

from routing.decide.handoff_intent import person_request

# Pure small talk: a greeting, thanks or goodbye and nothing else. The bot answers it itself
# (route ``decline``: no FAQ, no remote model, no person) instead of queueing it for an agent.
SMALL_TALK = re.compile(
    r"^\s*(hi+|hello+|hey+|hiya|good (morning|afternoon|evening)|thanks?( you)?( (so|very) much)?|thank u|thx|ty|"
    r"cheers|ok(ay)?( thanks?)?|bye+|goodbye|see you|你好|您好|嗨|哈喽|在吗|在不在|谢谢(你|您)?|多谢|好的(谢谢)?|再见|拜拜)"
    r"[\s!！.。,，~～?？]*(there|kefu|team)?[\s!！.。~～?？]*$",
    re.IGNORECASE,
)


def small_talk_reply(text: str, locale: str) -> str | None:
    """The bot's own reply to a message that is only a greeting, thanks or goodbye; else None."""
    if not SMALL_TALK.match(text):
        return None
    low = text.strip().lower()
    thanks = any(w in low for w in ("thank", "thx", "cheers", "谢", "ty"))
    bye = any(w in low for w in ("bye", "see you", "再见", "拜拜"))
    if locale == "zh":
        if bye:
            return "再见！有问题随时回来问我。"
        if thanks:
            return "不客气！还有其他问题随时问我。"
        return "您好！我可以帮您解答商品、订单、配送、退换货和付款方面的问题。请问有什么可以帮您？"
    if bye:
        return "Goodbye! Come back any time you have a question."
    if thanks:
        return "You're welcome! Ask me anything else any time."
    return "Hello! I can help with products, orders, shipping, returns and payments. What can I do for you?"


def wants_human(text: str, locale: str = "en") -> bool:
    """Whether ``text`` (in ``locale``) asks for a person, in any language kefu detects
    (``routing.decide.handoff_intent.person_request``)."""
    return person_request(text, locale) is not None


def person_request_words(text: str, locale: str = "en") -> str:
    """The words of ``text`` that ask for a person (the first match), or ``""``."""
    found = person_request(text, locale)
    return found.words if found is not None else ""
