"""Ops views (docs/ops.md): ``/ops/`` (page), ``/ops/api/summary`` (JSON), ``/metrics`` (Prometheus).

``/ops/`` and its API are for staff users with the ``routing.view_costs`` permission ("Can see
costs, savings and latency"; give it in the admin, directly or through a group). ``/metrics`` is
for a Prometheus server: open unless ``KEFU_METRICS_TOKEN`` is set, then it needs
``Authorization: Bearer <token>`` (put it behind the proxy's access rules either way).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.cache import cache
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils.translation import gettext as _

from chat import regroup
from lib import metrics as process_metrics
from routing import services as router

from . import charts, export
from . import labels as ops_labels
from . import selectors as ops

PERMISSION = "routing.view_costs"
WINDOWS = (1, 24, 24 * 7, 24 * 30)  # hours offered on the page
#: Longest custom window (``?from=&to=``), days.
MAX_SPAN_DAYS = 90
OPS_CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


def can_see_costs(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff and user.has_perm(PERMISSION))


class BadRequest(ValueError):
    """A query parameter the views refuse (HTTP 400); its message says why."""


@dataclass(frozen=True)
class Period:
    """The window a request asks for: ``?hours=`` (the last hours; ``hours`` set) or
    ``?from=&to=`` (``hours`` None)."""

    start: datetime
    end: datetime
    hours: float | None


def period_hours(period: Period) -> float:
    """The length of ``period`` in hours (as asked with ``?hours=``, else from ``from``/``to``)."""
    if period.hours is not None:
        return period.hours
    return max((period.end - period.start).total_seconds() / 3600, 1 / 3600)


def _hours(request: HttpRequest) -> float:
    """``?hours=`` (default 24), validated: ``BadRequest`` with a message for the 400."""
    raw = request.GET.get("hours", "24")
    try:
        hours = float(raw)
    except ValueError:
        raise BadRequest(f"hours must be a number, got {raw!r}") from None
    if not (0 < hours <= ops.MAX_HOURS):
        raise BadRequest(f"hours must be more than 0 and at most {ops.MAX_HOURS}, got {raw}")
    return hours


def _instant(name: str, raw: str) -> datetime:
    """A ``from``/``to`` value: UTC epoch seconds, or ISO 8601 (no offset: UTC)."""
    try:
        return datetime.fromtimestamp(float(raw), tz=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise BadRequest(f"{name} must be epoch seconds or an ISO 8601 time, got {raw!r}") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _period(request: HttpRequest) -> Period:
    """``?from=&to=`` when either is given (both needed, from before to, at most
    :data:`MAX_SPAN_DAYS` apart), else ``?hours=``. ``BadRequest`` says what is wrong."""
    if "from" not in request.GET and "to" not in request.GET:
        start, end = ops.window_bounds(hours=_hours(request))
        return Period(start, end, (end - start).total_seconds() / 3600)
    raw_from, raw_to = request.GET.get("from", ""), request.GET.get("to", "")
    if not raw_from or not raw_to:
        raise BadRequest("from and to go together: give both, or neither (then hours)")
    start, end = _instant("from", raw_from), _instant("to", raw_to)
    if end <= start:
        raise BadRequest("to must be after from")
    if end - start > timedelta(days=MAX_SPAN_DAYS):
        raise BadRequest(f"from and to may be at most {MAX_SPAN_DAYS} days apart")
    return Period(start, end, None)


def _ops_only(api: bool) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    def decorate(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapper(request: HttpRequest) -> HttpResponseBase:
            if not request.user.is_authenticated:
                if api:
                    return JsonResponse({"error": "sign in as staff with the cost permission"}, status=401)
                return redirect_to_login(request.get_full_path(), "/console/login/")
            if not can_see_costs(request.user):
                if api:
                    return JsonResponse({"error": f"needs staff status and the {PERMISSION} permission"}, status=403)
                return HttpResponse("Staff with the cost permission only.", status=403, content_type="text/plain")
            try:
                period = _period(request)
                response = view(request, period)
            except BadRequest as e:
                if api:
                    return JsonResponse({"error": str(e)}, status=400)
                return HttpResponse(str(e), status=400, content_type="text/plain")
            response["Cache-Control"] = "no-store"
            return response

        return wrapper

    return decorate


def _summary(period: Period) -> dict[str, Any]:
    data = ops.summary(start=period.start, end=period.end)
    if period.hours is not None:
        data["window"]["hours"] = period.hours  # as asked, not as the clock's subtraction gives it
    return data


@_ops_only(api=True)
def summary_api(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/api/summary?hours=24`` (or ``?from=&to=``): :func:`ops.selectors.summary` as JSON."""
    return JsonResponse(_summary(period))


@_ops_only(api=True)
def series_api(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/api/series?hours=24`` (or ``?from=&to=``), ``&tz=Europe/Berlin`` (the viewer's
    zone, for day buckets; default UTC), ``&step=300|3600|86400`` (default: by the window's
    length): :func:`ops.charts.series` as JSON."""
    raw_tz = request.GET.get("tz", "UTC")
    try:
        tz = ZoneInfo(raw_tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadRequest(f"tz must be an IANA time zone name such as Europe/Berlin, got {raw_tz!r}") from None
    raw_step = request.GET.get("step")
    step = None
    if raw_step:
        if raw_step not in ("300", "3600", "86400"):
            raise BadRequest(f"step must be 300, 3600 or 86400 seconds, got {raw_step!r}")
        step = int(raw_step)
    return JsonResponse(charts.series(start=period.start, end=period.end, tz=tz, step=step))


@_ops_only(api=False)
def ledger_csv(request: HttpRequest, period: Period) -> HttpResponseBase:
    """``GET /ops/export/ledger.csv?from=&to=`` (or ``?hours=``): the cost ledger's rows of the
    window as CSV (``ops.export``), streamed: the rows are read in chunks as they are sent."""
    name = f"kefu-ledger-{period.start:%Y%m%dT%H%M%SZ}-{period.end:%Y%m%dT%H%M%SZ}.csv"
    if isinstance(request, ASGIRequest):
        content: Any = export.ledger_lines_async(start=period.start, end=period.end)
    else:
        content = export.ledger_lines(start=period.start, end=period.end)
    response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@_ops_only(api=False)
def dashboard(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/?hours=24`` (or ``?from=&to=``): the same figures as the API, as a page (readable
    without script), and the charts (``static/kefu/ops.js`` draws ``/ops/api/series`` with uPlot)."""
    data = _summary(period)
    routes = [{"route": k, **v} for k, v in data["answers"]["by_route"].items()]
    query = (
        f"hours={period.hours:g}"
        if period.hours is not None
        else f"from={_epoch(period.start)}&to={_epoch(period.end)}"
    )
    response = render(
        request,
        "ops.html",
        {
            "s": data,
            "routes": routes,
            "hours": period.hours,
            "hours_q": f"{period.hours:g}" if period.hours is not None else "",
            "query": query,
            "from_epoch": _epoch(period.start),
            "to_epoch": _epoch(period.end),
            "windows": WINDOWS,
            "tiers": sorted(data["upstream"]["ttft_ms"].items()),
            # Which model each tier calls, or why it is off (routing.upstream.listing).
            "model_tiers": list(router.router_tiers().items()),
            "resolution_window_h": settings.KEFU_RESOLUTION_WINDOW_H,
            # Per label: its conversations in the window and their outcomes (ops.labels).
            "labels": ops_labels.labels_summary(start=period.start, end=period.end),
        },
    )
    response["Content-Security-Policy"] = OPS_CSP
    return response


@_ops_only(api=True)
def canary_api(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/api/canary?hours=24``: :func:`ops.selectors.canary_summary` as JSON."""
    return JsonResponse(ops.canary_summary(standings=router.canary_standings(), hours=period_hours(period)))


@_ops_only(api=False)
def canary_page(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/canary/?hours=24``: each tier's candidate beside its own model, with the forms
    that promote, roll back or resume it. The forms post to the router's own view
    (``routing.views``): this page only reads. ``static/kefu/ops.js`` asks for a
    confirmation before a form is sent (no inline script: the CSP allows none)."""
    hours = period_hours(period)
    data = ops.canary_summary(standings=router.canary_standings(), hours=hours)
    rows = (
        ("answers", _("Answers")),
        ("ttft_p50", _("Time to first token p50 (ms)")),
        ("ttft_p95", _("Time to first token p95 (ms)")),
        ("cost_per_answer", _("Cost per answer (USD)")),
        ("thumbs_down", _("Thumbs down")),
        ("handoff", _("Handed to a person next")),
        ("cut", _("Cut")),
        ("errors", _("Upstream errors (as the breaker counts)")),
    )
    tiers = []
    for t in data["tiers"]:
        cells = {variant: _canary_cells(figures) for variant, figures in t["figures"].items()}
        tiers.append(
            {
                **t,
                "rows": [(label, cells["current"][key], cells["candidate"][key]) for key, label in rows],
                "share_pct": f"{t['share'] * 100:g}",
                "env_share_pct": f"{t['env_share'] * 100:g}",
            }
        )
    response = render(
        request,
        "ops_canary.html",
        {"tiers": tiers, "window": data["window"], "hours": hours, "hours_q": f"{hours:g}", "windows": WINDOWS},
    )
    response["Content-Security-Policy"] = OPS_CSP
    return response


def _canary_cells(f: dict[str, Any]) -> dict[str, str]:
    """One deployment's figures as the page's cells: each with its count (in the active language)."""

    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v:g}"

    def rate(r: dict[str, Any]) -> str:
        pct = "—" if r["rate"] is None else f"{r['rate'] * 100:.1f}%"
        return _("%(rate)s (%(count)s of %(of)s)") % {"rate": pct, "count": r["count"], "of": r["of"]}

    def of_n(v: float | None) -> str:
        return _("%(ms)s (of %(n)s)") % {"ms": ms(v), "n": f["ttft_ms"]["count"]}

    per_answer = "—" if f["cost_per_answer_usd"] is None else f"{f['cost_per_answer_usd']:.6f}"
    return {
        "answers": str(f["answers"]),
        "ttft_p50": of_n(f["ttft_ms"]["p50"]),
        "ttft_p95": of_n(f["ttft_ms"]["p95"]),
        "cost_per_answer": _("%(per_answer)s (%(total)s over %(answers)s)")
        % {"per_answer": per_answer, "total": f"{f['cost_usd']:.6f}", "answers": f["answers"]},
        "thumbs_down": _("%(rate)s, %(rated)s rated")
        % {"rate": rate(f["thumbs_down"]), "rated": f["thumbs_down"]["rated"]},
        "handoff": rate(f["handoff"]),
        "cut": rate(f["cut"]),
        "errors": rate(f["errors"]),
    }


def _epoch(t: datetime) -> str:
    return f"{t.timestamp():.0f}" if t.microsecond == 0 else f"{t.timestamp():.3f}"


def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: Prometheus text format (``prometheus_client``), from the database so every
    worker process reports the same totals: ``kefu_answers_total{route}``,
    ``kefu_saved_usd_total{route}``, ``kefu_upstream_calls_total{tier,purpose,outcome}``,
    ``kefu_upstream_cost_usd_total{tier,purpose,outcome}`` (counters) and
    ``kefu_conversations{status}`` for ``waiting_agent`` / ``agent`` (the queue length) and
    ``kefu_agent_queue_oldest_wait_seconds`` (gauges); then the processes' own ``lib.metrics``
    (``kefu_time_to_first_token_seconds``, ``kefu_answer_latency_seconds``,
    ``kefu_open_sockets{kind}`` for shopper and agent sockets, and process metrics outside
    multiprocess mode)."""
    token = settings.KEFU_METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return HttpResponse(
                "metrics need Authorization: Bearer <KEFU_METRICS_TOKEN>\n", status=401, content_type="text/plain"
            )
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Totals:
        def collect(self) -> Any:
            t = ops.totals()
            answers = CounterMetricFamily("kefu_answers", "Bot answers stored, by route.", labels=["route"])
            saved = CounterMetricFamily(
                "kefu_saved_usd",
                "USD the tier that would have answered would have cost (FAQ, cache and shared answers), by route.",
                labels=["route"],
            )
            for route, n, usd in t["answers"]:
                answers.add_metric([route], n)
                saved.add_metric([route], usd)
            calls = CounterMetricFamily(
                "kefu_upstream_calls", "Upstream attempts (cost ledger rows).", labels=["tier", "purpose", "outcome"]
            )
            cost = CounterMetricFamily(
                "kefu_upstream_cost_usd",
                "USD of upstream attempts at list prices.",
                labels=["tier", "purpose", "outcome"],
            )
            for tier, purpose, outcome, n, usd in t["calls"]:
                calls.add_metric([tier, purpose, outcome], n)
                cost.add_metric([tier, purpose, outcome], usd)
            conv = GaugeMetricFamily(
                "kefu_conversations", "Conversations waiting for or held by an agent now.", labels=["status"]
            )
            conv.add_metric(["waiting_agent"], t["waiting"])
            conv.add_metric(["agent"], t["with_agent"])
            oldest = GaugeMetricFamily(
                "kefu_agent_queue_oldest_wait_seconds",
                "How long the conversation waiting longest for an agent has waited (0: none waits).",
                value=t["oldest_wait_s"],
            )
            yield from (answers, saved, calls, cost, conv, oldest)

    registry = CollectorRegistry()
    registry.register(_Totals())
    # Then what the processes recorded themselves (lib.metrics: time to first token and latency
    # histograms, open sockets; summed over the workers with PROMETHEUS_MULTIPROC_DIR).
    return HttpResponse(generate_latest(registry) + process_metrics.exposition(), content_type=CONTENT_TYPE_LATEST)


# --- Health (docs/ops.md) -------------------------------------------------------------------------


def _check_database() -> str:
    with connection.cursor() as c:
        c.execute("SELECT 1")
    return "ok"


def _check_cache() -> str:
    cache.set("kefu:healthz", "1", 5)
    return "ok" if cache.get("kefu:healthz") == "1" else "error"


def livez(request: HttpRequest) -> JsonResponse:
    """``GET /livez``: ``{"status": "ok"}`` with HTTP 200 whenever the process serves requests,
    whatever its dependencies say (a liveness probe: restart the process only when this fails;
    ``/healthz`` says whether to send it traffic)."""
    return JsonResponse({"status": "ok"})


async def healthz(request: HttpRequest) -> JsonResponse:
    """``GET /healthz``: ``{"status", "database", "channel_layer", "cache", "faq_model", "router"}``,
    each ``ok``/``loading``/``error: ...``; HTTP 200 only when all are ``ok``, else 503. ``faq_model``
    and ``router`` are the router's (``routing.services.router_status``: the FAQ model, the start-up
    warm-up). ``tiers``: each remote tier's standing (``routing.services.router_tiers``: ``ok:
    <model>``, ``unverified: ...``, ``off: ...`` naming the variable to set), a detail that never
    makes the answer 503."""
    result: dict[str, str] = {}
    try:
        result["database"] = await sync_to_async(_check_database)()
    except Exception as e:  # health checks report failures rather than raise
        result["database"] = f"error: {type(e).__name__}"
    try:
        layer = get_channel_layer()
        name = await asyncio.wait_for(layer.new_channel(), 2)
        await asyncio.wait_for(layer.send(name, {"type": "healthz"}), 2)
        await asyncio.wait_for(layer.receive(name), 2)
        if settings.REDIS_URL:
            # A Redis that restarted lost its groups: this process's sockets join theirs again
            # now rather than at the next poll (chat.regroup), so "ok" means frames flow again.
            await asyncio.wait_for(regroup.check(), 2)
        result["channel_layer"] = "ok"
    except Exception as e:
        result["channel_layer"] = f"error: {type(e).__name__}"
    try:
        result["cache"] = await sync_to_async(_check_cache)()
    except Exception as e:
        result["cache"] = f"error: {type(e).__name__}"
    result.update(router.router_status())
    ok = all(v == "ok" for v in result.values())
    # The remote tiers are a detail, not a condition: with one off, the FAQ, the cache and people
    # still answer (routing.upstream.listing).
    return JsonResponse(
        {"status": "ok" if ok else "unavailable", **result, "tiers": router.router_tiers()},
        status=200 if ok else 503,
    )
