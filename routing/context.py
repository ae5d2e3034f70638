"""The prompt sent to a remote model: a system prompt, the store's most relevant FAQ entries
(grounding), a rolling summary of older turns, the last turns that fit, and the new message.

Budget (issue 4, point 6): a tier's prompt takes at most ``KEFU_CONTEXT_TOKENS[tier]`` tokens
(settings ``KEFU_<TIER>_CONTEXT_TOKENS``, defaults 3000 / 6000 / 12000), counted with the tier
model's tokenizer (``routing.providers.openai_remote.count_tokens``, tiktoken-compatible). The
system prompt (with grounding and summary) is always kept whole, the shopper's new message is
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

import asyncio
import logging
import math
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from django.conf import settings

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
#: Defaults of ``KEFU_<TIER>_CONTEXT_TOKENS`` (tokens), used for a tier the setting lacks.
DEFAULT_CONTEXT_TOKENS = {"simple": 3000, "medium": 6000, "complex": 12000}

Turn = list[tuple[str, str]]


# --- Token counting --------------------------------------------------------------------------------

# Encodings known to be loaded in this process (``encoding_name_for_model`` names). Loading one
# takes 2-3 s, which must not happen on the event loop: there, until it is loaded, tokens are
# estimated and the encoding is loaded in a background thread.
_ready: set[str] = set()
_warming: set[str] = set()
_ready_lock = threading.Lock()


def warm_tokenizer(model: str) -> None:
    """Load the tokenizer of ``model`` now (blocking, 2-3 s the first time in a process)."""
    from .providers.openai_remote import count_tokens, encoding_name_for_model

    count_tokens("", model)
    with _ready_lock:
        _ready.add(encoding_name_for_model(model))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _exact_counts(model: str) -> bool:
    """Whether tokens of ``model`` may be counted exactly right now: its encoding is loaded, or
    this thread may block to load it (no event loop runs here). Otherwise starts loading it in
    the background and returns False (the caller estimates)."""
    from .providers.openai_remote import encoding_name_for_model

    name = encoding_name_for_model(model)
    with _ready_lock:
        if name in _ready:
            return True
    if not _on_event_loop():
        warm_tokenizer(model)
        return True
    with _ready_lock:
        start = name not in _warming
        _warming.add(name)
    if start:
        threading.Thread(target=_warm_quietly, args=(model,), name="kefu-tokenizer", daemon=True).start()
    return False


def _warm_quietly(model: str) -> None:
    try:
        warm_tokenizer(model)
    except Exception:  # a background warm-up: counting stays estimated, the answer goes on
        log.exception("loading the tokenizer of %s failed", model)


def estimate_tokens(text: str) -> int:
    """A quick upper-leaning estimate of ``text``'s tokens: ceil(UTF-8 bytes / 3). English runs
    at about 4-5 characters a token (so this over-counts), Chinese at about 1-1.5 characters a
    token (3 bytes each: about right)."""
    return math.ceil(len(text.encode("utf-8")) / 3)


def text_tokens(text: str, model: str) -> tuple[int, bool]:
    """Tokens of ``text`` as completion text for ``model``: ``(count, estimated)``. Exact with the
    model's tokenizer; estimated (:func:`estimate_tokens`) on the event loop while it loads."""
    from .providers.openai_remote import count_tokens

    if _exact_counts(model):
        return count_tokens(text, model), False
    return estimate_tokens(text), True


class _Counter:
    """Tokens of single chat messages for one model: exact, or estimated while the tokenizer
    loads (``estimated`` then True). A message costs its role and content plus the chat format's
    overhead; the reply priming is counted once per prompt (``priming``)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.exact = _exact_counts(model)
        self.estimated = not self.exact
        self.priming = self._count([]) if self.exact else 3

    def _count(self, messages: Sequence[Mapping[str, Any]]) -> int:
        from .providers.openai_remote import count_tokens

        return count_tokens(messages, self.model)

    def message(self, role: str, content: str) -> int:
        if self.exact:
            return self._count([{"role": role, "content": content}]) - self.priming
        return 3 + estimate_tokens(role) + estimate_tokens(content)


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
    """``KEFU_CONTEXT_TOKENS[tier]``: the tier's prompt budget in tokens (positive)."""
    budget = getattr(settings, "KEFU_CONTEXT_TOKENS", {}).get(tier) or DEFAULT_CONTEXT_TOKENS.get(tier, 3000)
    return max(1, int(budget))


def turns_that_fit(turns: Sequence[Turn], *, budget: int, counter: _Counter, max_turns: int) -> tuple[int, int]:
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


def system_message(*, grounding: Sequence[tuple[str, str]], locale: str, summary: str = "") -> str:
    """The system message: instructions, ``grounding`` as Q/A pairs, and the summary (if any)."""
    facts = "\n".join(f"- Q: {q}\n  A: {a}" for q, a in grounding) or "- (no matching store information)"
    system = SYSTEM_PROMPT.format(
        store=settings.KEFU_STORE_NAME, language="Chinese" if locale == "zh" else "English", grounding=facts
    )
    if summary.strip():
        system += f"\n\n{SUMMARY_HEADING} {summary.strip()}"
    return system


@dataclass(frozen=True)
class Prompt:
    """A prompt and how it was fitted. ``messages``: OpenAI chat messages; ``kept_turns`` /
    ``dropped_turns``: turns of the given history in / left out; ``tokens``: the prompt's size
    in tokens (counted, or estimated while the tokenizer loads: ``estimated``); ``truncated``:
    the new message was cut to fit; ``summary``: the summary is in the system message."""

    messages: list[dict[str, str]]
    kept_turns: int
    dropped_turns: int
    tokens: int
    truncated: bool
    summary: bool
    estimated: bool


def build_prompt(
    *,
    grounding: Sequence[tuple[str, str]],
    history: Sequence[tuple[str, str]],
    text: str,
    locale: str,
    tier: str = "simple",
    summary: str = "",
) -> Prompt:
    """The prompt for ``tier`` within its budget (see the module docstring).

    ``grounding``: ``(question, answer)`` pairs; ``history``: ``(role, text)`` with role
    ``shopper``/``bot``/``agent``, oldest first (older turns beyond ``KEFU_CONTEXT_TURNS`` are
    dropped here too); ``text``: the shopper's new message; ``locale``: ``en``/``zh``;
    ``summary``: ``Conversation.summary``, the rolling summary of turns before ``history``
    (``""`` for none), put in the system message under :data:`SUMMARY_HEADING`.

    Safe to call on the event loop: until the tier model's tokenizer is loaded (2-3 s, once per
    process, started in the background), tokens are estimated (:func:`estimate_tokens`).
    """
    model = settings.KEFU_TIERS.get(tier, {}).get("model") or "gpt-4o"
    counter = _Counter(model)
    budget = context_tokens(tier)
    system = system_message(grounding=grounding, locale=locale, summary=summary)
    used = counter.priming + counter.message("system", system)

    message, truncated = text, False
    message_tokens = counter.message("user", text)
    if used + message_tokens > budget:
        message, message_tokens = _truncate(text, max(MIN_MESSAGE_TOKENS, budget - used), counter)
        truncated = True
    used += message_tokens

    turns = group_turns(history)
    kept, turn_tokens = turns_that_fit(turns, budget=max(0, budget - used), counter=counter,
                                       max_turns=max(0, settings.KEFU_CONTEXT_TURNS))
    messages = [{"role": "system", "content": system}]
    for turn in turns[len(turns) - kept:]:
        messages.extend({"role": _role(role), "content": body} for role, body in turn)
    messages.append({"role": "user", "content": message})
    return Prompt(messages=messages, kept_turns=kept, dropped_turns=len(turns) - kept, tokens=used + turn_tokens,
                  truncated=truncated, summary=bool(summary.strip()), estimated=counter.estimated)


def _truncate(text: str, limit: int, counter: _Counter) -> tuple[str, int]:
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
    return build_prompt(grounding=grounding, history=history, text=text, locale=locale, tier=tier,
                        summary=summary).messages


# --- Rolling summary (routing.tasks.summarise_conversation) -----------------------------------------

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


@dataclass(frozen=True)
class SummaryWork:
    """Turns of a conversation that left the prompt window and are not summarised yet.

    ``previous``: the summary so far; ``upto_seq``: the seq it reaches (0: none);
    ``turns``: the turns to fold in, ``(role, text)`` oldest first; ``new_upto_seq``: the seq of
    their last message; ``locale``: the conversation's."""

    previous: str
    upto_seq: int
    turns: list[Turn]
    new_upto_seq: int
    locale: str


def summary_work(*, conversation_id: uuid.UUID) -> SummaryWork | None:
    """The turns of the conversation that left the ``simple`` tier's window (beyond the last
    ``KEFU_CONTEXT_TURNS`` turns, or beyond what fits its budget less
    :data:`SUMMARY_RESERVE_TOKENS`) and are not in ``Conversation.summary`` yet; None when fewer
    than ``KEFU_SUMMARY_MIN_TURNS`` (or the setting is 0). Finished, non-system messages only.
    Synchronous (ORM, tokenizer): not on the event loop."""
    from chat.models import Conversation, Message, MessageState

    min_turns = int(getattr(settings, "KEFU_SUMMARY_MIN_TURNS", 2))
    if min_turns <= 0:
        return None
    conv = Conversation.objects.filter(pk=conversation_id).values("summary", "summary_upto_seq", "locale").first()
    if conv is None:
        return None
    rows = list(
        Message.objects.filter(conversation_id=conversation_id, seq__gt=conv["summary_upto_seq"],
                               state=MessageState.DONE)
        .exclude(role="system").exclude(text="").order_by("seq").values_list("seq", "role", "text")
    )
    turns: list[list[tuple[int, str, str]]] = []
    for seq, role, body in rows:
        if role == "shopper" or not turns:
            turns.append([])
        turns[-1].append((seq, role, body))
    model = settings.KEFU_TIERS.get(SUMMARY_TIER, {}).get("model") or "gpt-4o"
    counter = _Counter(model)
    system = system_message(grounding=[], locale=conv["locale"], summary=conv["summary"])
    budget = context_tokens(SUMMARY_TIER) - SUMMARY_RESERVE_TOKENS - counter.priming - counter.message("system", system)
    kept, _ = turns_that_fit([[(r, b) for _, r, b in t] for t in turns], budget=max(0, budget), counter=counter,
                             max_turns=max(0, settings.KEFU_CONTEXT_TURNS))
    older = turns[: len(turns) - kept]
    if len(older) < min_turns:
        return None
    return SummaryWork(
        previous=conv["summary"], upto_seq=conv["summary_upto_seq"],
        turns=[[(r, b) for _, r, b in t] for t in older[-SUMMARY_MAX_BATCH_TURNS:]],
        new_upto_seq=older[-1][-1][0], locale=conv["locale"],
    )


def build_summary_messages(work: SummaryWork) -> list[dict[str, str]]:
    """The summary call's prompt: an instruction, then the summary so far and the new turns as a
    transcript in one user message (quoted, so the model summarises instead of answering)."""
    lines = [f"{'Shopper' if role == 'shopper' else 'Store'}: {' '.join(body.split())}"
             for turn in work.turns for role, body in turn]
    language = "Chinese" if work.locale == "zh" else "English"
    return [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT.format(store=settings.KEFU_STORE_NAME, language=language)},
        {"role": "user", "content": f"Summary so far:\n{work.previous.strip() or '(none)'}\n\nNew turns:\n" + "\n".join(lines)},
    ]


async def _summary_call(messages: list[dict[str, str]], *, conversation_id: uuid.UUID, locale: str) -> str | None:
    """Stream ``messages`` from :data:`SUMMARY_TIER` through ``stream_with_fallback`` (gates,
    retries, fallback, a ledger row per attempt with the conversation) to its end; the text, or
    None when the answer was cut by its token budget. Raises ``ProviderError``."""
    from . import ledger
    from .ledger import CallContext
    from .providers.base import ChatRequest, StreamDone, TextDelta
    from .providers.openai_remote import close_clients
    from .resilience import stream_with_fallback
    from .strategy import Decision, _provider

    request = ChatRequest(messages=messages, model=settings.KEFU_TIERS[SUMMARY_TIER]["model"],
                          max_tokens=SUMMARY_MAX_TOKENS, temperature=0.0)
    decision = Decision(route=f"llm.{SUMMARY_TIER}", locale=locale, tier=SUMMARY_TIER,
                        provider=_provider(SUMMARY_TIER), request=request, reason="summary")
    texts: list[str] = []
    done: StreamDone | None = None
    try:
        async with aclosing(stream_with_fallback(decision, context=CallContext(conversation_id=conversation_id, purpose="summary"))) as stream:
            async for item in stream:
                if isinstance(item, TextDelta):
                    texts.append(item.text)
                elif isinstance(item, StreamDone):
                    done = item
    finally:
        await ledger.flush()  # this private loop ends with the call: its ledger rows first
        await close_clients()
    if done is None or done.finish_reason == "length":
        return None
    return "".join(texts)


def _on_private_loop(messages: list[dict[str, str]], *, conversation_id: uuid.UUID, locale: str) -> str | None:
    """Run :func:`_summary_call` on a private event loop in a fresh thread (blocking); see
    ``cache_layer.audit._on_private_loop`` for why not ``async_to_sync`` in the caller's thread."""
    from asgiref.sync import async_to_sync
    from django.db import connections

    def run() -> str | None:
        try:
            return async_to_sync(_summary_call)(messages, conversation_id=conversation_id, locale=locale)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kefu-summary") as pool:
        return pool.submit(run).result()


def conversation_summarise(*, conversation_id: uuid.UUID) -> str | None:
    """Fold the turns that left the prompt window into ``Conversation.summary`` (with the
    previous summary) using the ``simple`` tier, and move ``summary_upto_seq`` to their last
    message. Returns the new summary, or None when nothing was due, no tier is configured, the
    call failed or was cut, or another summary of the same conversation was stored meanwhile
    (compare-and-set on ``summary_upto_seq``). Never raises for upstream failures. Blocking."""
    from chat.models import Conversation

    from .providers.base import ProviderError
    from .strategy import tier_configured

    if not tier_configured(SUMMARY_TIER):
        return None  # no model: older turns are simply kept out of the prompt
    work = summary_work(conversation_id=conversation_id)
    if work is None:
        return None
    try:
        text = _on_private_loop(build_summary_messages(work), conversation_id=conversation_id, locale=work.locale)
    except ProviderError as e:
        log.info("summary (%s) of %s failed: %s", SUMMARY_PROMPT_VERSION, conversation_id, e.code)
        return None
    text = (text or "").strip()[:SUMMARY_MAX_CHARS]
    if not text:
        log.info("summary (%s) of %s empty or cut", SUMMARY_PROMPT_VERSION, conversation_id)
        return None
    # update(): no auto_now bump (the console orders by activity; a summary is none).
    stored = Conversation.objects.filter(pk=conversation_id, summary_upto_seq=work.upto_seq).update(
        summary=text, summary_upto_seq=work.new_upto_seq
    )
    return text if stored else None


_pending: set[asyncio.Future[bool]] = set()
# Conversations whose summary check (and, eager, summary) runs in this process now: one at a time,
# the next answer checks again (another summary meanwhile would repeat the same upstream call).
_summarising: set[uuid.UUID] = set()


def maybe_summarise(*, conversation_id: uuid.UUID) -> bool:
    """Enqueue ``routing.tasks.summarise_conversation`` when the current transaction commits if
    the conversation has turns due for the summary (:func:`summary_work`). Returns whether it was
    enqueued. Synchronous; with eager Celery the summary itself runs here (use
    :func:`maybe_summarise_async` from the event loop)."""
    from django.db import transaction

    from .strategy import tier_configured

    if not tier_configured(SUMMARY_TIER) or summary_work(conversation_id=conversation_id) is None:
        return False
    from .tasks import summarise_conversation

    transaction.on_commit(lambda: summarise_conversation.delay(str(conversation_id)), robust=True)
    return True


async def maybe_summarise_async(*, conversation_id: uuid.UUID) -> None:
    """:func:`maybe_summarise` for the answering loop: returns at once; the check, the enqueue
    and (eager Celery) the summary run in a worker thread that nothing waits for, so the next
    message never waits for a summary. No-op without a configured ``simple`` tier.
    :func:`drain` waits for those threads (tests, shutdown)."""
    from django.db import close_old_connections

    from .strategy import tier_configured

    if not tier_configured(SUMMARY_TIER) or int(getattr(settings, "KEFU_SUMMARY_MIN_TURNS", 2)) <= 0:
        return
    if conversation_id in _summarising:
        return
    _summarising.add(conversation_id)

    def run() -> bool:
        close_old_connections()
        try:
            return maybe_summarise(conversation_id=conversation_id)
        except Exception:  # a summary is an optimisation of later prompts: logged, never shown
            log.exception("summarising conversation %s failed", conversation_id)
            return False
        finally:
            close_old_connections()
            _summarising.discard(conversation_id)

    future = asyncio.get_running_loop().run_in_executor(None, run)
    _pending.add(future)
    future.add_done_callback(_pending.discard)


async def drain() -> None:
    """Wait until every summary handed off by :func:`maybe_summarise_async` on this loop has ended."""
    loop = asyncio.get_running_loop()
    while pending := [f for f in _pending if f.get_loop() is loop and not f.done()]:
        await asyncio.gather(*pending, return_exceptions=True)
