"""Rewrite a follow-up ("and the blue one?") into a standalone question (issue 3, point 3).

A follow-up only makes sense with the turns before it, so it is never a cache key as it stands
(:func:`cache_layer.policy.is_follow_up`). :func:`standalone_question` asks a remote tier (the
``simple`` one by default) to rewrite the shopper's last message into one question that carries
every product, number and detail it leans on; only that rewrite may then be looked up in (and
stored into) the answer cache. Without a rewrite the follow-up is answered by the model with the
full history, and never served from the cache.

The call goes through :func:`routing.upstream.resilience.stream_with_fallback`, like every remote call:
it passes the same gates (upstream rate-limit headers, circuit breaker, client-side limits), is
retried / falls back the same way and is a row of the cost ledger (with ``context``). All of it is
bounded by ``KEFU_REWRITE_TIMEOUT_S`` (seconds, default 3.0) of wall-clock time: the rewrite sits
in front of the answer, so a slow upstream costs the cache hit, never the answer.

Settings read: ``KEFU_REWRITE_TIMEOUT_S`` (float seconds), ``KEFU_TIERS`` (the tier's model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Sequence

from django.conf import settings

from lib.logredact import shopper_text
from lib.text import language_name
from routing.providers.base import ProviderError
from routing.types import CallContext
from routing.upstream.complete import complete
from routing.upstream.tiers import tier_configured

log = logging.getLogger(__name__)

#: Version of the prompt below; part of nothing yet, logged with failures.
REWRITE_PROMPT_VERSION = "2026-12-01.1"
#: Answer budget of the rewrite call, in tokens (a question, not an answer).
REWRITE_MAX_TOKENS = 60
#: A rewrite longer than this (characters) is not one question: refused.
REWRITE_MAX_CHARS = 300
#: Each earlier turn is cut to this many characters in the prompt (the compacted history).
REWRITE_TURN_MAX_CHARS = 500

REWRITE_SYSTEM_PROMPT = (
    "Rewrite the shopper's last message as one standalone question that keeps every product, number "
    "and detail from the conversation; reply with the question only. Do not answer it. If the last "
    "message is already a standalone question, repeat it unchanged. Write the question in {language}."
)

# Labels a model sometimes puts before its rewrite ("Standalone question: ...").
_LABEL = re.compile(
    r"^\s*(?:standalone question|rewritten question|rewritten|rewrite|question|q|独立问题|改写后的问题|改写|问题)\s*[:：]\s*",
    re.IGNORECASE,
)
_QUOTES = {'"': '"', "'": "'", "`": "`", "“": "”", "‘": "’", "「": "」", "『": "』", "«": "»"}
_SPACES = re.compile(r"\s+")


def rewrite_timeout_s() -> float:
    """``KEFU_REWRITE_TIMEOUT_S``: the whole rewrite's wall-clock budget in seconds (default 3.0)."""
    return float(settings.KEFU_REWRITE_TIMEOUT_S)


def build_rewrite_messages(*, history: Sequence[tuple[str, str]], text: str, locale: str) -> list[dict[str, str]]:
    """The rewrite prompt in the OpenAI chat format: a system instruction and one user message
    holding the compacted transcript (``history``: ``(role, text)`` oldest first, role
    ``shopper``/``bot``/``agent``; each turn cut to :data:`REWRITE_TURN_MAX_CHARS` characters) and
    the shopper's last message ``text``. The transcript is quoted inside one message rather than
    replayed as turns, so the model rewrites it instead of answering it."""
    lines = []
    for role, body in history:
        body = _SPACES.sub(" ", body or "").strip()
        if not body:
            continue
        if len(body) > REWRITE_TURN_MAX_CHARS:
            body = body[:REWRITE_TURN_MAX_CHARS] + "…"
        lines.append(f"{'Shopper' if role == 'shopper' else 'Store'}: {body}")
    transcript = "\n".join(lines) or "(no earlier messages)"
    language = language_name(locale)
    return [
        {"role": "system", "content": REWRITE_SYSTEM_PROMPT.format(language=language)},
        {"role": "user", "content": f"Conversation:\n{transcript}\n\nShopper's last message: {text.strip()}"},
    ]


def clean_rewrite(reply: str) -> str | None:
    """The model's reply as one line, or ``None`` when it is not one usable question.

    Strips whitespace, a leading label ("Standalone question:", "问题：") and wrapping quotes, and
    collapses inner whitespace. ``None``: empty, more than one non-empty line (the model added an
    explanation or an answer), or longer than :data:`REWRITE_MAX_CHARS` characters.
    """
    lines = [ln.strip() for ln in (reply or "").strip().splitlines() if ln.strip()]
    if len(lines) != 1:
        return None
    out = _LABEL.sub("", lines[0]).strip()
    while len(out) >= 2 and _QUOTES.get(out[0]) == out[-1]:
        out = out[1:-1].strip()
    out = _SPACES.sub(" ", out)
    if not out or len(out) > REWRITE_MAX_CHARS:
        return None
    return out


async def standalone_question(
    *,
    history: list[tuple[str, str]],
    text: str,
    locale: str,
    tier: str = "simple",
    context: CallContext | None = None,
) -> str | None:
    """The shopper's last message ``text`` rewritten as one standalone question, or ``None``.

    ``history``: the earlier turns as ``(role, text)``, oldest first (``chat.selectors.
    history_for_prompt`` rows, already cut to ``KEFU_CONTEXT_TURNS``); ``locale``: ``"en"`` or
    ``"zh"``, the language the question is written in; ``tier``: which tier rewrites (it falls back
    to the tiers above it like any call, see the module docstring); ``context``: stored on the
    cost-ledger rows (conversation, message).

    ``None`` (and a log line) when: ``tier`` is not configured, ``text`` is blank, there is no
    history to resolve it from, the call failed (any ``ProviderError``) or did not finish within
    ``KEFU_REWRITE_TIMEOUT_S``, the answer was cut by the token budget (``finish_reason
    "length"``), or :func:`clean_rewrite` refuses the reply. Never raises for upstream failures;
    cancellation of the caller propagates.
    """
    if not tier_configured(tier) or not text.strip():
        return None
    if not any((body or "").strip() for _, body in history):
        return None  # nothing to resolve "it" / "the blue one" from
    try:
        async with asyncio.timeout(rewrite_timeout_s()):
            answer = await complete(
                messages=build_rewrite_messages(history=history, text=text, locale=locale),
                tier=tier,
                context=dataclasses.replace(context or CallContext(), purpose="rewrite"),
                max_tokens=REWRITE_MAX_TOKENS,
                temperature=0.0,  # the same follow-up should give the same key
            )
    except TimeoutError:
        log.info("rewrite (%s) timed out after %.1f s", REWRITE_PROMPT_VERSION, rewrite_timeout_s())
        return None
    except ProviderError as e:
        log.info("rewrite (%s) failed: %s", REWRITE_PROMPT_VERSION, e.code)
        return None
    except Exception:  # a bug of ours must not cost the shopper the answer: it only costs a cache hit
        log.exception("rewrite (%s) broke", REWRITE_PROMPT_VERSION)
        return None
    if not answer.complete:
        log.info("rewrite (%s) cut short (finish_reason=%s)", REWRITE_PROMPT_VERSION, answer.finish_reason)
        return None
    out = clean_rewrite(answer.text)
    if out is None:
        log.info("rewrite (%s) refused: %s", REWRITE_PROMPT_VERSION, shopper_text(answer.text))
    return out
