"""``/ops/faq-candidates/`` and its JSON: the questions the bot could not answer itself, grouped by
meaning, each with a button that drafts an FAQ entry in the admin (``ops.candidates``)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from .candidates import faq_candidates
from .views import OPS_CSP, Period, _ops_only, period_hours


@_ops_only(api=True)
def candidates_api(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/api/faq-candidates?hours=168`` (or ``?from=&to=``): ``{"hours", "groups":
    [...]}`` (:func:`ops.candidates.faq_candidates`)."""
    hours = period_hours(period)
    return JsonResponse({"hours": hours, "groups": faq_candidates(hours=hours, now=period.end)})


@_ops_only(api=False)
def candidates_page(request: HttpRequest, period: Period) -> HttpResponse:
    """``GET /ops/faq-candidates/?hours=168``: the same groups as a page; each "Draft FAQ entry"
    opens the admin's form filled with the group's question, its other phrasings and a model's
    answer, for staff to correct and save."""
    hours = period_hours(period)
    groups = faq_candidates(hours=hours, now=period.end)
    response = render(request, "ops_candidates.html", {"groups": groups, "hours": f"{hours:g}"})
    response["Content-Security-Policy"] = OPS_CSP
    return response
