"""HTTP for the OpenAI-compatible gateway: ``POST /v1/chat/completions`` (see ``routing.gateway.completions``).

Speaks OpenAI's wire format, so the official ``openai`` SDK works against ``http://KEFU/v1``:
a ``chat.completion`` object, or (``"stream": true``) server-sent events of ``chat.completion.chunk``
objects (``data: {...}`` lines; a usage chunk with empty ``choices`` when
``stream_options.include_usage``; then ``data: [DONE]``). Errors are
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status: 401 (no or wrong key),
400 (bad body), 405, 413 (body over ``KEFU_GATEWAY_MAX_BODY_BYTES``), 429 / 503 (every tier
failed or was rate-limited before answering), 502 (the upstream broke off a non-streamed answer).
A streamed answer that breaks after its first token ends with an ``error`` event and no
``[DONE]`` (OpenAI does the same; the SDK raises ``APIError``).

Every response carries ``x-kefu-route`` (``faq``, ``cache.exact``, ``llm.medium``...), and the
completion (or the last chunk) a ``kefu`` object: ``{"route", "cost_usd", "estimated"}``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from routing.decide.answers import chunks
from routing.decide.decision import Decision
from routing.gateway.completions import (
    GatewayError,
    GatewayRequest,
    Plan,
    api_key_authenticate,
    budget_error,
    kefu_body,
    offer_to_cache,
    parse_request,
    plan,
    usage_body,
)
from routing.providers.base import ProviderError, StreamDone, TextDelta, ToolCall
from routing.types import Payer
from routing.upstream.call import Answered, CallItem
from routing.upstream.ledger import CallContext
from routing.upstream.resilience import stream_with_fallback


def error_response(error: GatewayError) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="kefu"'
    return response


def _unavailable(error: ProviderError) -> GatewayError:
    if error.code == "budget":
        return budget_error(str(error))
    if error.code == "rate_limited":
        return GatewayError(
            429,
            "Every model tier is rate-limited now; please retry later.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
        )
    return GatewayError(
        503,
        f"No model tier could answer ({error.code}); please retry later.",
        type="server_error",
        code="upstream_unavailable",
    )


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


class _Completion:
    """The ids and shapes shared by one answer's completion object or chunks."""

    def __init__(self, req: GatewayRequest) -> None:
        self.req = req
        self.id = f"chatcmpl-kefu{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def chunk(self, model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if self.req.include_usage:
            out["usage"] = None
        return out

    def whole(
        self, model: str, text: str, finish_reason: str, usage: dict[str, Any], kefu: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": usage,
            "kefu": kefu,
        }

    def ending(self, model: str, finish_reason: str, usage: dict[str, Any], kefu: dict[str, Any]) -> list[bytes]:
        """The last chunk (finish reason and ``kefu``), the usage chunk when asked for, ``[DONE]``."""
        last = self.chunk(model, {}, finish_reason)
        last["kefu"] = kefu
        out = [_sse(last)]
        if self.req.include_usage:
            out.append(_sse({**self.chunk(model, {}), "choices": [], "usage": usage}))
        out.append(_sse("[DONE]"))
        return out


def _stream_response(body: AsyncIterator[bytes], route: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    response["x-kefu-route"] = route
    return response


def _fixed_answer(p: Plan, c: _Completion) -> HttpResponseBase:
    """A FAQ or cached answer: no remote call, no tokens."""
    text, route = p.text or "", p.decision.route
    model, kefu = f"kefu-{route}", kefu_body(route=route, tier=None, usage=None)
    if not c.req.stream:
        response = JsonResponse(c.whole(model, text, "stop", usage_body(None), kefu))
        response["x-kefu-route"] = route
        return response

    async def events() -> AsyncIterator[bytes]:
        yield _sse(c.chunk(model, {"role": "assistant", "content": ""}))
        for piece in chunks(text):
            yield _sse(c.chunk(model, {"content": piece}))
        for line in c.ending(model, "stop", usage_body(None), kefu):
            yield line

    return _stream_response(events(), route)


async def _remote_answer(p: Plan, c: _Completion, key_id: int) -> HttpResponseBase:
    """Stream from the tiers. The first item is awaited before the response starts, so a failure
    of every tier before any text is a proper HTTP error, and the route is final (the stream's
    ``Answered`` says which tier answered; the plan is never changed)."""
    d = p.decision
    source = stream_with_fallback(
        d.call(CallContext(api_key_id=key_id, purpose="gateway", payer=Payer(api_key_id=key_id)))
    )
    try:
        first: CallItem = await anext(source)
    except ProviderError as e:
        await source.aclose()
        return error_response(_unavailable(e))
    answered = first if isinstance(first, Answered) else None

    async def items() -> AsyncIterator[TextDelta | StreamDone]:
        # The gateway sends no tools (it refuses them), so no ToolCall ever comes.
        nonlocal answered
        try:
            if isinstance(first, (TextDelta, StreamDone)):
                yield first
            async for item in source:
                if isinstance(item, Answered):
                    answered = item
                elif not isinstance(item, ToolCall):
                    yield item
        finally:
            await source.aclose()

    def ended() -> Decision:
        """The plan with the tier that answered so far."""
        return d.answered_by(answered)

    def model_of(done: StreamDone | None) -> str:
        request = ended().request
        return (done.model if done is not None else "") or (request.model if request else "")

    if not c.req.stream:
        texts: list[str] = []
        done: StreamDone | None = None
        try:
            async for item in items():
                if isinstance(item, TextDelta):
                    texts.append(item.text)
                else:
                    done = item
        except ProviderError:
            return error_response(
                GatewayError(
                    502,
                    "The upstream model broke off its answer; please retry.",
                    type="server_error",
                    code="upstream_cut",
                )
            )
        text = "".join(texts)
        usage = done.usage if done is not None else None
        response = JsonResponse(
            c.whole(
                model_of(done),
                text,
                (done.finish_reason if done else None) or "stop",
                usage_body(usage),
                kefu_body(route=ended().route, tier=ended().tier, usage=usage),
            )
        )
        response["x-kefu-route"] = ended().route
        await offer_to_cache(
            p, text=text, model=model_of(done), finish_reason=done.finish_reason if done else None, answered=answered
        )
        return response

    async def events() -> AsyncIterator[bytes]:
        texts: list[str] = []
        done: StreamDone | None = None
        model = model_of(None)
        yield _sse(c.chunk(model, {"role": "assistant", "content": ""}))
        try:
            async for item in items():
                if isinstance(item, TextDelta):
                    texts.append(item.text)
                    yield _sse(c.chunk(model, {"content": item.text}))
                else:
                    done = item
        except ProviderError as e:
            # Cut after the first token: say so in the stream (no [DONE]); the ledger has the row.
            yield _sse(
                {
                    "error": {
                        "message": f"The upstream model broke off its answer ({e.code}).",
                        "type": "server_error",
                        "param": None,
                        "code": "upstream_cut",
                    }
                }
            )
            return
        usage = done.usage if done is not None else None
        for line in c.ending(
            model_of(done),
            (done.finish_reason if done else None) or "stop",
            usage_body(usage),
            kefu_body(route=ended().route, tier=ended().tier, usage=usage),
        ):
            yield line
        await offer_to_cache(
            p,
            text="".join(texts),
            model=model_of(done),
            finish_reason=done.finish_reason if done else None,
            answered=answered,
        )

    return _stream_response(events(), ended().route)


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    """``POST /v1/chat/completions`` with ``Authorization: Bearer <gateway key>`` (module docstring)."""
    if request.method != "POST":
        response = error_response(GatewayError(405, "Use POST.", code="method_not_allowed"))
        response["Allow"] = "POST"
        return response
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return error_response(
            GatewayError(
                401,
                "Missing API key: send 'Authorization: Bearer <key>' with a key issued in kefu's admin.",
                code="invalid_api_key",
            )
        )
    key_id = await database_sync_to_async(api_key_authenticate)(raw.strip())
    if key_id is None:
        return error_response(GatewayError(401, "Incorrect or inactive API key.", code="invalid_api_key"))
    limit = settings.KEFU_GATEWAY_MAX_BODY_BYTES
    too_big = GatewayError(413, f"The body is over {limit} bytes.", code="request_too_large")
    try:
        body = request.body
    except RequestDataTooBig:
        return error_response(too_big)
    if len(body) > limit:
        return error_response(too_big)
    try:
        req = parse_request(body)
        p = await plan(req, api_key_id=key_id)
    except GatewayError as e:
        return error_response(e)
    c = _Completion(req)
    if p.text is not None:
        return _fixed_answer(p, c)
    return await _remote_answer(p, c, key_id)
