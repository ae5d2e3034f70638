"""Fixed answers: FAQ answers with their ``{{placeholders}}`` filled from the store settings in the
answer's own language, and the bot's own decline and handoff texts in English and Chinese (any
other locale gets English)."""

from __future__ import annotations

import re

from django.conf import settings

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")

# Demo store values; a store overrides any of them with KEFU_STORE_PLACEHOLDERS (JSON).
DEFAULT_PLACEHOLDERS: dict[str, str] = {
    "Store Name": "Lantern & Loom",
    "Website Name": "Lantern & Loom",
    "Support Email": "help@lanternandloom.example",
    "Customer Support Email": "help@lanternandloom.example",
    "Support Phone": "+1 555 010 0199",
    "Customer Support Phone Number": "+1 555 010 0199",
    "Support Hours": "Monday to Friday, 9:00-18:00",
    "Customer Support Hours": "Monday to Friday, 9:00-18:00",
    "Customer Support Availability": "Monday to Friday, 9:00-18:00",
    "Free Shipping Threshold": "$75",
    "Return Window Days": "30",
    "Live Chat": "live chat",
    "Contact Page": "Contact page",
}

# The same values in Chinese, for answers in ``zh`` (a locale without its own values gets English).
LOCALE_PLACEHOLDERS: dict[str, dict[str, str]] = {
    "zh": {
        "Support Hours": "周一至周五 9:00-18:00",
        "Customer Support Hours": "周一至周五 9:00-18:00",
        "Customer Support Availability": "周一至周五 9:00-18:00",
        "Free Shipping Threshold": "75 美元",
        "Live Chat": "在线聊天",
        "Contact Page": "联系我们页面",
    },
}

# Names of placeholders that stand for the shopper's own data: never shown raw, never guessed.
_PERSONAL: dict[str, dict[str, str]] = {
    "en": {
        "order number": "your order",
        "invoice number": "your invoice",
        "account": "your account",
        "person name": "there",
        "refund amount": "the refund amount",
        "client name": "there",
    },
    "zh": {
        "order number": "您的订单",
        "invoice number": "您的发票",
        "account": "您的账户",
        "person name": "您",
        "refund amount": "退款金额",
        "client name": "您",
    },
}
# Stand-ins for a kind of placeholder the store left unset.
_GENERIC = {
    "en": {"phone": "our phone line", "email": "our support e-mail", "hours": "our opening hours"},
    "zh": {"phone": "我们的客服电话", "email": "我们的客服邮箱", "hours": "我们的服务时间"},
}


def placeholders(locale: str = "en") -> dict[str, str]:
    """The values of ``{{Name}}`` placeholders for answers in ``locale``: the demo store's, then
    that locale's own (``LOCALE_PLACEHOLDERS``), then the store's ``KEFU_STORE_PLACEHOLDERS``.

    ``KEFU_STORE_PLACEHOLDERS`` is a JSON object of names to values for every locale; a value that
    is itself an object gives one value per locale (``{"Support Hours": {"en": "9-5", "zh":
    "9点到5点"}}``), its ``en`` value standing in for a locale it lacks."""
    merged = dict(DEFAULT_PLACEHOLDERS)
    merged["Store Name"] = merged["Website Name"] = settings.KEFU_STORE_NAME
    merged.update(LOCALE_PLACEHOLDERS.get(locale, {}))
    for key, value in (settings.KEFU_STORE_PLACEHOLDERS or {}).items():
        if isinstance(value, dict):
            chosen = value.get(locale, value.get("en"))
            if chosen is not None:
                merged[str(key)] = str(chosen)
        else:
            merged[str(key)] = str(value)
    return merged


def _fallback(name: str, locale: str, values: dict[str, str]) -> str:
    """A readable stand-in for a placeholder the store did not set, in ``locale``.

    Bitext-style names are often navigation labels ("{{Order History}}" -> "Order History");
    names of the shopper's own data ("{{Order Number Anonymized}}") read as "your order".
    The spelling of names is not normalised upstream, hence the keyword matching.
    """
    low = name.lower().replace("anonymized", "").strip()
    for key, value in values.items():
        if key.lower() == low:
            return value
    generic = _GENERIC.get(locale, _GENERIC["en"])
    if "phone" in low:
        return values.get("Support Phone", generic["phone"])
    if "email" in low:
        return values.get("Support Email", generic["email"])
    if "hours" in low or "availability" in low:
        return values.get("Support Hours", generic["hours"])
    if "website" in low or "store name" in low or "company" in low:
        return settings.KEFU_STORE_NAME
    for key, value in _PERSONAL.get(locale, _PERSONAL["en"]).items():
        if key in low:
            return value
    return name.replace("Anonymized", "").strip()


def fill_placeholders(text: str, locale: str = "en") -> str:
    """``text`` (an answer in ``locale``) with every ``{{Name}}`` replaced: the store's value for
    that locale, else a readable stand-in in it (:func:`placeholders`)."""
    values = placeholders(locale)
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1)) or _fallback(m.group(1), locale, values), text)


def handoff_text(locale: str, *, remote_failed: bool = False) -> str:
    if locale == "zh":
        return "这个问题我需要请同事来帮您处理。我已经为您转接人工客服，客服一有空就会在这里回复您。"
    # True whether or not an agent is online right now (when none is, a notice says so next).
    return (
        "I'd like a member of our team to help you with this. I've passed your conversation to our "
        "team, and a person will reply here as soon as one is available."
    )


def budget_text(locale: str) -> str:
    """What a shopper reads when their spend budget (or the store's) leaves no remote answer
    (``routing.upstream.budgets``): polite, no figures, and a person will answer."""
    if locale == "zh":
        return "这个问题我现在没法自动回答。我已经把您的消息转给了我们的团队，客服一有空就会在这里回复您。"
    return (
        "I can't look into this one automatically right now, so I've passed your message to our "
        "team. A person will reply here as soon as one is available."
    )


def decline_text(locale: str) -> str:
    if locale == "zh":
        return "抱歉，这个问题超出了我能帮忙的范围。我可以回答关于商品、订单、配送、退换货和付款的问题。"
    return (
        "Sorry, that's outside what I can help with here. I can answer questions about our products, "
        "orders, shipping, returns and payments."
    )


def chunks(text: str, size: int = 40) -> list[str]:
    """A fixed answer (FAQ, cache, decline, handoff) in stream pieces of about ``size`` code
    points, split after spaces where possible; ``"".join(chunks(t)) == t``."""
    out: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            space = text.rfind(" ", start + 1, end + 1)
            if space > start:
                end = space + 1
        out.append(text[start:end])
        start = end
    return out
