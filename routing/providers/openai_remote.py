"""The remote-model provider: streams chat completions from any OpenAI-compatible endpoint.

This is the only module in kefu that imports `openai`. Everything it hands out is a type from
`routing.providers.base`: `TextDelta` items, one `StreamDone`, or a `ProviderError` whose
`code`/`permanent`/`retry_after_s`/`after_first_token` tell the router what it may do next.

Choices that differ from the SDK's defaults, and why:
- `max_retries=0`: the SDK would retry 429/5xx on its own, with its own back-off, invisible to
  the router and blind to our first-token deadline. Retries and fallbacks are the router's job,
  and never after a token reached the shopper.
- Explicit timeouts (the SDK's default read timeout is 10 minutes): a connect timeout, a read
  timeout equal to the first-token timeout (the longest silence a healthy stream has), and our
  own asyncio deadlines for the first token and for the whole answer, which HTTP timeouts
  cannot express (a server trickling one byte a second never trips a read timeout).
- One `AsyncOpenAI` client per (base URL, API key) per event loop, so connections are pooled
  across answers. Per event loop because the SDK's HTTP pool is bound to the loop that opened
  its connections: reusing a client after `asyncio.run()` finished (Celery tasks, tests) fails
  with "Event loop is closed". A server process has one loop, so in practice one client per
  process per upstream.
- Idle pooled connections are kept `config.keepalive_s` (the HTTP client's default is 5 s, so a
  store with a message a minute paid a new TCP and TLS handshake, two round trips, before nearly
  every answer), and `keep_warm` sends a free request (`GET /models`) to each upstream that had
  no call for a while, so its connection stays open. `config.http2` offers HTTP/2 over TLS (one
  connection carries every concurrent stream; measured in bench/upstream_conn.py).
- `base_url=None` in the config means the official endpoint, passed explicitly: the SDK would
  otherwise read `OPENAI_BASE_URL` from the environment, and settings are read in one place.

- The stream is opened through `with_raw_response` so that the upstream's `x-ratelimit-*`
  headers are read (`routing.providers.ratelimits.book`): an upstream that says it has no
  requests or tokens left gets none until its reset.

Token counting uses `bpe_openai` (tiktoken-compatible, ships its encodings in the wheel);
`tiktoken` would try to download its encoding files and fails offline.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import httpx2
import openai
from openai import AsyncOpenAI, AsyncStream, DefaultAsyncHttpxClient, Timeout, omit
from openai.types.chat import ChatCompletionMessageParam

from lib.tokens import count_tokens
from routing.providers import ratelimits
from routing.providers.base import (
    ChatRequest,
    ModelList,
    ProviderConfig,
    ProviderError,
    ProviderErrorCode,
    StreamDone,
    TextDelta,
    ToolCall,
    Usage,
)
from routing.providers.ratelimits import UpstreamKey

__all__ = [
    "DEFAULT_BASE_URL",
    "OpenAIProvider",
    "close_clients",
    "get_client",
    "keep_warm",
    "list_models",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# ---------------------------------------------------------------------------- clients

# (base URL, API key, HTTP/2, keep-alive seconds)
_ClientKey = tuple[str, str, bool, float]
# event loop -> client key -> client. Weak on the loop so a finished loop's clients go
# away with it.
_clients_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_ClientKey, AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)
# Clients built outside any running loop (a sync caller preparing one); rarely used.
_clients_without_loop: dict[_ClientKey, AsyncOpenAI] = {}
_clients_lock = threading.Lock()
# client -> the event loop's time of its latest call's start or end, and its calls streaming now
# (keep_warm pings only an idle upstream).
_last_call: weakref.WeakKeyDictionary[AsyncOpenAI, float] = weakref.WeakKeyDictionary()
_in_flight: weakref.WeakKeyDictionary[AsyncOpenAI, int] = weakref.WeakKeyDictionary()

#: The SDK's own pool limits (openai._constants.DEFAULT_CONNECTION_LIMITS), with our keep-alive.
MAX_CONNECTIONS = 1000
MAX_KEEPALIVE_CONNECTIONS = 100


def http_timeout(config: ProviderConfig) -> Timeout:
    """The HTTP-level timeouts for `config`, in seconds.

    `read` is the longest silence between two received bytes; before the first token that is
    the first-token timeout, and no healthy stream is silent longer afterwards.
    """
    return Timeout(
        connect=config.connect_timeout_s,
        read=config.first_token_timeout_s,
        write=config.connect_timeout_s,
        pool=config.connect_timeout_s,
    )


def get_client(config: ProviderConfig) -> AsyncOpenAI:
    """The shared `AsyncOpenAI` client for `config`'s base URL and API key.

    One client per (base_url, api_key, http2, keepalive_s) per running event loop (see the module
    docstring); its pool keeps up to 100 idle connections for `config.keepalive_s` seconds.
    The client is built with `max_retries=0` and `config`'s timeouts; calls pass their own
    config's timeouts again, so two tiers sharing an upstream may differ in timeouts.

    Raises:
        ProviderError: code `auth` (permanent) when `config.api_key` is empty; code
            `bad_request` (permanent) when the SDK refuses the configuration.
    """
    if not config.api_key:
        # The SDK would fall back to OPENAI_API_KEY from the environment for None, and raise
        # for "": either way the key must come from our settings.
        raise ProviderError("no API key configured for this upstream", code="auth", permanent=True)
    key: _ClientKey = (config.base_url or DEFAULT_BASE_URL, config.api_key, config.http2, config.keepalive_s)
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # called from sync code: no loop to bind to
        loop = None
    with _clients_lock:
        clients = _clients_without_loop if loop is None else _clients_by_loop.setdefault(loop, {})
        client = clients.get(key)
        if client is None:
            try:
                client = AsyncOpenAI(
                    api_key=config.api_key,
                    base_url=key[0],
                    timeout=http_timeout(config),
                    max_retries=0,
                    http_client=DefaultAsyncHttpxClient(
                        http2=config.http2,
                        timeout=http_timeout(config),
                        limits=httpx2.Limits(
                            max_connections=MAX_CONNECTIONS,
                            max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
                            keepalive_expiry=config.keepalive_s,
                        ),
                    ),
                )
            except (openai.OpenAIError, ImportError) as error:  # ImportError: http2 without the h2 package
                raise ProviderError(
                    f"cannot configure the OpenAI client: {error}",
                    code="bad_request",
                    permanent=True,
                ) from error
            clients[key] = client
        return client


def list_models(config: ProviderConfig, *, timeout_s: float) -> ModelList:
    """``GET /models`` of ``config``'s endpoint with its key, blocking (run it off the event loop),
    at most ``timeout_s`` seconds (connecting: ``config.connect_timeout_s`` at most), no retry.

    Never raises: HTTP 200 with a list is ``listed`` (ids without a ``models/`` prefix, as Gemini's
    OpenAI-compatible endpoint names them), 401 / 403 ``refused``, anything else ``unknown`` with
    what happened in ``detail`` (routing.providers.base.ModelList)."""
    if not config.api_key:
        return ModelList("refused", detail="no API key")
    try:
        with openai.OpenAI(
            api_key=config.api_key,
            base_url=config.base_url or DEFAULT_BASE_URL,
            timeout=Timeout(timeout_s, connect=min(config.connect_timeout_s, timeout_s)),
            max_retries=0,
        ) as client:
            ids = [str(getattr(m, "id", "") or "") for m in client.models.list().data]
    except (openai.AuthenticationError, openai.PermissionDeniedError) as error:
        return ModelList("refused", detail=f"HTTP {error.status_code}")
    except openai.APIStatusError as error:
        return ModelList("unknown", detail=f"HTTP {error.status_code}")
    except openai.APITimeoutError:
        return ModelList("unknown", detail=f"timed out after {timeout_s:g} s")
    except openai.APIConnectionError as error:
        return ModelList("unknown", detail=f"no connection ({type(error.__cause__ or error).__name__})")
    except (openai.OpenAIError, ValueError, TypeError, AttributeError) as error:  # not a model list
        return ModelList("unknown", detail=f"not a model list ({type(error).__name__})")
    return ModelList("listed", models=tuple(i.removeprefix("models/") for i in ids if i))


async def keep_warm(configs: list[ProviderConfig], *, every_s: float) -> None:
    """Keep a pooled connection open to each upstream of `configs` until cancelled (a task of the
    server's event loop): a connection is opened at once (the first shopper pays no handshake),
    then an upstream that had no call for `every_s` seconds gets `GET /models`, a request that
    costs no tokens, over the pooled connection. Pick `every_s` below `keepalive_s` and below the
    upstream's own idle timeout. Any answer (a 404 from a server without that route included)
    keeps the connection; a failure is logged at DEBUG and tried again next time, as calls
    report upstream trouble themselves. Configs without an API key are skipped."""
    loop = asyncio.get_running_loop()
    configs = [c for c in configs if c.api_key]
    while True:
        for config in configs:
            client = get_client(config)
            if _in_flight.get(client, 0) or loop.time() - _last_call.get(client, float("-inf")) < every_s:
                continue
            _last_call[client] = loop.time()
            try:
                await client.models.with_raw_response.list(timeout=config.connect_timeout_s)
            except openai.APIStatusError:
                pass  # an answer all the same: the connection is open and pooled
            except openai.OpenAIError as error:
                log.debug("keeping the connection to %s warm failed: %s", config.base_url or DEFAULT_BASE_URL, error)
        await asyncio.sleep(every_s / 2)


async def close_clients() -> None:
    """Close the clients of the running event loop (at shutdown, or at the end of a test)."""
    loop = asyncio.get_running_loop()
    with _clients_lock:
        clients = list(_clients_by_loop.pop(loop, {}).values())
    for client in clients:
        await client.close()


# ---------------------------------------------------------------------------- errors


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    value_ms = headers.get("retry-after-ms")
    if value_ms is not None:
        try:
            return max(0.0, float(value_ms) / 1000)
        except ValueError:
            pass  # a malformed header: try the other one
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass  # not a number: maybe an HTTP date
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


_SDKError = (openai.OpenAIError, json.JSONDecodeError, UnicodeDecodeError)


# `error.code` / `error.type` values of an error event inside a stream, as OpenAI's API sends them
# (API reference, "Error codes"; the same body as the HTTP error responses), and what they mean here.
_STREAM_AUTH = {"invalid_api_key", "authentication_error", "permission_error", "insufficient_quota"}
_STREAM_BAD_REQUEST = {"context_length_exceeded", "invalid_request_error", "string_above_max_length"}
_STREAM_RATE_LIMITED = {"rate_limit_exceeded", "requests", "tokens"}


def _stream_error_kind(error: openai.APIError) -> tuple[ProviderErrorCode, bool]:
    """(code, permanent) of an error event inside a stream, from its `code`, else its `type`:
    credentials and quota -> `auth` (permanent); a request the model rejects (context too long)
    -> `bad_request` (permanent); a rate limit -> `rate_limited`; anything else -> `server`."""
    for value in (error.code, error.type):
        if not isinstance(value, str):
            continue
        if value in _STREAM_AUTH:
            return "auth", True
        if value in _STREAM_BAD_REQUEST:
            return "bad_request", True
        if value in _STREAM_RATE_LIMITED:
            return "rate_limited", False
    return "server", False


def _provider_error(error: BaseException, *, after_first_token: bool) -> ProviderError:
    """Map an SDK (or stream decoding) error to our `ProviderError`."""
    first = after_first_token
    code: ProviderErrorCode
    if isinstance(error, openai.APITimeoutError):  # before APIConnectionError: a subclass
        return ProviderError("the upstream timed out", code="timeout", permanent=False, after_first_token=first)
    if isinstance(error, openai.APIConnectionError):
        cause = error.__cause__
        detail = f": {cause}" if cause is not None else ""
        return ProviderError(
            f"connection to the upstream failed{detail}",
            code="connection",
            permanent=False,
            after_first_token=first,
        )
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        retry_after = _retry_after_s(error.response.headers)
        message = f"upstream answered {status}: {error.message}"
        if isinstance(error, openai.RateLimitError):
            code, permanent = "rate_limited", False
        elif isinstance(error, (openai.AuthenticationError, openai.PermissionDeniedError)):
            code, permanent = "auth", True
        elif status >= 500:
            code, permanent = "server", False
        elif status == 408:
            code, permanent = "timeout", False
        elif status in (409, 425):  # conflict / too early: worth another try
            code, permanent = "server", False
        else:  # 400, 404 (unknown model), 413, 422...: the same request fails again
            code, permanent = "bad_request", True
        return ProviderError(
            message,
            code=code,
            permanent=permanent,
            retry_after_s=retry_after,
            status=status,
            after_first_token=first,
        )
    if isinstance(error, openai.APIResponseValidationError):
        return ProviderError(
            f"the upstream sent an invalid response: {error.message}",
            code="malformed",
            permanent=False,
            status=error.status_code,
            after_first_token=first,
        )
    if isinstance(error, openai.APIError):
        # An `{"error": ...}` event inside the stream: it keeps the type the upstream gave it.
        code, permanent = _stream_error_kind(error)
        return ProviderError(
            f"the upstream failed mid-stream ({error.code or error.type or 'no code'}): {error.message}",
            code=code,
            permanent=permanent,
            after_first_token=first,
        )
    if isinstance(error, (json.JSONDecodeError, UnicodeDecodeError)):
        return ProviderError(
            f"the upstream sent a chunk that is not valid JSON: {error}",
            code="malformed",
            permanent=False,
            after_first_token=first,
        )
    # Any other SDK error: unexpected, treat as a transient upstream failure.
    return ProviderError(
        f"the OpenAI client failed: {error}",
        code="server",
        permanent=False,
        after_first_token=first,
    )


# ---------------------------------------------------------------------------- streaming

# Reasoning models reject `max_tokens` and want `max_completion_tokens`; many OpenAI-compatible
# servers know only `max_tokens`. So: the new name for those models, the old one elsewhere.
_NEEDS_MAX_COMPLETION_TOKENS = re.compile(r"^(o\d|gpt-5)")


@dataclass
class _ChunkView:
    """What one streamed chunk carries, checked for shape (the SDK does not validate)."""

    texts: list[str]
    finish_reason: str | None
    usage: Usage | None
    model: str | None
    # Fragments of tool calls: (index, id or "", name or "", arguments fragment).
    tool_fragments: list[tuple[int, str, str, str]]


def _malformed(message: str, *, after_first_token: bool) -> ProviderError:
    return ProviderError(message, code="malformed", permanent=False, after_first_token=after_first_token)


def _read_chunk(chunk: object, *, after_first_token: bool) -> _ChunkView:
    """Extract text, finish reason, usage and model from a chunk: the JSON object of one server-sent
    event, as the SDK decoded it (``AsyncStream[object]``: no pydantic model is built per chunk;
    building ``ChatCompletionChunk`` models was 37% of a worker's CPU at 64 concurrent streams,
    profiled under bench/stream_gap.py).

    Only choice index 0 is read (we never ask for `n` > 1). A refusal is returned as text: it
    is written for the end user, and an empty answer would serve the shopper worse.

    Raises:
        ProviderError: code `malformed` when the chunk or its fields have the wrong types.
    """
    if not isinstance(chunk, dict):
        raise _malformed("chunk is not a JSON object", after_first_token=after_first_token)
    choices: Any = chunk.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list):
        raise _malformed("chunk `choices` is not a list", after_first_token=after_first_token)
    texts: list[str] = []
    fragments: list[tuple[int, str, str, str]] = []
    finish_reason: str | None = None
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for field in ("content", "refusal"):
                value = delta.get(field)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise _malformed(f"chunk delta `{field}` is not a string", after_first_token=after_first_token)
                if value:
                    texts.append(value)
            calls = delta.get("tool_calls")
            if calls is not None:
                fragments.extend(_tool_fragments(calls, after_first_token=after_first_token))
        reason = choice.get("finish_reason")
        if reason is not None:
            finish_reason = str(reason)

    usage: Usage | None = None
    raw_usage: Any = chunk.get("usage")
    if raw_usage is not None:
        counts = raw_usage if isinstance(raw_usage, dict) else {}
        prompt, completion = counts.get("prompt_tokens"), counts.get("completion_tokens")
        details = counts.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(prompt, int) or not isinstance(completion, int):
            raise _malformed("usage chunk without integer token counts", after_first_token=after_first_token)
        usage = Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_prompt_tokens=cached if isinstance(cached, int) else 0,
        )
    model = chunk.get("model")
    return _ChunkView(
        texts=texts,
        finish_reason=finish_reason,
        usage=usage,
        model=model if isinstance(model, str) and model else None,
        tool_fragments=fragments,
    )


def _tool_fragments(calls: object, *, after_first_token: bool) -> list[tuple[int, str, str, str]]:
    """The pieces of tool calls one chunk's delta carries: OpenAI streams each call as a first
    fragment with its ``index``, ``id``, ``type`` and ``function.name``, then fragments of
    ``function.arguments`` with the same ``index`` only (the API reference, "The chat completion
    chunk object", ``choices[].delta.tool_calls``).

    Raises:
        ProviderError: code `malformed` for fragments of the wrong shape.
    """
    if not isinstance(calls, list):
        raise _malformed("chunk delta `tool_calls` is not a list", after_first_token=after_first_token)
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
            raise _malformed("a tool call fragment is not an object with an index", after_first_token=after_first_token)
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise _malformed("a tool call's `function` is not an object", after_first_token=after_first_token)
        call_id, name, arguments = call.get("id") or "", function.get("name") or "", function.get("arguments") or ""
        if not all(isinstance(v, str) for v in (call_id, name, arguments)):
            raise _malformed("a tool call's id, name or arguments is not a string", after_first_token=after_first_token)
        out.append((int(call.get("index", 0)), call_id, name, arguments))
    return out


class OpenAIProvider:
    """Streams answers from one OpenAI-compatible upstream (see `routing.providers.base`).

    Usage::

        provider = OpenAIProvider(ProviderConfig(base_url=..., api_key=...))
        async for item in provider.stream(ChatRequest(messages=[...], model="gpt-4o-mini")):
            if isinstance(item, TextDelta): ...     # forward item.text to the shopper
            else: ...                               # StreamDone: usage, timings

    The provider holds no per-call state, so one instance may serve many concurrent streams.
    """

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    async def stream(self, request: ChatRequest) -> AsyncGenerator[TextDelta | ToolCall | StreamDone, None]:
        """Stream one chat completion: `TextDelta` items, then exactly one `StreamDone`.

        Timeouts (from the config, seconds): the first non-empty text must arrive within
        `first_token_timeout_s` of the call (or the request's `first_token_within_s` when
        shorter), the whole answer within `total_timeout_s`.
        `StreamDone.ttft_ms`/`latency_ms` are measured with `time.perf_counter` from the first
        step of this iterator. When the upstream sends no usage, tokens are counted with
        `count_tokens` and `Usage.estimated` is True.

        Closing the iterator early closes the upstream response.

        Raises:
            ProviderError: on any failure; `after_first_token` is True when a `TextDelta` was
                already yielded (the caller must not retry then). A stream that ends without
                a `finish_reason` counts as cut (code `connection`).
        """
        config = self.config
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        total_deadline = loop.time() + config.total_timeout_s
        first_token_s = config.first_token_timeout_s
        if request.first_token_within_s is not None:
            first_token_s = min(first_token_s, max(0.0, request.first_token_within_s))
        first_token_deadline = min(total_deadline, loop.time() + first_token_s)

        client = get_client(config)
        _last_call[client] = loop.time()
        _in_flight[client] = _in_flight.get(client, 0) + 1
        texts: list[str] = []
        # Tool calls being streamed, by index: [id, name, arguments so far].
        calls: dict[int, list[str]] = {}
        ttft_ms: float | None = None
        usage: Usage | None = None
        finish_reason: str | None = None
        model = request.model
        sdk_stream: AsyncStream[object] | None = None
        try:
            sdk_stream = await self._within(
                self._create(client, request),
                first_token_deadline,
                after_first_token=False,
                waiting_for="the first token",
            )
            while True:
                # A tool call being streamed is the model's answer starting, as text is.
                started_answer = bool(texts or calls)
                waiting_for = "the end of the answer" if started_answer else "the first token"
                deadline = total_deadline if started_answer else first_token_deadline
                chunk = await self._within(
                    _next_chunk(sdk_stream),
                    deadline,
                    after_first_token=bool(texts),
                    waiting_for=waiting_for,
                )
                if chunk is _END_OF_STREAM:
                    break
                view = _read_chunk(chunk, after_first_token=bool(texts))
                model = view.model or model
                usage = view.usage or usage
                finish_reason = view.finish_reason or finish_reason
                for text in view.texts:
                    if ttft_ms is None:
                        ttft_ms = (time.perf_counter() - started) * 1000
                    texts.append(text)
                    yield TextDelta(text)
                for index, call_id, name, arguments in view.tool_fragments:
                    call = calls.setdefault(index, ["", "", ""])
                    call[0], call[1] = call[0] or call_id, call[1] or name
                    call[2] += arguments
        finally:
            _last_call[client] = loop.time()
            _in_flight[client] -= 1
            if sdk_stream is not None:
                # Also runs when the consumer stops early: release the connection now rather
                # than when the garbage collector finds the response.
                await sdk_stream.close()

        if finish_reason is None:
            raise ProviderError(
                "the upstream stream ended without a finish_reason (cut short)",
                code="connection",
                permanent=False,
                after_first_token=bool(texts),
            )
        for index in sorted(calls):
            call_id, name, arguments = calls[index]
            if not name:
                raise ProviderError("a streamed tool call had no function name", code="malformed", permanent=False)
            yield ToolCall(call_id=call_id or f"call_{index}", name=name, arguments=arguments)
        if usage is None:
            # Off the event loop: the first count loads the tokenizer (2–3 s).
            received = "".join(texts) + "".join(c[1] + c[2] for c in calls.values())
            usage = await asyncio.to_thread(_estimate_usage, request.messages, received, model)
        yield StreamDone(
            usage=usage,
            model=model,
            finish_reason=finish_reason,
            ttft_ms=ttft_ms,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def upstream_key(self, model: str) -> UpstreamKey:
        """The key of `ratelimits.book` for calls of `model` through this provider."""
        return (self.config.base_url or DEFAULT_BASE_URL, self.config.api_key, model)

    async def _create(self, client: AsyncOpenAI, request: ChatRequest) -> AsyncStream[object]:
        """Open the stream. The response's `x-ratelimit-*` headers (of a success or of an error
        status) go to `ratelimits.book`, so that the router holds off an exhausted upstream.
        The SDK decodes the events (and raises for an error event) but hands each chunk over as
        its JSON object: `parse(to=AsyncStream[object])`, the SDK's documented way to choose the
        type a response is parsed into (see `_read_chunk`)."""
        key = self.upstream_key(request.model)
        try:
            raw = await self._create_raw(client, request)
        except openai.APIStatusError as error:
            ratelimits.book.observe(key, ratelimits.parse_rate_limit_headers(error.response.headers))
            raise
        ratelimits.book.observe(key, ratelimits.parse_rate_limit_headers(raw.headers))
        stream: AsyncStream[object] = raw.parse(to=AsyncStream[object])
        return stream

    async def _create_raw(
        self, client: AsyncOpenAI, request: ChatRequest
    ) -> Any:  # openai's LegacyAPIResponse (a private module)
        max_tokens: int | None = request.max_tokens
        use_new_name = bool(_NEEDS_MAX_COMPLETION_TOKENS.match(request.model.lower()))
        # `with_raw_response`: the same call, with the response headers readable.
        return await client.chat.completions.with_raw_response.create(
            model=request.model,
            # ChatRequest.messages are in the OpenAI chat format by contract.
            messages=cast("list[ChatCompletionMessageParam]", request.messages),
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=max_tokens if max_tokens is not None and not use_new_name else omit,
            max_completion_tokens=max_tokens if max_tokens is not None and use_new_name else omit,
            temperature=request.temperature if request.temperature is not None else omit,
            tools=cast("Any", request.tools) if request.tools else omit,
            tool_choice=cast("Any", request.tool_choice) if request.tools and request.tool_choice else omit,
            # Per call, so two configs sharing a client (same upstream) keep their own limits.
            timeout=http_timeout(self.config),
        )

    @staticmethod
    async def _within(
        awaitable: Awaitable[_T],
        deadline: float,
        *,
        after_first_token: bool,
        waiting_for: str,
    ) -> _T:
        """Await `awaitable` until the loop-time `deadline`, mapping every failure.

        The deadline wraps only this await, never a `yield` of the generator: a timeout that
        spanned a yield would fire inside the consumer's code instead of ours.
        """
        try:
            async with asyncio.timeout_at(deadline):
                return await awaitable
        except TimeoutError as error:
            raise ProviderError(
                f"timed out waiting for {waiting_for}",
                code="timeout",
                permanent=False,
                after_first_token=after_first_token,
            ) from error
        except _SDKError as error:
            raise _provider_error(error, after_first_token=after_first_token) from error


_END_OF_STREAM = object()


async def _next_chunk(sdk_stream: AsyncStream[object]) -> object:
    """The next chunk, or ``_END_OF_STREAM`` (StopAsyncIteration may not escape into an async
    generator: Python would turn it into a RuntimeError; a ``data: null`` event is a chunk, and
    malformed)."""
    try:
        return await sdk_stream.__anext__()
    except StopAsyncIteration:
        return _END_OF_STREAM


def _estimate_usage(messages: list[dict[str, Any]], answer: str, model: str) -> Usage:
    return Usage(
        prompt_tokens=count_tokens(messages, model),
        completion_tokens=count_tokens(answer, model),
        estimated=True,
    )
