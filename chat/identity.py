"""Signed shopper identity: the store's backend vouches for a logged-in customer.

The scheme (docs/security.md has a server-side snippet): the store signs a short-lived JSON Web
Token with HS256 (RFC 7519, RFC 7518 §3.2) and the shared secret ``KEFU_IDENTITY_SECRET``, and
the widget passes it once in ``hello`` as ``identity``. It is what Intercom's identity
verification and Chatwoot's ``identifier_hash`` do with an HMAC of the user id, with an expiry
and a one-time id added so a token copied from a page cannot be used later or twice.

Claims: ``sub`` (the store's customer id, a non-empty string of at most 255 characters), ``exp``
and ``iat`` (NumericDate; ``exp - iat`` at most ``KEFU_IDENTITY_MAX_AGE_S``), ``jti`` (unique per
token, at most 64 characters), and optionally ``name`` and ``email`` (shown to agents). Clocks may
differ by ``KEFU_IDENTITY_LEEWAY_S`` seconds.

Each ``jti`` is accepted once (``UsedIdentityToken``, in the database: shared by every worker and
kept across restarts until the token expired). A reconnecting widget resumes with its
conversation token, not the identity token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import jwt
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import UsedIdentityToken

__all__ = [
    "IdentityRejected",
    "ShopperIdentity",
    "address_key",
    "customer_token",
    "identity_verify",
    "used_tokens_purge",
]

#: ``error`` frame codes of a rejected identity token (the socket is then closed with 4401).
INVALID, EXPIRED, REPLAYED, UNSUPPORTED = "identity_invalid", "identity_expired", "identity_replayed", "identity_off"

MAX_CUSTOMER_ID, MAX_JTI, MAX_NAME = 255, 64, 150


class IdentityRejected(Exception):
    """An identity token kefu does not accept. ``code``: one of ``identity_invalid`` (bad
    signature, algorithm, shape or claims), ``identity_expired``, ``identity_replayed`` (its
    ``jti`` was used before), ``identity_off`` (no ``KEFU_IDENTITY_SECRET`` is set);
    ``message``: what the store's developer should fix (never echoes the token)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ShopperIdentity:
    """A verified customer: ``customer_id`` (``sub``), ``name`` and ``email`` ("" when the store
    sent none), ``jti`` and ``expires_at`` of the token that proved it."""

    customer_id: str
    name: str
    email: str
    jti: str
    expires_at: datetime


def identity_verify(token: object, *, now: datetime | None = None) -> ShopperIdentity:
    """Check ``token`` (the ``hello`` frame's ``identity``) and spend its ``jti``.

    Raises:
        IdentityRejected: see its codes. A token is spent only when everything else held, so a
            token refused as expired or invalid was not recorded.
    """
    secret = settings.KEFU_IDENTITY_SECRET
    if not secret:
        raise IdentityRejected(UNSUPPORTED, "this store has not set up signed identity (KEFU_IDENTITY_SECRET)")
    if not isinstance(token, str) or not token or len(token) > 4096:
        raise IdentityRejected(INVALID, "identity must be a signed token (a JWT string)")
    moment = now or timezone.now()
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],  # never "none", never a key confusion with RS256
            options={"require": ["exp", "iat", "sub", "jti"], "verify_exp": False, "verify_iat": False},
        )
    except jwt.InvalidTokenError as e:
        raise IdentityRejected(INVALID, f"identity token refused: {e}") from e
    leeway = float(settings.KEFU_IDENTITY_LEEWAY_S)
    raw_exp, raw_iat = claims.get("exp"), claims.get("iat")
    if not isinstance(raw_exp, (int, float)) or not isinstance(raw_iat, (int, float)) or _bool(raw_exp, raw_iat):
        raise IdentityRejected(INVALID, "exp and iat must be NumericDates (seconds since the epoch)")
    exp, iat = float(raw_exp), float(raw_iat)
    if exp - iat > settings.KEFU_IDENTITY_MAX_AGE_S:
        raise IdentityRejected(
            INVALID, f"identity tokens may live at most {settings.KEFU_IDENTITY_MAX_AGE_S} s (exp - iat)"
        )
    stamp = moment.timestamp()
    if iat > stamp + leeway:
        raise IdentityRejected(INVALID, "identity token issued in the future (iat): check the store's clock")
    if exp <= stamp - leeway:
        raise IdentityRejected(EXPIRED, "identity token expired: sign a new one for each page view")
    sub, jti = claims.get("sub"), claims.get("jti")
    if not isinstance(sub, str) or not sub.strip() or len(sub) > MAX_CUSTOMER_ID:
        raise IdentityRejected(INVALID, f"sub must be the customer id, 1-{MAX_CUSTOMER_ID} characters")
    if not isinstance(jti, str) or not jti or len(jti) > MAX_JTI:
        raise IdentityRejected(INVALID, f"jti must be a unique string of 1-{MAX_JTI} characters")
    name, email = claims.get("name", ""), claims.get("email", "")
    if not isinstance(name, str) or not isinstance(email, str) or len(email) > 254:
        raise IdentityRejected(INVALID, "name and email must be strings")
    expires_at = datetime.fromtimestamp(exp, tz=UTC)
    try:
        with transaction.atomic():
            UsedIdentityToken.objects.create(jti=jti, expires_at=expires_at + timedelta(seconds=leeway))
    except IntegrityError as e:
        raise IdentityRejected(REPLAYED, "identity token already used: sign a new one for each page view") from e
    return ShopperIdentity(
        customer_id=sub.strip(), name=name.strip()[:MAX_NAME], email=email.strip(), jti=jti, expires_at=expires_at
    )


def customer_token(conversation_id: uuid.UUID) -> str:
    """The bearer token of a verified customer's conversation, the same on every device: an
    HMAC-SHA256 of the conversation id under ``SECRET_KEY`` (derived, not stored; valid only
    while the conversation belongs to a customer, ``services.conversation_authenticate``)."""
    key = hashlib.sha256(f"kefu.customer-token:{settings.SECRET_KEY}".encode()).digest()
    return hmac.new(key, str(conversation_id).encode(), hashlib.sha256).hexdigest()


def used_tokens_purge(*, now: datetime | None = None) -> int:
    """Forget the spent ``jti`` of tokens that expired (they are refused as expired anyway);
    returns how many rows went. Run by the beat schedule."""
    deleted, _ = UsedIdentityToken.objects.filter(expires_at__lt=now or timezone.now()).delete()
    return int(deleted)


def _bool(*values: object) -> bool:
    return any(isinstance(v, bool) for v in values)


def address_key(address: str) -> str:
    """A keyed hash (HMAC-SHA256 with ``SECRET_KEY``, 32 hex digits) of the network a shopper
    connects from: the IPv4 address, or the /64 of an IPv6 one (the block one subscriber gets,
    RFC 6177, within which a client may change its address at will). What an anonymous
    shopper's address budget is kept under (``routing.upstream.budgets``) without storing the address.
    "" for an address that is not an IP address (a test client, a Unix socket)."""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return ""
    if ip.version == 6 and getattr(ip, "ipv4_mapped", None) is None:
        net = str(ipaddress.ip_network(f"{ip}/64", strict=False))
    else:
        net = str(getattr(ip, "ipv4_mapped", None) or ip)
    return hmac.new(settings.SECRET_KEY.encode(), f"kefu-address:{net}".encode(), hashlib.sha256).hexdigest()[:32]
