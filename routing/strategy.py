"""Who answers a shopper message: the cheapest way that is still right.

Order of checks (docs/routing.md):
1. the shopper asks for a person (keyword rules, English and Chinese) -> ``handoff``;
2. the local FAQ model is confident -> ``faq`` (the entry's answer, placeholders filled);
3. the scope classifier says the message is not a store matter -> ``decline``;
4. a remote model is configured -> ``llm.<tier>``, grounded on the closest FAQ entries; the tier
   classifier (``routing.classifier``: keyword rules, then a learned model) chooses the tier, or a
   keyword rule (legal threat, fraud, chargeback...) hands the message to a person;
5. otherwise -> ``handoff`` (a person answers).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections

from cache_layer import services as cache
from cache_layer.embeddings import embed_async, embed_batched
from cache_layer.policy import is_follow_up
from lib.text import detect_locale
from lib.tokens import count_tokens

from . import answers, context, ledger, rewrite
from .classifier import HANDOFF, TierDecision, choose_tier, rule_for
from .faq_model import FaqMatch, normalise_text
from .providers.base import ChatRequest, StreamDone, Usage
from .registry import registry
from .replies import small_talk_reply, wants_human
from .scope import ScopeVerdict
from .tiers import provider_for, tier_model
from .types import ROUTING_MAX_CHARS, AnswerRecord, CallContext, Decision, HistoryLoader, Question


def handoff_decision(*, locale: str, reason: str) -> Decision:
    return Decision(route="handoff", locale=locale, text=answers.handoff_text(locale), reason=reason)


@dataclass
class Classified:
    """What routing learns from a message's text alone (computed off the event loop, possibly
    while the message is still being stored): the FAQ match, the scope verdict and, for a
    message headed for the remote model, its grounding and any answer-cache hit."""

    match: FaqMatch | None = None
    verdict: ScopeVerdict | None = None
    remote: tuple[list[tuple[str, str]], list[int], np.ndarray | None] | None = None
    cache_scope: str = ""
    hit: cache.CacheHit | None = None
    # The tier classifier's verdict for a remote-bound message.
    tier: TierDecision | None = None


def classify(text: str, locale: str) -> Classified:
    """Classify ``text`` (blocking; run in a worker thread). The scope check reuses the FAQ
    model's embedding; grounding and the cache lookup run only when a remote model would answer.
    The cache's exact key uses the whole text; everything embedded uses its first
    ``ROUTING_MAX_CHARS`` code points."""
    full_text, text = text, text[:ROUTING_MAX_CHARS]
    # The message is embedded first, through the batcher (cache_layer.embeddings): concurrent
    # messages from other threads share one model call. The vector lands in the embedder's LRU,
    # so the FAQ model's own embedding of the same normalised text below is a lookup, and the
    # scope check, the grounding and the cache all use this one vector.
    # Measured: the scope verdicts on normalised and raw text agree (600 Bitext questions:
    # 0 declined either way; CLINC oos_val: 78% vs 77% declined).
    norm = normalise_text(text)
    vector = embed_batched([norm])[0] if norm else None
    model, scope = registry.model, registry.scope
    out = Classified()
    out.match = model.match(text, locale=locale) if model is not None else None
    if out.match is not None and out.match.accepted:
        return out
    if scope is not None:
        out.verdict = scope.classify(text) if vector is None else scope.classify_vector(vector, text=text)
    if (out.verdict is not None and out.verdict.out_of_scope) or wants_human(full_text):
        return out
    out.tier = choose_tier(full_text, vector)  # rules on the whole text, the model on this vector
    if out.tier is None or out.tier.tier == HANDOFF:
        return out
    grounding, grounded_on = grounding_for(text, locale)
    out.remote = (grounding, grounded_on, vector)
    out.cache_scope = cache_scope_for(locale=locale, tier=out.tier.tier)
    if settings.KEFU_CACHE_ENABLED:
        close_old_connections()  # this worker thread keeps its own connection, within CONN_MAX_AGE
        out.hit = cache.lookup(question=full_text, scope=out.cache_scope, embedding=vector)
    return out


# Classifications started when a message arrives, before it is stored (see ``prefetch``):
# (text, locale) -> future of ``classify``. Entries are consumed by ``decide`` or dropped after
# PREFETCH_TTL_S (e.g. when an agent holds the conversation and the bot never decides).
_prefetched: dict[tuple[str, str], asyncio.Future[Classified]] = {}
PREFETCH_TTL_S = 30.0


def prefetch(*, text: str, conversation_locale: str) -> None:
    """Start classifying ``text`` off the event loop now, so that the embedding (the slowest step
    of routing, ~10-15 ms on 2 cores) and the cache lookup overlap the database writes that store
    the message."""
    locale = detect_locale(text, conversation_locale)
    key = (text, locale)
    if key in _prefetched or registry.model is None:
        return
    loop = asyncio.get_running_loop()
    _prefetched[key] = loop.run_in_executor(None, classify, text, locale)
    loop.call_later(PREFETCH_TTL_S, _prefetched.pop, key, None)


async def _classified(text: str, locale: str) -> Classified:
    future = _prefetched.pop((text, locale), None)
    if future is not None:
        try:
            return await future
        except Exception:  # a failed prefetch is retried below, where errors reach the caller
            pass
    return await asyncio.to_thread(classify, text, locale)


async def decide(*, question: Question, history: HistoryLoader) -> Decision:
    """Choose the route for ``question`` (see the module docstring). ``history`` is called only
    on the remote path, and not for a conversation's first message. Never raises for content;
    raises what ``history`` raises."""
    text = question.text
    locale = detect_locale(text, question.locale)
    rule = rule_for(text)  # keyword rules (KEFU_TIER_RULES_PATH): a handoff rule queues for a person
    asks_for_person = wants_human(text) or (rule is not None and rule.action == HANDOFF)

    classified = await _classified(text, locale)
    match, verdict = classified.match, classified.verdict
    if match is not None and match.accepted and match.entry_id is not None:
        entry = registry.entries.get(match.entry_id)
        if entry is not None:
            # Prefer the same intent in the shopper's language.
            entry = registry.by_intent.get((entry.intent, locale), entry)
            # A shopper who asks for a person gets the store's own answer about it (its FAQ
            # entry) and is put in the agents' queue all the same.
            return Decision(
                route="faq",
                locale=locale,
                text=answers.fill_placeholders(entry.answer),
                faq_entry_id=entry.entry_id,
                reason=f"faq {entry.intent} p={match.confidence:.2f}",
                queue_for_agent=asks_for_person,
            )
    if asks_for_person:
        if rule is not None and rule.action == HANDOFF:
            return handoff_decision(locale=locale, reason=f"rule {rule.name}")
        return handoff_decision(locale=locale, reason="shopper asked for a person")
    reply = small_talk_reply(text, locale)
    if reply is not None:
        return Decision(route="decline", locale=locale, text=reply, reason="small talk")
    if verdict is not None and verdict.out_of_scope:
        return Decision(route="decline", locale=locale, text=answers.decline_text(locale), reason="out of scope")

    if classified.remote is not None and classified.tier is not None:
        tier_decision = classified.tier  # never handoff here: classify sets no remote for that
        tier = tier_decision.tier
        cache_scope = classified.cache_scope
        grounding, grounded_on, vector = classified.remote
        hit = classified.hit
        turns: list[tuple[str, str]] = []
        summary = ""
        cache_question = ""
        # A hit needs no history, nor does a conversation's first message: no database round trip.
        if hit is None and question.seq > 1:
            past = await history(before_seq=question.seq, turns=settings.KEFU_CONTEXT_TURNS)
            turns, summary = [(role, body) for role, body in past.turns if body], past.summary
        if hit is None and settings.KEFU_CACHE_ENABLED and turns and is_follow_up(text):
            # A follow-up is only a cache key once rewritten into a standalone question from the
            # conversation (by the simple tier); without a rewrite it is neither served nor stored.
            standalone = await rewrite.standalone_question(
                history=turns,
                text=text,
                locale=locale,
                context=CallContext(conversation_id=question.conversation_id, message_id=question.message_id),
            )
            if standalone:
                norm = normalise_text(standalone)
                vector = (await embed_async([norm]))[0] if norm else None
                cache_question = standalone
                hit = await database_sync_to_async(cache.lookup)(
                    question=standalone, scope=cache_scope, embedding=vector
                )
        if hit is not None:
            return Decision(
                route=hit.route,
                locale=locale,
                tier=tier,
                text=hit.answer,
                cache_entry_id=hit.entry_id,
                cache_question=cache_question or text,
                reason=f"{hit.route} {hit.rule} similarity={hit.similarity:.3f} entry={hit.entry_id}",
            )
        messages = context.build_messages(
            grounding=grounding, history=turns, text=text, locale=locale, tier=tier, summary=summary
        )
        return Decision(
            route=f"llm.{tier}",
            locale=locale,
            tier=tier,
            provider=provider_for(tier),
            request=ChatRequest(messages=messages, model=tier_model(tier), max_tokens=settings.KEFU_LLM_MAX_TOKENS),
            reason=f"remote model, {tier_decision.describe()}",
            cache_scope=cache_scope,
            cache_vector=vector,
            grounded_on=grounded_on,
            cache_question=cache_question,
        )
    return handoff_decision(locale=locale, reason="no FAQ answer and no remote model configured")


def grounding_for(text: str, locale: str, k: int = 3) -> tuple[list[tuple[str, str]], list[int]]:
    """The ``k`` FAQ entries closest to ``text`` as (question, answer with placeholders filled),
    and their ids (what a cached answer is grounded on)."""
    model = registry.model
    if model is None:
        return [], []
    out, ids = [], []
    for entry_id in model.top_entries(text, k=k, locale=locale):
        e = registry.entries.get(entry_id)
        if e is not None:
            e = registry.by_intent.get((e.intent, locale), e)
            out.append((e.question, answers.fill_placeholders(e.answer)))
            ids.append(e.entry_id)
    return out, ids


def cache_scope_for(*, locale: str, tier: str) -> str:
    """Everything that changes the right answer, except the FAQ entries an answer was grounded
    on: those are recorded per answer, and editing one evicts exactly its answers."""
    return cache.scope_key(
        store=settings.KEFU_STORE_NAME,
        locale=locale,
        tier=tier,
        faq_version="per-answer",
        prompt_version=context.SYSTEM_PROMPT_VERSION,
    )


def answer_record(
    *,
    decision: Decision,
    route: str,
    text: str,
    done: StreamDone | None,
    ttft_ms: float | None,
    latency_ms: float,
    cut: bool,
) -> AnswerRecord:
    """How an answer ended, with its cost (remote) or the cost it saved (fixed answers), in USD."""
    if route.startswith("llm.") and decision.tier:
        usage = done.usage if done is not None else None
        if usage is None:
            # The stream broke before its usage chunk: the call may still be billed, so count
            # what was sent and received (tiktoken-compatible encodings) and mark it estimated.
            model = tier_model(decision.tier)
            usage = Usage(
                prompt_tokens=count_tokens(decision.request.messages if decision.request else [], model),
                completion_tokens=count_tokens(text, model) if text else 0,
                estimated=True,
            )
        prompt, completion, cached = usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens
        return AnswerRecord(
            text=text,
            route=route,
            model=(done.model if done else "") or tier_model(decision.tier),
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=ledger.cost_usd(
                tier=decision.tier, prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached
            ),
            ttft_ms=ttft_ms,
            latency_ms=latency_ms,
            estimated=usage.estimated,
            cut=cut,
            reason=decision.reason,
        )
    saved = Decimal(0)
    if route == "faq" or route.startswith("cache."):
        # Priced at the tier that would have answered (the FAQ route has none: the simple tier).
        saved = ledger.saved_usd(tier=decision.tier or "simple", answer_text=text)
    return AnswerRecord(
        text=text,
        route=route,
        ttft_ms=ttft_ms,
        latency_ms=latency_ms,
        cut=cut,
        faq_entry_id=decision.faq_entry_id,
        saved_usd=saved,
        cache_entry_id=decision.cache_entry_id if route.startswith("cache.") else None,
        reason=decision.reason,
    )
