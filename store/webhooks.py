"""The store's HTTP face for Shopify: ``POST /api/store/shopify/webhooks`` receives the catalog's
webhooks (``products/update``, ``products/delete``, ``inventory_levels/update``) and hands them to
``store.shopify_sync``. Wired by Config (``config/urls.py``), as the router's gateway is: Chat's
faces never import the store.

Verification (https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-5-verify-the-webhook):
``X-Shopify-Hmac-Sha256`` is the base64 HMAC-SHA256 of the raw body with the app's client secret
(``KEFU_SHOPIFY_WEBHOOK_SECRET``), compared in constant time before the body is parsed. Headers
read: ``X-Shopify-Topic``, ``X-Shopify-Webhook-Id`` (a delivery's id, the same on Shopify's
retries: a delivery applied once is not applied again), ``X-Shopify-Shop-Domain`` (logged).

Answers: ``200`` ``{"outcome": "applied" | "replay" | "ignored"}`` (Shopify wants a 2xx within 5
seconds, else it retries); ``401`` for a missing or wrong signature (logged, with the shop domain
the request claims and its address); ``400`` for a signed body that is not a JSON object or a
delivery without ``X-Shopify-Webhook-Id``; ``502`` when Shopify could not be read back (nothing
stored: its retry applies the delivery); ``404`` when the secret is not set (webhooks off);
``405`` for anything but ``POST``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from . import shopify_sync
from .catalog import BadProductRecord
from .types import StoreError

log = logging.getLogger(__name__)

__all__ = ["shopify_webhook", "signature"]


def signature(body: bytes, secret: str) -> str:
    """Shopify's ``X-Shopify-Hmac-Sha256`` of ``body``: base64 of its HMAC-SHA256 with ``secret``."""
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


@csrf_exempt
@require_POST
def shopify_webhook(request: HttpRequest) -> HttpResponse:
    """``POST /api/store/shopify/webhooks`` (see the module docstring)."""
    secret = settings.KEFU_SHOPIFY_WEBHOOK_SECRET
    if not secret:
        raise Http404("Shopify webhooks are off (KEFU_SHOPIFY_WEBHOOK_SECRET)")
    body = request.body
    given = request.headers.get("X-Shopify-Hmac-Sha256", "")
    topic = request.headers.get("X-Shopify-Topic", "")
    shop = request.headers.get("X-Shopify-Shop-Domain", "")
    if not given or not hmac.compare_digest(given.encode(), signature(body, secret).encode()):
        log.warning(
            "shopify webhook refused: %s signature (topic %r, shop %r, from %s)",
            "wrong" if given else "no",
            topic[:64],
            shop[:255],
            request.META.get("REMOTE_ADDR", "?"),
        )
        return JsonResponse({"error": "bad signature"}, status=401)
    webhook_id = request.headers.get("X-Shopify-Webhook-Id", "").strip()
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not webhook_id or not isinstance(payload, dict):
        return JsonResponse({"error": "a JSON object and X-Shopify-Webhook-Id are required"}, status=400)
    try:
        outcome = shopify_sync.apply_webhook(topic, payload, webhook_id)
    except StoreError as e:
        log.warning("shopify webhook %s %s not applied: %s", topic, webhook_id, e.message)
        return JsonResponse({"error": e.message}, status=502)
    except BadProductRecord as e:  # retrying cannot mend it: acknowledged, logged
        log.warning("shopify webhook %s %s: the product cannot be written: %s", topic, webhook_id, e.reason)
        outcome = "ignored"
    log.info("shopify webhook %s %s from %s: %s", topic, webhook_id, shop[:255], outcome)
    return JsonResponse({"outcome": outcome})
