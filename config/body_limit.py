"""Request bodies over kefu's limits are refused before they are read (issue 29, item 6).

Without this, a body far over every limit was read whole before any view could refuse it: Daphne
(Twisted) receives the body to its end, then hands it to the application in one go, so a
300 MB ``POST`` raised a worker's memory by 243 MB, never given back.

The limit of a request (:func:`limit_for`): ``KEFU_GATEWAY_MAX_BODY_BYTES`` for the gateway
(``/v1/...``), ``KEFU_ATTACHMENT_MAX_BYTES`` plus ``KEFU_ATTACHMENT_FORM_OVERHEAD_BYTES`` (the
multipart framing) for the attachment upload (``/api/chat/attachments``, kefu's one file upload),
Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (2.5 MB by default) for every other path; ``None``
(Django's "no limit") leaves that path unbounded here. Over the limit, the answer is ``413`` with
a JSON body in the OpenAI error shape (``{"error": {"message", "type", "param", "code":
"request_too_large"}}``), the one the gateway gives (the upload's own shape there: ``{"error":
{"code": "too_large", "message"}}``), and the connection is closed:

- **Daphne** (:func:`install_daphne_guard`, called by ``config/asgi.py`` when the server starts):
  a request whose ``Content-Length`` is over the limit is answered as soon as its headers are
  in, before any of the body is read (no ``100 Continue`` is sent to a client that asked); a
  chunked body is counted as it arrives and cut once the limit is passed. Nothing of either
  reaches the application. Daphne has no option for this, so its request class is patched, as
  ``config/asgi.py`` already does for Autobahn's frame-size reply.
- **Any ASGI server** (:class:`BodyLimit`, around Django's ASGI application): the same refusal by
  ``Content-Length`` before the application runs, and a body that passes the limit while the
  application reads it is cut with ``413``. Behind Daphne it is a second line.

The reverse proxy in front should refuse first (nginx ``client_max_body_size``): the deployment
declares its value in ``KEFU_PROXY_MAX_BODY_BYTES``, checked by ``manage.py check --deploy``
(``ops.checks``; docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from io import BytesIO
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: How long a refused request's connection keeps reading (and dropping) what the client still
#: sends after the 413, seconds (nginx's ``lingering_time`` is 30 s; a client that reads answers
#: stops sending at once).
LINGER_S = 5.0

#: Paths of the OpenAI-compatible gateway, limited by ``KEFU_GATEWAY_MAX_BODY_BYTES``.
GATEWAY_PREFIX = "/v1/"
#: The attachment upload (chat.attachment_views), limited by ``KEFU_ATTACHMENT_MAX_BYTES``.
UPLOAD_PATH = "/api/chat/attachments"


def limit_for(path: str) -> int | None:
    """The longest request body accepted on ``path``, bytes (None: no limit)."""
    if path.startswith(GATEWAY_PREFIX):
        return int(settings.KEFU_GATEWAY_MAX_BODY_BYTES)
    if path == UPLOAD_PATH:
        return int(settings.KEFU_ATTACHMENT_MAX_BYTES) + int(settings.KEFU_ATTACHMENT_FORM_OVERHEAD_BYTES)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return None if limit is None else int(limit)


def refusal_body(limit: int, path: str = "") -> bytes:
    """The JSON body of a 413 (the gateway's OpenAI-shaped error; the upload's own on ``UPLOAD_PATH``)."""
    if path == UPLOAD_PATH:
        over = {"code": "too_large", "message": f"the file is over {settings.KEFU_ATTACHMENT_MAX_BYTES} bytes"}
        return json.dumps({"error": over}).encode()
    error = {
        "message": f"The body is over {limit} bytes.",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }
    return json.dumps({"error": error}).encode()


def refusal_bytes(limit: int, path: str = "") -> bytes:
    """A whole HTTP/1.1 413 response that closes the connection."""
    body = refusal_body(limit, path)
    head = (
        "HTTP/1.1 413 Content Too Large\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: HTTP requests over :func:`limit_for` get ``413`` (JSON) instead of the
    application. ``Content-Length`` is checked before ``app`` runs; the body ``app`` reads is
    counted, and ``app`` is stopped with ``413`` once it passes the limit (when no response has
    started; otherwise the connection just ends)."""

    def __init__(self, app: Any) -> None:
        self.app: ASGIApp = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        limit = limit_for(path)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_refusal(send, limit, path)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _TooLarge:
            if not started:
                await _send_refusal(send, limit, path)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_refusal(send: Send, limit: int, path: str = "") -> None:
    body = refusal_body(limit, path)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install_daphne_guard() -> None:
    """Make Daphne refuse over-limit bodies as their headers arrive (module docstring).

    Patches ``daphne.http_protocol.WebRequest`` (a Twisted ``http.Request``): ``gotLength`` (the
    headers are in: the declared length), ``handleContentChunk`` (a piece of body: counted) and
    ``process`` (the whole request: never run for a refused one). No-op without Daphne, and when
    already installed."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # another ASGI server: BodyLimit alone
        return
    if getattr(WebRequest, "_kefu_body_limit", False):
        return
    got_length = WebRequest.gotLength
    handle_content_chunk = WebRequest.handleContentChunk
    process = WebRequest.process

    def refuse(request: Any, limit: int) -> None:
        path = bytes(getattr(request.channel, "_path", b"") or b"").split(b"?", 1)[0].decode("latin-1")
        request._kefu_refused = True
        request.content = BytesIO()  # what arrives from now on is dropped
        transport = request.channel.transport
        transport.write(refusal_bytes(limit, path))
        # A lingering close, as nginx does: the answer is followed by our FIN (half-close) while
        # what the client is still sending is read and dropped for up to LINGER_S; closing at
        # once would answer its next bytes with a TCP reset, which can destroy the 413 unread.
        lose_write = getattr(transport, "loseWriteConnection", None)
        if lose_write is None:
            request.channel.loseConnection()
            return
        lose_write()
        from twisted.internet import reactor

        clock: Any = reactor
        clock.callLater(LINGER_S, transport.abortConnection)

    def gotLength(self: Any, length: int | None) -> None:
        raw_path = bytes(getattr(self.channel, "_path", b"") or b"").split(b"?", 1)[0]
        self._kefu_limit = limit_for(raw_path.decode("latin-1"))
        self._kefu_received = 0
        self._kefu_refused = False
        if length is not None and self._kefu_limit is not None and length > self._kefu_limit:
            # Read by Twisted right after this method: a client waiting for "100 Continue" gets the 413 alone.
            self.requestHeaders.removeHeader(b"Expect")
            refuse(self, self._kefu_limit)
            return
        got_length(self, length)

    def handleContentChunk(self: Any, data: bytes) -> None:
        if getattr(self, "_kefu_refused", False):
            return
        limit = getattr(self, "_kefu_limit", None)
        if limit is not None:
            self._kefu_received += len(data)
            if self._kefu_received > limit:
                self.content.close()
                refuse(self, limit)
                return
        handle_content_chunk(self, data)

    def guarded_process(self: Any) -> Any:
        if getattr(self, "_kefu_refused", False):
            return None
        return process(self)

    WebRequest.gotLength = gotLength
    WebRequest.handleContentChunk = handleContentChunk
    WebRequest.process = guarded_process
    WebRequest._kefu_body_limit = True
