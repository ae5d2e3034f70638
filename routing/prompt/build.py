"""The prompt sent to a remote model: a system prompt, the store's most relevant FAQ entries
(grounding), the catalog facts of the products the message is about (``routing.products.grounding``),
a rolling summary of older turns, the last turns that fit, and the new message.

Budget (issue 4, point 6): a tier's prompt takes at most ``KEFU_CONTEXT_TOKENS[tier]`` tokens
(settings ``KEFU_<TIER>_CONTEXT_TOKENS``, defaults 3000 / 6000 / 12000), counted with the tier
model's tokenizer (``routing.upstream.tokens``, tiktoken-compatible). The
system prompt (with grounding and summary) is always kept whole; the catalog facts of each
product (best first) are kept while the system prompt with them leaves :data:`MIN_MESSAGE_TOKENS`
for the new message (``Prompt.catalog_tokens`` says what they took); the shopper's new message is
always kept (cut, with a note, when it alone does not fit), and then as many of the most recent
turns as fit, never more than ``KEFU_CONTEXT_TURNS``. A turn is a shopper message and the answers
after it (``chat.selectors.history_for_prompt``); a turn is kept whole or not at all.

Rolling summary: turns that left the window are folded into ``Conversation.summary`` by the Celery
task ``routing.tasks.summarise_conversation`` (the ``simple`` tier), which also records the seq up
to which the summary reaches (``Conversation.summary_upto_seq``). A summary only ever covers turns
that had left the window, and windows only move forward, so a non-empty summary passed to
:func:`build_messages` always stands for turns that are not in the prompt.

Settings read: ``KEFU_CONTEXT_TOKENS``, ``KEFU_CONTEXT_TURNS``, ``KEFU_SUMMARY_MIN_TURNS``,
``KEFU_TIERS``, ``KEFU_STORE_NAME``, ``KEFU_LLM_MAX_TOKENS``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings

from lib.text import language_name
from routing.upstream.tiers import tier_model_or
from routing.upstream.tokens import PromptCounter

log = logging.getLogger(__name__)

SYSTEM_PROMPT_VERSION = "2026-11-30.1"

SYSTEM_PROMPT = """You are the customer-service assistant of {store}, an online store.
Answer the shopper's last message helpfully and briefly (at most 5 sentences or a short numbered list).
Use only the store information below and the conversation. Never promise refunds, discounts, delivery
dates or exceptions that the store information does not state; when you do not know, say so and offer
to connect the shopper with a person. Never ask for card numbers or passwords.
Answer in the language of the shopper's last message ({language}).

Store information:
{grounding}"""

#: Heading of the rolling summary inside the system message.
SUMMARY_HEADING = "Earlier in this conversation:"
#: Appended to a shopper message cut to fit the budget, so the model knows it is incomplete.
TRUNCATION_NOTE = "\n[The shopper's message was longer; it was cut here to fit the prompt.]"
#: A new message is never cut below this many tokens, even when the system prompt alone fills the budget.
MIN_MESSAGE_TOKENS = 64

Turn = list[tuple[str, str]]

#: Heading and rule of the catalog facts inside the system message (``routing.products.grounding``).
CATALOG_HEADING = "Catalog facts (the only source of prices and stock levels):"
CATALOG_RULE = (
    "State a price or a stock level only exactly as these catalog facts give it, with its currency; "
    "if they do not give it, say you do not know. Never estimate, round or invent one."
)


# --- Turns and the window --------------------------------------------------------------------------


def group_turns(history: Sequence[tuple[str, str]]) -> list[Turn]:
    """``history`` (``(role, text)`` oldest first) as turns: each starts at a shopper message and
    holds the answers after it; messages before the first shopper message form a turn of their own."""
    turns: list[Turn] = []
    for role, body in history:
        if role == "shopper" or not turns:
            turns.append([])
        turns[-1].append((role, body))
    return turns


def _role(role: str) -> str:
    return "user" if role == "shopper" else "assistant"


def context_tokens(tier: str) -> int:
    """``KEFU_CONTEXT_TOKENS[tier]``: the tier's prompt budget in tokens (positive; defaults in
    config/settings.py). Raises ``KeyError`` for an unknown tier."""
    return max(1, int(settings.KEFU_CONTEXT_TOKENS[tier]))


def turns_that_fit(turns: Sequence[Turn], *, budget: int, counter: PromptCounter, max_turns: int) -> tuple[int, int]:
    """How many of the newest ``turns`` fit in ``budget`` tokens (newest first, contiguous, whole
    turns, at most ``max_turns``): ``(count, tokens they take)``."""
    kept = used = 0
    for turn in reversed(turns):
        if kept >= max_turns:
            break
        cost = sum(counter.message(_role(role), body) for role, body in turn)
        if used + cost > budget:
            break
        kept += 1
        used += cost
    return kept, used


def instructions(locale: str) -> str:
    """kefu's own instructions to the model, as sent (the system prompt before the store
    information): what an answer must never repeat (``routing.decide.injection.LeakGuard``)."""
    head = SYSTEM_PROMPT.split("Store information:")[0]
    return head.format(store=settings.KEFU_STORE_NAME, language=language_name(locale))


def catalog_section(products: Sequence[str]) -> str:
    """The catalog facts of ``products`` (one block a product) under :data:`CATALOG_HEADING`
    with :data:`CATALOG_RULE`; "" for none."""
    if not products:
        return ""
    return f"\n\n{CATALOG_HEADING}\n" + "\n".join(products) + f"\n{CATALOG_RULE}"


def system_message(
    *, grounding: Sequence[tuple[str, str]], locale: str, summary: str = "", products: Sequence[str] = ()
) -> str:
    """The system message: instructions, ``grounding`` as Q/A pairs, the catalog facts of
    ``products`` (if any) and the summary (if any)."""
    facts = "\n".join(f"- Q: {q}\n  A: {a}" for q, a in grounding) or "- (no matching store information)"
    system = SYSTEM_PROMPT.format(store=settings.KEFU_STORE_NAME, language=language_name(locale), grounding=facts)
    system += catalog_section(products)
    if summary.strip():
        system += f"\n\n{SUMMARY_HEADING} {summary.strip()}"
    return system


@dataclass(frozen=True)
class Prompt:
    """A prompt and how it was fitted. ``messages``: OpenAI chat messages; ``kept_turns`` /
    ``dropped_turns``: turns of the given history in / left out; ``tokens``: the prompt's size
    in tokens (counted, or estimated while the tokenizer loads: ``estimated``); ``truncated``:
    the new message was cut to fit; ``summary``: the summary is in the system message;
    ``catalog_products`` / ``catalog_tokens``: the products whose catalog facts are in the system
    message, and the tokens those facts (heading and rule included) take."""

    messages: list[dict[str, str]]
    kept_turns: int
    dropped_turns: int
    tokens: int
    truncated: bool
    summary: bool
    estimated: bool
    catalog_products: int = 0
    catalog_tokens: int = 0


def build_prompt(
    *,
    grounding: Sequence[tuple[str, str]],
    history: Sequence[tuple[str, str]],
    text: str,
    locale: str,
    tier: str = "simple",
    summary: str = "",
    products: Sequence[str] = (),
) -> Prompt:
    """The prompt for ``tier`` within its budget (see the module docstring).

    ``grounding``: ``(question, answer)`` pairs; ``history``: ``(role, text)`` with role
    ``shopper``/``bot``/``agent``, oldest first (older turns beyond ``KEFU_CONTEXT_TURNS`` are
    dropped here too); ``text``: the shopper's new message; ``locale``: ``en``/``zh``;
    ``summary``: ``Conversation.summary``, the rolling summary of turns before ``history``
    (``""`` for none), put in the system message under :data:`SUMMARY_HEADING`; ``products``:
    the catalog facts of the products the message is about, one block a product, best first
    (``routing.products.grounding.facts_text``), put under :data:`CATALOG_HEADING` as far as
    they fit (the last ones are left out first).

    Safe to call on the event loop: until the tier model's tokenizer is loaded (2-3 s, once per
    process, started in the background), tokens are estimated (:func:`estimate_tokens`).
    """
    model = tier_model_or(tier, "gpt-4o")
    counter = PromptCounter(model)
    budget = context_tokens(tier)
    system = system_message(grounding=grounding, locale=locale, summary=summary)
    used = counter.priming + counter.message("system", system)
    catalog_products = catalog_tokens = 0
    for count in range(len(products), 0, -1):
        grounded = system_message(grounding=grounding, locale=locale, summary=summary, products=products[:count])
        with_catalog = counter.priming + counter.message("system", grounded)
        if with_catalog + MIN_MESSAGE_TOKENS <= budget:
            catalog_products, catalog_tokens = count, with_catalog - used
            system, used = grounded, with_catalog
            break

    message, truncated = text, False
    message_tokens = counter.message("user", text)
    if used + message_tokens > budget:
        message, message_tokens = _truncate(text, max(MIN_MESSAGE_TOKENS, budget - used), counter)
        truncated = True
    used += message_tokens

    turns = group_turns(history)
    kept, turn_tokens = turns_that_fit(
        turns, budget=max(0, budget - used), counter=counter, max_turns=max(0, settings.KEFU_CONTEXT_TURNS)
    )
    messages = [{"role": "system", "content": system}]
    for turn in turns[len(turns) - kept :]:
        messages.extend({"role": _role(role), "content": body} for role, body in turn)
    messages.append({"role": "user", "content": message})
    return Prompt(
        messages=messages,
        kept_turns=kept,
        dropped_turns=len(turns) - kept,
        tokens=used + turn_tokens,
        truncated=truncated,
        summary=bool(summary.strip()),
        estimated=counter.estimated,
        catalog_products=catalog_products,
        catalog_tokens=catalog_tokens,
    )


def _truncate(text: str, limit: int, counter: PromptCounter) -> tuple[str, int]:
    """The longest prefix of ``text`` that, with :data:`TRUNCATION_NOTE`, takes at most
    ``limit`` tokens as a user message (binary search on code points): ``(message, tokens)``."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.message("user", text[:mid] + TRUNCATION_NOTE) <= limit:
            lo = mid
        else:
            hi = mid - 1
    message = text[:lo].rstrip() + TRUNCATION_NOTE
    return message, counter.message("user", message)


def build_messages(
    *,
    grounding: Sequence[tuple[str, str]],
    history: Sequence[tuple[str, str]],
    text: str,
    locale: str,
    tier: str = "simple",
    summary: str = "",
) -> list[dict[str, str]]:
    """OpenAI chat messages: system (with ``grounding`` as Q/A pairs and the rolling ``summary``),
    then as many of the most recent turns of ``history`` as fit ``tier``'s budget, then the new
    shopper ``text`` (see :func:`build_prompt`)."""
    return build_prompt(
        grounding=grounding, history=history, text=text, locale=locale, tier=tier, summary=summary
    ).messages
