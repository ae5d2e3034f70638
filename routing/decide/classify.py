"""What routing learns from a message's text alone, off the event loop: the FAQ match, the scope
verdict and, for a message headed for the remote model, its tier, grounding and any answer-cache
hit (``classify``). ``prefetch`` starts it as the message arrives, while it is being stored."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import close_old_connections

from cache_layer import services as cache
from cache_layer.embeddings import embed_batched
from lib.text import detect_locale
from routing.decide import answers
from routing.decide.replies import wants_human
from routing.decide.smalltalk import SmallTalk, small_talk
from routing.decide.tier_classifier import HANDOFF, TierDecision, choose_tier
from routing.faq.model import FaqMatch, normalise_text
from routing.faq.registry import registry
from routing.faq.scope import ScopeVerdict
from routing.orders.actions import without_references
from routing.prompt import build as prompt
from routing.types import ROUTING_MAX_CHARS
from routing.upstream.tiers import tier_model


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
    # The FAQ's trained state it was computed with (``registry.snapshot``): a prefetched
    # classification is used only while that state is still the current one.
    faq_state: object | None = None
    # The message's embedding (``normalise_text`` of its first ``ROUTING_MAX_CHARS`` code points,
    # unit norm, ``(dim,)``); None when nothing is left after normalisation.
    vector: np.ndarray | None = None
    # Small talk kefu answers itself (routing.decide.smalltalk): set, nothing else is computed.
    small_talk: SmallTalk | None = None


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
    snapshot = registry.snapshot
    model, scope = snapshot.model, snapshot.scope
    out = Classified(faq_state=snapshot, vector=vector)
    # The FAQ answers only in a language it has entries for: a question in another language goes
    # on to a remote model, which answers in it (or to a person), grounded on the entries it matches.
    if model is not None and locale in snapshot.locales:
        # Order numbers and e-mail addresses are not words of a question (routing.orders.actions).
        asked = without_references(text) if settings.KEFU_STORE_ADAPTER else text
        out.match = model.match(asked, locale=locale)
    if out.match is not None and out.match.accepted:
        return out
    asks_for_person = wants_human(full_text, locale)
    if not asks_for_person:
        out.small_talk = small_talk(text, vector, locale)
        if out.small_talk is not None:
            return out
    if scope is not None:
        out.verdict = scope.classify(text) if vector is None else scope.classify_vector(vector, text=text)
    if (out.verdict is not None and out.verdict.out_of_scope) or asks_for_person:
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


def follow_up_classified(text: str, locale: str, *, route: str) -> Classified:
    """A "yes"/"no" answering the question the last bot answer (on remote ``route``,
    ``"llm.<tier>"``) asked: bound for that tier, whatever the FAQ or the scope check make of
    the bare word (``routing.orders.tasks``). Grounded on the closest FAQ entries; no cache
    scope (its answer rests on the history, so it is neither served from nor stored in the
    cache). Blocking only for the grounding's embedding (cached: the message was embedded)."""
    tier = route.removeprefix("llm.")
    grounding, grounded_on = grounding_for(text[:ROUTING_MAX_CHARS], locale)
    return Classified(
        remote=(grounding, grounded_on, None),
        tier=TierDecision(tier=tier, confidence=1.0, rule="follow_up", source="rule"),
        faq_state=registry.snapshot,
    )


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


async def classified(text: str, locale: str) -> Classified:
    """``classify(text, locale)``: the prefetched result when there is one, computed with the FAQ
    as it is now (a retrain or reload since makes it stale: computed again); else computed now,
    in a worker thread. Raises what ``classify`` raises."""
    future = _prefetched.pop((text, locale), None)
    if future is not None:
        try:
            result = await future
        except Exception:  # a failed prefetch is retried below, where errors reach the caller
            result = None
        if result is not None and result.faq_state is registry.snapshot:
            return result
    return await asyncio.to_thread(classify, text, locale)


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
            out.append((e.question, answers.fill_placeholders(e.answer, e.locale)))
            ids.append(e.entry_id)
    return out, ids


def cache_scope_for(*, locale: str, tier: str) -> str:
    """Everything that changes the right answer, except the FAQ entries an answer was grounded
    on: those are recorded per answer, and editing one evicts exactly its answers. That includes
    the model ``tier`` asks (its current deployment's, ``KEFU_<TIER>_MODEL``) and the output limit
    (``KEFU_LLM_MAX_TOKENS``): a worker started with another of either neither serves nor is
    served the other's answers (issue 29, item 6). Raises ``KeyError`` for an unknown tier."""
    return cache.scope_key(
        store=settings.KEFU_STORE_NAME,
        locale=locale,
        tier=tier,
        faq_version="per-answer",
        prompt_version=prompt.SYSTEM_PROMPT_VERSION,
        model=tier_model(tier),
        max_tokens=settings.KEFU_LLM_MAX_TOKENS,
    )
