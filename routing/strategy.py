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
import re
from typing import TYPE_CHECKING

import numpy as np
from dataclasses import dataclass, field
from decimal import Decimal

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections

from chat.models import Conversation, Message
from chat.selectors import history_for_prompt
from chat.services import AnswerRecord

from cache_layer.embeddings import embed_batched

from cache_layer.policy import is_follow_up

from . import answers, context, ledger, rewrite
from .ledger import CallContext
from .providers.base import ChatRequest, Provider, ProviderConfig, StreamDone, Usage
from .services import registry

if TYPE_CHECKING:
    from .classifier import TierDecision

CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

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


def detect_locale(text: str, fallback: str = "en") -> str:
    """``zh`` when the text holds Chinese characters, ``en`` when it holds Latin letters, else ``fallback``."""
    if CJK.search(text):
        return "zh"
    if re.search(r"[A-Za-z]", text):
        return "en"
    return fallback


def wants_human(text: str) -> bool:
    return bool(HUMAN_EN.search(text) or HUMAN_ZH.search(text))


@dataclass
class Decision:
    """The router's choice. ``text`` for fixed answers (faq, decline, handoff); ``provider`` +
    ``request`` + ``tier`` for a remote model."""

    route: str
    locale: str
    text: str | None = None
    tier: str | None = None
    provider: Provider | None = None
    request: ChatRequest | None = None
    faq_entry_id: int | None = None
    reason: str = ""
    queue_for_agent: bool = False  # after the answer, put the conversation in the agents' queue
    cache_scope: str = ""  # where a remote answer may be stored (answer cache)
    cache_vector: "np.ndarray | None" = None
    # The question the answer cache keys on: the message itself, or for a follow-up ("and the
    # blue one?") its standalone rewrite (routing.rewrite); "" = the message's text.
    cache_question: str = ""
    cache_entry_id: int | None = None  # the cached answer served (cache.* routes)
    grounded_on: list[int] = field(default_factory=list)


def handoff_decision(*, locale: str, reason: str) -> Decision:
    return Decision(route="handoff", locale=locale, text=answers.handoff_text(locale), reason=reason)


def tier_configured(tier: str) -> bool:
    t = settings.KEFU_TIERS.get(tier) or {}
    return bool(t.get("api_key") and t.get("model"))


def _provider(tier: str) -> Provider:
    from .providers.openai_remote import OpenAIProvider

    t = settings.KEFU_TIERS[tier]
    return OpenAIProvider(
        ProviderConfig(
            base_url=t["base_url"] or None,
            api_key=t["api_key"],
            connect_timeout_s=t.get("connect_timeout_s") or settings.KEFU_LLM_CONNECT_TIMEOUT_S,
            first_token_timeout_s=t.get("first_token_timeout_s") or settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S,
            total_timeout_s=t.get("total_timeout_s") or settings.KEFU_LLM_TOTAL_TIMEOUT_S,
        )
    )


@dataclass
class Classified:
    """What routing learns from a message's text alone (computed off the event loop, possibly
    while the message is still being stored): the FAQ match, the scope verdict and, for a
    message headed for the remote model, its grounding and any answer-cache hit."""

    match: object = None
    verdict: object = None
    remote: tuple[list[tuple[str, str]], list[int], np.ndarray | None] | None = None
    cache_scope: str = ""
    hit: object = None
    # The tier classifier's verdict (routing.classifier.TierDecision) for a remote-bound message.
    tier: "TierDecision | None" = None


# Routing looks at the first ROUTING_MAX_CHARS code points only: the embedding model reads at
# most 512 tokens anyway, and embedding a 2,000-character message takes ~0.5 s of both cores,
# which a user test showed delaying every other conversation's answers.
ROUTING_MAX_CHARS = 500


def _classify(text: str, locale: str) -> Classified:
    """Classify ``text`` (blocking; run in a worker thread). The scope check reuses the FAQ
    model's embedding; grounding and the cache lookup run only when a remote model would answer.
    The cache's exact key uses the whole text; everything embedded uses its first
    ``ROUTING_MAX_CHARS`` code points."""
    full_text, text = text, text[:ROUTING_MAX_CHARS]
    from .faq_model import normalise_text

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
    if getattr(out.verdict, "out_of_scope", False) or wants_human(full_text):
        return out
    from .classifier import HANDOFF, choose_tier

    out.tier = choose_tier(full_text, vector)  # rules on the whole text, the model on this vector
    if out.tier is None or out.tier.tier == HANDOFF:
        return out
    grounding, grounded_on = _grounding(text, locale)
    out.remote = (grounding, grounded_on, vector)
    out.cache_scope = _cache_scope(locale=locale, tier=out.tier.tier)
    if settings.KEFU_CACHE_ENABLED:
        from cache_layer import services as cache

        close_old_connections()  # this worker thread keeps its own connection, within CONN_MAX_AGE
        out.hit = cache.lookup(question=full_text, scope=out.cache_scope, embedding=vector)
    return out


# Classifications started when a message arrives, before it is stored (see ``prefetch``):
# (text, locale) -> future of ``_classify``. Entries are consumed by ``decide`` or dropped after
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
    _prefetched[key] = loop.run_in_executor(None, _classify, text, locale)
    loop.call_later(PREFETCH_TTL_S, _prefetched.pop, key, None)


async def _classified(text: str, locale: str) -> Classified:
    future = _prefetched.pop((text, locale), None)
    if future is not None:
        try:
            return await future
        except Exception:  # a failed prefetch is retried below, where errors reach the caller
            pass
    return await asyncio.to_thread(_classify, text, locale)


async def decide(*, conversation: Conversation, message: Message) -> Decision:
    """Choose the route for ``message`` (see the module docstring). Never raises for content."""
    text = message.text
    locale = detect_locale(text, conversation.locale)
    from .classifier import HANDOFF, rule_for

    rule = rule_for(text)  # keyword rules (KEFU_TIER_RULES_PATH): a handoff rule queues for a person
    asks_for_person = wants_human(text) or (rule is not None and rule.action == HANDOFF)

    classified = await _classified(text, locale)
    match, verdict = classified.match, classified.verdict
    if match is not None and getattr(match, "accepted", False):
        entry = registry.entries.get(match.entry_id)  # type: ignore[attr-defined]
        if entry is not None:
            # Prefer the same intent in the shopper's language.
            entry = registry.by_intent.get((entry.intent, locale), entry)
            # A shopper who asks for a person gets the store's own answer about it (its FAQ
            # entry) and is put in the agents' queue all the same.
            return Decision(
                route="faq", locale=locale, text=answers.fill_placeholders(entry.answer), faq_entry_id=entry.entry_id,
                reason=f"faq {entry.intent} p={match.confidence:.2f}",  # type: ignore[attr-defined]
                queue_for_agent=asks_for_person,
            )
    if asks_for_person:
        if rule is not None and rule.action == HANDOFF:
            return handoff_decision(locale=locale, reason=f"rule {rule.name}")
        return handoff_decision(locale=locale, reason="shopper asked for a person")
    reply = small_talk_reply(text, locale)
    if reply is not None:
        return Decision(route="decline", locale=locale, text=reply, reason="small talk")
    if verdict is not None and getattr(verdict, "out_of_scope", False):
        return Decision(route="decline", locale=locale, text=answers.decline_text(locale), reason="out of scope")

    if classified.remote is not None and classified.tier is not None:
        tier_decision = classified.tier  # never handoff here: _classify sets no remote for that
        tier = tier_decision.tier
        cache_scope = classified.cache_scope
        grounding, grounded_on, vector = classified.remote
        hit = classified.hit
        history: list[tuple[str, str]] = []
        cache_question = ""
        # A hit needs no history, nor does a conversation's first message: no database round trip.
        if hit is None and message.seq > 1:
            history = await _history(conversation, message)
        if hit is None and settings.KEFU_CACHE_ENABLED and history and is_follow_up(text):
            # A follow-up is only a cache key once rewritten into a standalone question from the
            # conversation (by the simple tier); without a rewrite it is neither served nor stored.
            standalone = await rewrite.standalone_question(
                history=history, text=text, locale=locale,
                context=CallContext(conversation_id=conversation.id, message_id=message.pk),
            )
            if standalone:
                from cache_layer import services as cache
                from cache_layer.embeddings import embed_async

                from .faq_model import normalise_text

                norm = normalise_text(standalone)
                vector = (await embed_async([norm]))[0] if norm else None
                cache_question = standalone
                hit = await database_sync_to_async(cache.lookup)(question=standalone, scope=cache_scope, embedding=vector)
        if hit is not None:
            return Decision(
                route=hit.route, locale=locale, tier=tier, text=hit.answer, cache_entry_id=hit.entry_id,
                cache_question=cache_question or message.text,
                reason=f"{hit.route} {hit.rule} similarity={hit.similarity:.3f} entry={hit.entry_id}",
            )
        messages = context.build_messages(grounding=grounding, history=history, text=text, locale=locale,
                                          tier=tier, summary=conversation.summary)
        return Decision(
            route=f"llm.{tier}", locale=locale, tier=tier, provider=_provider(tier),
            request=ChatRequest(messages=messages, model=settings.KEFU_TIERS[tier]["model"],
                                max_tokens=settings.KEFU_LLM_MAX_TOKENS),
            reason=f"remote model, {tier_decision.describe()}", cache_scope=cache_scope, cache_vector=vector, grounded_on=grounded_on,
            cache_question=cache_question,
        )
    return handoff_decision(locale=locale, reason="no FAQ answer and no remote model configured")


def _grounding(text: str, locale: str, k: int = 3) -> tuple[list[tuple[str, str]], list[int]]:
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


def _cache_scope(*, locale: str, tier: str) -> str:
    """Everything that changes the right answer, except the FAQ entries an answer was grounded
    on: those are recorded per answer, and editing one evicts exactly its answers."""
    from cache_layer.services import scope_key

    return scope_key(store=settings.KEFU_STORE_NAME, locale=locale, tier=tier,
                     faq_version="per-answer", prompt_version=context.SYSTEM_PROMPT_VERSION)


async def _history(conversation: Conversation, message: Message) -> list[tuple[str, str]]:
    rows = await database_sync_to_async(history_for_prompt)(
        conversation_id=conversation.id, before_seq=message.seq, turns=settings.KEFU_CONTEXT_TURNS
    )
    return [(m.role, m.text) for m in rows if m.text]


def answer_record(
    *, decision: Decision, route: str, text: str, done: StreamDone | None, ttft_ms: float | None,
    latency_ms: float, cut: bool,
) -> AnswerRecord:
    """How an answer ended, with its cost (remote) or the cost it saved (fixed answers), in USD."""
    if route.startswith("llm.") and decision.tier:
        usage = done.usage if done is not None else None
        if usage is None:
            # The stream broke before its usage chunk: the call may still be billed, so count
            # what was sent and received (tiktoken-compatible encodings) and mark it estimated.
            from .providers.openai_remote import count_tokens

            model = settings.KEFU_TIERS[decision.tier]["model"]
            usage = Usage(
                prompt_tokens=count_tokens(decision.request.messages if decision.request else [], model),
                completion_tokens=count_tokens(text, model) if text else 0,
                estimated=True,
            )
        prompt, completion, cached = usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens
        return AnswerRecord(
            text=text, route=route, model=(done.model if done else "") or settings.KEFU_TIERS[decision.tier]["model"],
            prompt_tokens=prompt, completion_tokens=completion,
            cost_usd=ledger.cost_usd(tier=decision.tier, prompt_tokens=prompt, completion_tokens=completion,
                                     cached_prompt_tokens=cached),
            ttft_ms=ttft_ms, latency_ms=latency_ms, estimated=usage.estimated, cut=cut,
        )
    saved = Decimal("0")
    if route == "faq" or route.startswith("cache."):
        # Priced at the tier that would have answered (the FAQ route has none: the simple tier).
        saved = ledger.saved_usd(tier=decision.tier or "simple", answer_text=text)
    return AnswerRecord(text=text, route=route, ttft_ms=ttft_ms, latency_ms=latency_ms, cut=cut,
                        faq_entry_id=decision.faq_entry_id, saved_usd=saved,
                        cache_entry_id=decision.cache_entry_id if route.startswith("cache.") else None)
