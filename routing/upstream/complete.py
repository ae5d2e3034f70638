"""One-shot model calls: a whole answer that nobody watches stream (a summary, a cache audit's
re-answer, a follow-up's rewrite, an agent's suggested reply).

Every call goes through :func:`routing.upstream.resilience.stream_with_fallback` like a shopper's answer:
the same gates (the upstream's rate-limit headers, the circuit breaker, client-side limits), the
same retries and tier fallback, and one cost-ledger row per attempt with its ``purpose``.

:func:`complete` runs on the caller's event loop. :func:`complete_blocking` is for synchronous
callers (Celery tasks, which may run eagerly inside the server's sync thread): it runs the call on
a private event loop in a fresh thread, writes its ledger rows and closes that loop's clients.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections

from routing.providers.base import ChatRequest, StreamDone, TextDelta
from routing.types import CallContext
from routing.upstream import ledger
from routing.upstream.call import Answered, Call
from routing.upstream.resilience import stream_with_fallback
from routing.upstream.tiers import provider_for, tier_model


@dataclass(frozen=True)
class Completion:
    """A finished one-shot answer: ``text``, the ``tier`` and ``model`` that answered (after any
    fallback), whether the stream ``ended`` with its last chunk, and the upstream's
    ``finish_reason`` (``None`` when it gave none)."""

    text: str
    tier: str
    model: str
    ended: bool
    finish_reason: str | None

    @property
    def complete(self) -> bool:
        """False when the answer was cut by its token budget (``finish_reason == "length"``) or
        the stream ended without its last chunk: such a text must not be used as a whole answer."""
        return self.ended and self.finish_reason != "length"


async def complete(
    *,
    messages: list[dict[str, Any]],
    tier: str,
    context: CallContext,
    max_tokens: int,
    temperature: float | None = None,
) -> Completion:
    """Stream ``messages`` from ``tier`` (then its fallbacks) to the end and return the whole answer.

    ``context.purpose`` names the call on its ledger rows (``summary``, ``audit``, ``rewrite``,
    ``suggestion``); ``max_tokens`` bounds the answer (tokens); ``temperature`` None leaves the
    upstream's default. Raises ``ProviderError`` when every attempt failed or the stream broke;
    ``KeyError`` for an unknown tier. Cancelling the caller abandons the call (its ledger row says
    ``abandoned``)."""
    # stream_with_fallback asks the endpoints for their models before any call and sets each
    # attempt's model from the answer: nothing to check here.
    request = ChatRequest(messages=messages, model=tier_model(tier), max_tokens=max_tokens, temperature=temperature)
    return await complete_call(Call(tier=tier, request=request, provider=provider_for(tier), context=context))


async def complete_call(call: Call) -> Completion:
    """:func:`complete` for a call the router already planned (e.g. an agent's suggested reply
    with the answer's own grounded prompt, ``routing.decide.decision.Decision.call``): the whole
    answer, with the tier and model that answered after any fallback. Raises ``ProviderError``."""
    texts: list[str] = []
    done: StreamDone | None = None
    answered: Answered | None = None
    async with aclosing(stream_with_fallback(call)) as stream:
        async for item in stream:
            if isinstance(item, TextDelta):
                texts.append(item.text)
            elif isinstance(item, StreamDone):
                done = item
            elif isinstance(item, Answered):
                answered = item
    by = answered.request if answered is not None else call.request  # the deployment that answered
    return Completion(
        text="".join(texts),
        tier=answered.tier if answered is not None else call.tier,
        model=(done.model if done is not None else "") or by.model,
        ended=done is not None,
        finish_reason=done.finish_reason if done is not None else None,
    )


def complete_blocking(**kwargs: Any) -> Completion:
    """:func:`complete` for synchronous callers (same arguments and errors), blocking until the end.

    Runs on a private event loop in a fresh thread. ``async_to_sync`` called in the caller's own
    thread would misbehave when a Celery task runs eagerly inside ``database_sync_to_async`` (the
    server's thread-sensitive thread): it would run the stream on the server's own loop and then
    close that loop's shared upstream clients, and the ledger's own ``database_sync_to_async``
    writes would queue behind this very call (a deadlock). A new thread starts with an empty
    context and no loop, so ``async_to_sync`` there makes a private loop, and the ledger rows are
    written in that thread before it ends."""
    # Imported here: the provider module imports the openai SDK (~1.2 s), which only a call pays.
    from routing.providers.openai_remote import close_clients

    async def call() -> Completion:
        try:
            return await complete(**kwargs)
        finally:
            await ledger.flush()  # this private loop ends with the call: its ledger rows first
            await close_clients()

    def run() -> Completion:
        try:
            return async_to_sync(call)()
        finally:
            connections.close_all()  # this thread's connection (the ledger rows) ends with it

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kefu-one-shot") as pool:
        return pool.submit(run).result()
