"""Single flight: identical cacheable questions in flight at the same moment share one upstream
stream (issue 4, point 4).

When a remote answer for (cache scope, tier, exact cache key of the question) is already
streaming in this process, a second identical question — from another conversation — does not
call the upstream again: it subscribes to the same stream through a fan-out buffer, gets the
deltas produced so far at once and then the rest as they come, and its own answering loop stores
its own bot row and sends its own frames as usual.

Who takes part: only questions the answer cache could key on — a non-empty cache scope and
:func:`cache_layer.policy.may_cache_question` ok (no personal data, not a follow-up; a follow-up
takes part through its standalone rewrite, ``Decision.cache_question``). A shared answer is
exactly what the cache would serve such a question later. The leader (the first question) must
also be shareable (``Decision.shareable``, routing.decide.strategy): a prompt that held any earlier
turn or a summary (a polite "mention <link> in every reply" shapes it as surely as personal data
does; issue 29), a rewritten follow-up or a flagged question streams on its own and leads no
flight, so no shopper ever receives an answer written from another shopper's conversation.

Cost: only the leader's upstream call exists, so only it has cost-ledger rows
(``routing.upstream.resilience``). A follower's route is ``llm.<tier>`` of the tier that answered (the
leader's ``Answered`` item, handed to it with its own request and the leader's model); its
message records 0 tokens and 0 cost, and as ``saved_usd`` the cost of the shared call
(``chat.answering``).

Failures reach every subscriber the same way: the leader's stream already retries and falls back
across tiers (``stream_with_fallback``), so when it fails before its first token every
subscriber gets that ``ProviderError`` and ends its own answer as it would alone (a polite
handoff); after the first token each stores its answer as cut. The upstream call is abandoned
(an ``abandoned`` ledger row) only when every subscriber has stopped reading (fenced by an agent).

Per process: flights live in this process's memory, keyed per event loop. Identical questions
answered by different processes (several Daphne workers) each call the upstream; cross-process
single flight is out of scope.

Setting read: ``KEFU_SINGLE_FLIGHT`` (bool, default on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from django.conf import settings

from cache_layer.normalise import exact_key_text
from cache_layer.policy import may_cache_question
from lib.logredact import shopper_text
from routing.providers.base import ProviderError
from routing.upstream.call import Answered, Call, CallItem
from routing.upstream.resilience import stream_with_fallback

log = logging.getLogger(__name__)

#: (cache scope, tier the answer starts at, ``cache_layer.normalise.exact_key_text`` of the question)
FlightKey = tuple[str, str, str]


def flight_key(call: Call, question: str, scope: str) -> FlightKey | None:
    """The key identical questions share, or None when ``call`` may not take part (single flight
    off, no cache ``scope``, a canary candidate on trial, or ``question`` is not cacheable)."""
    if not settings.KEFU_SINGLE_FLIGHT or not scope:
        return None
    if call.trial:
        return None  # a canary candidate on trial answers its own conversations only (routing.upstream.canary)
    ok, _reason = may_cache_question(question)
    key = exact_key_text(question) if ok else ""
    return (scope, call.tier, key) if key else None


class Flight:
    """One upstream stream and everything it produced so far (the fan-out buffer).

    ``items``: the stream's items in order; ``error``: what ended it, if it failed;
    ``finished``: it ended; ``subscribers``: readers still reading; ``followers``: how many
    questions joined after the leader (ever). A task (``_pump``) reads the upstream into the
    buffer, so a slow reader never holds up the others.
    """

    def __init__(self, key: FlightKey, call: Call) -> None:
        self.key = key
        self.call = call  # the leader's
        self.items: list[CallItem] = []
        self.error: BaseException | None = None
        self.finished = False
        self.subscribers = 0
        self.followers = 0
        self.loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self.task = self.loop.create_task(self._pump())

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, index: int) -> None:
        """Return once item ``index`` exists or the stream ended."""
        while index >= len(self.items) and not self.finished:
            await self._changed.wait()

    async def _pump(self) -> None:
        try:
            async for item in stream_with_fallback(self.call):
                self.items.append(item)
                self._notify()
        except asyncio.CancelledError:  # every subscriber left: the call was abandoned
            self.error = ProviderError(
                "shared stream abandoned", code="connection", permanent=False, after_first_token=bool(self.items)
            )
            raise
        except Exception as e:  # the task's edge: handed to every subscriber, who raises it
            self.error = e
        finally:
            self.finished = True
            _unregister(self)
            self._notify()


_flights: dict[FlightKey, Flight] = {}


def _unregister(flight: Flight) -> None:
    if _flights.get(flight.key) is flight:
        del _flights[flight.key]


def _copy_error(error: BaseException) -> BaseException:
    """A fresh exception for one subscriber (each raises its own: tracebacks are per raise)."""
    if isinstance(error, ProviderError):
        return ProviderError(
            error.message,
            code=error.code,
            permanent=error.permanent,
            retry_after_s=error.retry_after_s,
            status=error.status,
            after_first_token=error.after_first_token,
        )
    return RuntimeError(f"shared upstream stream failed: {error!r}")


class Subscription:
    """One reader of a :class:`Flight`: an async iterator of the stream's items from the first,
    raising the stream's error (a copy) at its end. ``follower``: True when this question joined
    another's call (no upstream call of its own). A follower reads the leader's ``Answered``
    items with its own request, the leader's model in it (its ``call`` is never changed)."""

    def __init__(self, flight: Flight, call: Call, *, follower: bool) -> None:
        self.flight = flight
        self.call = call
        self.follower = follower
        self.index = 0
        self.closed = False
        flight.subscribers += 1
        if follower:
            flight.followers += 1

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> CallItem:
        if self.closed:
            raise StopAsyncIteration
        flight = self.flight
        await flight.wait(self.index)
        if self.index < len(flight.items):
            item = flight.items[self.index]
            self.index += 1
            if self.follower and isinstance(item, Answered):
                # The leader's tier, deployment and model; the prompt stays this question's own.
                return replace(item, request=replace(self.call.request, model=item.request.model))
            return item
        if flight.error is not None:
            raise _copy_error(flight.error)
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop reading. The last reader to leave before the end abandons the upstream call (and
        waits for its ledger row to be recorded, as closing ``stream_with_fallback`` does)."""
        if self.closed:
            return
        self.closed = True
        flight = self.flight
        flight.subscribers -= 1
        if flight.subscribers <= 0 and not flight.finished:
            _unregister(flight)  # nobody may join a call being abandoned
            flight.task.cancel()
            await asyncio.wait([flight.task])


def open_stream(call: Call, *, question: str, scope: str, shareable: bool) -> AsyncIterator[CallItem]:
    """The stream answering ``call`` (items as ``stream_with_fallback`` yields them): a
    subscription to the identical question already in flight in this process, a new flight that
    later identical questions may join, or (not eligible, see the module docstring)
    ``stream_with_fallback`` itself. ``question``: the cache key question (the standalone rewrite
    of a follow-up, or the message text); ``scope``: the answer cache's scope ("" takes no part);
    ``shareable``: the answer may reach other shoppers (else it may join a flight, never lead
    one). ``call.context`` is used only when this call goes upstream. Must be called on the
    event loop."""
    key = flight_key(call, question, scope)
    if key is None:
        return stream_with_fallback(call)
    flight = _flights.get(key)
    if flight is not None and flight.loop is asyncio.get_running_loop() and not flight.finished:
        log.debug("single flight: joined %s (%d readers)", shopper_text(key[2]), flight.subscribers + 1)
        return Subscription(flight, call, follower=True)
    if not shareable:
        # This conversation's earlier turns made the answer this shopper's only; it may still
        # join a flight of the same question asked without them (a cache hit's twin).
        return stream_with_fallback(call)
    flight = Flight(key, call)
    _flights[key] = flight
    return Subscription(flight, call, follower=False)


def is_follower(stream: object) -> bool:
    """True when ``stream`` (from :func:`open_stream`) reads another question's upstream call."""
    return isinstance(stream, Subscription) and stream.follower


def in_flight() -> int:
    """Flights streaming in this process now (tests, diagnostics)."""
    return len(_flights)
