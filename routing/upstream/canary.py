"""Canary rollout: a tier's candidate model answers a share of that tier's conversations
(docs/routing.md, "Canary rollout").

**Who gets the candidate.** A tier with ``KEFU_<TIER>_CANARY_MODEL`` set (its base URL, key and
prices default to the tier's) gives it ``KEFU_<TIER>_CANARY_SHARE`` (0 to 1) of its conversations:
conversation ``c`` is the candidate's when ``point(tier, c) < share``, where ``point`` maps the
SHA-256 of ``"<tier>:<conversation id>"`` onto [0, 1). The same conversation always gets the same
answer (sticky, reproducible in any process), a larger share keeps every conversation a smaller one
had, and the tiers draw apart. Only shoppers' answers take part (purposes ``answer`` and ``tool``):
rewrites, summaries, agents' drafts, audits and the gateway (no conversation) stay on the tier's
own model.

**Staff's word** (``TierOverride``, append-only, the newest row of a tier in force while it names
the configured candidate): ``promoted`` gives the candidate every conversation of the tier,
``rolled_back`` none, ``canary`` the environment's share again. With no row, or a row about
another candidate, the environment decides. Every process reads the newest row through Django's
cache (shared with ``REDIS_URL``) and keeps it for ``KEFU_CANARY_REFRESH_S`` (2 s): a decision
takes effect at once in the process that wrote it, within that bound in the others with Redis,
and within twice that without (each process's own cache).

**Automatic rollback** (:func:`check_errors`, after each candidate failure's ledger row): the
candidate's calls of the tier in the last ``KEFU_CANARY_WINDOW_S`` seconds (and since staff's
newest decision) are counted the way its circuit breaker counts them: an answer that streamed to
its end is a success, a ``server``, ``connection``, ``timeout``, ``malformed`` or ``auth``
failure a failure; rate limits, refused requests, skips and abandoned calls neither. With at least
``KEFU_CANARY_MIN_CALLS`` of them and failures / calls above ``KEFU_CANARY_MAX_ERROR_RATE``, the
candidate is rolled back (a row by ``auto`` whose reason gives the figures) and a warning logged.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q
from django.utils import timezone

from routing.models import CanaryState, Outcome, Purpose, TierOverride, UpstreamCall
from routing.types import CallContext
from routing.upstream.breaker import BREAKER_FAILURES
from routing.upstream.call import Call
from routing.upstream.tiers import (
    CANDIDATE,
    CURRENT,
    TIER_ORDER,
    candidate_configured,
    candidate_share,
    provider_for,
    recheck_tier,
    tier_model,
)

log = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "Canary",
    "CanaryError",
    "assign",
    "check_errors",
    "decide",
    "error_rate",
    "forget",
    "point",
    "status",
    "status_async",
    "variant_async",
]

#: ``TierOverride.by`` of the automatic rollback.
AUTO = "auto"
#: The purposes whose calls a candidate may answer: a shopper's answer and its tool rounds.
CANARY_PURPOSES = (Purpose.ANSWER.value, Purpose.TOOL.value)

_CACHE_KEY = "kefu:canary:{tier}"
_SPACE = 2**64


class CanaryError(Exception):
    """A decision that cannot be taken: the tier has no candidate configured, or the state is unknown."""


def point(tier: str, conversation_id: uuid.UUID | str) -> float:
    """Where conversation ``conversation_id`` falls in [0, 1) for ``tier``'s canary: the first 8
    bytes of SHA-256(``"<tier>:<conversation id>"``) over 2**64. Same input, same point, in every
    process and release."""
    digest = hashlib.sha256(f"{tier}:{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SPACE


@dataclass(frozen=True)
class Canary:
    """Where one tier's canary stands: its ``candidate`` model (and the tier's own, ``current``),
    the environment's share (``env_share``), the ``state`` in force (``canary`` when staff said nothing about this
    candidate) and the decision behind it (``decided_by``/``decided_at``/``reason``; empty/None
    when the environment decides)."""

    tier: str
    current: str
    candidate: str
    env_share: float
    state: str = CanaryState.CANARY.value
    decided_by: str = ""
    decided_at: datetime | None = None
    reason: str = ""

    @property
    def share(self) -> float:
        """The share of the tier's conversations the candidate answers now: 1 promoted, 0 rolled
        back, else the environment's."""
        if self.state == CanaryState.PROMOTED:
            return 1.0
        if self.state == CanaryState.ROLLED_BACK:
            return 0.0
        return self.env_share

    @property
    def trial(self) -> bool:
        """The candidate is still on trial (not promoted): its answers are kept apart."""
        return self.state != CanaryState.PROMOTED

    def takes(self, conversation_id: uuid.UUID | str | None) -> bool:
        """Whether the candidate answers ``conversation_id`` (never None: no conversation)."""
        return conversation_id is not None and self.share > 0 and point(self.tier, conversation_id) < self.share

    def as_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "current": self.current,
            "candidate": self.candidate,
            "env_share": self.env_share,
            "state": self.state,
            "share": self.share,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
            "reason": self.reason,
        }


# tier -> (monotonic time until which it is trusted, the newest TierOverride row as a dict or {})
_memo: dict[str, tuple[float, dict[str, Any]]] = {}
_memo_lock = threading.Lock()


def _row_dict(row: TierOverride | None) -> dict[str, Any]:
    if row is None:
        return {}
    return {
        "id": row.pk,
        "state": row.state,
        "model": row.candidate_model,
        "by": row.by,
        "at": row.created_at.isoformat(),
        "reason": row.reason,
    }


def _remember(tier: str, newest: dict[str, Any], *, decided: bool = False) -> None:
    """Keep ``newest`` as this process's copy; a decision made here (``decided``) or one this
    process learns of from another makes it ask the tier's endpoints again."""
    with _memo_lock:
        held = _memo.get(tier)
        _memo[tier] = (time.monotonic() + settings.KEFU_CANARY_REFRESH_S, newest)
    if decided or (held is not None and newest and held[1].get("id") != newest.get("id")):
        # Another process promoted or rolled back the candidate: this one asks the tier's
        # endpoints again too before its next call (routing.upstream.listing).
        recheck_tier(tier)


def _fresh(tier: str) -> dict[str, Any] | None:
    with _memo_lock:
        held = _memo.get(tier)
    return held[1] if held is not None and held[0] > time.monotonic() else None


def _newest(tier: str) -> dict[str, Any]:
    """The newest decision about ``tier`` (a dict, {} for none): this process's copy while fresh,
    else the shared cache's, else the database's (then cached). Blocking on a stale copy. A cache
    or database that fails keeps the last copy known (or none) for another refresh period."""
    held = _fresh(tier)
    if held is not None:
        return held
    key = _CACHE_KEY.format(tier=tier)
    newest: dict[str, Any] | None = None
    try:
        newest = cache.get(key)
    except Exception:  # the shared cache is down: the database answers
        log.warning("reading the %s canary's state from the cache failed", tier, exc_info=True)
    if newest is None:
        try:
            newest = _row_dict(TierOverride.objects.filter(tier=tier).order_by("-id").first())
        except Exception:
            log.exception("reading the %s canary's state failed; the last one known stands", tier)
            with _memo_lock:
                last = _memo.get(tier)
            newest = last[1] if last is not None else {}
            _remember(tier, newest)
            return newest
        try:
            cache.set(key, newest, timeout=settings.KEFU_CANARY_REFRESH_S)
        except Exception:
            log.warning("caching the %s canary's state failed", tier, exc_info=True)
    _remember(tier, newest)
    return newest


def _canary(tier: str, newest: dict[str, Any]) -> Canary:
    model = tier_model(tier, CANDIDATE)
    base = Canary(tier=tier, current=tier_model(tier), candidate=model, env_share=candidate_share(tier))
    if not newest or newest.get("model") != model:
        return base  # no decision, or one about another candidate: the environment decides
    return replace(
        base,
        state=newest["state"],
        decided_by=newest.get("by", ""),
        decided_at=datetime.fromisoformat(newest["at"]) if newest.get("at") else None,
        reason=newest.get("reason", ""),
    )


def status(tier: str) -> Canary | None:
    """Where ``tier``'s canary stands (None: no candidate configured). Blocking when this
    process's copy is older than ``KEFU_CANARY_REFRESH_S``."""
    if not candidate_configured(tier):
        return None
    return _canary(tier, _newest(tier))


async def status_async(tier: str) -> Canary | None:
    """:func:`status` for the event loop: no thread hop while this process's copy is fresh (or
    the tier has no candidate)."""
    if not candidate_configured(tier):
        return None
    newest = _fresh(tier)
    if newest is None:
        newest = await database_sync_to_async(_newest)(tier)
    return _canary(tier, newest)


async def variant_async(tier: str, context: CallContext) -> str:
    """Which deployment of ``tier`` answers a call for ``context``: ``candidate`` for a shopper's
    answer (purposes ``answer``, ``tool``) in a conversation the canary takes, else ``current``."""
    if context.conversation_id is None or context.purpose not in CANARY_PURPOSES:
        return CURRENT
    state = await status_async(tier)
    return CANDIDATE if state is not None and state.takes(context.conversation_id) else CURRENT


async def assign(call: Call, *, conversation_id: uuid.UUID | None) -> Call:
    """``call`` sent to its tier's candidate when the canary takes ``conversation_id``: a new
    :class:`~routing.upstream.call.Call` with ``variant`` ``candidate``, the candidate's provider
    and model, and ``trial`` while the candidate is on trial (its answer is then neither cached
    nor shared with identical questions in flight, whose askers may not be the candidate's).
    Otherwise ``call`` itself (the same object). ``call`` is never changed. Blocking only when
    this process's copy of the canary's state is stale (read in a thread)."""
    if conversation_id is None:
        return call
    state = await status_async(call.tier)
    if state is None or not state.takes(conversation_id):
        return call
    return replace(
        call,
        variant=CANDIDATE,
        provider=provider_for(call.tier, CANDIDATE),
        request=replace(call.request, model=state.candidate),
        trial=call.trial or state.trial,
    )


def decide(tier: str, *, state: str, by: str, user_id: int | None = None, reason: str = "") -> Canary:
    """Record staff's (or ``auto``'s) decision about ``tier``'s candidate (``promoted``,
    ``rolled_back`` or ``canary``: the environment's share again) as a new ``TierOverride`` row,
    and put it in force at once in this process and in the shared cache. Returns the new
    standing. Raises :class:`CanaryError` for a tier without a candidate or an unknown state."""
    if state not in CanaryState.values:
        raise CanaryError(f"unknown canary state {state!r}")
    if tier not in TIER_ORDER or not candidate_configured(tier):
        raise CanaryError(f"the {tier} tier has no canary candidate (KEFU_{tier.upper()}_CANARY_MODEL)")
    row = TierOverride.objects.create(
        tier=tier,
        state=CanaryState(state).value,
        candidate_model=tier_model(tier, CANDIDATE)[:100],
        by=by[:150],
        user_id=user_id,
        reason=reason,
    )
    _publish(tier, _row_dict(row))  # and asks the tier's endpoints again (_remember)
    log.warning("canary of the %s tier (%s): %s by %s: %s", tier, row.candidate_model, state, by, reason or "-")
    standing = status(tier)
    assert standing is not None
    return standing


def _publish(tier: str, newest: dict[str, Any]) -> None:
    _remember(tier, newest, decided=True)
    try:
        cache.set(_CACHE_KEY.format(tier=tier), newest, timeout=settings.KEFU_CANARY_REFRESH_S)
    except Exception:  # other processes read the database once their copies expire
        log.warning("publishing the %s canary's state to the cache failed", tier, exc_info=True)


@dataclass(frozen=True)
class ErrorRate:
    """A candidate's recent calls as its breaker counts them: ``ok`` + ``failed`` = ``calls``."""

    ok: int
    failed: int
    since: datetime

    @property
    def calls(self) -> int:
        return self.ok + self.failed

    @property
    def rate(self) -> float | None:
        return self.failed / self.calls if self.calls else None


def error_rate(tier: str, *, since: datetime) -> ErrorRate:
    """The candidate's calls of ``tier`` (shoppers' answers) from ``since`` on, counted the way
    its breaker counts (module docstring). One query."""
    counts = UpstreamCall.objects.filter(
        tier=tier, variant=CANDIDATE, purpose__in=CANARY_PURPOSES, created_at__gte=since
    ).aggregate(
        ok=Count("id", filter=Q(outcome=Outcome.OK)),
        failed=Count("id", filter=Q(error_code__in=BREAKER_FAILURES)),
    )
    return ErrorRate(ok=counts["ok"] or 0, failed=counts["failed"] or 0, since=since)


def check_errors(tier: str) -> bool:
    """Roll ``tier``'s candidate back when its error rate passes the threshold (module
    docstring); True when this call did. Blocking (one or two queries)."""
    state = status(tier)
    if state is None or state.share <= 0:
        return False
    since = timezone.now() - timedelta(seconds=settings.KEFU_CANARY_WINDOW_S)
    if state.decided_at is not None and state.decided_at > since:
        since = state.decided_at  # what staff decided starts a new count
    figures = error_rate(tier, since=since)
    limit = settings.KEFU_CANARY_MAX_ERROR_RATE
    if figures.calls < settings.KEFU_CANARY_MIN_CALLS or figures.rate is None or figures.rate <= limit:
        return False
    # Another process may have rolled it back already: ask the database, not the cache.
    newest = TierOverride.objects.filter(tier=tier).order_by("-id").first()
    if newest is not None and newest.candidate_model == state.candidate and newest.state == CanaryState.ROLLED_BACK:
        _publish(tier, _row_dict(newest))
        return False
    window = f"{settings.KEFU_CANARY_WINDOW_S:g} s"
    decide(
        tier,
        state=CanaryState.ROLLED_BACK,
        by=AUTO,
        reason=(
            f"error rate {figures.failed}/{figures.calls} = {figures.rate:.1%} of the candidate's calls "
            f"in the last {window}, above {limit:.1%} (at least {settings.KEFU_CANARY_MIN_CALLS} calls)"
        ),
    )
    return True


def forget() -> None:
    """Drop this process's copies and the shared cache's entries (tests; after deleting rows)."""
    with _memo_lock:
        _memo.clear()
    try:
        cache.delete_many([_CACHE_KEY.format(tier=tier) for tier in TIER_ORDER])
    except Exception:
        log.warning("forgetting the canaries' cached state failed", exc_info=True)
