"""Staff's decisions about a tier's canary candidate: ``POST /ops/canary/<tier>/<action>`` with
``action`` ``promote``, ``rollback`` or ``resume`` and an optional ``reason`` (docs/routing.md,
"Canary rollout"; the forms are on Ops' read-only page ``/ops/canary/``).

The router's own face for its own state, like the gateway (``routing.gateway.views``), wired by
Config: Ops only reads, and the decision is written where it is read (``routing.upstream.canary.decide``:
a ``TierOverride`` row, in force at once in this process and the shared cache). For staff users
with the ``routing.view_costs`` permission, the one the ops page asks for; Django's CSRF check
applies (the page's forms carry the token).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_POST

from routing.models import CanaryState
from routing.upstream import canary

PERMISSION = "routing.view_costs"
ACTIONS = {
    "promote": CanaryState.PROMOTED,
    "rollback": CanaryState.ROLLED_BACK,
    "resume": CanaryState.CANARY,
}
#: Longest reason kept (characters).
MAX_REASON = 500


def may_decide(user: Any) -> bool:
    """Staff with the cost permission (the ops page's)."""
    return bool(user.is_authenticated and user.is_active and user.is_staff and user.has_perm(PERMISSION))


def _text(body: str, status: int) -> HttpResponse:
    return HttpResponse(body + "\n", status=status, content_type="text/plain")


@require_POST
def decide(request: HttpRequest, tier: str, action: str) -> HttpResponse:
    """Promote (every conversation of ``tier``), roll back (none) or resume (the environment's
    share) the tier's candidate, recorded with the user and ``reason``; then back to the page
    (303). 401 signed out, 403 without the permission, 404 for an unknown action, 409 for a
    tier without a candidate."""
    if not request.user.is_authenticated:
        return _text("sign in as staff with the cost permission", 401)
    if not may_decide(request.user):
        return _text(f"needs staff status and the {PERMISSION} permission", 403)
    state = ACTIONS.get(action)
    if state is None:
        return _text(f"unknown action {action!r}: one of {', '.join(ACTIONS)}", 404)
    reason = " ".join(request.POST.get("reason", "").split())[:MAX_REASON]
    try:
        canary.decide(tier, state=state, by=request.user.get_username(), user_id=request.user.pk, reason=reason)
    except canary.CanaryError as e:
        return _text(str(e), 409)
    return HttpResponseRedirect("/ops/canary/", status=303)
