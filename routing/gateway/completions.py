"""The OpenAI-compatible gateway: kefu's router behind ``POST /v1/chat/completions``.

A store's other tools (any OpenAI client) send chat completions to kefu instead of to a provider
and get the same FAQ model, answer cache, tiers, retries, fallbacks, guards and cost ledger as the
shopper chat. This module holds the logic (keys, request validation, choosing who answers);
``routing.gateway.views`` speaks HTTP.

Who answers a request (docs/routing.md, "Gateway"):

- A **bare question** — the messages are one ``user`` message, no system prompt, no history —
  is what a shopper asks the chat, so it is routed like one: the FAQ model (route ``faq``), then
  the answer cache (``cache.exact`` / ``cache.semantic``), then the ``simple`` tier with kefu's
  own grounded prompt (and the answer is offered to the cache).
- **Anything else** (the client's own system prompt, or a conversation) goes to the tiers as
  given: kefu's FAQ and cached answers were made for its own prompt, not for the client's.
- ``model`` naming a tier (``simple``, ``medium``, ``complex``) starts at that tier and skips the
  FAQ model and the cache; any other value lets kefu choose.

Keys (``ApiKey``) are ``kefu_`` + 43 URL-safe characters (256 random bits); only their SHA-256
is stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from lib.text import detect_locale
from routing.decide import answers, classify, strategy
from routing.decide.decision import Decision
from routing.faq.registry import registry
from routing.models import ApiKey
from routing.prompt import build as prompt
from routing.providers.base import ChatRequest, Usage
from routing.types import Payer
from routing.upstream import budgets
from routing.upstream.call import Answered
from routing.upstream.ledger import cost_usd
from routing.upstream.tiers import check_tiers_async, configured_tiers, provider_for, tier_configured, tier_model

log = logging.getLogger(__name__)

KEY_PREFIX = "kefu_"
ROLES = {"system", "developer", "user", "assistant"}
TIERS = ("simple", "medium", "complex")


class GatewayError(Exception):
    """A request the gateway refuses, as an OpenAI-style error: HTTP ``status``, ``message`` for
    people, ``type`` (``invalid_request_error``, ``server_error``...), ``param`` (the offending
    field or None) and ``code`` (a stable string or None)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``, the OpenAI error shape."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ---------------------------------------------------------------------------- keys


def hash_key(raw: str) -> str:
    """SHA-256 hex of a key (keys are 256-bit random: a slow hash would add nothing)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def new_key() -> str:
    """A fresh key: ``kefu_`` + 43 URL-safe characters."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def api_key_issue(*, name: str, created_by_id: int | None = None) -> tuple[Any, str]:
    """Create an ``ApiKey``; returns (the row, the key itself — shown once, never stored)."""
    raw = new_key()
    row = ApiKey.objects.create(name=name, prefix=raw[:12], key_hash=hash_key(raw), created_by_id=created_by_id)
    return row, raw


def api_key_authenticate(raw: str) -> int | None:
    """The id of the active ``ApiKey`` whose key is ``raw`` (and marks it used now), or None."""
    if not raw.startswith(KEY_PREFIX):
        return None
    row = ApiKey.objects.filter(key_hash=hash_key(raw), active=True).values_list("pk", flat=True).first()
    if row is not None:
        ApiKey.objects.filter(pk=row).update(last_used_at=timezone.now())
    return row


# ---------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class GatewayRequest:
    """A validated ``/v1/chat/completions`` body. ``messages`` in the OpenAI chat format (text
    content only); ``max_tokens`` capped to ``KEFU_GATEWAY_MAX_TOKENS``; ``start_tier`` set when
    ``model`` names a tier."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    start_tier: str | None = None
    caller_params: bool = False


def content_text(content: object) -> str | None:
    """The text of a message ``content`` (a string, or a list of ``{"type": "text"}`` parts);
    None when it is neither (images, audio... are not supported)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def parse_request(body: bytes) -> GatewayRequest:
    """Validate a request body.

    Raises:
        GatewayError: status 400 naming the first problem (``param`` says which field).
    """

    def bad(message: str, param: str | None = None) -> GatewayError:
        return GatewayError(400, message, param=param)

    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad("The body is not valid JSON.") from None
    except RecursionError:  # e.g. 100,000 nested arrays: the decoder's recursion limit
        raise bad("The body is nested too deeply.") from None
    if not isinstance(data, dict):
        raise bad("The body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad("'model' is required: a non-empty string.", "model")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' is required: a non-empty array.", "messages")
    clean: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"messages[{i}] must be an object with 'role' one of {sorted(ROLES)}.", f"messages[{i}].role")
        text = content_text(m.get("content"))
        if text is None:
            raise bad(f"messages[{i}].content must be a string or an array of text parts.", f"messages[{i}].content")
        clean.append({"role": m["role"], "content": text})
    if clean[-1]["role"] != "user" or not clean[-1]["content"].strip():
        raise bad("The last message must be a non-blank 'user' message.", "messages")
    if data.get("n", 1) != 1:
        raise bad("Only n=1 is supported.", "n")
    for unsupported in ("tools", "functions", "tool_choice", "function_call"):
        if data.get(unsupported):
            raise bad(f"'{unsupported}' is not supported by this gateway.", unsupported)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be a boolean.", "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise bad("'stream_options.include_usage' must be a boolean.", "stream_options")
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad("'max_tokens' must be a positive integer.", "max_tokens")
    temperature = data.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2
    ):
        raise bad("'temperature' must be a number from 0 to 2.", "temperature")
    name = model.strip().lower().removeprefix("kefu-")
    return GatewayRequest(
        model=model,
        messages=clean,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        max_tokens=min(max_tokens or settings.KEFU_GATEWAY_MAX_TOKENS, settings.KEFU_GATEWAY_MAX_TOKENS),
        temperature=float(temperature) if temperature is not None else None,
        start_tier=name if name in TIERS else None,
        caller_params=max_tokens is not None or temperature is not None,
    )


# ---------------------------------------------------------------------------- routing


@dataclass(frozen=True, slots=True)
class Plan:
    """Who answers a gateway request (frozen): a fixed ``text`` (route ``faq`` or ``cache.*``), or
    the tiers through ``decision`` (``decision.request`` set; the tier that answers comes back
    in the stream, ``routing.upstream.call.Answered``). ``question`` / ``offer_to_cache`` /
    ``grounded_on`` (FAQ entry ids) are kept to offer a bare question's remote answer to the
    answer cache."""

    decision: Decision
    question: str = ""
    offer_to_cache: bool = False
    grounded_on: tuple[int, ...] = field(default_factory=tuple)

    @property
    def text(self) -> str | None:
        return self.decision.text


def _remote(req: GatewayRequest, tier: str, messages: list[dict[str, Any]], locale: str) -> Decision:
    return Decision(
        route=f"llm.{tier}",
        locale=locale,
        tier=tier,
        provider=provider_for(tier),
        request=ChatRequest(
            messages=messages, model=tier_model(tier), max_tokens=req.max_tokens, temperature=req.temperature
        ),
        reason="gateway",
    )


def budget_error(reason: str) -> GatewayError:
    """The 429 ``budget_exceeded`` a key gets when its spend budget (or the store's cap of every
    tier it could reach) leaves no remote call; FAQ and cache answers still come."""
    return GatewayError(
        429,
        f"No model tier is within the spend budget ({reason}); FAQ and cached answers still work. "
        "The budget frees up at the start of the next day or month.",
        type="insufficient_quota",
        code="budget_exceeded",
    )


async def plan(req: GatewayRequest, *, api_key_id: int | None = None) -> Plan:
    """Choose who answers ``req`` (module docstring); ``api_key_id``: the caller's key, whose spend
    budgets (``routing.upstream.budgets``) may send the request a tier down (past the soft share) or
    refuse it (spent).

    Raises:
        GatewayError: 503 ``no_model`` when the answer needs a remote tier and none is configured;
            429 ``budget_exceeded`` when the spend budgets leave it no tier.
    """
    p = await _plan(req)
    d = p.decision
    if d.tier is None or d.request is None:
        return p
    configured = configured_tiers()
    standing = await budgets.standing_async(Payer(api_key_id=api_key_id), configured)
    chosen = standing.choose(d.tier, configured)
    if chosen is None:
        raise budget_error(standing.reason())
    if chosen != d.tier:
        d = replace(
            d,
            tier=chosen,
            route=f"llm.{chosen}",
            request=replace(d.request, model=tier_model(chosen)),
            provider=provider_for(chosen),
            reason=f"{d.reason}, sent to {chosen} by the budget ({standing.reason()})",
            shareable=False,
        )
        p = replace(p, offer_to_cache=False)
    return replace(p, decision=replace(d, tiers_allowed=tuple(standing.tiers_open(configured))))


async def _plan(req: GatewayRequest) -> Plan:
    await check_tiers_async()  # no deployment called before its GET /models answered
    question = req.messages[-1]["content"]
    locale = detect_locale(question)
    start = req.start_tier or "simple"
    if req.start_tier is None and len(req.messages) == 1:
        c = await asyncio.to_thread(classify.classify, question, locale)
        match = c.match
        if match is not None and match.accepted and match.entry_id is not None:
            entry = registry.entries.get(match.entry_id)
            if entry is not None:
                entry = registry.by_intent.get((entry.intent, locale), entry)
                return Plan(
                    Decision(
                        route="faq",
                        locale=locale,
                        text=answers.fill_placeholders(entry.answer, entry.locale),
                        faq_entry_id=entry.entry_id,
                        reason="gateway faq",
                    )
                )
        # The answer cache's answers were made within kefu's own output limit (KEFU_LLM_MAX_TOKENS,
        # part of their scope): a client that set its own max_tokens or temperature gets an answer
        # made to its measure, never one of those, and its answer is never stored for shoppers.
        if c.hit is not None and not req.caller_params:
            hit: Any = c.hit
            return Plan(Decision(route=hit.route, locale=locale, text=hit.answer, reason="gateway cache"))
        if c.remote is not None and c.tier is not None:
            # The tier the router chose (routing.decide.tier_classifier), the one its cache scope names.
            tier = c.tier.tier
            grounding, grounded_on, vector = c.remote
            # Left to kefu, a bare question is answered as a shopper's is: kefu's prompt, kefu's
            # output limit (within the gateway's), the limit its cache scope names.
            limit = min(settings.KEFU_LLM_MAX_TOKENS, settings.KEFU_GATEWAY_MAX_TOKENS)
            d = replace(
                _remote(
                    req if req.caller_params else replace(req, max_tokens=limit),
                    tier,
                    prompt.build_messages(grounding=grounding, history=[], text=question, locale=locale, tier=tier),
                    locale,
                ),
                cache_scope=c.cache_scope,
                cache_vector=vector,
                grounded_on=tuple(grounded_on),
                shareable=not req.caller_params and limit == settings.KEFU_LLM_MAX_TOKENS,
            )
            return Plan(
                d,
                question=question,
                offer_to_cache=bool(c.cache_scope) and d.shareable,
                grounded_on=tuple(grounded_on),
            )
    first_tier = next((t for t in TIERS[TIERS.index(start) :] if tier_configured(t)), None)
    if first_tier is None:
        raise GatewayError(
            503,
            "No remote model is configured for this request: the FAQ does not answer it and "
            "no tier has an API key (set OPENAI_API_KEY, or KEFU_<TIER>_API_KEY).",
            type="server_error",
            code="no_model",
        )
    return Plan(_remote(req, first_tier, req.messages, locale))


async def offer_to_cache(
    p: Plan, *, text: str, model: str, finish_reason: str | None = None, answered: Answered | None = None
) -> None:
    """Offer a bare question's complete remote answer to the answer cache
    (``routing.decide.strategy.offer_to_cache``: its policy may refuse it; never raises), under
    the route of the tier that ``answered`` (the stream's ``Answered``; None: the planned one).
    An answer the token limit stopped (``finish_reason`` ``"length"``) is never offered."""
    if p.offer_to_cache and finish_reason != "length":
        decision = p.decision.answered_by(answered)
        await strategy.offer_to_cache(decision, question=p.question, text=text, model=model)


def usage_body(usage: Usage | None) -> dict[str, Any]:
    """The OpenAI ``usage`` object (zeros for answers that called no remote model)."""
    u = usage or Usage(prompt_tokens=0, completion_tokens=0)
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    }


def kefu_body(*, route: str, tier: str | None, usage: Usage | None) -> dict[str, Any]:
    """kefu's extension of a response: ``{"route", "cost_usd", "estimated"}`` (USD, 6 decimals)."""
    cost = Decimal("0")
    if usage is not None and tier is not None and route.startswith("llm."):
        cost = cost_usd(
            tier=tier,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
        )
    return {"route": route, "cost_usd": float(cost), "estimated": bool(usage and usage.estimated)}
