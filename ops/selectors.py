"""What ops watch: cost, savings, cache hit rate and latency over a window (docs/ops.md).

:func:`summary` reads the stored truth — bot answers (``chat.Message``: route, time to first
token, ``cost_usd``, ``saved_usd``) and the cost ledger (``routing.models.UpstreamCall``: every
upstream attempt with its purpose, tier, outcome and USD) — so the figures agree across worker
processes and survive restarts. ``/ops/`` renders it, ``/ops/api/summary`` returns it as JSON and
``/metrics`` exposes the running totals to Prometheus (``routing.ops_views``).

Definitions (all over answers created in the window):

* **cost_usd**: sum of ``UpstreamCall.cost_usd`` (every purpose: answers, rewrites, summaries,
  suggestions, audits, gateway calls); USD at the tiers' list prices (``routing.ledger.cost_usd``).
* **saved_usd**: sum of ``Message.saved_usd``: what the tier that would have answered would have
  cost for FAQ, cache and shared (single-flight) answers (``routing.ledger.saved_usd``).
* **saved_share**: ``saved / (cost + saved)``: the share of the would-be spend that kefu avoided.
* **cache hit rate**: ``cache.* answers / (cache.* answers + llm.* answers)``: of the answers that
  needed the remote model or the cache, how many the cache served.
* **time to first token**: ``Message.ttft_ms``, from the shopper's message being stored to the
  first delta sent; p50 / p95 by the nearest-rank method on at most :data:`MAX_SAMPLES` newest
  answers per route.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from chat.models import Conversation, ConversationStatus, Message, Role
from chat.outcomes import outcomes_summary
from routing.breaker import BREAKER_FAILURES
from routing.models import BudgetCounter, Outcome, Purpose, UpstreamCall, Variant

#: Newest answers per route read for the percentiles (bounds the work of one summary).
MAX_SAMPLES = 20_000
#: Longest window :func:`summary` accepts, hours (30 days).
MAX_HOURS = 24 * 30


def percentile(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100) of ``values`` by the nearest-rank method (the smallest value
    with at least p% of the values at or below it); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _usd(value: Decimal | None) -> float:
    return float(round(value or Decimal("0"), 6))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _agent_queue_now() -> tuple[int, int]:
    """Conversations waiting for an agent and held by one, now: ``(waiting, with_agent)``."""
    counts = dict(
        Conversation.objects.filter(status__in=[ConversationStatus.WAITING_AGENT, ConversationStatus.AGENT])
        .values_list("status")
        .annotate(n=Count("id"))
    )
    return counts.get(ConversationStatus.WAITING_AGENT, 0), counts.get(ConversationStatus.AGENT, 0)


def summary(*, hours: float = 24, now: datetime | None = None) -> dict[str, Any]:
    """Figures for the last ``hours`` (0 < hours <= :data:`MAX_HOURS`), as a JSON-ready dict::

        {"window": {"from", "to", "hours"},
         "answers": {"total", "by_route": {route: {"count", "share", "ttft_ms": {"p50", "p95"}}}},
         "shopper_messages", "cost_usd", "saved_usd", "saved_share",
         "cost_by_purpose": {purpose: usd}, "cost_by_tier": {tier: usd},
         "cache": {"hits", "exact", "semantic", "remote_answers", "hit_rate"},
         "upstream": {"calls", "by_outcome": {outcome: n}, "failure_rate", "stopped",
                      "budget_skips", "ttft_ms": {tier: {"p50", "p95"}}},
         "handoffs": {"answers", "waiting_now", "with_agent_now"},
         "budgets": see :func:`budgets_now`}

    ``failure_rate`` is the upstream's: failed attempts over attempts, not counting what kefu
    itself ended — ``stopped`` (``error_code`` ``abandoned``: an agent took the conversation
    over, the shopper's answer was fenced or its reader left) — nor tiers a spend budget skipped
    (``budget_skips``, ``routing.budgets``: no request was sent).
    Shares and rates are fractions in [0, 1] (``None`` when their denominator is 0); USD floats
    rounded to 6 places; milliseconds to 0.1. Raises ``ValueError`` for a window out of range.
    """
    if not (0 < hours <= MAX_HOURS):
        raise ValueError(f"hours must be in (0, {MAX_HOURS}], got {hours}")
    end = now or timezone.now()
    start = end - timedelta(hours=hours)

    answers = Message.objects.filter(role=Role.BOT, created_at__gt=start, created_at__lte=end).exclude(route="")
    by_route = {r["route"]: r for r in answers.values("route").annotate(n=Count("id"), saved=Sum("saved_usd"))}
    total = sum(r["n"] for r in by_route.values())
    routes: dict[str, Any] = {}
    for route, row in sorted(by_route.items()):
        ttfts = [
            float(v)
            for v in answers.filter(route=route, ttft_ms__isnull=False)
            .order_by("-id")
            .values_list("ttft_ms", flat=True)[:MAX_SAMPLES]
            if v is not None
        ]
        routes[route] = {
            "count": row["n"],
            "share": row["n"] / total if total else None,
            "ttft_ms": {"p50": _ms(percentile(ttfts, 50)), "p95": _ms(percentile(ttfts, 95))},
        }
    saved = sum((r["saved"] or Decimal("0") for r in by_route.values()), Decimal("0"))

    calls = UpstreamCall.objects.filter(created_at__gt=start, created_at__lte=end)
    cost_by_purpose: dict[str, Decimal] = defaultdict(Decimal)
    cost_by_tier: dict[str, Decimal] = defaultdict(Decimal)
    by_outcome: dict[str, int] = defaultdict(int)
    stopped = budget_skips = 0
    for call in calls.values("purpose", "tier", "outcome", "error_code").annotate(n=Count("id"), usd=Sum("cost_usd")):
        cost_by_purpose[call["purpose"]] += call["usd"] or Decimal("0")
        cost_by_tier[call["tier"]] += call["usd"] or Decimal("0")
        by_outcome[call["outcome"]] += call["n"]
        if call["error_code"] == "abandoned":
            stopped += call["n"]
        elif call["error_code"] == "budget":
            budget_skips += call["n"]
    cost = sum(cost_by_purpose.values(), Decimal("0"))
    n_calls = sum(by_outcome.values())
    failed_attempts = calls.filter(outcome="failed").exclude(error_code__in=("abandoned", "budget")).count()
    sent = n_calls - budget_skips
    upstream_ttft: dict[str, Any] = {}
    for tier in sorted(cost_by_tier):
        values = [
            float(v)
            for v in calls.filter(tier=tier, ttft_ms__isnull=False)
            .order_by("-id")
            .values_list("ttft_ms", flat=True)[:MAX_SAMPLES]
            if v is not None
        ]
        upstream_ttft[tier] = {"p50": _ms(percentile(values, 50)), "p95": _ms(percentile(values, 95))}

    counts: dict[str, int] = {route: int(r["n"]) for route, r in by_route.items()}
    exact = counts.get("cache.exact", 0)
    semantic = counts.get("cache.semantic", 0)
    remote = sum(r["n"] for route, r in by_route.items() if route.startswith("llm."))
    waiting, with_agent = _agent_queue_now()
    return {
        "window": {"from": start.isoformat(), "to": end.isoformat(), "hours": hours},
        "answers": {"total": total, "by_route": routes},
        "shopper_messages": Message.objects.filter(
            role=Role.SHOPPER, created_at__gt=start, created_at__lte=end
        ).count(),
        "cost_usd": _usd(cost),
        "saved_usd": _usd(saved),
        "saved_share": float(saved / (cost + saved)) if cost + saved else None,
        "cost_by_purpose": {k: _usd(v) for k, v in sorted(cost_by_purpose.items())},
        "cost_by_tier": {k: _usd(v) for k, v in sorted(cost_by_tier.items())},
        "cache": {
            "hits": exact + semantic,
            "exact": exact,
            "semantic": semantic,
            "remote_answers": remote,
            "hit_rate": (exact + semantic) / (exact + semantic + remote) if exact + semantic + remote else None,
        },
        "upstream": {
            "calls": n_calls,
            "by_outcome": dict(sorted(by_outcome.items())),
            "failure_rate": failed_attempts / sent if sent else None,
            "stopped": stopped,
            "budget_skips": budget_skips,
            "ttft_ms": upstream_ttft,
        },
        "handoffs": {"answers": counts.get("handoff", 0), "waiting_now": waiting, "with_agent_now": with_agent},
        # Conversations started in the window, resolved or not (chat.outcomes: strict, confirmed
        # and assumed apart, open until their recontact window passed); CSAT scores.
        "outcomes": outcomes_summary(since=start, until=end),
        "budgets": budgets_now(today=timezone.localdate(end)),
    }


#: Payers listed by :func:`budgets_now`, the most used first.
TOP_PAYERS = 10


def budgets_now(*, today: Any = None) -> dict[str, Any]:
    """Where the spend budgets (``routing.budgets``) stand today and this month::

        {"soft_share", "payers": {"past_soft", "spent"},
         "top": [{"kind", "key", "period", "spent_usd", "reserved_usd", "limit_usd", "share"}],
         "tiers": {tier: {"spent_usd", "reserved_usd", "limit_usd", "share"}}}

    ``past_soft`` / ``spent``: payers' budgets (customer, conversation, address, key; day or
    month) at or past ``KEFU_BUDGET_SOFT_SHARE`` / at or past their limit; ``top``: the
    :data:`TOP_PAYERS` most used (share = (spent + held) / limit, a fraction); ``tiers``: the
    store-wide daily caps. Customer ids and addresses are keyed hashes. USD floats to 6 places."""
    day = today or timezone.localdate()
    month = day.replace(day=1)
    soft = float(settings.KEFU_BUDGET_SOFT_SHARE)
    rows = (
        BudgetCounter.objects.filter(limit_usd__gt=0)
        .filter(Q(period="day", starts_on=day) | Q(period="month", starts_on=month))
        .values("kind", "key", "period", "spent_usd", "reserved_usd", "limit_usd")
    )
    payers: list[dict[str, Any]] = []
    tiers: dict[str, Any] = {}
    for r in rows:
        share = float((r["spent_usd"] + r["reserved_usd"]) / r["limit_usd"])
        item = {
            "kind": r["kind"],
            "key": r["key"],
            "period": r["period"],
            "spent_usd": _usd(r["spent_usd"]),
            "reserved_usd": _usd(r["reserved_usd"]),
            "limit_usd": _usd(r["limit_usd"]),
            "share": share,
        }
        if r["kind"] == "tier":
            tiers[r["key"]] = {k: item[k] for k in ("spent_usd", "reserved_usd", "limit_usd", "share")}
        else:
            payers.append(item)
    payers.sort(key=lambda p: (-p["share"], p["kind"], p["key"]))
    return {
        "soft_share": soft,
        "payers": {
            "past_soft": sum(1 for p in payers if p["share"] >= soft),
            "spent": sum(1 for p in payers if p["share"] >= 1.0),
        },
        "top": payers[:TOP_PAYERS],
        "tiers": dict(sorted(tiers.items())),
    }


def totals() -> dict[str, Any]:
    """All-time running totals for ``/metrics`` (Prometheus counters): answers by route,
    upstream calls by tier / purpose / outcome with their USD, and USD saved by route; plus the
    conversations waiting for / held by an agent now and how long the longest has waited, in
    seconds (gauges)."""
    answers = list(
        Message.objects.filter(role=Role.BOT)
        .exclude(route="")
        .values("route")
        .annotate(n=Count("id"), saved=Sum("saved_usd"))
        .order_by("route")
    )
    calls = list(
        UpstreamCall.objects.values("tier", "purpose", "outcome")
        .annotate(n=Count("id"), usd=Sum("cost_usd"))
        .order_by("tier", "purpose", "outcome")
    )
    waiting, with_agent = _agent_queue_now()
    oldest = Conversation.objects.filter(
        status=ConversationStatus.WAITING_AGENT, waiting_since__isnull=False
    ).aggregate(oldest=Min("waiting_since"))["oldest"]
    return {
        "oldest_wait_s": (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0,
        "answers": [(r["route"], r["n"], _usd(r["saved"])) for r in answers],
        "calls": [(r["tier"], r["purpose"], r["outcome"], r["n"], _usd(r["usd"])) for r in calls],
        "waiting": waiting,
        "with_agent": with_agent,
    }


def _rate(count: int, of: int) -> dict[str, Any]:
    return {"count": count, "of": of, "rate": count / of if of else None}


def canary_variant(*, tier: str, variant: str, start: datetime, end: datetime) -> dict[str, Any]:
    """One deployment of ``tier`` (``current`` or ``candidate``) over (start, end]; see
    :func:`canary_summary`."""
    answers = Message.objects.filter(
        role=Role.BOT,
        route=f"llm.{tier}",
        variant=variant,
        superseded=False,
        created_at__gt=start,
        created_at__lte=end,
    )
    n = answers.count()
    ttfts = [
        float(v)
        for v in answers.filter(ttft_ms__isnull=False).order_by("-id").values_list("ttft_ms", flat=True)[:MAX_SAMPLES]
        if v is not None
    ]
    following = Message.objects.filter(conversation=OuterRef("conversation"), role=Role.BOT, seq__gt=OuterRef("seq"))
    counts = answers.aggregate(
        down=Count("id", filter=Q(rating="down")),
        rated=Count("id", filter=~Q(rating="")),
        cut=Count("id", filter=Q(cut=True)),
    )
    handoffs = (
        answers.annotate(next_route=Subquery(following.order_by("seq").values("route")[:1]))
        .filter(next_route="handoff")
        .count()
    )
    calls = UpstreamCall.objects.filter(
        tier=tier,
        variant=variant,
        purpose__in=(Purpose.ANSWER, Purpose.TOOL),
        created_at__gt=start,
        created_at__lte=end,
    ).aggregate(
        usd=Sum("cost_usd"),
        ok=Count("id", filter=Q(outcome=Outcome.OK)),
        failed=Count("id", filter=Q(error_code__in=BREAKER_FAILURES)),
    )
    cost = calls["usd"] or Decimal("0")
    judged = (calls["ok"] or 0) + (calls["failed"] or 0)
    return {
        "answers": n,
        "ttft_ms": {"p50": _ms(percentile(ttfts, 50)), "p95": _ms(percentile(ttfts, 95)), "count": len(ttfts)},
        "cost_usd": _usd(cost),
        "cost_per_answer_usd": _usd(cost / n) if n else None,
        "thumbs_down": {**_rate(counts["down"], n), "rated": counts["rated"]},
        "handoff": _rate(handoffs, n),
        "cut": _rate(counts["cut"], n),
        "errors": _rate(calls["failed"] or 0, judged),
    }


def canary_summary(
    *, standings: list[dict[str, Any]], hours: float = 24, now: datetime | None = None
) -> dict[str, Any]:
    """Each tier's canary candidate beside the tier's own model over the last ``hours``::

        {"window": {"from", "to", "hours"},
         "tiers": [{...its standing (routing.services.canary_standings: the models' names, the
                    state, the shares, the last decision)...,
                    "figures": {"current": {...}, "candidate": {...}}}]}

    with, per deployment, over its remote answers (bot messages of route ``llm.<tier>`` it gave,
    ``chat.Message.variant``; answers dropped for a burst left out) and its ledger rows for
    shoppers' answers (purposes ``answer`` and ``tool``)::

        {"answers", "ttft_ms": {"p50", "p95", "count"}, "cost_usd", "cost_per_answer_usd",
         "thumbs_down": {"count", "of", "rate", "rated"}, "handoff": {"count", "of", "rate"},
         "cut": {"count", "of", "rate"}, "errors": {"count", "of", "rate"}}

    ``ttft_ms``: the answers' time to first token as the shopper saw it; ``cost_usd``: its ledger
    rows' USD (retries, failed attempts and tool rounds included) and per answer; ``thumbs_down``:
    answers rated down (``rated``: rated at all); ``handoff``: answers whose conversation's next
    bot answer was a handoff (the shopper asked for a person after it, or a rule sent them);
    ``cut``: answers that stopped before their end; ``errors``: failures over calls as the circuit
    breaker counts them (``ok`` succeeds; ``server``, ``connection``, ``timeout``, ``malformed``,
    ``auth`` fail; the automatic rollback reads the same). ``standings``: the tiers with a
    candidate, from the router. Rates are fractions (None over 0). Raises ``ValueError`` for a
    window out of range."""
    if not (0 < hours <= MAX_HOURS):
        raise ValueError(f"hours must be in (0, {MAX_HOURS}], got {hours}")
    end = now or timezone.now()
    start = end - timedelta(hours=hours)
    tiers = []
    for standing in standings:
        tier = str(standing["tier"])
        tiers.append(
            {
                **standing,
                "figures": {
                    variant: canary_variant(tier=tier, variant=variant, start=start, end=end)
                    for variant in (Variant.CURRENT.value, Variant.CANDIDATE.value)
                },
            }
        )
    return {"window": {"from": start.isoformat(), "to": end.isoformat(), "hours": hours}, "tiers": tiers}
