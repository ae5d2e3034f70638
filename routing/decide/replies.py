"""The bot's own words for what needs no model: requests for a person and small talk.

English patterns match whole words; Chinese ones match substrings (Chinese has no spaces).
"""

from __future__ import annotations

import re

# Requests for a person. English matches whole words; Chinese matches substrings.
HUMAN_EN = re.compile(
    r"\b(human|real person|live (agent|person)|(talk|speak|chat) (to|with) (a |an |someone|somebody|"
    r"your )?(person|agent|representative|someone|somebody|staff)|customer (service )?(agent|representative)|"
    r"operator)\b",
    re.IGNORECASE,
)
HUMAN_ZH = re.compile(r"人工|真人|转接|客服人员|找客服|接线员")

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


def wants_human(text: str) -> bool:
    """Whether ``text`` asks for a person (``HUMAN_EN`` whole words, ``HUMAN_ZH`` substrings)."""
    return bool(HUMAN_EN.search(text) or HUMAN_ZH.search(text))


def person_request_words(text: str) -> str:
    """The words of ``text`` that ask for a person (the first match), or ``""``."""
    m = HUMAN_EN.search(text) or HUMAN_ZH.search(text)
    return m.group(0) if m else ""
