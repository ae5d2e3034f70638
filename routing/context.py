"""The prompt sent to a remote model: a system prompt, the store's most relevant FAQ entries
(grounding), the last N turns of the conversation, and the new message."""
from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

SYSTEM_PROMPT_VERSION = "2026-11-30.1"

SYSTEM_PROMPT = """You are the customer-service assistant of {store}, an online store.
Answer the shopper's last message helpfully and briefly (at most 5 sentences or a short numbered list).
Use only the store information below and the conversation. Never promise refunds, discounts, delivery
dates or exceptions that the store information does not state; when you do not know, say so and offer
to connect the shopper with a person. Never ask for card numbers or passwords.
Answer in the language of the shopper's last message ({language}).

Store information:
{grounding}"""


def build_messages(
    *, grounding: Sequence[tuple[str, str]], history: Sequence[tuple[str, str]], text: str, locale: str
) -> list[dict[str, str]]:
    """OpenAI chat messages: system (with ``grounding`` as Q/A pairs), then ``history`` as
    ``(role, text)`` with role ``shopper``/``bot``/``agent`` (oldest first, already cut to the last
    N turns), then the new shopper ``text``."""
    facts = "\n".join(f"- Q: {q}\n  A: {a}" for q, a in grounding) or "- (no matching store information)"
    system = SYSTEM_PROMPT.format(
        store=settings.KEFU_STORE_NAME, language="Chinese" if locale == "zh" else "English", grounding=facts
    )
    messages = [{"role": "system", "content": system}]
    for role, body in history:
        messages.append({"role": "user" if role == "shopper" else "assistant", "content": body})
    messages.append({"role": "user", "content": text})
    return messages
