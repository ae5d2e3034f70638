"""The router's one door: everything Chat asks of the router goes through this module (and the
plain values of ``routing.types``). An import-linter contract keeps it so (``make check``).

One shopper message crosses the door three times::

    router.answer_prepare(text=..., locale=...)            # as the message arrives: classify early
    answer = await router.answer_open(question=q, history=loader)   # who answers (a route)
    async for piece in answer.stream(): ...                # the text, piece by piece
    record = await answer.finish(text=..., ttft_ms=..., latency_ms=..., cut=...)
    await answer.after_end()                               # cache store / audit, after stream.end

Chat supplies the history (a :class:`~routing.types.HistoryLoader`), called only on the remote
path, so a cache or FAQ answer costs no history query. Names follow HackSoft's
``<entity>_<action>``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings

from cache_layer import audit as cache_audit
from cache_layer import policy as cache_policy
from cache_layer.services import evict_naming
from lib import sandbox
from routing import tasks, warmup
from routing.decide import answers, classify, injection, strategy
from routing.decide.decision import Decision
from routing.decide.replies import person_request_words
from routing.faq.registry import registry
from routing.models import UpstreamCall
from routing.orders import actions as order_actions
from routing.orders import task_state, tools
from routing.products import grounding
from routing.products.cards import card_of
from routing.products.cards import cards_of as product_cards_of
from routing.products.cards import image_hosts as product_image_hosts_of
from routing.products.index import catalog as product_catalog
from routing.prompt import build as prompt
from routing.prompt import privacy
from routing.prompt import summary as summaries
from routing.providers.base import ProviderError, StreamDone, TextDelta
from routing.types import (
    MAX_CARDS,
    AnswerRecord,
    CallContext,
    HistoryLoader,
    Payer,
    ProductCard,
    Question,
    Suggestion,
)
from routing.upstream import canary, ledger, singleflight, tiers, tokens
from routing.upstream.call import Answered, CallItem
from routing.upstream.complete import complete, complete_call
from store import services as store

log = logging.getLogger(__name__)

__all__ = [
    "Answer",
    "AnswerCut",
    "answer_link_domains",
    "answer_open",
    "answer_prepare",
    "cached_answer_mark_wrong",
    "cached_answer_marks",
    "canary_standings",
    "person_request_words",
    "product_cards",
    "product_image_hosts",
    "product_lookup",
    "reply_suggest",
    "router_keep_upstreams_warm",
    "router_ready",
    "router_start",
    "router_status",
    "router_tiers",
    "router_wait_ready",
    "shopper_messages_forget",
    "summaries_on",
    "summary_compose",
    "summary_min_turns",
    "summary_turns_due",
]


class AnswerCut(Exception):
    """A remote answer broke after some of its text was streamed (``cause`` says why): the caller
    stores what it streamed as cut and tells the shopper. ``code`` is the provider's error code."""

    def __init__(self, cause: ProviderError) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.code = cause.code


def answer_prepare(*, text: str, locale: str) -> None:
    """Start classifying ``text`` off the event loop now (FAQ match, scope, cache lookup), so that
    the embedding and the cache lookup overlap the database writes that store the message.
    ``locale``: the conversation's (``"en"``/``"zh"``). Never raises; must run on the event loop."""
    classify.prefetch(text=text, conversation_locale=locale)


class Answer:
    """One shopper message's answer, opened by :func:`answer_open`.

    ``route``: who answers (protocol 1's routes); it may change while streaming (a tier fallback,
    or a handoff when the remote model fails before its first token), so read it again after
    :meth:`stream`. ``locale``, ``reason`` (the router's own words), ``queue_for_agent`` (after the
    answer, put the conversation in the agents' queue; always so for route ``handoff``),
    ``flags`` (signals about the question for agents, e.g. ``["prompt_injection"]``: Chat stores
    them with the shopper's message).

    The decision is never changed: what the stream learns (the deployment that answered, a store
    tool's call) is kept as the stream's last ``Answered`` value, and the answer is recorded with
    the decision that value gives (``Decision.answered_by``).
    """

    def __init__(self, decision: Decision, question: Question) -> None:
        self._question = question
        # A message that tries to override the instructions is flagged for agents, and its
        # answer is this shopper's alone (routing.decide.injection).
        self.flags: list[str] = [injection.FLAG] if injection.injection_signals(question.text) else []
        if self.flags:
            decision = replace(decision, shareable=False)
        # The plan; replaced by a handoff's (never changed) when the remote model fails.
        self._decision = decision
        self._answered: Answered | None = None  # the deployment that answered, from the stream
        self._done: StreamDone | None = None
        self._source: AsyncIterator[CallItem] | None = None
        self._first: asyncio.Future[CallItem] | None = None
        self._closed = False
        self._record: AnswerRecord | None = None
        self._remote = decision.remote
        # A price or stock level the model stated that the catalog did not give (routing.products.grounding).
        self._wrong_figure: grounding.WrongFigure | None = None
        # Checks the answer's prices and stock levels; catalog tools' results widen what it allows.
        self._figures = grounding.FigureGuard(decision.figures) if decision.figures is not None else None
        if self._remote:
            call = decision.call(_context(question))
            if call.request.tools:
                # May call the store for this shopper's orders: never shared with another question.
                self._source = tools.stream_with_tools(
                    call,
                    question=question,
                    locale=decision.locale,
                    vault=decision.vault,
                    on_products=self._figures.allow if self._figures is not None else None,
                )
            else:
                # Identical cacheable questions in flight at once share one upstream call (routing.upstream.singleflight).
                self._source = singleflight.open_stream(
                    call,
                    question=decision.cache_question or question.text,
                    scope=decision.cache_scope,
                    shareable=decision.shareable,
                )
            # Open the upstream request now, while Chat writes the bot row: saves a DB round trip of TTFT.
            self._first = asyncio.ensure_future(anext(self._source))

    @property
    def _ended(self) -> Decision:
        """The decision as the answer went so far: the plan, with the deployment that answered
        (read from the stream, or already waiting as its first item)."""
        answered, first = self._answered, self._first
        if answered is None and first is not None and first.done() and not first.cancelled():
            item = first.result() if first.exception() is None else None
            answered = item if isinstance(item, Answered) else None
        return self._decision.answered_by(answered)

    @property
    def route(self) -> str:
        return self._ended.route

    @property
    def locale(self) -> str:
        return self._decision.locale

    @property
    def variant(self) -> str:
        """Which deployment of the tier a remote answer was sent to (``current``, or
        ``candidate``: its canary candidate, routing.upstream.canary); "" when no model answers. It may
        change while streaming (a candidate that fails before its first token is followed by the
        tier's own model): the ``AnswerRecord`` says which answered."""
        return self._ended.variant if self._remote else ""

    @property
    def reason(self) -> str:
        return self._decision.reason

    @property
    def queue_for_agent(self) -> bool:
        return self._decision.queue_for_agent or self._decision.route == "handoff"

    @property
    def complaint(self) -> bool:
        """Whether the question only says the last answer missed it ("that's not what I asked",
        ``routing.decide.repeat``): Chat then stores the question before it as the conversation's
        complaint, so the same question asked again soon goes to a person."""
        return self._decision.complaint

    @property
    def remote(self) -> bool:
        """Whether the answer was opened on a remote model (its request is already on its way)."""
        return self._remote

    @property
    def summary_due(self) -> bool:
        """Whether a rolling summary is due after this answer: its remote prompt left out older
        turns that the conversation's summary does not cover yet (``Decision.summary_due``).
        False for every answer no model made (FAQ, cache, store, decline, handoff), so those
        never cause a summary, and Chat needs no query to know it."""
        return self._decision.summary_due

    @property
    def fixed_text(self) -> str | None:
        """The whole answer when it is known before it is shown (FAQ, cache, decline, handoff: no
        remote call), else None. Chat then stores it in one write and sends it as one delta
        instead of streaming it; :meth:`finish` is still called."""
        return None if self._remote else (self._decision.text or "")

    async def stream(self) -> AsyncGenerator[str, None]:
        """The answer's text in pieces (non-empty strings). A fixed answer (FAQ, cache, decline,
        handoff) comes in pieces of about 40 code points. When the remote model fails before any
        text, a polite handoff is streamed instead (``route`` becomes ``handoff``). Raises
        :class:`AnswerCut` when the remote stream broke after some text.

        An answer grounded on catalog products (``Decision.figures``) is held back only while a
        price or stock figure is being written, and released once the catalog gave it; a figure
        it did not give is never sent: the answer stops before it, ends with the handoff
        sentence, and is queued for a person (``queue_for_agent``, ``reason`` naming the figure;
        never cached). ``route`` stays the tier's (its tokens were spent)."""
        if self._source is None:
            for piece in answers.chunks(self._decision.text or ""):
                yield piece
            return
        sent = False
        # The request carried placeholders for personal data (routing.prompt.privacy): the shopper reads
        # their own values again, a placeholder split across pieces held until it is whole.
        unmasker = privacy.StreamUnmasker(self._decision.vault) if self._decision.vault else None
        # An answer that repeats the assistant's own instructions is stopped (routing.decide.injection).
        guard = injection.LeakGuard(prompt.instructions(self._decision.locale))
        figures = self._figures
        wrong: grounding.WrongFigure | None = None
        try:
            while True:
                try:
                    if self._first is not None:
                        first, self._first = self._first, None
                        item = await first
                    else:
                        item = await anext(self._source)
                except StopAsyncIteration:
                    break
                if isinstance(item, StreamDone):
                    self._done = item
                elif isinstance(item, Answered):
                    self._answered = item
                elif isinstance(item, TextDelta) and item.text:
                    if guard.feed(item.text):
                        raise _leak()
                    piece = unmasker.feed(item.text) if unmasker is not None else item.text
                    if piece and figures is not None:
                        piece, wrong = figures.feed(piece)
                    if piece:
                        sent = True
                        yield piece
                    if wrong is not None:
                        break
            if wrong is None:
                if guard.end():
                    raise _leak()
                rest = unmasker.end() if unmasker is not None else ""
                if figures is not None:
                    rest, wrong = figures.feed(rest) if rest else ("", None)
                    if wrong is None:
                        last, wrong = figures.end()
                        rest += last
                if rest:
                    sent = True
                    yield rest
            if wrong is not None:
                await self.close()
                yield ("\n\n" if sent else "") + self._cut_for(wrong)
        except ProviderError as e:
            if sent:
                if unmasker is not None and e.code != "refused" and (rest := unmasker.end()):
                    if figures is not None:  # a figure still held when the stream broke is dropped
                        rest, _ = figures.feed(rest)
                    if rest:
                        yield rest
                raise AnswerCut(e) from e
            if e.code == "budget":
                # Another answer took the last of a budget since this one was chosen.
                self._decision = strategy.budget_decision(locale=self._decision.locale, reason=str(e))
            else:
                log.warning("remote model failed (%s, %s): %s", self._decision.route, e.code, e)
                self._decision = strategy.handoff_decision(
                    locale=self._decision.locale, reason=f"remote model failed: {e.code}"
                )
            self._answered = None
            await self.close()
            self._source = None
            for piece in answers.chunks(self._decision.text or ""):
                yield piece

    def _cut_for(self, wrong: grounding.WrongFigure) -> str:
        """The answer stopped before ``wrong``: queued for a person with a reason naming it,
        never cached or re-made. Returns the handoff sentence that ends the answer."""
        plan = self._decision
        log.warning("a remote answer stated a %s the catalog does not give; cut and handed off", wrong.describe())
        self._wrong_figure = wrong
        self._decision = replace(
            plan,
            queue_for_agent=True,
            shareable=False,
            remake=False,
            # The figure first: reasons are stored cut to 200 characters.
            reason=f"the model stated a {wrong.describe()} the catalog does not give; {plan.reason}",
        )
        return answers.handoff_text(plan.locale)

    async def close(self) -> None:
        """Stop the upstream call, if any (idempotent): after the stream, or when the answer is
        abandoned (an agent holds the conversation, the answer was fenced)."""
        if self._closed:
            return
        self._closed = True
        if self._first is not None:
            self._first.cancel()
            self._first = None
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()

    async def finish(self, *, text: str, ttft_ms: float | None, latency_ms: float, cut: bool) -> AnswerRecord:
        """How the answer ended, with its cost (remote: tokens and USD) or the cost it saved (FAQ
        and cache answers, priced at the tier that would have answered), for Chat to store.

        ``text``: what reached the shopper; ``ttft_ms`` / ``latency_ms``: from the message being
        stored to the first piece / to the end (ms); ``cut``: it stopped before its end. Counting
        tokens (a stream with no usage chunk) loads the tokenizer, so it runs in a thread."""
        await self.close()
        decision = self._ended
        route = decision.route
        done = self._done

        def account() -> AnswerRecord:
            return ledger.answer_record(
                route=route,
                text=text,
                done=done,
                ttft_ms=ttft_ms,
                latency_ms=latency_ms,
                cut=cut,
                tier=decision.tier,
                variant=decision.variant,
                messages=decision.request.messages if decision.request is not None else None,
                reason=decision.reason,
                faq_entry_id=decision.faq_entry_id,
                cache_entry_id=decision.cache_entry_id,
            )

        record = await asyncio.to_thread(account) if route.startswith("llm.") and done is None else account()
        if route.startswith("llm.") and singleflight.is_follower(self._source):
            # Another question's upstream call answered this one: no tokens or cost of its own; the
            # cost of that call is what this answer saved (routing.upstream.singleflight).
            record = replace(
                record, prompt_tokens=0, completion_tokens=0, cost_usd=Decimal(0), saved_usd=record.cost_usd
            )
        if decision.cards:
            record = replace(record, cards=decision.cards)
        self._record = record
        return record

    async def after_end(self) -> None:
        """Work after the answer reached the shopper, never waited for by the shopper and never
        raising: a complete remote answer is offered to the answer cache (its policy refuses
        personal data, follow-ups and the like), keyed on the standalone rewrite of a follow-up
        when there is one; a sampled share of semantic hits is re-answered and compared
        (``routing.tasks.maybe_audit_async``). Call after :meth:`finish`."""
        record = self._record
        if record is None or record.cut or sandbox.active() or self._wrong_figure is not None:
            return  # a bot test's answer (lib.sandbox) reads the cache, never writes or audits it
        decision, question = self._ended, self._question
        if self._done is not None and self._done.finish_reason == "length":
            return  # stopped by the token limit: not the whole answer, never shared
        if record.route.startswith("llm.") and decision.tier != self._decision.tier:
            # A fallback tier answered: its model is not the one the planned scope names
            # (``classify.cache_scope_for``), so its answer is the asker's alone.
            return
        if record.route.startswith("llm."):
            await strategy.offer_to_cache(
                decision, question=decision.cache_question or question.text, text=record.text, model=record.model
            )
            if decision.shareable and decision.cache_scope:
                # A near miss of the cache is judged off this path, and promoted when it needs
                # the same answer (routing.cache_review.promotion; nothing without a simple tier).
                try:
                    await tasks.maybe_judge_async(
                        question=question.text, scope=decision.cache_scope, embedding=decision.cache_vector
                    )
                except Exception:  # promotion is an optimisation: a failure is logged, never shown
                    log.exception("judging a near miss of the answer cache failed")
            elif self._remake_wanted(decision):
                # Made with this shopper's history: never shared; a clean answer to the standalone
                # question is re-made off this path and cached instead (routing.cache_review.remake).
                plan = self._decision
                try:
                    await tasks.maybe_remake_async(
                        question=decision.cache_question or question.text,
                        scope=decision.cache_scope,
                        tier=plan.tier or "",
                        locale=decision.locale,
                    )
                except Exception:  # a remake is an optimisation: a failure is logged, never shown
                    log.exception("handing off a clean remake for the answer cache failed")
        elif record.route == "cache.semantic" and decision.cache_entry_id is not None:
            try:
                await tasks.maybe_audit_async(
                    entry_id=decision.cache_entry_id,
                    question=decision.cache_question or question.text,
                    message_id=question.message_id,
                )
            except Exception:  # an audit is a measurement: a failure is logged, never shown
                log.exception("sampling cache hit %s for audit failed", decision.cache_entry_id)

    def _remake_wanted(self, decision: Decision) -> bool:
        """Whether this unshared remote answer (``decision``, as it ended) calls for a clean
        remake: planned so (``Decision.remake``), a cache scope, no flag on the question (a
        question that tries to instruct the model is not re-asked), no store tools in its request
        (an order's answer is its shopper's alone)."""
        plan = self._decision
        return (
            plan.remake
            and not decision.shareable
            and bool(decision.cache_scope)
            and not self.flags
            and plan.tier is not None
            and (plan.request is None or not plan.request.tools)
        )


def _leak() -> ProviderError:
    log.warning("a remote answer repeated the assistant's instructions; stopped")
    return ProviderError("the answer repeated the assistant's instructions", code="refused", permanent=True)


def order_number_in(text: str) -> str | None:
    """The order number ``text`` names (``KEFU_ORDER_NUMBER_PATTERN``), or None: the router's own
    reading (``routing.orders.actions.order_number_in``), for chat's canned-reply placeholders."""
    return order_actions.order_number_in(text)


def answer_link_domains() -> list[str]:
    """The domains an answer shared with other shoppers may link to, which the widget also shows
    as links in a bot answer (a link elsewhere is shown as plain text): the store's own (hosts of
    ``KEFU_WIDGET_ORIGINS``, ``ALLOWED_HOSTS``, ``CSRF_TRUSTED_ORIGINS``, ``KEFU_SHOPIFY_SHOP``,
    ``KEFU_STORE_PLACEHOLDERS``' URLs) and ``KEFU_ANSWER_LINK_DOMAINS``; a subdomain of one counts
    too. Normalised hosts, sorted (``cache_layer.policy.link_domains``)."""
    return cache_policy.link_domains()


def product_cards(*, skus: Sequence[str], locale: str) -> list[ProductCard]:
    """The product cards of ``skus`` (at most ``MAX_CARDS``; unknown ones skipped) in ``locale``,
    their addresses checked as a product answer's are (``routing.products.cards``): what an agent
    inserts into a reply (issue 36). Two queries a product. Blocking."""
    return list(product_cards_of(store.product_view(sku, locale) for sku in list(skus)[:MAX_CARDS]))


def product_image_hosts() -> list[str]:
    """Hosts a product card's image may come from besides :func:`answer_link_domains`
    (``KEFU_PRODUCT_IMAGE_HOSTS``, normalised; a subdomain counts too). No query."""
    return product_image_hosts_of()


def product_lookup(*, text: str, locale: str, limit: int = 8) -> list[ProductCard]:
    """Catalog products an agent looks up by SKU or title words (``store.services.product_search``),
    as cards with their description and attributes, for the console's product lookup. Blocking."""
    views = store.product_search(text, locale, limit=limit)
    domains = cache_policy.link_domains()
    return [card_of(v, describe=True, domains=domains) for v in views]


def answer_pieces(text: str) -> list[str]:
    """``text`` (a fixed answer) in the pieces of about 40 code points a stream of it would bring
    (``routing.decide.answers.chunks``); ``"".join`` gives ``text`` back."""
    return answers.chunks(text)


async def answer_open(*, question: Question, history: HistoryLoader) -> Answer:
    """Decide who answers ``question`` (``routing.decide.strategy``: handoff keywords, FAQ, scope, then a
    cached or fresh remote answer, else a handoff) and open its answer; a remote answer's upstream
    request is sent at once. ``history`` is called only on the remote path. Never raises for
    content; raises what ``history`` raises. A remote answer in a conversation its tier's canary
    takes goes to the tier's candidate model (``routing.upstream.canary``)."""
    decision = await strategy.decide(question=question, history=history)
    if decision.remote:
        planned = decision.call(_context(question))
        decision = decision.sent_to(await canary.assign(planned, conversation_id=question.conversation_id))
    return Answer(decision, question)


def _context(question: Question) -> CallContext:
    """Who a shopper's answer's upstream call is for, on its ledger rows: the conversation, the
    message, and the shopper who pays (``routing.upstream.budgets``)."""
    return CallContext(
        conversation_id=question.conversation_id,
        message_id=question.message_id,
        payer=Payer.of_question(question),
    )


def canary_standings() -> list[dict[str, object]]:
    """Every tier with a canary candidate configured, cheapest first: ``{"tier", "current",
    "candidate", "env_share", "state", "share", "decided_by", "decided_at", "reason"}`` (the
    models' names; ``routing.upstream.canary``;
    ``state`` ``canary``, ``promoted`` or ``rolled_back``; shares in [0, 1]). Blocking (at most
    one query per tier, when this process's copy is stale)."""
    return [s.as_dict() for tier in tiers.TIER_ORDER if (s := canary.status(tier)) is not None]


async def reply_suggest(*, questions: Sequence[Question], history: HistoryLoader) -> Suggestion:
    """Draft a reply for an agent to the latest of ``questions`` (newest first) the bot could
    answer: the FAQ model, the answer cache, then the remote model (purpose ``suggestion``).
    Questions only asking for a person, or that the bot would decline or hand off, are skipped
    in favour of the earlier ones. A draft is never sent or stored. A remote failure is logged
    and gives an empty draft; never raises for upstream failures."""
    for question in questions:
        decision = await strategy.decide(question=question, history=history, store_actions=False)
        if decision.route == "faq" or decision.route.startswith("cache."):
            return Suggestion(decision.text or "", decision.route, question.seq)
        if decision.provider is not None and decision.request is not None:
            context = CallContext(conversation_id=question.conversation_id, purpose="suggestion")
            try:
                draft = await complete_call(decision.call(context))
            except ProviderError as e:
                log.warning("suggested reply for %s failed: %s", question.conversation_id, e)
                return Suggestion("", None, None)
            text = decision.vault.unmask(draft.text) if decision.vault else draft.text
            return Suggestion(text, decision.route, question.seq)
    return Suggestion("", None, None)


#: What the judge of a bot test's criterion is told (``answer_judge``).
JUDGE_INSTRUCTIONS = (
    "You check one answer of a shop's customer-service assistant against one criterion. "
    "Reply PASS if the answer meets the criterion, FAIL if it does not, as your first word, "
    "then one short sentence saying why."
)


@dataclass(frozen=True)
class Judgement:
    """A judged criterion: ``passed`` (None when it could not be judged), ``reason`` (the judge's
    sentence, or why it was not judged), ``model`` that judged ("" none)."""

    passed: bool | None
    reason: str
    model: str = ""


async def answer_judge(
    *, criterion: str, question: str, answer: str, transcript: Sequence[tuple[str, str]] = ()
) -> Judgement:
    """Ask the strongest configured tier (complex, then medium, then simple) whether ``answer``
    (the bot's, to the shopper's ``question``) meets ``criterion`` (plain words, e.g. "does not
    promise a refund"); with ``transcript`` (``(speaker, text)`` pairs, speaker ``shopper`` or
    ``assistant``, oldest first) the whole conversation is judged instead of one answer. Inside a
    bot test's sandbox the call's ledger row says ``test``. Never raises for the upstream: no tier
    configured, a failed call or an unreadable reply is a :class:`Judgement` with ``passed=None``
    and the reason."""
    await tiers.check_tiers_async()
    tier = next((t for t in reversed(tiers.TIER_ORDER) if tiers.tier_configured(t)), None)
    if tier is None:
        return Judgement(None, "no model is configured to judge it (no remote tier)")
    if transcript:
        shown = "\n\n".join(f"{'Shopper' if who == 'shopper' else 'Assistant'}: {text}" for who, text in transcript)
        content = f"Criterion (for the assistant's answers in this conversation): {criterion}\n\n{shown}"
    else:
        content = f"Criterion: {criterion}\n\nShopper: {question}\n\nAssistant: {answer}"
    try:
        reply = await complete(
            messages=[
                {"role": "system", "content": JUDGE_INSTRUCTIONS},
                {"role": "user", "content": content},
            ],
            tier=tier,
            context=CallContext(purpose="judge"),
            max_tokens=60,
            temperature=0.0,
        )
    except ProviderError as e:
        return Judgement(None, f"the judge's call failed ({e.code})")
    words = reply.text.strip().split(maxsplit=1)
    verdict = words[0].strip(".,!:;\"'*").upper() if words else ""
    why = words[1].strip() if len(words) > 1 else ""
    if verdict not in ("PASS", "FAIL"):
        return Judgement(None, f"the judge's reply was neither PASS nor FAIL: {reply.text[:80]!r}", reply.model)
    return Judgement(verdict == "PASS", why, reply.model)


#: The simulated shopper's reply ends with one of these lines when its conversation is over.
SHOPPER_REACHED = "GOAL_REACHED"
SHOPPER_GAVE_UP = "GIVE_UP"
#: The most a simulated shopper's message may take (tokens): a shopper types short messages.
SHOPPER_MAX_TOKENS = 150
#: What the model playing a bot test's shopper is told; ``{persona}``, ``{goal}``, ``{knows}`` and
#: ``{language}`` are filled in (``shopper_say``).
SHOPPER_INSTRUCTIONS = (
    "You play a shopper chatting with an online shop's customer-service assistant, to test it. "
    "Who you are: {persona}\n"
    "Your goal: {goal}\n"
    "What you know (give it when the assistant asks for it or when it helps, never invent other "
    "facts such as order numbers or e-mail addresses): {knows}\n\n"
    "Each reply of yours is the next message you type to the assistant: short and natural, in "
    "{language}, one message, without quotes. Never say you are a model or a test. "
    f"When the assistant has done what your goal needs, reply with the single line {SHOPPER_REACHED}. "
    "When you see it will not be done (the assistant refuses, cannot help, or keeps misunderstanding "
    f"after you tried twice), reply with the single line {SHOPPER_GAVE_UP}."
)
#: The first message the shopper model gets, before the assistant said anything.
SHOPPER_OPENING = "(The shop's chat window is open. Type your first message.)"


@dataclass(frozen=True)
class ShopperLine:
    """What the simulated shopper said next: ``text`` to send ("" when it only ended the
    conversation), ``outcome`` ``reached`` (it wrote ``GOAL_REACHED``), ``gave_up`` (``GIVE_UP``)
    or "" (the conversation goes on); ``error`` why no line came ("" when one did: no tier, a
    failed call, an empty reply); ``model`` that played it."""

    text: str
    outcome: str = ""
    error: str = ""
    model: str = ""


@dataclass(frozen=True)
class ShopperEstimate:
    """The most a simulated shopper's conversation of ``calls`` model calls may cost at ``tier``'s
    list prices (``model``): ``usd`` (6 decimals)."""

    tier: str
    model: str
    calls: int
    usd: Decimal


async def shopper_tier() -> str | None:
    """The tier that plays a bot test's shopper: the cheapest configured one (simple, then medium,
    then complex); None when no remote tier is configured."""
    await tiers.check_tiers_async()
    return next((t for t in tiers.TIER_ORDER if tiers.tier_configured(t)), None)


def _shopper_instructions(*, persona: str, goal: str, knows: Sequence[str], locale: str) -> str:
    return SHOPPER_INSTRUCTIONS.format(
        persona=persona.strip(),
        goal=goal.strip(),
        knows="; ".join(k.strip() for k in knows) or "nothing beyond your goal",
        language=f"the language of the locale {locale!r}",
    )


def _shopper_ending(text: str) -> tuple[str, str]:
    """``(text without its marker, outcome)``: a marker ends the reply (what follows it is only
    punctuation, asterisks or quotes); "" outcome without one."""
    found = _SHOPPER_MARKER.search(text.strip())
    if found is None:
        return text.strip(), ""
    outcome = "reached" if found.group(1).upper() == SHOPPER_REACHED else "gave_up"
    return text.strip()[: found.start()].strip().rstrip("*`\"'").strip(), outcome


_SHOPPER_MARKER = re.compile(rf"\b({SHOPPER_REACHED}|{SHOPPER_GAVE_UP})\b[\W_]*$", re.IGNORECASE)


async def shopper_say(
    *,
    persona: str,
    goal: str,
    knows: Sequence[str],
    locale: str,
    transcript: Sequence[tuple[str, str]],
    conversation_id: uuid.UUID | None = None,
) -> ShopperLine:
    """The simulated shopper's next message in a bot test (``manage.py bot_test``, a scenario with
    a persona): a model (``shopper_tier``) plays ``persona`` pursuing ``goal``, knowing the facts
    ``knows``, writing in ``locale``'s language, after ``transcript`` (``(speaker, text)``,
    speaker ``shopper`` or ``assistant``, oldest first). Its ledger row is on ``conversation_id``
    with no message, purpose ``test``. Never raises for the upstream: no tier, a failed call or an
    empty reply is a :class:`ShopperLine` with ``error``."""
    tier = await shopper_tier()
    if tier is None:
        return ShopperLine("", error="no model is configured to play the shopper (no remote tier)")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _shopper_instructions(persona=persona, goal=goal, knows=knows, locale=locale)},
        {"role": "user", "content": SHOPPER_OPENING},
    ]
    for who, text in transcript:
        # Roles swap: the model plays the shopper, so the shop's assistant is its "user".
        messages.append({"role": "assistant" if who == "shopper" else "user", "content": text or "(no answer)"})
    try:
        reply = await complete(
            messages=messages,
            tier=tier,
            context=CallContext(conversation_id=conversation_id, purpose=sandbox.LEDGER_PURPOSE),
            max_tokens=SHOPPER_MAX_TOKENS,
        )
    except ProviderError as e:
        return ShopperLine("", error=f"the shopper's call failed ({e.code})")
    text, outcome = _shopper_ending(reply.text)
    if not text and not outcome:
        return ShopperLine("", error="the shopper's reply was empty", model=reply.model)
    return ShopperLine(text, outcome, model=reply.model)


async def shopper_estimate(*, persona: str, goal: str, knows: Sequence[str], max_turns: int) -> ShopperEstimate | None:
    """The most a simulated shopper's conversation of ``max_turns`` messages may cost (None: no
    tier configured): ``max_turns + 1`` calls (the last says whether the goal was reached), the
    n-th with the instructions (``persona``, ``goal``, ``knows``) and n - 1 exchanges of a shopper
    message (``SHOPPER_MAX_TOKENS``) and an answer (``KEFU_LLM_MAX_TOKENS``) as input, tokens
    estimated at ceil(UTF-8 bytes / 3), and ``SHOPPER_MAX_TOKENS`` as output, at the tier's list
    prices."""
    tier = await shopper_tier()
    if tier is None:
        return None
    base = tokens.estimate_tokens(_shopper_instructions(persona=persona, goal=goal, knows=knows, locale="en"))
    base += tokens.estimate_tokens(SHOPPER_OPENING) + 10  # the messages' framing
    exchange = SHOPPER_MAX_TOKENS + int(settings.KEFU_LLM_MAX_TOKENS) + 8
    calls = max_turns + 1
    prompt = sum(base + n * exchange for n in range(calls))
    usd = ledger.cost_usd(tier=tier, prompt_tokens=prompt, completion_tokens=calls * SHOPPER_MAX_TOKENS)
    return ShopperEstimate(tier, tiers.tier_model(tier), calls, usd)


def test_spend_usd(*, conversation_ids: Sequence[uuid.UUID]) -> dict[str, Decimal]:
    """What the cost ledger holds for bot test conversations ``conversation_ids`` (purpose
    ``test``), USD: ``{"shopper": ..., "answers": ...}`` (6 decimals), the simulated shopper's calls (no
    message) and the bot's answers (a shopper message's). Blocking: call in a thread."""
    rows = UpstreamCall.objects.filter(purpose=sandbox.LEDGER_PURPOSE, conversation_id__in=list(conversation_ids))
    spent = {"shopper": Decimal(0), "answers": Decimal(0)}
    for message_id, usd in rows.values_list("message_id", "cost_usd"):
        spent["shopper" if message_id is None else "answers"] += Decimal(usd)
    return {k: v.quantize(ledger.USD_PLACES) for k, v in spent.items()}


def answer_lost(
    *,
    route: str,
    conversation_id: uuid.UUID,
    question_message_id: int | None,
    question: str,
    text: str,
    started_at: datetime | None = None,
    variant: str = "",
) -> Decimal:
    """An answer whose process died while it streamed (Chat's orphan sweep found it): when it came
    from a remote tier (``route`` ``llm.<tier>``), write that call's ledger row, estimated from
    ``question`` and the ``text`` the shopper had (``routing.upstream.ledger.lost_call_record``), and return
    its estimated cost in USD; other routes cost nothing (0). Blocking: call in a thread.
    ``question_message_id``: the shopper message it answered; ``started_at``: when the answer's
    row was written (a call recorded since, by a process that stopped gracefully, is not counted
    twice); ``variant``: the deployment it was sent to (``candidate``: the tier's canary
    candidate, priced and named as such; else the tier's own model)."""
    tier = route.removeprefix("llm.")
    if not route.startswith("llm.") or tier not in settings.KEFU_TIERS:
        return Decimal(0)
    return ledger.lost_call_record(
        tier=tier,
        conversation_id=conversation_id,
        message_id=question_message_id,
        question=question,
        received_text=text,
        since=started_at,
        variant=variant or "current",
    )


def cached_answer_mark_wrong(*, entry_id: int, by: str, message_id: int | None) -> bool:
    """An agent (``by``: username) says cached answer ``entry_id`` was wrong for shopper message
    ``message_id``: evict it and count a false hit (``cache_layer.audit.mark_wrong``). False when
    the entry was already gone (nothing recorded)."""
    return cache_audit.mark_wrong(entry_id=entry_id, by=by, message_id=message_id)


def shopper_messages_forget(*, message_ids: list[int]) -> int:
    """Chat is deleting shopper messages ``message_ids`` (retention, or an erasure on request):
    the router's rows that quote them (cache audits) lose the text and the link, and keep their
    verdicts. Returns how many rows changed. Blocking (one statement)."""
    return cache_audit.forget_questions(message_ids=message_ids)


def conversation_tasks_forget(*, conversation_ids: list[uuid.UUID]) -> int:
    """Chat is deleting these conversations: forget their tasks (``routing.orders.task_state``;
    a task holds the e-mail an anonymous shopper gave). Returns the rows deleted. Blocking (one
    statement)."""
    return task_state.tasks_forget(conversation_ids)


def conversation_task(*, conversation_id: uuid.UUID) -> dict[str, Any] | None:
    """What the shopper of ``conversation_id`` is doing across messages, for the agents' console
    (``routing.orders.task_state.task_view``: ``{"intent", "order_number", "email", "awaiting",
    "source", "session_from_seq", "updated_at", "expires_at", "expired"}``), or None. Blocking
    (one query)."""
    return task_state.task_view(conversation_id)


def conversation_task_clear(*, conversation_id: uuid.UUID) -> bool:
    """An agent clears the conversation's task and any change it offered (a "yes" then confirms
    nothing); whether there was one. Blocking (two statements)."""
    had = task_state.task_drop(conversation_id)
    return store.pending_drop(conversation_id) or had


def cached_answer_marks(*, message_ids: list[int]) -> dict[int, str]:
    """Of the shopper messages ``message_ids``, those whose cached answer an agent marked wrong:
    ``{message id: agent's username}``. One query, none for an empty list."""
    return cache_audit.agent_marks(message_ids=message_ids)


def summaries_on() -> bool:
    """Whether rolling summaries are written (the ``simple`` tier is configured, and
    ``KEFU_SUMMARY_MIN_TURNS`` is positive)."""
    return summaries.summaries_on()


def summary_min_turns() -> int:
    """``KEFU_SUMMARY_MIN_TURNS``: at least this many turns must have left the window."""
    return summaries.min_turns()


def summary_turns_due(*, turns: Sequence[list[tuple[str, str]]], summary: str, locale: str) -> int:
    """How many of the oldest ``turns`` (not yet summarised, oldest first) left the prompt window
    next to the rolling ``summary``. Blocking (the tokenizer)."""
    return summaries.turns_left_window(turns, summary=summary, locale=locale)


def summary_compose(
    *,
    previous: str,
    turns: Sequence[list[tuple[str, str]]],
    locale: str,
    conversation_id: uuid.UUID | None,
    payer: Payer | None = None,
) -> str | None:
    """The rolling summary ``previous`` extended with ``turns``, written by the ``simple`` tier;
    None when that failed, no tier is configured or ``payer``'s spend budgets refused it (the
    summary counts against them like an answer; None: the tier's store-wide cap only). Blocking."""
    return summaries.summary_write(
        previous=previous, turns=turns, locale=locale, conversation_id=conversation_id, payer=payer
    )


def router_start() -> None:
    """Load the FAQ model and keep it fresh, and warm the router up (SDK import, tokenizers, tier
    classifier, embedder), and the catalog index (kept fresh; a changed product's cached answers
    are evicted), in background threads; returns at once (the server's start-up)."""
    registry.start_background()
    product_catalog.start_background(on_change=evict_naming)
    warmup.start()


def router_started() -> bool:
    """Whether this process's router has its FAQ model, or is loading it (:func:`router_start`
    was called, or a test loaded one): a process that answers shoppers without a server (a bot
    test) calls :func:`router_start` when not."""
    return registry.ready or registry.loading


def router_keep_upstreams_warm() -> None:
    """Keep a connection open to each configured tier's upstream from this event loop
    (``routing.upstream.tiers.keep_upstreams_warm``): call from the server's loop, e.g. as a socket
    connects; idempotent, returns at once."""
    tiers.keep_upstreams_warm()


def router_ready() -> bool:
    """False while the router started by :func:`router_start` is still loading: its first FAQ model
    is training or its warm-up runs. A router never started (tests, management commands) loads
    each part at first use and is ready; a part that failed to load counts as done (it retries
    lazily and the answer takes the route it can)."""
    return not registry.loading and warmup.status() != "loading"


async def router_wait_ready(*, poll_s: float = 0.1) -> None:
    """Return once :func:`router_ready` (polled every ``poll_s`` seconds: the loading runs in other
    threads, and a process has several event loops in tests)."""
    while not router_ready():
        await asyncio.sleep(poll_s)


async def router_drain() -> None:
    """Wait for the router's background work of this loop (ledger rows being written, cache-hit
    audits handed off): before a process stops, so no paid call goes unrecorded."""
    await ledger.flush()
    await tasks.drain()


def router_tiers() -> dict[str, str]:
    """Each remote tier's standing (``routing.upstream.tiers.tier_states``): ``ok: <model>``,
    ``unverified: ...``, ``off: ...`` naming the variable to set and the models its endpoint
    offers, ``checking`` or ``not configured: ...``. For ``/healthz`` and the ops page: a tier
    that is off leaves the FAQ, the cache and people answering, so it is a detail, not a failure."""
    return tiers.tier_states()


def router_status() -> dict[str, str]:
    """``{"faq_model": ..., "router": ...}``, each ``ok``, ``loading`` or ``error: ...``."""
    if registry.ready:
        faq = "ok"
    else:
        faq = f"error: {registry.error}" if registry.error else "loading"
    return {"faq_model": faq, "router": warmup.status()}
