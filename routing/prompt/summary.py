"""The rolling summary's model half: which turns left the prompt window, the summary prompt, and
the call that writes the summary (the ``simple`` tier).

Chat holds the database half (``chat.summary``): it reads the turns not summarised yet, asks
:func:`turns_left_window` how many of them left the window, asks :func:`summary_write` for the
new summary and stores it. A summary only ever covers turns that had left the window, and
windows only move forward, so a non-empty summary in a prompt always stands for turns that are
not in it (``routing.prompt.build``).

Settings read: ``KEFU_CONTEXT_TOKENS``, ``KEFU_CONTEXT_TURNS``, ``KEFU_SUMMARY_MIN_TURNS``,
``KEFU_TIERS``, ``KEFU_STORE_NAME``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from django.conf import settings

from lib.text import language_name
from routing.prompt import privacy
from routing.prompt.build import Turn, context_tokens, system_message, turns_that_fit
from routing.providers.base import ProviderError
from routing.types import CallContext, Payer
from routing.upstream.complete import complete_blocking
from routing.upstream.tiers import tier_configured, tier_model_or
from routing.upstream.tokens import PromptCounter

log = logging.getLogger(__name__)

SUMMARY_TIER = "simple"
#: Answer budget of a summary call, tokens.
SUMMARY_MAX_TOKENS = 300
#: The stored summary is cut to this many characters.
SUMMARY_MAX_CHARS = 2000
#: Tokens the summariser keeps free for the parts of a prompt it cannot know in advance (the
#: grounding of the next question and the new message) when it decides which turns left the window.
SUMMARY_RESERVE_TOKENS = 800
#: At most this many unsummarised turns go into one summary call (older ones are skipped).
SUMMARY_MAX_BATCH_TURNS = 20
SUMMARY_PROMPT_VERSION = "2026-12-02.1"

SUMMARY_SYSTEM_PROMPT = (
    "You keep a running summary of a customer-service chat between a shopper and the assistant of "
    "{store}, an online store. Update the summary with the new turns: keep the products, sizes, colours, "
    "quantities, numbers and facts the shopper gave, what the store answered or promised, and what is "
    "still open. At most 120 words, plain sentences, in {language}. Reply with the summary only."
)


def summaries_on() -> bool:
    """Whether rolling summaries are written: the ``simple`` tier is configured and
    ``KEFU_SUMMARY_MIN_TURNS`` is positive."""
    return tier_configured(SUMMARY_TIER) and min_turns() > 0


def min_turns() -> int:
    """``KEFU_SUMMARY_MIN_TURNS``: a summary is written once at least this many turns left the window."""
    return int(settings.KEFU_SUMMARY_MIN_TURNS)


def turns_left_window(turns: Sequence[Turn], *, summary: str, locale: str) -> int:
    """How many of the oldest ``turns`` (``(role, text)`` lists, oldest first) left the ``simple``
    tier's window: beyond the last ``KEFU_CONTEXT_TURNS`` turns, or beyond what fits its budget
    less :data:`SUMMARY_RESERVE_TOKENS` beside a system message carrying ``summary``. Counts
    tokens (the tokenizer may load: not on the event loop)."""
    model = tier_model_or(SUMMARY_TIER, "gpt-4o")
    counter = PromptCounter(model)
    system = system_message(grounding=[], locale=locale, summary=summary)
    budget = context_tokens(SUMMARY_TIER) - SUMMARY_RESERVE_TOKENS - counter.priming - counter.message("system", system)
    kept, _ = turns_that_fit(
        turns, budget=max(0, budget), counter=counter, max_turns=max(0, settings.KEFU_CONTEXT_TURNS)
    )
    return len(turns) - kept


def build_summary_messages(*, previous: str, turns: Sequence[Turn], locale: str) -> list[dict[str, str]]:
    """The summary call's prompt: an instruction, then the summary so far and the new turns as a
    transcript in one user message (quoted, so the model summarises instead of answering)."""
    lines = [
        f"{'Shopper' if role == 'shopper' else 'Store'}: {' '.join(body.split())}"
        for turn in turns
        for role, body in turn
    ]
    language = language_name(locale)
    return [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT.format(store=settings.KEFU_STORE_NAME, language=language)},
        {
            "role": "user",
            "content": f"Summary so far:\n{previous.strip() or '(none)'}\n\nNew turns:\n" + "\n".join(lines),
        },
    ]


def summary_write(
    *,
    previous: str,
    turns: Sequence[Turn],
    locale: str,
    conversation_id: uuid.UUID | None,
    payer: Payer | None = None,
) -> str | None:
    """The summary ``previous`` extended with ``turns`` (at most :data:`SUMMARY_MAX_CHARS`
    characters), written by the ``simple`` tier (retries and fallback, a ledger row per attempt
    with purpose ``summary`` and the conversation). Its cost is held and settled on ``payer``'s
    spend budgets as an answer's is (``routing.upstream.budgets``; None: the tier's store-wide cap
    only). ``None`` when no tier is configured, the budgets refused the call, it failed, was cut
    by its token budget or came back empty. Never raises for upstream failures.
    Blocking (a private event loop in a fresh thread)."""
    if not tier_configured(SUMMARY_TIER) or not turns:
        return None
    messages = build_summary_messages(previous=previous, turns=turns[-SUMMARY_MAX_BATCH_TURNS:], locale=locale)
    vault = privacy.Vault() if privacy.masking_on() else None
    if vault is not None:  # placeholders for personal data upstream; the stored summary has the values
        messages = privacy.mask_messages(messages, vault)
    try:
        answer = complete_blocking(
            messages=messages,
            tier=SUMMARY_TIER,
            context=CallContext(conversation_id=conversation_id, purpose="summary", payer=payer),
            max_tokens=SUMMARY_MAX_TOKENS,
            temperature=0.0,
        )
    except ProviderError as e:
        log.info("summary (%s) of %s failed: %s", SUMMARY_PROMPT_VERSION, conversation_id, e.code)
        return None
    text = answer.text.strip()[:SUMMARY_MAX_CHARS] if answer.complete else ""
    if vault is not None:
        text = vault.unmask(text)
    if not text:
        log.info("summary (%s) of %s empty or cut", SUMMARY_PROMPT_VERSION, conversation_id)
        return None
    return text
