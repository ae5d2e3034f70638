"""Spend budgets that degrade instead of failing: who may still send what to a remote tier.

Payers and their limits (USD; settings in config/settings.py, 0 = no limit):

- a verified shopper, by the store's customer id: ``KEFU_BUDGET_SHOPPER_DAY_USD`` / ``_MONTH_USD``
  on every device;
- an anonymous shopper: the same limits per conversation, and ``KEFU_BUDGET_ADDRESS_DAY_USD`` /
  ``_MONTH_USD`` per network they connect from (``chat.identity.address_key``), so a new
  conversation is not a new budget;
- a gateway key: its own limits (``ApiKey.budget_day_usd`` / ``budget_month_usd``, set in the
  admin), else ``KEFU_BUDGET_KEY_DAY_USD`` / ``_MONTH_USD``;
- the store, per tier and day: ``KEFU_<TIER>_DAY_CAP_USD``.

Days are calendar days and months calendar months in ``TIME_ZONE``.

How they degrade (:class:`Standing`, read before a remote answer is chosen):

- past ``KEFU_BUDGET_SOFT_SHARE`` (80%) of any of the payer's budgets, the costliest configured
  tier is no longer reached (a question for it goes to the next tier down);
- a tier past that share of its store-wide cap takes no question a cheaper open tier can take;
- past 100% of a payer's budget, or with no tier left open, only the FAQ, the answer cache and a
  person answer (``routing.decide.strategy.budget_decision``, a polite notice and a handoff).

Correct under concurrency (the known failure of LiteLLM's end-user budgets, where requests that
start together all pass a check of spend so far): before each attempt to call a tier,
:func:`reserve` holds the call's maximum cost (``routing.upstream.ledger.max_cost_usd``: its prompt and
``max_tokens`` at list prices) on every counter that pays for it, in one transaction whose
``UPDATE ... WHERE spent + reserved + amount <= limit`` is re-checked on the latest row under the
row lock (PostgreSQL's READ COMMITTED; SQLite writes one at a time), so two workers cannot both
take the last of a budget. When the attempt ends, :func:`settle` (with its ledger row) replaces
the hold by the call's cost. A budget is therefore never overshot by more than the difference
between a call's counted and billed tokens; a hold whose process died counts as spent at its
maximum once it expires (``KEFU_BUDGET_HOLD_S``, :func:`expire_holds`, every minute from beat).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from lib import sandbox
from routing.models import ApiKey, BudgetCounter, BudgetHold
from routing.types import Payer
from routing.upstream.tiers import TIER_ORDER, known_tier, tier_settings

log = logging.getLogger(__name__)

__all__ = [
    "BudgetRefused",
    "Hold",
    "Scope",
    "Standing",
    "expire_holds",
    "payer_scopes",
    "reserve",
    "settle",
    "standing",
]

DAY, MONTH = "day", "month"
#: How long a gateway key's own limits are trusted in this process after reading them, seconds.
KEY_LIMITS_TTL_S = 10.0


@dataclass(frozen=True, order=True)
class Scope:
    """One budget one call counts against: payer ``kind`` (``customer``, ``conversation``,
    ``address``, ``key``, ``tier``) and ``key``, ``period`` (``day``/``month``) starting on
    ``starts_on``, and its ``limit_usd``."""

    kind: str
    key: str
    period: str
    starts_on: date
    limit_usd: Decimal = field(compare=False)

    def describe(self) -> str:
        """Plain words for logs, reasons and error messages, e.g. ``shopper daily budget``."""
        who = {"customer": "shopper", "conversation": "shopper", "address": "address", "key": "key"}
        if self.kind == "tier":
            return f"{self.key} tier's daily cap"
        return f"{who.get(self.kind, self.kind)} {'daily' if self.period == DAY else 'monthly'} budget"


class BudgetRefused(Exception):
    """A call's maximum cost does not fit a budget that pays for it: ``scope`` (the first such
    budget) and ``share`` (how much of it is spent or held, 0..1+)."""

    def __init__(self, scope: Scope, share: float) -> None:
        super().__init__(f"the {scope.describe()} is spent ({share:.0%} of ${scope.limit_usd})")
        self.scope = scope
        self.share = share


@dataclass(frozen=True)
class Hold:
    """A reservation made by :func:`reserve`: ``hold_id``, the counters it holds ``amount_usd``
    on (``counter_ids``)."""

    hold_id: uuid.UUID
    counter_ids: tuple[int, ...]
    amount_usd: Decimal


def enabled() -> bool:
    """``KEFU_BUDGETS_ENABLED``."""
    return bool(settings.KEFU_BUDGETS_ENABLED)


def _periods() -> list[tuple[str, date]]:
    today = timezone.localdate()
    return [(DAY, today), (MONTH, today.replace(day=1))]


def _hashed(kind: str, value: str) -> str:
    """A keyed hash of a customer id (never stored as such here: erasing a shopper's data leaves
    nothing to find); addresses come hashed already (``chat.identity.address_key``)."""
    return hmac.new(settings.SECRET_KEY.encode(), f"kefu-{kind}:{value}".encode(), hashlib.sha256).hexdigest()[:32]


_key_limits: dict[int, tuple[float, tuple[Decimal, Decimal]]] = {}
_key_limits_lock = threading.Lock()


def _limits_of_key(api_key_id: int) -> tuple[Decimal, Decimal]:
    """(day, month) limits of a gateway key in USD: its own, else the settings' (0 = none).
    Read from the database at most every ``KEY_LIMITS_TTL_S`` seconds per key."""
    now = time.monotonic()
    with _key_limits_lock:
        cached = _key_limits.get(api_key_id)
    if cached is not None and now - cached[0] < KEY_LIMITS_TTL_S:
        return cached[1]
    found = ApiKey.objects.filter(pk=api_key_id).values_list("budget_day_usd", "budget_month_usd").first()
    day, month = found if found is not None else (None, None)
    limits = (
        Decimal(str(settings.KEFU_BUDGET_KEY_DAY_USD)) if day is None else Decimal(day),
        Decimal(str(settings.KEFU_BUDGET_KEY_MONTH_USD)) if month is None else Decimal(month),
    )
    with _key_limits_lock:
        _key_limits[api_key_id] = (now, limits)
    return limits


def forget_key_limits() -> None:
    """Drop the cached gateway-key limits (after an admin edit in this process; tests)."""
    with _key_limits_lock:
        _key_limits.clear()


def payer_scopes(payer: Payer | None) -> list[Scope]:
    """The budgets ``payer``'s calls count against, for today and this month (those with a
    limit only; none when budgets are off, or in a bot test's sandbox: ``lib.sandbox``). Blocking:
    a gateway key's limits may be read."""
    if payer is None or not enabled() or sandbox.active():
        return []
    pairs: list[tuple[str, str, Decimal, Decimal]] = []
    shopper = (Decimal(str(settings.KEFU_BUDGET_SHOPPER_DAY_USD)), Decimal(str(settings.KEFU_BUDGET_SHOPPER_MONTH_USD)))
    if payer.customer_id:
        pairs.append(("customer", _hashed("customer", payer.customer_id), *shopper))
    else:
        if payer.conversation_id is not None:
            pairs.append(("conversation", str(payer.conversation_id), *shopper))
        if payer.address_key:
            pairs.append(
                (
                    "address",
                    payer.address_key,
                    Decimal(str(settings.KEFU_BUDGET_ADDRESS_DAY_USD)),
                    Decimal(str(settings.KEFU_BUDGET_ADDRESS_MONTH_USD)),
                )
            )
    if payer.api_key_id is not None:
        pairs.append(("key", str(payer.api_key_id), *_limits_of_key(payer.api_key_id)))
    (day_kind, day), (month_kind, month) = _periods()
    out: list[Scope] = []
    for kind, key, day_limit, month_limit in pairs:
        if day_limit > 0:
            out.append(Scope(kind, key, day_kind, day, day_limit))
        if month_limit > 0:
            out.append(Scope(kind, key, month_kind, month, month_limit))
    return out


def tier_scopes(tiers: Iterable[str]) -> list[Scope]:
    """The store-wide daily caps of ``tiers`` that have one (``KEFU_<TIER>_DAY_CAP_USD``); none in
    a bot test's sandbox (``lib.sandbox``: its calls count in no cap)."""
    if not enabled() or sandbox.active():
        return []
    today = timezone.localdate()
    out = []
    for tier in tiers:
        cap = Decimal(str(tier_settings(tier).day_cap_usd if known_tier(tier) else 0))
        if cap > 0:
            out.append(Scope("tier", tier, DAY, today, cap))
    return out


def _where(scopes: Sequence[Scope]) -> Q:
    q = Q(pk__in=[])
    for s in scopes:
        q |= Q(kind=s.kind, key=s.key, period=s.period, starts_on=s.starts_on)
    return q


def _used(scopes: Sequence[Scope]) -> dict[Scope, Decimal]:
    """Spent + held in USD of each of ``scopes`` (0 for one with no row yet); one query."""
    if not scopes:
        return {}
    rows = BudgetCounter.objects.filter(_where(scopes)).values_list(
        "kind", "key", "period", "starts_on", "spent_usd", "reserved_usd"
    )
    found = {(k, key, p, d): spent + held for k, key, p, d, spent, held in rows}
    return {s: Decimal(found.get((s.kind, s.key, s.period, s.starts_on), 0)) for s in scopes}


@dataclass(frozen=True)
class Standing:
    """Where a payer and the tiers' caps stand before a remote answer is chosen.

    ``share``: the payer's highest share of a budget spent or held (0 with no budget), ``scope``
    that budget (None with none); ``tier_shares``: each capped tier's share of its daily cap."""

    share: float = 0.0
    scope: Scope | None = None
    tier_shares: dict[str, float] = field(default_factory=dict)

    @property
    def blocked(self) -> bool:
        """The payer's budget is spent: no remote call."""
        return self.share >= 1.0

    @property
    def soft(self) -> bool:
        """The payer is past the soft share: not the costliest tier."""
        return self.share >= settings.KEFU_BUDGET_SOFT_SHARE

    def tiers_open(self, configured: Sequence[str]) -> list[str]:
        """Of ``configured`` (cheapest first), the tiers the payer may still reach: none when
        blocked; not a tier whose cap is spent; not the costliest one past the soft share."""
        if self.blocked:
            return []
        open_ = [t for t in configured if self.tier_shares.get(t, 0.0) < 1.0]
        if self.soft and len(configured) > 1:
            costliest = max(configured, key=TIER_ORDER.index)
            open_ = [t for t in open_ if t != costliest]
        return open_

    def choose(self, tier: str, configured: Sequence[str]) -> str | None:
        """The tier to send a question meant for ``tier`` to: ``tier`` itself when open and not
        past the soft share of its cap while a cheaper tier is open; else the nearest cheaper open
        tier; else the nearest costlier one; None when no tier is open."""
        open_ = self.tiers_open(configured)
        rank = TIER_ORDER.index
        cheaper = [t for t in open_ if rank(t) < rank(tier)]
        if tier in open_ and not (self.tier_shares.get(tier, 0.0) >= settings.KEFU_BUDGET_SOFT_SHARE and cheaper):
            return tier
        if cheaper:
            return max(cheaper, key=rank)
        costlier = [t for t in open_ if rank(t) > rank(tier)]
        return min(costlier, key=rank) if costlier else None

    def reason(self) -> str:
        """Why the standing changed a route, in plain words."""
        if self.scope is not None and self.share >= settings.KEFU_BUDGET_SOFT_SHARE:
            return f"{self.scope.describe()} at {self.share:.0%}"
        capped = [f"{t} tier's daily cap at {s:.0%}" for t, s in self.tier_shares.items() if s >= 1.0]
        return ", ".join(capped) or "no tier open"


def standing(payer: Payer | None, tiers: Sequence[str]) -> Standing:
    """Read where ``payer`` and the caps of ``tiers`` stand (one query; none when nothing has a
    limit). Blocking. A database failure is logged and reads as nothing spent: the reservation
    before each call still holds the limit."""
    scopes = payer_scopes(payer)
    caps = tier_scopes(tiers)
    if not scopes and not caps:
        return Standing()
    try:
        used = _used(scopes + caps)
    except Exception:
        log.warning("reading spend budgets failed; the reservation will decide", exc_info=True)
        return Standing()
    share, worst = 0.0, None
    for s in scopes:
        ratio = float(used[s] / s.limit_usd)
        if ratio > share or worst is None:
            share, worst = ratio, s
    return Standing(share=share, scope=worst, tier_shares={s.key: float(used[s] / s.limit_usd) for s in caps})


standing_async = database_sync_to_async(standing)


def reserve(payer: Payer | None, tier: str, amount_usd: Decimal) -> Hold | None:
    """Hold ``amount_usd`` (a call's maximum cost) on every budget that pays for a call of
    ``tier`` by ``payer`` (:func:`payer_scopes` and the tier's cap), all or none, in one
    transaction (module docstring). Returns the :class:`Hold` to :func:`settle`, or None when no
    budget applies (nothing held). Blocking.

    Raises:
        BudgetRefused: the amount does not fit one of the budgets (nothing is held).
        django.db.Error: the database failed (after two retries of a deadlock).
    """
    scopes = sorted(payer_scopes(payer) + tier_scopes([tier]))
    if not scopes:
        return None
    amount = max(Decimal(0), amount_usd)
    hold_id = uuid.uuid4()
    for attempt in range(3):
        try:
            with transaction.atomic():
                now = timezone.now()
                # Rows are made (or their limit refreshed) in a fixed order, so two transactions
                # lock them in the same order and never wait on each other in a circle.
                rows = BudgetCounter.objects.bulk_create(
                    [
                        BudgetCounter(
                            kind=s.kind, key=s.key, period=s.period, starts_on=s.starts_on, limit_usd=s.limit_usd
                        )
                        for s in scopes
                    ],
                    update_conflicts=True,
                    unique_fields=["kind", "key", "period", "starts_on"],
                    update_fields=["limit_usd"],
                )
                ids = tuple(r.pk for r in rows)
                taken = BudgetCounter.objects.filter(
                    pk__in=ids, spent_usd__lte=F("limit_usd") - F("reserved_usd") - amount
                ).update(reserved_usd=F("reserved_usd") + amount, updated_at=now)
                if taken != len(ids):
                    raise _DoesNotFit
                expires = now + timedelta(seconds=settings.KEFU_BUDGET_HOLD_S)
                BudgetHold.objects.bulk_create(
                    [BudgetHold(hold=hold_id, counter_id=pk, amount_usd=amount, expires_at=expires) for pk in ids]
                )
            return Hold(hold_id=hold_id, counter_ids=ids, amount_usd=amount)
        except _DoesNotFit:
            used = _used(scopes)
            for s in scopes:
                if used[s] + amount > s.limit_usd:
                    raise BudgetRefused(s, float(used[s] / s.limit_usd)) from None
            continue  # freed in between (a settle): try again
        except OperationalError:
            if attempt == 2:
                raise
            log.warning("reserving a %s call's budget failed; trying again", tier, exc_info=True)
    raise BudgetRefused(scopes[0], 1.0)


class _DoesNotFit(Exception):
    pass


reserve_async = database_sync_to_async(reserve)


def settle(hold: Hold, cost_usd: Decimal) -> None:
    """Replace ``hold`` by the call's ``cost_usd`` on its counters. Blocking; raises what the
    database raises (the hold then expires and counts at its maximum). A hold that already
    expired (counted at its maximum) is corrected to the cost."""
    cost = max(Decimal(0), cost_usd)
    with transaction.atomic():
        held = set(
            BudgetHold.objects.select_for_update().filter(hold=hold.hold_id).values_list("counter_id", flat=True)
        )
        if held:
            BudgetHold.objects.filter(hold=hold.hold_id).delete()
            BudgetCounter.objects.filter(pk__in=held).update(
                reserved_usd=F("reserved_usd") - hold.amount_usd, spent_usd=F("spent_usd") + cost
            )
        gone = [pk for pk in hold.counter_ids if pk not in held]
        if gone:
            BudgetCounter.objects.filter(pk__in=gone).update(spent_usd=F("spent_usd") + cost - hold.amount_usd)


def expire_holds(*, keep_days: int = 62) -> int:
    """Count every hold past its ``expires_at`` as spent at its amount (its call's process died
    before settling), and delete counters of periods that started more than ``keep_days`` days
    ago. Returns how many holds expired. Blocking (beat, every minute)."""
    now = timezone.now()
    expired = 0
    with transaction.atomic():
        rows = list(
            BudgetHold.objects.select_for_update(skip_locked=True)
            .filter(expires_at__lt=now)
            .values_list("pk", "counter_id", "amount_usd")[:5000]
        )
        by_counter: dict[int, Decimal] = {}
        for _pk, counter_id, amount in rows:
            by_counter[counter_id] = by_counter.get(counter_id, Decimal(0)) + amount
        BudgetHold.objects.filter(pk__in=[r[0] for r in rows]).delete()
        for counter_id, amount in by_counter.items():
            BudgetCounter.objects.filter(pk=counter_id).update(
                reserved_usd=F("reserved_usd") - amount, spent_usd=F("spent_usd") + amount
            )
        expired = len(rows)
    BudgetCounter.objects.filter(starts_on__lt=timezone.localdate() - timedelta(days=keep_days)).delete()
    if expired:
        log.warning("%d spend-budget holds expired unsettled; counted at their maximum", expired)
    return expired


def spent_usd(scope: Scope) -> Decimal:
    """Settled spend of ``scope`` in USD (0 with no row). For tests and the ops view."""
    got = BudgetCounter.objects.filter(_where([scope])).aggregate(s=Sum("spent_usd"))["s"]
    return Decimal(got or 0)
