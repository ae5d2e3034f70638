"""Fixed answers: FAQ answers with their ``{{placeholders}}`` filled from the store settings, and
the bot's own decline and handoff texts in English and Chinese."""

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

# Names of placeholders that stand for the shopper's own data: never shown raw, never guessed.
_PERSONAL = {
    "order number": "your order",
    "invoice number": "your invoice",
    "account": "your account",
    "person name": "there",
    "refund amount": "the refund amount",
    "client name": "there",
}


def placeholders() -> dict[str, str]:
    merged = dict(DEFAULT_PLACEHOLDERS)
    merged["Store Name"] = merged["Website Name"] = settings.KEFU_STORE_NAME
    merged.update({str(k): str(v) for k, v in (settings.KEFU_STORE_PLACEHOLDERS or {}).items()})
    return merged


def _fallback(name: str) -> str:
    """A readable stand-in for a placeholder the store did not set.

    Bitext-style names are often navigation labels ("{{Order History}}" -> "Order History");
    names of the shopper's own data ("{{Order Number Anonymized}}") read as "your order".
    The spelling of names is not normalised upstream, hence the keyword matching.
    """
    low = name.lower().replace("anonymized", "").strip()
    settings_map = placeholders()
    for key, value in settings_map.items():
        if key.lower() == low:
            return value
    if "phone" in low:
        return settings_map.get("Support Phone", "our phone line")
    if "email" in low:
        return settings_map.get("Support Email", "our support e-mail")
    if "hours" in low or "availability" in low:
        return settings_map.get("Support Hours", "our opening hours")
    if "website" in low or "store name" in low or "company" in low:
        return settings.KEFU_STORE_NAME
    for key, value in _PERSONAL.items():
        if key in low:
            return value
    return name.replace("Anonymized", "").strip()


def fill_placeholders(text: str) -> str:
    """``text`` with every ``{{Name}}`` replaced: store setting, else a readable fallback."""
    values = placeholders()
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), None) or _fallback(m.group(1)), text)


def handoff_text(locale: str, *, remote_failed: bool = False) -> str:
    if locale == "zh":
        return "这个问题我需要请同事来帮您处理。我已经为您转接人工客服，客服一有空就会在这里回复您。"
    # True whether or not an agent is online right now (when none is, a notice says so next).
    return (
        "I'd like a member of our team to help you with this. I've passed your conversation to our "
        "team, and a person will reply here as soon as one is available."
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
