"""What ops watch: cost, savings, cache hit rate and latency over a window (docs/ops.md).

:func:`summary` reads the stored truth — bot answers (``chat.Message``: route, time to first
token, ``cost_usd``, ``saved_usd``) and the cost ledger (``routing.models.UpstreamCall``: every
upstream attempt with its purpose, tier, outcome and USD) — so the figures agree across worker
processes and survive restarts. It reads them through ``ops.cells``: whole hours from Ops' own
rollups (``ops.rollup``) where they are rolled up, the rest from the raw rows. ``/ops/`` renders
it, ``/ops/api/summary`` returns it as JSON and ``/metrics`` exposes the running totals to
Prometheus (``ops.views``).

Definitions (all over rows created in the window ``[from, to)``):

* **cost_usd**: sum of ``UpstreamCall.cost_usd`` (every purpose: answers, rewrites, summaries,
  suggestions, audits, gateway calls); USD at the tiers' list prices (``routing.upstream.ledger.cost_usd``).
* **saved_usd**: sum of ``Message.saved_usd``: what the tier that would have answered would have
  cost for FAQ, cache and shared (single-flight) answers (``routing.upstream.ledger.saved_usd``).
* **saved_share**: ``saved / (cost + saved)``: the share of the would-be spend that kefu avoided.
* **cache hit rate**: ``cache.* answers / (cache.* answers + llm.* answers)``: of the answers that
  needed the remote model or the cache, how many the cache served.
* **time to first token**: ``Message.ttft_ms``, from the shopper's message being stored to the
  first delta sent; p50 / p95 / p99 by the nearest-rank method, read from log-spaced histograms
  (``ops.histogram``: within 2.2% of the exact value, 0.5 ms under 1 ms).
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from cache_layer.audit import COUNTED, FALSE_HITS, wilson_interval
from chat.mail import email_counts
from chat.models import Conversation, ConversationStatus, Message, Role
from routing.models import BudgetCounter, Outcome, Purpose, UpstreamCall, Variant
from routing.upstream.breaker import BREAKER_FAILURES

from .cells import MICRO, agent_queue_now, at, runs_of, window_cells, window_outcomes
from .histogram import Hist
from .models import AnswerRollup, CallRollup, RolledHour

#: Newest answers per variant read for the canary's percentiles (bounds the work of one page).
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


def _ttft(hist: Hist) -> dict[str, float | None]:
    return {
        "p50": _ms(hist.percentile(50)),
        "p95": _ms(hist.percentile(95)),
        "p99": _ms(hist.percentile(99)),
    }


def window_bounds(*, hours: float = 24, now: datetime | None = None) -> tuple[datetime, datetime]:
    """``(start, end)`` of the last ``hours`` before ``now``; raises ``ValueError`` for a window
    out of (0, :data:`MAX_HOURS`]."""
    if not (0 < hours <= MAX_HOURS):
        raise ValueError(f"hours must be in (0, {MAX_HOURS}], got {hours}")
    end = now or timezone.now()
    return end - timedelta(hours=hours), end


def summary(
    *,
    hours: float = 24,
    now: datetime | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    use_rollups: bool = True,
) -> dict[str, Any]:
    """Figures for the last ``hours`` (0 < hours <= :data:`MAX_HOURS`), or for ``[start, end)``
    when both are given, as a JSON-ready dict::

        {"window": {"from", "to", "hours"},
         "answers": {"total", "by_route": {route: {"count", "share", "ttft_ms": {"p50", "p95", "p99"}}}},
         "shopper_messages", "cost_usd", "saved_usd", "saved_share",
         "cost_by_purpose": {purpose: usd}, "cost_by_tier": {tier: usd},
         "cache": {"hits", "exact", "semantic", "remote_answers", "hit_rate",
                   "audits": {"counted", "false_hits", "false_hit_rate", "low", "high"}},
         "upstream": {"calls", "by_outcome": {outcome: n}, "failure_rate", "stopped",
                      "budget_skips", "ttft_ms": {tier: {"p50", "p95", "p99"}}},
         "handoffs": {"answers", "waiting_now", "with_agent_now"},
         "emails": {"sent", "refused", "given_up"} (chat.mail.email_counts),
         "budgets": see :func:`budgets_now`,
         "source": {"rolled_hours", "raw_ranges"}}

    Read through ``ops.cells.window_cells``: whole hours from Ops' rollups where they are rolled
    up, the rest from the raw rows (``use_rollups=False``: all raw). Counts and USD are exact
    either way; percentiles come from histograms, within ``ops.histogram.ERROR_BOUND`` (2.2%).

    ``failure_rate`` is the upstream's: failed attempts over attempts, not counting what kefu
    itself ended — ``stopped`` (``error_code`` ``abandoned``: an agent took the conversation
    over, the shopper's answer was fenced or its reader left) — nor tiers a spend budget skipped
    (``budget_skips``, ``routing.upstream.budgets``: no request was sent). ``cache.audits``: the cache
    audits opened in the window (``cache_layer.audit``): counted verdicts, false hits among them,
    their rate and its Wilson 95% interval.
    Shares and rates are fractions in [0, 1] (``None`` when their denominator is 0); USD floats
    rounded to 6 places; milliseconds to 0.1. Raises ``ValueError`` for a window out of range.
    """
    if start is None or end is None:
        start, end = window_bounds(hours=hours, now=now)
    else:
        hours = (end - start).total_seconds() / 3600
    window = window_cells(start, end, key=lambda _: 0, use_rollups=use_rollups)  # one bucket
    total = window.total()

    answers = total.answers
    n_answers = sum(a.answers for a in answers.values())
    routes: dict[str, Any] = {
        route: {
            "count": a.answers,
            "share": a.answers / n_answers if n_answers else None,
            "ttft_ms": _ttft(a.ttft),
        }
        for route, a in sorted(answers.items())
    }
    saved = sum(a.saved_micro for a in answers.values())

    cost_by_purpose: dict[str, int] = defaultdict(int)  # micro-USD
    cost_by_tier: dict[str, int] = defaultdict(int)
    by_outcome: dict[str, int] = defaultdict(int)
    stopped = budget_skips = failed_attempts = 0
    for (tier, purpose, outcome, stop), c in total.calls.items():
        cost_by_purpose[purpose] += c.cost_micro
        cost_by_tier[tier] += c.cost_micro
        by_outcome[outcome] += c.calls
        if stop == "abandoned":
            stopped += c.calls
        elif stop == "budget":
            budget_skips += c.calls
        elif outcome == "failed":
            failed_attempts += c.calls
    cost = sum(cost_by_purpose.values())
    n_calls = sum(by_outcome.values())
    sent = n_calls - budget_skips

    counts = {route: a.answers for route, a in answers.items()}
    exact = counts.get("cache.exact", 0)
    semantic = counts.get("cache.semantic", 0)
    remote = sum(n for route, n in counts.items() if route.startswith("llm."))
    waiting, with_agent = agent_queue_now()
    return {
        "window": {"from": start.isoformat(), "to": end.isoformat(), "hours": hours},
        "answers": {"total": n_answers, "by_route": routes},
        "shopper_messages": total.shopper_messages,
        "cost_usd": cost / MICRO,
        "saved_usd": saved / MICRO,
        "saved_share": saved / (cost + saved) if cost + saved else None,
        "cost_by_purpose": {k: v / MICRO for k, v in sorted(cost_by_purpose.items())},
        "cost_by_tier": {k: v / MICRO for k, v in sorted(cost_by_tier.items())},
        "cache": {
            "hits": exact + semantic,
            "exact": exact,
            "semantic": semantic,
            "remote_answers": remote,
            "hit_rate": (exact + semantic) / (exact + semantic + remote) if exact + semantic + remote else None,
            "audits": audit_rate(total.audits),
        },
        "upstream": {
            "calls": n_calls,
            "by_outcome": dict(sorted(by_outcome.items())),
            "failure_rate": failed_attempts / sent if sent else None,
            "stopped": stopped,
            "budget_skips": budget_skips,
            "ttft_ms": {tier: _ttft(total.tier_ttft.get(tier) or Hist()) for tier in sorted(cost_by_tier)},
        },
        "handoffs": {"answers": counts.get("handoff", 0), "waiting_now": waiting, "with_agent_now": with_agent},
        # E-mails owed in the window: sent, refused by the server (retried or given up; chat.mail).
        "emails": email_counts(start=start, end=end),
        # Conversations started in the window, resolved or not (chat.outcomes: strict, confirmed
        # and assumed apart, open until their recontact window passed); CSAT scores.
        "outcomes": window_outcomes(start, end, use_rollups=use_rollups).summary(timezone.now()),
        "budgets": budgets_now(today=timezone.localdate(end)),
        "source": {
            "rolled_hours": window.rolled_hours,
            "raw_ranges": [[lo.isoformat(), hi.isoformat()] for lo, hi in window.raw_ranges],
        },
    }


def audit_rate(audits: dict[str, int]) -> dict[str, Any]:
    """The measured false-hit rate of cache audits counted by verdict (``cache_layer.audit``'s
    definitions: ``same``, ``different`` and ``agent_wrong`` are counted, the last two are false
    hits): ``{"counted", "false_hits", "false_hit_rate", "low", "high"}`` with the Wilson 95%
    interval (``false_hit_rate`` None when nothing was counted)."""
    counted = sum(audits.get(v, 0) for v in COUNTED)
    false = sum(audits.get(v, 0) for v in FALSE_HITS)
    low, high = wilson_interval(false, counted)
    return {
        "counted": counted,
        "false_hits": false,
        "false_hit_rate": false / counted if counted else None,
        "low": round(low, 4),
        "high": round(high, 4),
    }


#: Payers listed by :func:`budgets_now`, the most used first.
TOP_PAYERS = 10


def budgets_now(*, today: Any = None) -> dict[str, Any]:
    """Where the spend budgets (``routing.upstream.budgets``) stand today and this month::

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
    """All-time running totals for ``/metrics`` (Prometheus counters): ``answers`` as
    ``[(route, count, saved USD)]`` and ``calls`` as ``[(tier, purpose, outcome, count, USD)]``,
    sorted; plus ``waiting`` / ``with_agent``: conversations waiting for / held by an agent now,
    and ``oldest_wait_s``: how long the longest has waited, seconds (gauges).

    Rolled-up hours are summed from Ops' rollups (small tables), the rest — before the first
    rolled hour, gaps, the current hour — from the raw rows, so a scrape does not scan millions
    of rows and the totals are the raw rows' (a ledger row written into an hour already rolled
    is counted at the next 5-minute roll). USD summed in micro-dollars, exactly."""
    answers: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # route: [answers, saved micro-USD]
    calls: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])  # [calls, cost micro-USD]
    rolled = sorted(RolledHour.objects.values_list("hour", flat=True))
    raw: list[Q] = [Q()]
    if rolled:
        rolled_answers = AnswerRollup.objects.values("route").annotate(n=Sum("answers"), usd=Sum("saved_micro_usd"))
        for route, n, usd in rolled_answers.order_by().values_list("route", "n", "usd"):
            answers[route][0] += n
            answers[route][1] += usd
        rolled_calls = CallRollup.objects.values("tier", "purpose", "outcome").annotate(
            n=Sum("calls"), usd=Sum("cost_micro_usd")
        )
        for tier, purpose, outcome, n, usd in rolled_calls.order_by().values_list(
            "tier", "purpose", "outcome", "n", "usd"
        ):
            calls[(tier, purpose, outcome)][0] += n
            calls[(tier, purpose, outcome)][1] += usd
        runs = list(runs_of(rolled))
        raw = [Q(created_at__lt=at(runs[0][0]))]
        raw += [Q(created_at__gte=at(hi), created_at__lt=at(lo)) for (_, hi), (lo, _) in pairwise(runs)]
        raw.append(Q(created_at__gte=at(runs[-1][1])))
    for span in raw:
        raw_answers = (
            Message.objects.filter(span, role=Role.BOT, conversation__sandbox=False)
            .exclude(route="")
            .values("route")
            .annotate(n=Count("id"), saved=Sum("saved_usd"))
        )
        for route, n, saved in raw_answers.order_by().values_list("route", "n", "saved"):
            answers[route][0] += n
            answers[route][1] += _micro(saved)
        raw_calls = (
            UpstreamCall.objects.filter(span)
            .exclude(purpose=Purpose.TEST)
            .values("tier", "purpose", "outcome")
            .annotate(n=Count("id"), usd=Sum("cost_usd"))
        )
        for tier, purpose, outcome, n, cost in raw_calls.order_by().values_list(
            "tier", "purpose", "outcome", "n", "usd"
        ):
            calls[(tier, purpose, outcome)][0] += n
            calls[(tier, purpose, outcome)][1] += _micro(cost)
    waiting, with_agent = agent_queue_now()
    oldest = Conversation.objects.filter(
        status=ConversationStatus.WAITING_AGENT, waiting_since__isnull=False, sandbox=False
    ).aggregate(oldest=Min("waiting_since"))["oldest"]
    return {
        "oldest_wait_s": (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0,
        "answers": [(route, n, usd / MICRO) for route, (n, usd) in sorted(answers.items())],
        "calls": [(*key, n, usd / MICRO) for key, (n, usd) in sorted(calls.items())],
        "waiting": waiting,
        "with_agent": with_agent,
    }


def _micro(usd: Decimal | float | None) -> int:
    """A raw sum of USD (a ``Decimal``; a float on SQLite) in integer micro-dollars."""
    return 0 if usd is None else round(Decimal(str(usd)).scaleb(6))


def _rate(count: int, of: int) -> dict[str, Any]:
    return {"count": count, "of": of, "rate": count / of if of else None}


def canary_variant(*, tier: str, variant: str, start: datetime, end: datetime) -> dict[str, Any]:
    """One deployment of ``tier`` (``current`` or ``candidate``) over (start, end]; see
    :func:`canary_summary`."""
    answers = Message.objects.filter(
        role=Role.BOT,
        conversation__sandbox=False,
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
