"""An OpenAI-compatible streaming upstream over TLS that speaks HTTP/2 and HTTP/1.1 (ALPN), for
the tests and the benchmark of upstream connections (bench/upstream_conn.py).

``tests/fake_openai.py`` (aiohttp) speaks HTTP/1.1 on plain TCP only; real upstreams speak TLS
and most offer HTTP/2. This one is Hypercorn serving a small ASGI app with a certificate from a
throw-away CA (``trustme``); point a client at it with ``SSL_CERT_FILE=server.ca_file``.

Every request is recorded as ``(path, HTTP version, client port)``: a new client port is a new
TCP connection (and a new TLS handshake). ``POST /v1/chat/completions`` streams
``"tok0 tok1 ..."`` in ``chunks`` content chunks (fewer when the request's ``max_tokens`` is
smaller), ``ttft_ms`` before the first and ``gap_ms`` apart, then a finish chunk and a usage chunk; ``GET /v1/models`` lists one model.

In-process use (its own thread and event loop)::

    with running_tls_upstream(chunks=8) as server:
        ...  # SSL_CERT_FILE=server.ca_file; base URL server.base_url
        assert server.connections() == 1

From a shell (prints ``listening on https://127.0.0.1:PORT/v1 ca=FILE`` once ready)::

    python tests/tls_upstream.py --chunks 64 --gap-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trustme
from hypercorn.asyncio import serve
from hypercorn.config import Config

__all__ = ["TlsUpstream", "running_tls_upstream"]


class TlsUpstream:
    """The server (see the module docstring). ``requests`` holds ``(path, http_version, port)``."""

    def __init__(self, *, chunks: int = 5, ttft_ms: float = 0.0, gap_ms: float = 0.0) -> None:
        self.chunks, self.ttft_ms, self.gap_ms = chunks, ttft_ms, gap_ms
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="kefu-tls-upstream-")
        ca = trustme.CA()
        self.ca_file = os.path.join(self._dir, "ca.pem")
        self._cert_file = os.path.join(self._dir, "server.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(self._cert_file)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1"

    def connections(self, path: str | None = None) -> int:
        """How many TCP connections carried the requests (to ``path`` only, when given)."""
        with self._lock:
            return len({port for p, _, port in self.requests if path is None or p == path})

    def versions(self) -> set[str]:
        with self._lock:
            return {version for _, version, _ in self.requests}

    def start(self) -> TlsUpstream:
        ready = threading.Event()

        def run() -> None:
            asyncio.run(self._serve(ready))

        self._thread = threading.Thread(target=run, name="tls-upstream", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the TLS upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.certfile = config.keyfile = self._cert_file
        config.alpn_protocols = ["h2", "http/1.1"]
        config.accesslog = config.errorlog = None
        config.keep_alive_timeout = 300
        task = asyncio.ensure_future(serve(self._app, config, shutdown_trigger=self._stop.wait))  # type: ignore[arg-type]
        await self._wait_listening()
        ready.set()
        await task

    async def _wait_listening(self) -> None:
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            writer.close()
            return

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        with self._lock:
            self.requests.append((path, scope["http_version"], int(scope["client"][1])))
        if path.endswith("/models"):
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]})
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        max_tokens = json.loads(body or b"{}").get("max_tokens")
        chunks = min(self.chunks, max_tokens) if isinstance(max_tokens, int) else self.chunks
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(self.ttft_ms / 1000)
        for i in range(chunks):
            if i and self.gap_ms:
                await asyncio.sleep(self.gap_ms / 1000)
            await send({"type": "http.response.body", "body": _event({"content": f"tok{i} "}), "more_body": True})
        await send({"type": "http.response.body", "body": _event({}, finish="stop"), "more_body": True})
        usage = {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": 10 + chunks}
        tail = b"data: " + json.dumps(_chunk(None, None, usage=usage)).encode() + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": False})


def _chunk(delta: dict[str, str] | None, finish: str | None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    out: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


def _event(delta: dict[str, str], finish: str | None = None) -> bytes:
    return b"data: " + json.dumps(_chunk(delta, finish)).encode() + b"\n\n"


@contextmanager
def running_tls_upstream(**kwargs: Any) -> Iterator[TlsUpstream]:
    server = TlsUpstream(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    server = TlsUpstream(chunks=args.chunks, ttft_ms=args.ttft_ms, gap_ms=args.gap_ms)
    ready = threading.Event()

    async def announce() -> None:
        task = asyncio.ensure_future(server._serve(ready))
        while not ready.is_set():
            await asyncio.sleep(0.02)
        print(f"listening on {server.base_url} ca={server.ca_file}", flush=True)
        await task

    try:
        asyncio.run(announce())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
