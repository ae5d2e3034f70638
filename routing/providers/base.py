"""The provider seam: what every answer source that streams text speaks.

A provider turns a `ChatRequest` into an async stream of `TextDelta` items followed by exactly
one `StreamDone`, or raises `ProviderError`. Nothing here knows about Django, the ORM or any
SDK: the router, the tests and the benchmarks depend on these types only, and
`routing/providers/openai_remote.py` is the one module that speaks to the `openai` SDK.

Units: token counts are integers, durations are milliseconds (`*_ms`, floats), timeouts in a
`ProviderConfig` are seconds (`*_s`) because that is what HTTP clients take.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "ChatRequest",
    "ModelList",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "ProviderErrorCode",
    "StreamDone",
    "StreamItem",
    "TextDelta",
    "ToolCall",
    "Usage",
]

ProviderErrorCode = Literal[
    "refused",  # kefu stopped the answer: it repeated the assistant's instructions (routing.decide.injection)
    "rate_limited",  # 429 from the upstream
    "timeout",  # connect, first-token or total deadline passed
    "connection",  # could not connect, or the connection broke (also mid-stream)
    "server",  # 5xx, an error event inside the stream, or another transient status
    "bad_request",  # 400/404/422 and other 4xx: this request will never succeed there
    "auth",  # 401/403 or missing credentials
    "malformed",  # the upstream sent something that is not a valid chunk
    "budget",  # kefu did not call: the spend budgets leave no room for it (routing.upstream.budgets)
]


@dataclass(frozen=True)
class ModelList:
    """What an endpoint's ``GET /models`` answered (``openai_remote.list_models``).

    ``state``: ``listed`` (HTTP 200: ``models`` are the ids it lists, a ``models/`` prefix such as
    Gemini's removed, in its order), ``refused`` (HTTP 401 / 403: the API key was refused) or
    ``unknown`` (404, 5xx, a timeout, no connection, a body that is not a model list: many
    OpenAI-compatible servers have no ``/models``). ``detail``: what happened, for people
    (``"HTTP 404"``, ``"timed out after 5 s"``).
    """

    state: str
    models: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class Usage:
    """Tokens billed (or estimated) for one answer.

    `cached_prompt_tokens` is the part of `prompt_tokens` served from the upstream's prompt
    cache (billed cheaper); it is included in `prompt_tokens`, not added to it. `estimated` is
    True when the upstream reported no usage and we counted the tokens ourselves.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    estimated: bool = False


@dataclass(frozen=True)
class TextDelta:
    """A non-empty piece of answer text, in the order received."""

    text: str


@dataclass(frozen=True)
class StreamDone:
    """The last item of every successful stream.

    `model` is the model the upstream says answered (it may differ from the requested alias,
    e.g. a dated snapshot). `finish_reason` is the upstream's (`"stop"`, `"length"`,
    `"content_filter"`...), or None when the source has none. `ttft_ms` is the time from the
    call to the first non-empty text, None when no text came at all; `latency_ms` is the time
    from the call to the end of the stream.
    """

    usage: Usage
    model: str
    finish_reason: str | None
    ttft_ms: float | None
    latency_ms: float


@dataclass(frozen=True)
class ToolCall:
    """A function the model asked to call (OpenAI's ``tool_calls``), whole: its ``call_id``, the
    function ``name`` and its ``arguments`` as the model wrote them (a JSON object as text, not
    yet validated). Yielded after the call's last streamed fragment, before `StreamDone` (whose
    `finish_reason` is then ``"tool_calls"``)."""

    call_id: str
    name: str
    arguments: str


StreamItem = TextDelta | ToolCall | StreamDone


class ProviderError(Exception):
    """A failed call to an answer source, classified for the router.

    Attributes:
        code: what went wrong (see `ProviderErrorCode`).
        permanent: True when retrying the same request at the same deployment cannot succeed
            (bad credentials, a request the upstream rejects); the router may still fall back
            to another deployment. False for rate limits, timeouts, 5xx and broken connections.
        retry_after_s: seconds the upstream asked us to wait (`retry-after` /
            `retry-after-ms`), or None.
        status: the HTTP status, when the upstream answered with one.
        after_first_token: True when some `TextDelta` was already yielded before the failure;
            the router must not retry then (the shopper has seen part of an answer).
    """

    code: ProviderErrorCode
    permanent: bool
    retry_after_s: float | None
    status: int | None
    after_first_token: bool

    def __init__(
        self,
        message: str,
        *,
        code: ProviderErrorCode,
        permanent: bool,
        retry_after_s: float | None = None,
        status: int | None = None,
        after_first_token: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.permanent = permanent
        self.retry_after_s = retry_after_s
        self.status = status
        self.after_first_token = after_first_token

    def __repr__(self) -> str:
        return (
            f"ProviderError({self.message!r}, code={self.code!r}, permanent={self.permanent}, "
            f"retry_after_s={self.retry_after_s}, status={self.status}, "
            f"after_first_token={self.after_first_token})"
        )


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to stream.

    `messages` are in the OpenAI chat format: `{"role": "system"|"user"|"assistant",
    "content": str}` (content may also be a list of `{"type": "text", "text": str}` parts).
    `max_tokens` caps the answer length in tokens; None leaves it to the upstream.
    `first_token_within_s`: this call's own first-token budget, seconds, when shorter than the
    provider's configured one (the router sets what is left of a message's budget after earlier
    attempts); None: the configured one. `tools`: functions the model may call, in the OpenAI
    format (``{"type": "function", "function": {"name", "description", "parameters"}}``);
    `tool_choice`: ``"auto"`` or ``"none"`` (None: the upstream's default). Messages may then
    hold an assistant turn's ``tool_calls`` and ``{"role": "tool", "tool_call_id", "content"}``.
    """

    messages: list[dict[str, Any]]
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    first_token_within_s: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None


@dataclass(frozen=True)
class ProviderConfig:
    """Where and how to call one upstream.

    `base_url` None means the official OpenAI endpoint. Timeouts are in seconds:
    `connect_timeout_s` to open the connection, `first_token_timeout_s` from the call to the
    first non-empty text (also the longest silence allowed between two received bytes),
    `total_timeout_s` from the call to the end of the stream.

    Connections: `http2` offers HTTP/2 to the upstream (negotiated over TLS: an upstream that
    answers HTTP/1.1 gets HTTP/1.1); `keepalive_s` is how long an idle pooled connection is kept
    (seconds; the HTTP client's default is 5, after which the next call pays a new TCP and TLS
    handshake).
    """

    base_url: str | None
    api_key: str
    connect_timeout_s: float = 5
    first_token_timeout_s: float = 15
    total_timeout_s: float = 60
    http2: bool = False
    keepalive_s: float = 5


class Provider(Protocol):
    """Anything that streams an answer.

    `stream()` yields zero or more `TextDelta` (and, for a request with `tools`, `ToolCall`
    items after them) then exactly one `StreamDone`, or raises
    `ProviderError` (with `after_first_token` set when text was already yielded). Closing the
    iterator early (the shopper left) releases the upstream connection.
    """

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamItem]: ...
