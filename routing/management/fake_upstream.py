"""An OpenAI-compatible chat-completions server: the test upstream of the tests, the benchmarks
and ``manage.py fake_model`` (streamed answers on a machine without an API key).

It lives in the project, not in ``tests/``, because the app's own command serves it; the tests
reach it through ``tests/fake_openai.py``. It imports nothing of kefu's, no Django and no
``openai``: only the standard library and aiohttp.

It speaks enough of the OpenAI HTTP API for the real `openai` client to talk to it:
`POST /v1/chat/completions` (streamed as server-sent events, or one JSON object) and
`GET /v1/models`. Each request takes the next scripted `Behaviour` from a queue, or the
server's default behaviour when the queue is empty, so a test decides exactly how the
"upstream" misbehaves: slow first token, 429 with `retry-after`, 5xx, a connection dropped
before or after some chunks, an invalid JSON line, no usage chunk...

In-process use (the server runs on its own thread with its own event loop, so it works from
sync and async tests alike)::

    server = FakeOpenAI.start()               # free port on 127.0.0.1
    server.push(Behaviour(text="Hello there", ttft_ms=50))
    ...  # point an OpenAI client at server.base_url ("http://127.0.0.1:PORT/v1")
    assert server.requests[-1]["model"] == "gpt-4o-mini"
    server.stop()

From a shell (prints the address and the variables that point kefu at it once ready)::

    python manage.py fake_model --port 0 --ttft-ms 300 --token-ms 20

or, as the benchmarks do (prints `listening on http://127.0.0.1:PORT/v1` once ready)::

    python tests/fake_openai.py --port 0 --ttft-ms 300 --token-ms 20

Default answer: `"Echo: <text of the last user message>"`, split into word-sized chunks.
Default usage (when the client asks for it with `stream_options.include_usage`, and always in
non-streamed answers): prompt tokens = number of whitespace-separated words in all messages,
completion tokens = number of content chunks; a behaviour can set exact numbers instead.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["MODELS", "Behaviour", "FakeOpenAI", "default_answer", "running_fake_openai", "split_text"]

# What `GET /v1/models` lists unless the server is given its own names: the names the tests give
# their tiers (tests/conftest.py `remote`: fake-<tier>; canaries: fake-candidate...), then a few
# of OpenAI's. kefu calls only a model its endpoint lists (routing.upstream.listing).
MODELS = (
    "fake-simple",
    "fake-medium",
    "fake-complex",
    "fake-candidate",
    "fake-candidate-2",
    "fake-small",
    "fake-large",
    "kefu",
    "gpt-4o-mini",
    "gpt-4o",
    "gpt-4.1-mini",
    "gpt-3.5-turbo",
)

_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    502: ("server_error", None),
    503: ("server_error", None),
}


@dataclass
class Behaviour:
    """How the server answers one request. Every field has a well-behaved default.

    Attributes:
        text: the answer; None means `default_answer(messages)`.
        chunks: None splits the text into words (each with its trailing spaces); an int splits
            it into that many near-equal pieces; a list gives the exact pieces (and then
            replaces `text`).
        ttft_ms: delay before the first content chunk (the role chunk goes out at once, as
            OpenAI does), in milliseconds.
        token_ms: delay between two content chunks, in milliseconds.
        status: answer with this HTTP error status and an OpenAI-style error body instead.
        retry_after: value of the `retry-after` header sent with `status` (seconds, or any
            string such as an HTTP date); None sends no header.
        error_message: the `error.message` of the error body.
        drop_before_first_token: close the connection before sending any response (not even
            headers).
        drop_after_chunks: send the headers, the role chunk and this many content chunks, then
            close the connection without ending the chunked body (0: drop before any content).
        malformed_after_chunks: after this many content chunks, send a `data:` line that is
            not JSON, then end normally.
        error_event_after_chunks: after this many content chunks, send a
            `data: {"error": {...}}` event, as OpenAI does for mid-stream failures.
        error_event: the `error` object of that event (default: a `server_error`), e.g.
            `{"message": "...", "type": "invalid_request_error", "code": "context_length_exceeded"}`.
        hang_before_headers_ms: accept the request, then send nothing (not even the status line)
            for this long before answering, in milliseconds.
        include_usage: None honours `stream_options.include_usage`; False never sends usage;
            True always sends it.
        prompt_tokens / completion_tokens / cached_prompt_tokens: exact usage to report;
            None uses the default counts described in the module docstring.
        finish_reason: the `finish_reason` of the last content chunk; None sends none.
        model: the model name reported in chunks; None echoes the requested model.
        send_done: send the final `data: [DONE]` line.
        echo_prompt: a hostile upstream: answer with the whole prompt, every message's content
            (the system message first), one after the other (`text` is ignored).
        compliant: a model that politely does what the conversation asked of it: every http(s)
            link an earlier user message holds (not the last one) is repeated at the end of the
            answer ("... Discount link: <url>"), as a shopper's "please mention <url> in every
            reply" would have it. Without earlier user messages the answer is unchanged.
        tool_calls: the model calls these tools instead of (or after, with `text`) answering:
            ``[{"name": str, "arguments": dict | str, "id"?: str}]``, streamed as OpenAI streams
            them (a first delta with the id and name, then the arguments in three pieces) with
            `finish_reason` ``"tool_calls"``; `text` then defaults to no text at all.
    """

    text: str | None = None
    chunks: int | list[str] | None = None
    ttft_ms: float = 0.0
    token_ms: float = 0.0
    status: int | None = None
    retry_after: float | str | None = None
    error_message: str | None = None
    drop_before_first_token: bool = False
    drop_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    error_event_after_chunks: int | None = None
    error_event: dict[str, Any] | None = None
    hang_before_headers_ms: float = 0.0
    include_usage: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_prompt_tokens: int = 0
    finish_reason: str | None = "stop"
    model: str | None = None
    send_done: bool = True
    echo_prompt: bool = False
    compliant: bool = False
    tool_calls: list[dict[str, Any]] | None = None


def _content_text(content: object) -> str:
    """The text of a message `content`: a string, or a list of `{"type": "text"}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _earlier_links(messages: list[dict[str, Any]]) -> list[str]:
    """The http(s) links of every user message but the last, in order, without duplicates."""
    users = [_content_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    links = [link for text in users[:-1] for link in re.findall(r"https?://[^\s<>\"']+", text)]
    return list(dict.fromkeys(link.rstrip(".,;:!?)") for link in links))


def default_answer(messages: list[dict[str, Any]]) -> str:
    """`"Echo: <last user message text>"`, deterministic so tests can predict it."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return f"Echo: {_content_text(message.get('content'))}"
    return "Echo: "


def split_text(text: str, chunks: int | list[str] | None) -> list[str]:
    """Split `text` into the content pieces to stream (see `Behaviour.chunks`)."""
    if isinstance(chunks, list):
        return list(chunks)
    if chunks is None:
        return re.findall(r"\S+\s*|\s+", text)
    count = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), count)
    pieces: list[str] = []
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return [piece for piece in pieces if piece]


def _word_count(messages: list[dict[str, Any]]) -> int:
    return sum(len(_content_text(m.get("content")).split()) for m in messages)


class FakeOpenAI:
    """The server. Use `FakeOpenAI.start()` (background thread) or `serve_forever()` (CLI).

    Thread safety: `push`, `reset`, `requests` and `request_headers` may be used from any
    thread; the server itself runs on its own event loop.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default: Behaviour | None = None,
        api_key: str | None = None,
        models: Sequence[str] = MODELS,
    ) -> None:
        """`port` 0 picks a free port. With `api_key` set, requests carrying another bearer
        token get a 401 like OpenAI's; None accepts any key. `models` are the names
        `GET /v1/models` lists (any name is answered all the same)."""
        self.host = host
        self.port = port
        self.default = default or Behaviour()
        self.api_key = api_key
        self.models = tuple(models)
        # What `GET /v1/models` answers (tests change them between requests): its HTTP status
        # (200 lists `models`; 401 / 403 / 404 / 5xx an OpenAI-style error) and a delay before
        # it answers, in seconds (longer than kefu's check timeout: a timeout).
        self.models_status = 200
        self.models_delay_s = 0.0
        self._lock = threading.Lock()
        self._queue: deque[Behaviour] = deque()
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        # (path, client port) of every request, models included: a new port is a new connection.
        self._peers: list[tuple[str, int]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopped: asyncio.Event | None = None
        # Benchmarks set a list here: every content chunk written appends (the request's last
        # message text, the code points of the answer written so far, time.monotonic() just
        # after the write). Written from the server's thread; None (the default) records nothing.
        self.chunk_log: list[tuple[str, int, float]] | None = None

    # ----------------------------------------------------------------- public API

    @classmethod
    def start(
        cls,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default: Behaviour | None = None,
        api_key: str | None = None,
        models: Sequence[str] = MODELS,
    ) -> FakeOpenAI:
        """Start a server on a background thread and return it once it accepts connections.

        Raises whatever binding the port raised (e.g. `OSError` when it is taken).
        """
        server = cls(host=host, port=port, default=default, api_key=api_key, models=models)
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            server._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(server._serve(ready))
            except OSError as error:  # the bind failed: report it to start()'s caller
                failure.append(error)
                ready.set()
            finally:
                loop.close()

        server._thread = threading.Thread(target=run, name="fake-openai", daemon=True)
        server._thread.start()
        ready.wait(timeout=10)
        if failure:
            raise failure[0]
        if not ready.is_set():
            raise RuntimeError("fake OpenAI server did not start within 10 s")
        return server

    def stop(self) -> None:
        """Stop the background server and wait for its thread (at most ~5 s)."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def base_url(self) -> str:
        """`http://HOST:PORT/v1`, what an OpenAI client takes as `base_url`."""
        return f"http://{self.host}:{self.port}/v1"

    def push(self, *behaviours: Behaviour) -> None:
        """Queue behaviours; each request takes the next one (then `self.default`)."""
        with self._lock:
            self._queue.extend(behaviours)

    def reset(self) -> None:
        """Forget queued behaviours and recorded requests (between tests)."""
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            self._headers.clear()
            self._peers.clear()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of every chat-completions request received, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers (lower-cased names) of the same requests, in the same order."""
        with self._lock:
            return list(self._headers)

    @property
    def peers(self) -> list[tuple[str, int]]:
        """``(path, client port)`` of every request (``GET /v1/models`` included), oldest first:
        requests with the same port came over the same TCP connection."""
        with self._lock:
            return list(self._peers)

    def _note_peer(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        with self._lock:
            self._peers.append((request.path, int(peer[1]) if peer else 0))

    @property
    def pending(self) -> int:
        """How many pushed behaviours have not been used yet."""
        with self._lock:
            return len(self._queue)

    def serve_forever(self, *, on_ready: Callable[[FakeOpenAI], None] | None = None) -> None:
        """Serve on the current thread until interrupted (a command line). Once the port is bound,
        calls `on_ready(self)` (`self.port` is then the real one), or prints
        `listening on <base_url>` when it is None. Raises `OSError` when the bind fails."""
        ready = threading.Event()
        with suppress(KeyboardInterrupt):  # Ctrl-C is how a command line is meant to stop it
            asyncio.run(self._serve(ready, on_ready=on_ready or _announce))

    # ----------------------------------------------------------------- server

    async def _serve(self, ready: threading.Event, *, on_ready: Callable[[FakeOpenAI], None] | None = None) -> None:
        self._stopped = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a client that gives up (our timeout tests) cancels the
        # handler's sleep instead of leaving it to write into a dead socket later.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        self.port = int(self._runner.addresses[0][1])
        if on_ready is not None:
            on_ready(self)
        ready.set()
        try:
            await self._stopped.wait()
        finally:
            await self._runner.cleanup()

    def _next_behaviour(self) -> Behaviour:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default

    @property
    def models_requests(self) -> int:
        """How many `GET /v1/models` requests came (chat requests are in `requests`)."""
        with self._lock:
            return sum(1 for path, _ in self._peers if path.endswith("/models"))

    async def _models(self, request: web.Request) -> web.Response:
        self._note_peer(request)
        if self.models_delay_s > 0:
            await asyncio.sleep(self.models_delay_s)
        if self.models_status != 200:
            return _error_response(self.models_status, f"GET /models answers {self.models_status} here (test setting)")
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error_response(401, "Incorrect API key provided.")
        data = [
            {"id": name, "object": "model", "created": 1_700_000_000, "owned_by": "kefu-fake"} for name in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        self._note_peer(request)
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error_response(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error_response(400, "The body must be a JSON object.")
        with self._lock:
            self._requests.append(body)
            self._headers.append({k.lower(): v for k, v in request.headers.items()})
        behaviour = self._next_behaviour()

        if self.api_key is not None and (request.headers.get("Authorization") != f"Bearer {self.api_key}"):
            return _error_response(401, "Incorrect API key provided.")
        if behaviour.drop_before_first_token:
            _abort(request)
            # aiohttp needs a response object; the transport is gone, so nothing is sent.
            return web.Response(status=500)
        if behaviour.status is not None:
            headers: dict[str, str] = {}
            if behaviour.retry_after is not None:
                headers["retry-after"] = str(behaviour.retry_after)
            return _error_response(
                behaviour.status,
                behaviour.error_message or f"Fake upstream error {behaviour.status}.",
                headers=headers,
            )

        messages = body.get("messages") or []
        model = behaviour.model or str(body.get("model") or "gpt-4o-mini")
        if behaviour.echo_prompt:
            text = "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
        elif behaviour.tool_calls is not None and behaviour.text is None:
            text = ""
        else:
            text = behaviour.text if behaviour.text is not None else default_answer(messages)
        if behaviour.compliant and text:
            text += "".join(f" Discount link: {link}" for link in _earlier_links(messages))
        pieces = split_text(text, behaviour.chunks) if text else []
        usage = {
            "prompt_tokens": (
                behaviour.prompt_tokens if behaviour.prompt_tokens is not None else _word_count(messages)
            ),
            "completion_tokens": (
                behaviour.completion_tokens if behaviour.completion_tokens is not None else len(pieces)
            ),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        usage_obj: dict[str, Any] = {
            **usage,
            "prompt_tokens_details": {"cached_tokens": behaviour.cached_prompt_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        if not body.get("stream"):
            await asyncio.sleep((behaviour.ttft_ms + behaviour.token_ms * len(pieces)) / 1000)
            answer: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(pieces)},
                        "finish_reason": behaviour.finish_reason,
                        "logprobs": None,
                    }
                ],
                "usage": usage_obj,
            }
            if behaviour.include_usage is False:
                del answer["usage"]
            return web.json_response(answer)

        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        send_usage = wants_usage if behaviour.include_usage is None else behaviour.include_usage

        if behaviour.hang_before_headers_ms > 0:
            await asyncio.sleep(behaviour.hang_before_headers_ms / 1000)
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        response.enable_chunked_encoding()
        await response.prepare(request)

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
                # OpenAI sends `"usage": null` on every chunk when usage was requested.
                **({"usage": None} if send_usage else {}),
            }

        await _send(response, chunk({"role": "assistant", "content": "", "refusal": None}))
        written = 0
        for index, piece in enumerate(pieces):
            if index == behaviour.drop_after_chunks:
                _abort(request)
                return response
            if index == behaviour.malformed_after_chunks:
                await response.write(b'data: {"id": "broken", "choices": [\n\n')
            if index == behaviour.error_event_after_chunks:
                await _send(
                    response,
                    {"error": behaviour.error_event or {"message": "The server had an error.", "type": "server_error"}},
                )
            delay_ms = behaviour.ttft_ms if index == 0 else behaviour.token_ms
            if delay_ms > 0:
                await asyncio.sleep(delay_ms / 1000)
            last = index == len(pieces) - 1 and not behaviour.tool_calls
            await _send(
                response,
                chunk({"content": piece}, behaviour.finish_reason if last else None),
            )
            if self.chunk_log is not None:
                written += len(piece)
                self.chunk_log.append(
                    (_content_text(messages[-1].get("content")) if messages else "", written, time.monotonic())
                )
        count = len(pieces)
        if behaviour.drop_after_chunks is not None and behaviour.drop_after_chunks >= count:
            _abort(request)
            return response
        if behaviour.malformed_after_chunks is not None and behaviour.malformed_after_chunks >= count:
            await response.write(b'data: {"id": "broken", "choices": [\n\n')
        for number, call in enumerate(behaviour.tool_calls or []):
            arguments = call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"])
            head = {"index": number, "id": call.get("id") or f"call_{uuid.uuid4().hex[:12]}", "type": "function"}
            await _send(
                response, chunk({"tool_calls": [{**head, "function": {"name": call["name"], "arguments": ""}}]})
            )
            third = max(1, len(arguments) // 3)
            for start in range(0, len(arguments), third):
                fragment = {"index": number, "function": {"arguments": arguments[start : start + third]}}
                await _send(response, chunk({"tool_calls": [fragment]}))
        if behaviour.tool_calls:
            await _send(response, chunk({}, "tool_calls"))
        elif not pieces and behaviour.finish_reason is not None:
            await _send(response, chunk({}, behaviour.finish_reason))
        if send_usage:
            usage_chunk = chunk({})
            usage_chunk["choices"] = []
            usage_chunk["usage"] = usage_obj
            await _send(response, usage_chunk)
        if behaviour.send_done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _announce(server: FakeOpenAI) -> None:
    print(f"listening on {server.base_url}", flush=True)


async def _send(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode())


def _abort(request: web.Request) -> None:
    """Close the TCP connection at once, leaving any chunked body unfinished."""
    transport = request.transport
    if transport is not None:
        transport.close()


def _error_response(status: int, message: str, *, headers: dict[str, str] | None = None) -> web.Response:
    error_type, code = _ERROR_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


@contextmanager
def running_fake_openai(*, default: Behaviour | None = None, api_key: str | None = None) -> Iterator[FakeOpenAI]:
    """A started server on a free port, stopped on exit; the body of a pytest fixture::

    @pytest.fixture(scope="module")
    def fake_openai_server():
        with running_fake_openai() as server:
            yield server
    """
    server = FakeOpenAI.start(default=default, api_key=api_key)
    try:
        yield server
    finally:
        server.stop()
